// Grouped GEMM: A [M,K] row-major, B [N,K] row-major (K-major) = [W_gate; W_up] halves, fused with the SwiGLU
// forward: D fp32 [M, N] = [p | q] (of [g | u]) and aux bf16 [M, N/2] = a = bf16(silu(g) * u) (mainloop_gate_up.cuh,
// epilogue_swiglu_fwd.cuh). Forward gate/up + SwiGLU in one launch.
#include "gemm_kinds.h"
#include "grouped_gemm.cuh"
MOK_DEFINE_KIND(gemm_tn_swiglu_fwd, cutlass::layout::RowMajor, cutlass::layout::ColumnMajor, float,
                mok::Epi::kSwigluFwd)

// Grouped GEMM: A [M,K] row-major, B [K,N] row-major (N-major), fused with the SwiGLU backward: D bf16
// [M, 2N] = [dg | du] of the fp32 product da, reading C fp32 [M, 2N] = the forward's [p | q] (epilogue_swiglu_bwd.cuh).
// Backward d_a + SwiGLU backward in one launch.
#include "gemm_kinds.h"
#include "grouped_gemm.cuh"
MOK_DEFINE_KIND(gemm_nn_swiglu_bwd, cutlass::layout::RowMajor, cutlass::layout::RowMajor, cutlass::bfloat16_t,
                mok::Epi::kSwigluBwd)

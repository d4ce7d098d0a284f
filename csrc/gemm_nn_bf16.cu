// Grouped GEMM: A [M,K] row-major, B [K,N] row-major (N-major), D bf16 [M,N]. Backward d_x, whose B [2I, H] =
// [W_gate; W_up] may be two tensors (segment operand b_up: mainloop_k_halves.cuh); the router's d_x.
#include "gemm_kinds.h"
#include "grouped_gemm.cuh"
MOK_DEFINE_KIND_KH(gemm_nn_bf16, cutlass::layout::RowMajor, cutlass::layout::RowMajor, cutlass::bfloat16_t,
                   mok::Epi::kLinear, true)

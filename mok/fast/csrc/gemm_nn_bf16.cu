// Grouped GEMM: A [M,K] row-major, B [K,N] row-major (N-major), D bf16 [M,N]. Backward d_x.
#include "gemm_kinds.h"
#include "grouped_gemm.cuh"
MOK_DEFINE_KIND(gemm_nn_bf16, cutlass::layout::RowMajor, cutlass::layout::RowMajor,
                cutlass::bfloat16_t, mok::Epi::kLinear)

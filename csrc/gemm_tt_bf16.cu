// Grouped GEMM: A [K,M] row-major (M-major), B [K,N] row-major (N-major), D bf16 [M,N]. Weight
// gradients of bf16 parameters: the fp32 accumulator rounded once to bf16 in the epilogue (the same
// bits as the fp32 result rounded afterwards), so no fp32 gradient is written and read again.
#include "gemm_kinds.h"
#include "grouped_gemm.cuh"
MOK_DEFINE_KIND(gemm_tt_bf16, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor,
                cutlass::bfloat16_t, mok::Epi::kLinear)

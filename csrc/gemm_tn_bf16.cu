// Grouped GEMM: A [M,K] row-major, B [N,K] row-major (K-major), D bf16 [M,N]. Forward down.
#include "gemm_kinds.h"
#include "grouped_gemm.cuh"
MOK_DEFINE_KIND(gemm_tn_bf16, cutlass::layout::RowMajor, cutlass::layout::ColumnMajor,
                cutlass::bfloat16_t, mok::Epi::kLinear)

// Grouped GEMM: A [M,K] row-major, B [N,K] row-major (K-major), D fp32 [M,N]. Forward gate/up.
#include "gemm_kinds.h"
#include "grouped_gemm.cuh"
MOK_DEFINE_KIND(gemm_tn_f32, cutlass::layout::RowMajor, cutlass::layout::ColumnMajor,
                float, mok::Epi::kLinear)

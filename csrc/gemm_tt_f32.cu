// Grouped GEMM: A [K,M] row-major (M-major), B [K,N] row-major (N-major), D fp32 [M,N].
// Weight gradients: K runs over an expert's rows in canonical order, in one CTA per output tile.
#include "gemm_kinds.h"
#include "grouped_gemm.cuh"
MOK_DEFINE_KIND(gemm_tt_f32, cutlass::layout::ColumnMajor, cutlass::layout::RowMajor,
                float, mok::Epi::kLinear)

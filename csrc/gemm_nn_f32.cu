// Grouped GEMM: A [M,K] row-major, B [K,N] row-major (N-major), D fp32 [M,N]. Backward d_a.
#include "gemm_kinds.h"
#include "grouped_gemm.cuh"
MOK_DEFINE_KIND(gemm_nn_f32, cutlass::layout::RowMajor, cutlass::layout::RowMajor,
                float, mok::Epi::kLinear)

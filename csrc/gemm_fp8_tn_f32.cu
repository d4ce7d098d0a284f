// FP8 grouped GEMM with block scales: A [M,K] e4m3 row-major, B [N,K] e4m3 row-major (K-major), D fp32 [M,N]. The
// FP8 recipe's gate/up (fp32 [g | u]) and d_a products.
#include "gemm_kinds.h"
#include "grouped_gemm_fp8.cuh"
MOK_DEFINE_FP8_KIND(gemm_fp8_tn_f32, float)

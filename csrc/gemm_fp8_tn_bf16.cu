// FP8 grouped GEMM with block scales: A [M,K] e4m3 row-major, B [N,K] e4m3 row-major (K-major), D bf16 [M,N]. The
// FP8 recipe's down and d_x products.
#include "gemm_kinds.h"
#include "grouped_gemm_fp8.cuh"
MOK_DEFINE_FP8_KIND(gemm_fp8_tn_bf16, cutlass::bfloat16_t)

// The one SiLU of the fast path, shared by the SwiGLU kernels (elementwise.cu) and the SwiGLU-backward
// epilogue of the d_a GEMM (epilogue_swiglu_bwd.cuh), so both give the same bits:
// s = sigmoid(g), silu = g * s, silu' = s * (1 + g * (1 - s)). expf, and nvcc may contract FMAs:
// deterministic and within the 2x rule, not the reference's bits.
#pragma once
#include <cuda_bf16.h>

namespace mok {

__device__ __forceinline__ float sigmoid_(float g) { return 1.0f / (1.0f + expf(-g)); }
__device__ __forceinline__ float silu_(float g) { return g * sigmoid_(g); }

// SwiGLU backward of one element: da (fp32) the gradient of a = silu(g) * u; g, u fp32.
// dg = bf16(da * u * silu'(g)), du = bf16(da * silu(g)).
__device__ __forceinline__ void swiglu_bwd_one(float da, float g, float u, __nv_bfloat16& dg, __nv_bfloat16& du) {
  float sig = sigmoid_(g);
  float sl = g * sig;
  float dsilu = sig * (1.0f + g * (1.0f - sig));
  dg = __float2bfloat16_rn(da * u * dsilu);
  du = __float2bfloat16_rn(da * sl);
}

}  // namespace mok

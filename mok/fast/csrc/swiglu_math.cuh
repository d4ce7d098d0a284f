// The one SiLU of the fast path, shared by the SwiGLU kernels (elementwise.cu) and the SwiGLU epilogues of the
// gate/up and d_a GEMMs (epilogue_swiglu_fwd.cuh, epilogue_swiglu_bwd*.cuh), so each fused launch gives its kernel's
// bits: s = sigmoid(g) = 1 / (1 + expf(-g)), silu = g * s, silu' = s * (1 + g * (1 - s)). Deterministic and within
// the 2x rule, not the reference's bits (expf is within 2 ULP, and nvcc may contract FMAs).
// No branches: the reciprocal is two Newton steps from the hardware's approximation instead of the IEEE division,
// whose slow-path call and reconvergence serialised an epilogue's elements (one warp per scheduler runs it, so the
// latency of each element's chain was exposed: benchmarks/RESULTS.md run 15).
#pragma once
#include <cuda_bf16.h>

namespace mok {

// 1 / x for x >= 1 (x may be +inf): within an ULP of the correctly rounded quotient where it is a normal number,
// and 0 where it is not (x >= 2^126, including +inf, where the Newton steps would give inf * 0 = NaN).
__device__ __forceinline__ float recip_ge1_(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  r = __fmaf_rn(r, __fmaf_rn(-x, r, 1.0f), r);
  r = __fmaf_rn(r, __fmaf_rn(-x, r, 1.0f), r);
  return x < 0x1p126f ? r : 0.0f;
}

__device__ __forceinline__ float sigmoid_(float g) { return recip_ge1_(1.0f + expf(-g)); }
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

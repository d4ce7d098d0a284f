// The one SiLU of the fast path, shared by the SwiGLU kernels (elementwise.cu) and the SwiGLU epilogues of the
// gate/up and d_a GEMMs (epilogue_swiglu_fwd.cuh, epilogue_swiglu_bwd*.cuh), so each fused launch gives its kernel's
// bits: s = sigmoid(g) = 1 / (1 + expf(-g)), silu = g * s, silu' = s * (1 + g * (1 - s)). Deterministic and within
// the 2x rule, not the reference's bits (expf is within 2 ULP, and nvcc may contract FMAs).
// The forward keeps, in place of the pre-activations [g | u], the two factors of the backward [p | q] (fp32):
// p = u * silu'(g) and q = silu(g), computed from the sigmoid it has anyway; the backward is then two products,
// dg = bf16(da * p) and du = bf16(da * q), with no exp, reciprocal or Newton steps in the d_a epilogue. The same
// bytes are kept; rounding p and q (or g and u) to bf16 breaks the 2x rule on small batches.
// No branches: the reciprocal is two Newton steps from the hardware's approximation instead of the IEEE division,
// whose slow-path call and reconvergence serialised an epilogue's elements (one warp per scheduler runs it, so the
// latency of each element's chain was exposed; ptxas: 194 calls in the ping-pong kernel with the division, 2 now).
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

// SwiGLU forward of one element, g and u fp32: returns silu(g) * u (fp32; a = its bf16) and sets the backward's
// factors p = u * silu'(g), q = silu(g) (fp32), every step rounded as written (no contraction left to nvcc).
__device__ __forceinline__ float swiglu_fwd_one(float g, float u, float& p, float& q) {
  const float sig = sigmoid_(g);
  q = __fmul_rn(g, sig);  // silu(g)
  p = __fmul_rn(u, __fmul_rn(sig, __fmaf_rn(g, __fsub_rn(1.0f, sig), 1.0f)));  // rounding fixed: one bits everywhere
  return __fmul_rn(q, u);
}

// SwiGLU backward of one element: da (fp32) the gradient of a = silu(g) * u; p, q the forward's factors (fp32).
// dg = bf16(da * p), du = bf16(da * q).
__device__ __forceinline__ void swiglu_bwd_one(float da, float p, float q, __nv_bfloat16& dg, __nv_bfloat16& du) {
  dg = __float2bfloat16_rn(__fmul_rn(da, p));
  du = __float2bfloat16_rn(__fmul_rn(da, q));
}

}  // namespace mok

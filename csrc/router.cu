// Router of the fast path, per token (one warp each): scores, top-k and renormalisation from the
// logits, and the logit gradient of those, with the reference's formulas and orders
// (mok/reference/_router.py, _exact.py): every product, sum and quotient is a separately rounded
// fp32 operation (__fmul_rn & co., so nothing is contracted into an FMA), `exp` is the contract's
// polynomial, and every sum over experts or over the k picks is the contract's pairwise tree.
// So on the same logits the scores, top-k, weights and d_logits are bitwise the reference's, and a
// token's results never depend on the other tokens of the batch.
#include <cuda_bf16.h>

#include <cstdint>

#include "mok_fast.h"
#include "mok_status.h"

namespace {

constexpr int kWarps = 4;  // tokens per block

// ---- the contract's exp (mok/reference/_exact.py: exp_exact), same constants and order
__device__ __forceinline__ float pow2_(int n) { return __int_as_float((n + 127) << 23); }

__device__ float exp_exact(float x) {
  if (isnan(x)) return x;
  const float xc = fminf(fmaxf(x, -104.0f), 89.0f);
  const float n = floorf(__fadd_rn(__fmul_rn(xc, 1.44269502162933349609375f), 0.5f));
  const float r = __fsub_rn(__fsub_rn(xc, __fmul_rn(n, 0.693145751953125f)),
                            __fmul_rn(n, 1.428606765330187045e-06f));
  float p = 1.98412701138295233249664306640625e-04f;
  p = __fadd_rn(__fmul_rn(p, r), 1.38888892251998186111450195312500e-03f);
  p = __fadd_rn(__fmul_rn(p, r), 8.33333376795053482055664062500000e-03f);
  p = __fadd_rn(__fmul_rn(p, r), 4.16666679084300994873046875000000e-02f);
  p = __fadd_rn(__fmul_rn(p, r), 1.66666671633720397949218750000000e-01f);
  p = __fadd_rn(__fmul_rn(p, r), 0.5f);
  p = __fadd_rn(__fmul_rn(p, r), 1.0f);
  p = __fadd_rn(__fmul_rn(p, r), 1.0f);
  const int ni = (int)n;
  const int half = ni >> 1;  // floor division by 2
  float y = __fmul_rn(__fmul_rn(p, pow2_(half)), pow2_(ni - half));
  if (x > 89.0f) y = __int_as_float(0x7f800000);
  if (x < -104.0f) y = 0.0f;
  return y;
}

// sigmoid_exact: 1 / (1 + exp(-x)) for x >= -80, else e / (1 + e) with e = exp(x).
__device__ float sigmoid_exact(float x) {
  if (x < -80.0f) {
    const float e = exp_exact(x);
    return __fdiv_rn(e, __fadd_rn(1.0f, e));
  }
  return __fdiv_rn(1.0f, __fadd_rn(1.0f, exp_exact(-x)));
}

// The contract's pairwise tree over buf[0, n) (tree_sum): v_i += v_{h+i} for i < h = n / 2, an
// odd last element carried to slot h. In place in this warp's shared memory; all lanes return it.
__device__ float tree_sum_warp(float* buf, int n) {
  const int lane = threadIdx.x & 31;
  __syncwarp();
  if (n == 0) return 0.0f;
  while (n > 1) {
    const int h = n >> 1;
    for (int i = lane; i < h; i += 32) buf[i] = __fadd_rn(buf[i], buf[h + i]);
    __syncwarp();
    if (n & 1) {
      if (lane == 0) buf[h] = buf[2 * h];
      __syncwarp();
    }
    n = h + (n & 1);
  }
  const float v = buf[0];
  __syncwarp();
  return v;
}

// NaN-propagating max (torch.max).
__device__ __forceinline__ float nanmax_(float a, float b) {
  return (isnan(a) || isnan(b)) ? __int_as_float(0x7fc00000) : fmaxf(a, b);
}

// Does (va, ia) sort before (vb, ib) in a stable descending sort with NaN first?
__device__ __forceinline__ bool before_(float va, int ia, float vb, int ib) {
  const bool na = isnan(va), nb = isnan(vb);
  if (na != nb) return na;
  if (!na && va != vb) return va > vb;
  return ia < ib;
}

struct WarpSmem {
  float* p;    // [E] scores
  float* buf;  // [max(E, K)] tree scratch
  int* sel;    // [K] picked experts
  unsigned char* taken;  // [E]
};

__device__ WarpSmem warp_smem(char* smem, int E, int K) {
  const int n = max(E, K);
  const size_t per = (size_t)E * 4 + (size_t)n * 4 + (size_t)K * 4 + (size_t)((E + 15) / 16) * 16;
  char* base = smem + (threadIdx.x >> 5) * per;
  WarpSmem w;
  w.p = reinterpret_cast<float*>(base);
  w.buf = w.p + E;
  w.sel = reinterpret_cast<int*>(w.buf + n);
  w.taken = reinterpret_cast<unsigned char*>(w.sel + K);
  return w;
}

// scores_TE, topk_idx_TK, topk_w_TK from logits (row stride ld >= E).
__global__ void router_topk_k(const float* logits, int T, int E, int ld, int K, int softmax, int normalize,
                              float* scores, int64_t* topk_idx, float* topk_w) {
  extern __shared__ char smem[];
  const int lane = threadIdx.x & 31;
  const int t = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (t >= T) return;  // whole warps exit together
  WarpSmem s = warp_smem(smem, E, K);
  const float* l = logits + (int64_t)t * ld;
  if (softmax) {
    float m = -__int_as_float(0x7f800000);
    for (int e = lane; e < E; e += 32) m = nanmax_(m, l[e]);
    for (int off = 16; off > 0; off >>= 1) m = nanmax_(m, __shfl_xor_sync(0xffffffffu, m, off));
    for (int e = lane; e < E; e += 32) {
      const float v = exp_exact(__fsub_rn(l[e], m));
      s.p[e] = v;
      s.buf[e] = v;
    }
    const float sum = tree_sum_warp(s.buf, E);
    for (int e = lane; e < E; e += 32) s.p[e] = __fdiv_rn(s.p[e], sum);
  } else {
    for (int e = lane; e < E; e += 32) s.p[e] = sigmoid_exact(l[e]);
  }
  for (int e = lane; e < E; e += 32) {
    scores[(int64_t)t * E + e] = s.p[e];
    s.taken[e] = 0;
  }
  __syncwarp();
  for (int k = 0; k < K; ++k) {
    float bv = 0.0f;
    int bi = -1;
    for (int e = lane; e < E; e += 32) {
      if (s.taken[e]) continue;
      if (bi < 0 || before_(s.p[e], e, bv, bi)) { bv = s.p[e]; bi = e; }
    }
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
      if (oi >= 0 && (bi < 0 || before_(ov, oi, bv, bi))) { bv = ov; bi = oi; }
    }
    if (lane == 0) {
      s.taken[bi] = 1;
      s.sel[k] = bi;
    }
    __syncwarp();
  }
  float denom = 1.0f;
  if (normalize) {
    for (int k = lane; k < K; k += 32) s.buf[k] = s.p[s.sel[k]];
    denom = tree_sum_warp(s.buf, K);
  }
  for (int k = lane; k < K; k += 32) {
    const float w = s.p[s.sel[k]];
    topk_idx[(int64_t)t * K + k] = s.sel[k];
    // a sum of picked scores below the smallest normal fp32 (all picks' logits below about -87.3 with
    // sigmoid scores) gives the weights 1/k, as the reference's route (mok/reference/_router.py)
    const float wn = denom < 1.17549435e-38f ? __fdiv_rn(1.0f, (float)K) : __fdiv_rn(w, denom);
    topk_w[(int64_t)t * K + k] = normalize ? wn : w;
  }
}

// d_logits of (topk_w, scores) (the reference's route_backward) plus d_logits_in, split into
// bf16 hi = bf16(dl), lo = bf16(dl - hi): hl[t, e] = hi, hl[t, ld_half + e] = lo, pad columns 0.
__global__ void router_bwd_k(const float* scores, const int64_t* topk_idx, const float* d_w,
                             const float* d_scores, const float* d_logits, int T, int E, int K,
                             int softmax, int normalize, int ld_half, __nv_bfloat16* hl) {
  extern __shared__ char smem[];
  const int lane = threadIdx.x & 31;
  const int t = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (t >= T) return;
  WarpSmem s = warp_smem(smem, E, K);
  const float* p = scores + (int64_t)t * E;
  for (int e = lane; e < E; e += 32) {
    s.p[e] = d_scores ? d_scores[(int64_t)t * E + e] : 0.0f;  // dp, before adding the picks
    s.taken[e] = 0;
  }
  __syncwarp();
  // dpk: the gradient of the k picked scores
  float s_pk = 1.0f, t1 = 0.0f;
  if (normalize) {
    for (int k = lane; k < K; k += 32) s.buf[k] = p[topk_idx[(int64_t)t * K + k]];
    s_pk = tree_sum_warp(s.buf, K);
    for (int k = lane; k < K; k += 32) {
      const float w = __fdiv_rn(p[topk_idx[(int64_t)t * K + k]], s_pk);
      s.buf[k] = __fmul_rn(w, d_w ? d_w[(int64_t)t * K + k] : 0.0f);
    }
    t1 = tree_sum_warp(s.buf, K);
  }
  for (int k = lane; k < K; k += 32) {
    const float dwk = d_w ? d_w[(int64_t)t * K + k] : 0.0f;
    const float dpk = !normalize ? dwk : (s_pk < 1.17549435e-38f ? 0.0f : __fdiv_rn(__fsub_rn(dwk, t1), s_pk));
    const int e = (int)topk_idx[(int64_t)t * K + k];
    s.sel[k] = e;
    s.buf[k] = dpk;
  }
  __syncwarp();
  if (lane == 0) {
    for (int k = 0; k < K; ++k) s.taken[s.sel[k]] = (unsigned char)(k + 1);  // ids distinct per row
  }
  __syncwarp();
  // dp = d_scores + scatter(dpk) (+0.0 where not picked, as the reference's zeros().scatter())
  for (int e = lane; e < E; e += 32) {
    const int k = s.taken[e];
    s.p[e] = __fadd_rn(s.p[e], k ? s.buf[k - 1] : 0.0f);
  }
  __syncwarp();
  float c = 0.0f;
  if (softmax) {
    float* tmp = s.buf;  // free again: every lane has read its dpk above
    for (int e = lane; e < E; e += 32) tmp[e] = __fmul_rn(p[e], s.p[e]);
    c = tree_sum_warp(tmp, E);
  }
  __nv_bfloat16* row = hl + (int64_t)t * 2 * ld_half;
  for (int e = lane; e < ld_half; e += 32) {
    __nv_bfloat16 hi = __float2bfloat16_rn(0.0f), lo = hi;
    if (e < E) {
      const float pe = p[e], dp = s.p[e];
      float dl = softmax ? __fmul_rn(pe, __fsub_rn(dp, c)) : __fmul_rn(dp, __fmul_rn(pe, __fsub_rn(1.0f, pe)));
      dl = __fadd_rn(dl, d_logits ? d_logits[(int64_t)t * E + e] : 0.0f);
      hi = __float2bfloat16_rn(dl);
      lo = __float2bfloat16_rn(__fsub_rn(dl, __bfloat162float(hi)));
    }
    row[e] = hi;
    row[ld_half + e] = lo;
  }
}

size_t router_smem(int E, int K) {
  const int n = E > K ? E : K;
  const size_t per = (size_t)E * 4 + (size_t)n * 4 + (size_t)K * 4 + (size_t)((E + 15) / 16) * 16;
  return per * kWarps;
}

int set_smem(const void* fn, size_t smem) {
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return mok::set_error("router: %zu bytes of shared memory: %s", smem, cudaGetErrorString(e));
  }
  return 0;
}

}  // namespace

extern "C" {

int mok_router_topk(const float* logits, int T, int E, int ld, int K, int softmax, int normalize,
                    float* scores, int64_t* topk_idx, float* topk_w, cudaStream_t stream) {
  if (E < 1 || K < 1 || K > E || ld < E || E > MOK_ROUTER_MAX_E)
    return mok::set_error("router_topk: bad sizes E=%d K=%d ld=%d (need 1 <= K <= E <= %d, ld >= E)", E, K, ld,
                          MOK_ROUTER_MAX_E);
  if (T == 0) return 0;
  const size_t smem = router_smem(E, K);
  if (set_smem((const void*)router_topk_k, smem)) return 1;
  router_topk_k<<<(T + kWarps - 1) / kWarps, 32 * kWarps, smem, stream>>>(logits, T, E, ld, K, softmax, normalize,
                                                                         scores, topk_idx, topk_w);
  MOK_CHECK_LAUNCH("router_topk");
  return 0;
}

int mok_router_bwd(const float* scores, const int64_t* topk_idx, const float* d_w, const float* d_scores,
                   const float* d_logits, int T, int E, int K, int softmax, int normalize, int ld_half,
                   void* hl, cudaStream_t stream) {
  if (E < 1 || K < 1 || K > E || ld_half < E || E > MOK_ROUTER_MAX_E)
    return mok::set_error("router_bwd: bad sizes E=%d K=%d ld_half=%d", E, K, ld_half);
  if (T == 0) return 0;
  const size_t smem = router_smem(E, K);
  if (set_smem((const void*)router_bwd_k, smem)) return 1;
  router_bwd_k<<<(T + kWarps - 1) / kWarps, 32 * kWarps, smem, stream>>>(
      scores, topk_idx, d_w, d_scores, d_logits, T, E, K, softmax, normalize, ld_half,
      static_cast<__nv_bfloat16*>(hl));
  MOK_CHECK_LAUNCH("router_bwd");
  return 0;
}

}  // extern "C"

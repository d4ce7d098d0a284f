// The router losses on the device, deterministic and without atomics on floats:
//   load balance = E * sum_e f_e * P_e, f_e = picks of e / (T*K), P_e = mean over tokens of the token's
//     probability of e (softmax scores, or sigmoid scores divided by their row sum);
//   z = mean over tokens of lse_t^2, lse_t = logsumexp of the token's logits;
// and their gradients. Every floating-point sum has a fixed order: a row's sums run lane-strided in order, then
// a fixed butterfly (one warp per row); column sums run over a chunk of rows in row order (one block a chunk),
// then over the chunks in a fixed two-level order, and the final sum over experts in a fixed order too (one block,
// loss_final_k). Pick counts are integers (exact in any order).
#include <cmath>
#include <cstdint>

#include "mok_fast.h"
#include "mok_status.h"

namespace {

constexpr int kRows = 64;      // rows per chunk (one block)
constexpr int kThreads = 256;  // 8 warps
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ float warp_sum(float s) {
  for (int off = 16; off > 0; off >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, off));
  return s;
}

__device__ __forceinline__ float warp_max(float m) {
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  return m;
}

// log(sum_e exp(l_e)) of one row, by one warp; +-inf when the largest logit is (as torch.logsumexp), NaN when a
// logit is NaN.
__device__ float row_lse(const float* row, int E, int lane) {
  float m = -INFINITY;
  for (int e = lane; e < E; e += 32) m = fmaxf(m, row[e]);
  m = warp_max(m);
  float s = 0.0f;
  for (int e = lane; e < E; e += 32) s = __fadd_rn(s, expf(__fsub_rn(row[e], m)));
  s = warp_sum(s);
  return isinf(m) ? m : __fadd_rn(m, logf(s));
}

// One block per chunk of kRows rows: the chunk's column sums of the balance probabilities (row order), its pick
// counts per expert, and the sum of lse_t^2 over its rows (row order).
__global__ void loss_partials_k(const float* scores, const float* logits, const int64_t* topk_idx, int T, int E,
                                int K, int normalize_rows, float* psum_part, int* count_part, float* z_part) {
  extern __shared__ int smem[];
  int* cnt = smem;                                     // [E]
  float* inv = reinterpret_cast<float*>(smem + E);     // [kRows]: row sum of the scores, or 1
  float* lse = inv + kRows;                            // [kRows]
  const int r0 = blockIdx.x * kRows;
  const int rows = min(kRows, T - r0);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
  for (int r = warp; r < rows; r += kWarps) {
    const int64_t row = (int64_t)(r0 + r) * E;
    float s = 1.0f;
    if (normalize_rows) {
      s = 0.0f;
      for (int e = lane; e < E; e += 32) s = __fadd_rn(s, scores[row + e]);
      s = warp_sum(s);
    }
    const float l = row_lse(logits + row, E, lane);
    if (lane == 0) {
      inv[r] = s;
      lse[r] = l;
    }
  }
  __syncthreads();
  for (int p = threadIdx.x; p < rows * K; p += blockDim.x) {
    const int64_t e = topk_idx[(int64_t)r0 * K + p];
    if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);  // integers: exact in any order
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    float s = 0.0f;
    for (int r = 0; r < rows; ++r) {
      const float v = scores[(int64_t)(r0 + r) * E + e];
      s = __fadd_rn(s, normalize_rows ? __fdiv_rn(v, inv[r]) : v);
    }
    psum_part[(int64_t)blockIdx.x * E + e] = s;
    count_part[(int64_t)blockIdx.x * E + e] = cnt[e];
  }
  if (threadIdx.x == 0) {
    float z = 0.0f;
    for (int r = 0; r < rows; ++r) z = __fadd_rn(z, __fmul_rn(lse[r], lse[r]));
    z_part[blockIdx.x] = z;
  }
}

// One block of 1024 threads: both losses from the chunks' partials. Lane l of warp w takes expert g + l of each
// group g of 32 experts and sums chunks w, w + 32, ... in order (coalesced over the lanes); lane l of warp 0 then
// adds the 32 warps' sums in warp order and f_e * (psum_e / T) over its experts in order; the 32 lanes' sums go
// through a fixed butterfly. balance = (that sum) * E, f_e = count_e / (T*K); z = (sum of the chunks' z partials:
// lane-strided in order by warp 1, then a fixed butterfly) / T.
constexpr int kFinalWarps = 32;
__global__ void loss_final_k(const float* psum_part, const int* count_part, const float* z_part, int chunks, int T,
                             int E, int K, float* balance, float* z) {
  __shared__ float ps[kFinalWarps][32];
  __shared__ int cs[kFinalWarps][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float picks = (float)((int64_t)T * K), tokens = (float)T;
  float acc = 0.0f;
  for (int g = 0; g < E; g += 32) {
    const int e = g + lane;
    float s = 0.0f;
    int c = 0;
    if (e < E) {
      for (int i = warp; i < chunks; i += kFinalWarps) {
        s = __fadd_rn(s, psum_part[(int64_t)i * E + e]);
        c += count_part[(int64_t)i * E + e];
      }
    }
    ps[warp][lane] = s;
    cs[warp][lane] = c;
    __syncthreads();
    if (warp == 0 && e < E) {
      float st = 0.0f;
      int ct = 0;
      for (int w = 0; w < kFinalWarps; ++w) {
        st = __fadd_rn(st, ps[w][lane]);
        ct += cs[w][lane];
      }
      acc = __fadd_rn(acc, __fmul_rn(__fdiv_rn((float)ct, picks), __fdiv_rn(st, tokens)));
    }
    __syncthreads();
  }
  if (warp == 0) {
    acc = warp_sum(acc);
    if (lane == 0) *balance = __fmul_rn(acc, (float)E);
  } else if (warp == 1) {
    float zs = 0.0f;
    for (int i = lane; i < chunks; i += 32) zs = __fadd_rn(zs, z_part[i]);
    zs = warp_sum(zs);
    if (lane == 0) *z = __fdiv_rn(zs, tokens);
  }
}

// Pick counts per expert: a shared-memory histogram per block, then one integer atomic per expert and block.
__global__ void count_picks_k(const int64_t* topk_idx, int64_t n, int E, int* counts) {
  extern __shared__ int hist[];  // [E]
  for (int e = threadIdx.x; e < E; e += blockDim.x) hist[e] = 0;
  __syncthreads();
  for (int64_t p = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; p < n; p += (int64_t)gridDim.x * blockDim.x) {
    const int64_t e = topk_idx[p];
    if (e >= 0 && e < E) atomicAdd(&hist[e], 1);  // integers: exact in any order
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x)
    if (hist[e] != 0) atomicAdd(&counts[e], hist[e]);
}

// One warp per row t: d_scores[t] = dq (softmax), or (dq - sum_e q_e dq_e) / s with q = scores / s, s the row sum
// (sigmoid); dq_e = ((d_balance * E) * f_e) / T. d_logits[t] = (((d_z * 2) * lse_t) / T) * exp(l - lse_t).
__global__ void loss_grads_k(const float* d_balance, const float* d_z, const float* scores, const float* logits,
                             const int* counts, int T, int E, int K, int normalize_rows, float* d_scores,
                             float* d_logits) {
  const int lane = threadIdx.x & 31;
  const int t = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (t >= T) return;
  const float picks = (float)((int64_t)T * K), tokens = (float)T;
  const float db = __fmul_rn(*d_balance, (float)E);
  const int64_t row = (int64_t)t * E;
  auto dq = [&](int e) { return __fdiv_rn(__fmul_rn(db, __fdiv_rn((float)counts[e], picks)), tokens); };
  if (normalize_rows) {
    float s = 0.0f;
    for (int e = lane; e < E; e += 32) s = __fadd_rn(s, scores[row + e]);
    s = warp_sum(s);
    float dot = 0.0f;
    for (int e = lane; e < E; e += 32) dot = __fadd_rn(dot, __fmul_rn(__fdiv_rn(scores[row + e], s), dq(e)));
    dot = warp_sum(dot);
    for (int e = lane; e < E; e += 32) d_scores[row + e] = __fdiv_rn(__fsub_rn(dq(e), dot), s);
  } else {
    for (int e = lane; e < E; e += 32) d_scores[row + e] = dq(e);
  }
  const float lse = row_lse(logits + row, E, lane);
  const float c = __fdiv_rn(__fmul_rn(__fmul_rn(*d_z, 2.0f), lse), tokens);
  for (int e = lane; e < E; e += 32) d_logits[row + e] = __fmul_rn(c, expf(__fsub_rn(logits[row + e], lse)));
}

bool bad_sizes(int T, int E, int K) { return T < 1 || E < 1 || K < 1 || K > E || E > MOK_ROUTER_MAX_E; }

int chunks_of(int T) { return (T + kRows - 1) / kRows; }

}  // namespace

extern "C" {

size_t mok_router_losses_scratch_bytes(int T, int E) {
  const size_t chunks = (size_t)chunks_of(T);
  return chunks * (size_t)E * 8 + chunks * 4 + (size_t)E * 4;
}

int mok_router_losses(const float* scores, const float* logits, const int64_t* topk_idx, int T, int E, int K,
                      int normalize_rows, void* scratch, float* balance, float* z, cudaStream_t stream) {
  if (bad_sizes(T, E, K)) return mok::set_error("router_losses: bad sizes T=%d E=%d K=%d", T, E, K);
  const int chunks = chunks_of(T);
  float* psum_part = static_cast<float*>(scratch);
  int* count_part = reinterpret_cast<int*>(psum_part + (size_t)chunks * E);
  float* z_part = reinterpret_cast<float*>(count_part + (size_t)chunks * E);
  const size_t smem = (size_t)E * 4 + 2 * kRows * 4;
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(loss_partials_k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return mok::set_error("router_losses: %s", cudaGetErrorString(e));
  }
  loss_partials_k<<<chunks, kThreads, smem, stream>>>(scores, logits, topk_idx, T, E, K, normalize_rows, psum_part,
                                                      count_part, z_part);
  MOK_CHECK_LAUNCH("router_losses partials");
  loss_final_k<<<1, kFinalWarps * 32, 0, stream>>>(psum_part, count_part, z_part, chunks, T, E, K, balance, z);
  MOK_CHECK_LAUNCH("router_losses final");
  return 0;
}

int mok_router_losses_bwd(const float* d_balance, const float* d_z, const float* scores, const float* logits,
                          const int64_t* topk_idx, int T, int E, int K, int normalize_rows, void* scratch,
                          float* d_scores, float* d_logits, cudaStream_t stream) {
  if (bad_sizes(T, E, K)) return mok::set_error("router_losses_bwd: bad sizes T=%d E=%d K=%d", T, E, K);
  int* counts = static_cast<int*>(scratch);
  cudaError_t e = cudaMemsetAsync(counts, 0, (size_t)E * sizeof(int), stream);
  if (e != cudaSuccess) return mok::set_error("router_losses_bwd: %s", cudaGetErrorString(e));
  const int64_t picks = (int64_t)T * K;
  const int64_t want = (picks + 255) / 256;
  count_picks_k<<<(int)(want < 264 ? want : 264), 256, (size_t)E * sizeof(int), stream>>>(topk_idx, picks, E, counts);
  MOK_CHECK_LAUNCH("router_losses_bwd counts");
  loss_grads_k<<<(T + kWarps - 1) / kWarps, kThreads, 0, stream>>>(d_balance, d_z, scores, logits, counts, T, E,
                                                                   K, normalize_rows, d_scores, d_logits);
  MOK_CHECK_LAUNCH("router_losses_bwd grads");
  return 0;
}

}  // extern "C"

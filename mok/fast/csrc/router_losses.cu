// Batch statistics of the load-balancing loss on the device, deterministic and without atomics on
// floats: per expert, the number of (token, k) picks (integer counts, exact) and the sum over tokens
// of the token's probability (softmax scores, or sigmoid scores divided by their row sum).
// Two phases with a fixed order: each block sums its chunk of rows column by column in row order,
// then one thread per expert adds the chunks' partial sums in chunk order.
#include <cstdint>

#include "mok_fast.h"
#include "mok_status.h"

namespace {

constexpr int kRows = 64;      // rows per chunk (one block)
constexpr int kThreads = 256;

__global__ void balance_partials_k(const float* scores, const int64_t* topk_idx, int T, int E, int K,
                                   int normalize_rows, float* psum_part, int* count_part) {
  extern __shared__ int smem[];
  int* cnt = smem;                                     // [E]
  float* inv = reinterpret_cast<float*>(smem + E);     // [kRows]: 1 / row sum, or 1
  const int r0 = blockIdx.x * kRows;
  const int rows = min(kRows, T - r0);
  for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
  if (normalize_rows) {  // one warp per row: lane-strided sums in order, then a fixed butterfly
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int r = warp; r < rows; r += blockDim.x / 32) {
      float s = 0.0f;
      for (int e = lane; e < E; e += 32) s = __fadd_rn(s, scores[(int64_t)(r0 + r) * E + e]);
      for (int off = 16; off > 0; off >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, off));
      if (lane == 0) inv[r] = s;
    }
  } else {
    for (int r = threadIdx.x; r < rows; r += blockDim.x) inv[r] = 1.0f;
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
}

__global__ void balance_reduce_k(const float* psum_part, const int* count_part, int chunks, int E, float* psum,
                                 int* counts) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= E) return;
  float s = 0.0f;
  int c = 0;
  for (int i = 0; i < chunks; ++i) {
    s = __fadd_rn(s, psum_part[(int64_t)i * E + e]);
    c += count_part[(int64_t)i * E + e];
  }
  psum[e] = s;
  counts[e] = c;
}

}  // namespace

extern "C" {

size_t mok_balance_scratch_bytes(int T, int E) {
  const size_t chunks = (size_t)((T + kRows - 1) / kRows);
  return chunks * (size_t)E * 8;
}

int mok_balance_stats(const float* scores, const int64_t* topk_idx, int T, int E, int K, int normalize_rows,
                      void* scratch, float* psum, int* counts, cudaStream_t stream) {
  if (T < 1 || E < 1 || K < 1 || K > E || E > MOK_ROUTER_MAX_E)
    return mok::set_error("balance_stats: bad sizes T=%d E=%d K=%d", T, E, K);
  const int chunks = (T + kRows - 1) / kRows;
  float* psum_part = static_cast<float*>(scratch);
  int* count_part = reinterpret_cast<int*>(psum_part + (size_t)chunks * E);
  const size_t smem = (size_t)E * 4 + kRows * 4;
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(balance_partials_k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return mok::set_error("balance_stats: %s", cudaGetErrorString(e));
  }
  balance_partials_k<<<chunks, kThreads, smem, stream>>>(scores, topk_idx, T, E, K, normalize_rows, psum_part,
                                                         count_part);
  MOK_CHECK_LAUNCH("balance_partials");
  balance_reduce_k<<<(E + 255) / 256, 256, 0, stream>>>(psum_part, count_part, chunks, E, psum, counts);
  MOK_CHECK_LAUNCH("balance_reduce");
  return 0;
}

}  // extern "C"

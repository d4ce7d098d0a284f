// Routing schedule on the device, no host synchronisation: validate ids, count rows per local
// expert, and place each (token, k) pair at its canonical row (expert, then token, then k).
//
// The pairs are cut into chunks of kChunk (one block each). Within a chunk, lanes of a warp that
// hold the same expert find each other with __match_any_sync; per-warp counts go to shared memory.
// A scan over the (expert, chunk) counts (per expert, then over experts) gives each (expert,
// chunk) its first row, so a pair's row = base(expert, chunk) + rows of earlier warps + rank in its warp: the
// canonical order, computed without atomics (integer atomics only raise the error flag).
#include <cstdint>

#include "mok_fast.h"
#include "mok_status.h"

namespace {

constexpr int kChunk = 256;           // pairs per block (8 warps)
constexpr int kWarps = kChunk / 32;
constexpr int kScanThreads = 1024;

// flag bits: 1 = id out of range, 2 = id repeated within a row, 4 = rows exceed capacity.
__global__ void validate_ids(const int64_t* idx, int T, int K, int E, int* flag, int* pair_row) {
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= T) return;
  const int64_t* row = idx + (int64_t)t * K;
  int bad = 0;
  for (int k = 0; k < K; ++k) {
    int64_t e = row[k];
    if (e < 0 || e >= E) bad |= 1;
    for (int j = 0; j < k; ++j)
      if (row[j] == e) bad |= 2;
    pair_row[(int64_t)t * K + k] = -1;
  }
  if (bad) atomicOr(flag, bad);
}

// Local expert of pair p, or -1 (not local, out of range, or past the end).
__device__ __forceinline__ int local_expert(const int64_t* idx, int64_t p, int64_t n_pairs, int e0, int L) {
  if (p >= n_pairs) return -1;
  int64_t le = idx[p] - e0;
  return (le >= 0 && le < L) ? (int)le : -1;
}

// Per-warp counts of each local expert in this chunk, in smem cnt[kWarps][L]; returns this lane's
// rank among earlier lanes of its warp with the same expert.
__device__ __forceinline__ int warp_counts(int le, int* cnt, int L) {
  for (int i = threadIdx.x; i < kWarps * L; i += blockDim.x) cnt[i] = 0;
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned peers = __match_any_sync(0xffffffffu, le);
  int rank = __popc(peers & ((1u << lane) - 1u));
  if (le >= 0 && rank == 0) cnt[warp * L + le] = __popc(peers);
  __syncthreads();
  return rank;
}

__global__ void chunk_counts(const int64_t* idx, int64_t n_pairs, int e0, int L, int n_chunks, int* hist) {
  extern __shared__ int cnt[];
  const int64_t p = (int64_t)blockIdx.x * kChunk + threadIdx.x;
  const int le = local_expert(idx, p, n_pairs, e0, L);
  warp_counts(le, cnt, L);
  for (int e = threadIdx.x; e < L; e += blockDim.x) {
    int s = 0;
    for (int w = 0; w < kWarps; ++w) s += cnt[w * L + e];
    hist[(int64_t)e * n_chunks + blockIdx.x] = s;  // expert-major
  }
}

// Per expert (one block each): in-place exclusive scan of its n_chunks counts (coalesced, a
// block-wide scan per 1024 chunks); the expert's total goes to offsets[L + 1 + e].
__global__ void scan_chunks(int* hist, int n_chunks, int L, int* offsets) {
  __shared__ int warp_tot[kScanThreads / 32];
  int* row = hist + (int64_t)blockIdx.x * n_chunks;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int carry = 0;
  for (int c0 = 0; c0 < n_chunks; c0 += kScanThreads) {
    const int c = c0 + threadIdx.x;
    const int v = c < n_chunks ? row[c] : 0;
    int incl = v;
    for (int off = 1; off < 32; off <<= 1) {
      int u = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += u;
    }
    if (lane == 31) warp_tot[warp] = incl;
    __syncthreads();
    int before = 0, total = 0;
    for (int w = 0; w < kScanThreads / 32; ++w) {
      before += (w < warp) ? warp_tot[w] : 0;
      total += warp_tot[w];
    }
    if (c < n_chunks) row[c] = carry + before + incl - v;
    carry += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) offsets[L + 1 + blockIdx.x] = carry;
}

// offsets[e] = first row of expert e, offsets[L] = total, clamped to the capacity; starts[e] the
// same unclamped (one thread: L is small).
__global__ void expert_offsets(int L, int capacity, int* offsets, int* starts) {
  if (threadIdx.x != 0) return;
  int s = 0;
  for (int e = 0; e < L; ++e) {
    starts[e] = s;
    offsets[e] = min(s, capacity);
    s += offsets[L + 1 + e];
  }
  offsets[L] = min(s, capacity);
}

__global__ void place_rows(const int64_t* idx, int64_t n_pairs, int e0, int L, int n_chunks, int capacity,
                           const int* base, const int* starts, int* row_pair, int* pair_row,
                           int* flag) {
  extern __shared__ int cnt[];
  const int64_t p = (int64_t)blockIdx.x * kChunk + threadIdx.x;
  const int le = local_expert(idx, p, n_pairs, e0, L);
  const int rank = warp_counts(le, cnt, L);
  if (le < 0) return;
  const int warp = threadIdx.x >> 5;
  int pos = starts[le] + base[(int64_t)le * n_chunks + blockIdx.x] + rank;
  for (int w = 0; w < warp; ++w) pos += cnt[w * L + le];
  if (pos < capacity) {
    row_pair[pos] = (int)p;
    pair_row[p] = pos;
  } else {
    atomicOr(flag, 4);
  }
}

}  // namespace

extern "C" size_t mok_schedule_scratch_ints(int T, int K, int L) {
  int64_t n_chunks = ((int64_t)T * K + kChunk - 1) / kChunk;
  return (size_t)((n_chunks > 0 ? n_chunks : 1) + 1) * L;  // chunk counts, then expert starts
}

extern "C" int mok_schedule(const int64_t* topk_idx, int T, int K, int E, int e0, int L,
                            int capacity, int* offsets, int* row_pair, int* pair_row, int* flag,
                            int* scratch, cudaStream_t stream) {
  if (T < 1 || K < 1 || L < 1 || E < L || e0 < 0 || e0 + L > E)
    return mok::set_error("schedule: bad shape T=%d K=%d E=%d e0=%d L=%d", T, K, E, e0, L);
  if (L > 4096) return mok::set_error("schedule: L=%d local experts > 4096 not supported", L);
  const int64_t n_pairs = (int64_t)T * K;
  const int n_chunks = (int)((n_pairs + kChunk - 1) / kChunk);
  const size_t smem = sizeof(int) * kWarps * L;
  if (smem > 48 * 1024) {
    cudaFuncSetAttribute(chunk_counts, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    cudaFuncSetAttribute(place_rows, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  }
  cudaMemsetAsync(flag, 0, sizeof(int), stream);
  validate_ids<<<(T + 255) / 256, 256, 0, stream>>>(topk_idx, T, K, E, flag, pair_row);
  MOK_CHECK_LAUNCH("validate_ids");
  chunk_counts<<<n_chunks, kChunk, smem, stream>>>(topk_idx, n_pairs, e0, L, n_chunks, scratch);
  MOK_CHECK_LAUNCH("chunk_counts");
  scan_chunks<<<L, kScanThreads, 0, stream>>>(scratch, n_chunks, L, offsets);
  MOK_CHECK_LAUNCH("scan_chunks");
  int* starts = scratch + (int64_t)n_chunks * L;
  expert_offsets<<<1, 32, 0, stream>>>(L, capacity, offsets, starts);
  MOK_CHECK_LAUNCH("expert_offsets");
  place_rows<<<n_chunks, kChunk, smem, stream>>>(topk_idx, n_pairs, e0, L, n_chunks, capacity, scratch,
                                                 starts, row_pair, pair_row, flag);
  MOK_CHECK_LAUNCH("place_rows");
  return 0;
}

// Expert-parallel data plane (docs/expert_parallel.md): rows pulled from and pushed to the buffers of
// the other ranks by raw pointer (CUDA IPC mappings, same GPU or peers over NVLink), and flags that
// let ranks wait for each other on the device, without the host.
//
// Signalling: every rank owns a flag array flags[n_phases][W] inside its peer-visible buffer and an
// epoch counter in local memory. mok_ep_next_epoch advances the counter once per call;
// mok_ep_signal stores the epoch into flags[phase][rank] of every rank (system-scope release, after a
// system-scope fence, so the rows this rank wrote before are visible first); mok_ep_wait spins until
// flags[phase][p] has reached the epoch for every p (system-scope acquire). A wait that runs past its
// timeout prints which ranks it waited for and traps: the CUDA context fails and the host's next CUDA
// call raises, in bounded time, on every rank that waits (docs/expert_parallel.md, failures).
#include <cstdint>
#include <cstdio>

#include "mok_fast.h"
#include "mok_status.h"

namespace {
using u16 = uint16_t;

__device__ __forceinline__ void copy_row(const u16* __restrict__ src, u16* __restrict__ dst, int H) {
  const uint4* s = reinterpret_cast<const uint4*>(src);
  uint4* d = reinterpret_cast<uint4*>(dst);
  for (int i = threadIdx.x; i < H / 8; i += blockDim.x) d[i] = s[i];
}

// out[r] = peers[p][i] for each placed row r, where item = row_pair[r] / div, p = item / per_rank,
// i = item % per_rank. Rows past offsets[L] are not touched.
__global__ void ep_gather_k(const u16* const* peers, int W, int64_t per_rank, int div, const int* row_pair,
                            const int* offsets, int L, int H, u16* out) {
  const int placed = offsets[L];
  for (int r = blockIdx.x; r < placed; r += gridDim.x) {
    const int64_t item = row_pair[r] / div;
    const int p = (int)(item / per_rank);
    if (item < 0 || p >= W) continue;  // cannot happen for placed rows; never address outside
    copy_row(peers[p] + (item % per_rank) * H, out + (int64_t)r * H, H);
  }
}

// peers[p][j] = rows[r] for each placed row r, where pair = row_pair[r], p = pair / per_rank,
// j = pair % per_rank.
__global__ void ep_scatter_k(const u16* rows, const int* row_pair, const int* offsets, int L, int H, int W,
                             int64_t per_rank, u16* const* peers) {
  const int placed = offsets[L];
  for (int r = blockIdx.x; r < placed; r += gridDim.x) {
    const int64_t pair = row_pair[r];
    const int p = (int)(pair / per_rank);
    if (pair < 0 || p >= W) continue;
    copy_row(rows + (int64_t)r * H, peers[p] + (pair % per_rank) * H, H);
  }
}

__global__ void ep_next_epoch_k(int* epoch) { *epoch += 1; }

__device__ __forceinline__ void store_release_sys(int* p, int v) {
  asm volatile("st.release.sys.global.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ int load_acquire_sys(const int* p) {
  int v;
  asm volatile("ld.acquire.sys.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// One thread per destination rank p: flags_p[phase][rank] = epoch.
__global__ void ep_signal_k(int* const* peer_flags, int W, int phase, int rank, const int* epoch) {
  const int p = threadIdx.x;
  if (p >= W) return;
  __threadfence_system();
  store_release_sys(peer_flags[p] + (int64_t)phase * W + rank, *epoch);
}

// One thread per source rank p: flags[phase][p] must reach the epoch (wrap-around safe comparison).
__global__ void ep_wait_k(const int* flags_all, int W, const int* epoch, int64_t timeout_ns, int rank, int phase) {
  const int p = threadIdx.x;
  if (p >= W) return;
  const int* flags = flags_all + (int64_t)phase * W;
  const int want = *epoch;
  const uint64_t t0 = now_ns();
  while ((int)(load_acquire_sys(flags + p) - want) < 0) {
    if (timeout_ns > 0 && (int64_t)(now_ns() - t0) > timeout_ns) {
      printf("mok EP: rank %d waited %.1f s in phase %d for rank %d (epoch %d, has %d): a rank died, "
             "left, or is in another call; trapping\n",
             rank, timeout_ns * 1e-9, phase, p, want, load_acquire_sys(flags + p));
      __trap();
    }
    __nanosleep(256);
  }
  __threadfence_system();
}

// out[p * n8 + i] = peers[p][i]: every rank's region, concatenated in rank order (8-byte words).
__global__ void ep_concat_k(const uint2* const* peers, int64_t n8, uint2* out) {
  const uint2* src = peers[blockIdx.y];
  uint2* dst = out + (int64_t)blockIdx.y * n8;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = src[i];
}

constexpr int kRowThreads = 128;

int grid_rows(int capacity) {
  const int g = capacity < 1 ? 1 : capacity;
  return g < 65535 * 4 ? g : 65535 * 4;
}
}  // namespace

extern "C" int mok_ep_gather_rows(const void* const* peers, int W, int64_t per_rank, int div, const int* row_pair,
                                  const int* offsets, int L, int H, int capacity, void* out, cudaStream_t stream) {
  if (W < 1 || per_rank < 1 || div < 1 || L < 1 || H < 8 || H % 8)
    return mok::set_error("ep_gather_rows: bad arguments W=%d per_rank=%lld div=%d L=%d H=%d", W,
                          (long long)per_rank, div, L, H);
  ep_gather_k<<<grid_rows(capacity), kRowThreads, 0, stream>>>(reinterpret_cast<const u16* const*>(peers), W,
                                                               per_rank, div, row_pair, offsets, L, H,
                                                               static_cast<u16*>(out));
  MOK_CHECK_LAUNCH("ep_gather_rows");
  return 0;
}

extern "C" int mok_ep_scatter_rows(const void* rows, const int* row_pair, const int* offsets, int L, int H,
                                   int capacity, int W, int64_t per_rank, void* const* peers,
                                   cudaStream_t stream) {
  if (W < 1 || per_rank < 1 || L < 1 || H < 8 || H % 8)
    return mok::set_error("ep_scatter_rows: bad arguments W=%d per_rank=%lld L=%d H=%d", W, (long long)per_rank,
                          L, H);
  ep_scatter_k<<<grid_rows(capacity), kRowThreads, 0, stream>>>(static_cast<const u16*>(rows), row_pair, offsets,
                                                                 L, H, W, per_rank,
                                                                 reinterpret_cast<u16* const*>(peers));
  MOK_CHECK_LAUNCH("ep_scatter_rows");
  return 0;
}

extern "C" int mok_ep_concat(const void* const* peers, int W, int64_t bytes_per_rank, void* out,
                              cudaStream_t stream) {
  if (W < 1 || W > 65535 || bytes_per_rank < 0 || bytes_per_rank % 8)
    return mok::set_error("ep_concat: bad arguments W=%d bytes_per_rank=%lld (a multiple of 8)", W,
                          (long long)bytes_per_rank);
  if (bytes_per_rank == 0) return 0;
  const int64_t n8 = bytes_per_rank / 8;
  int blocks = (int)((n8 + 255) / 256);
  if (blocks > 1024) blocks = 1024;
  ep_concat_k<<<dim3(blocks, W), 256, 0, stream>>>(reinterpret_cast<const uint2* const*>(peers), n8,
                                                  static_cast<uint2*>(out));
  MOK_CHECK_LAUNCH("ep_concat");
  return 0;
}

extern "C" int mok_ep_enable_peer_access(int device, int peer) {
  if (device == peer) return 0;
  int prev = 0;
  cudaGetDevice(&prev);
  cudaError_t err = cudaSetDevice(device);
  if (err == cudaSuccess) {
    int can = 0;
    err = cudaDeviceCanAccessPeer(&can, device, peer);
    if (err == cudaSuccess && !can) {
      cudaSetDevice(prev);
      return mok::set_error("ep_enable_peer_access: device %d cannot access device %d (no P2P path)", device, peer);
    }
    if (err == cudaSuccess) err = cudaDeviceEnablePeerAccess(peer, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
      cudaGetLastError();  // not an error: clear it
      err = cudaSuccess;
    }
  }
  cudaSetDevice(prev);
  if (err != cudaSuccess)
    return mok::set_error("ep_enable_peer_access %d -> %d: %s", device, peer, cudaGetErrorString(err));
  return 0;
}

extern "C" int mok_ep_next_epoch(int* epoch, cudaStream_t stream) {
  ep_next_epoch_k<<<1, 1, 0, stream>>>(epoch);
  MOK_CHECK_LAUNCH("ep_next_epoch");
  return 0;
}

extern "C" int mok_ep_signal(int* const* peer_flags, int W, int phase, int rank, const int* epoch,
                             cudaStream_t stream) {
  if (W < 1 || W > 1024 || phase < 0 || rank < 0 || rank >= W)
    return mok::set_error("ep_signal: bad arguments W=%d phase=%d rank=%d", W, phase, rank);
  ep_signal_k<<<1, W, 0, stream>>>(peer_flags, W, phase, rank, epoch);
  MOK_CHECK_LAUNCH("ep_signal");
  return 0;
}

extern "C" int mok_ep_wait(const int* flags, int W, const int* epoch, int64_t timeout_ns, int rank, int phase,
                           cudaStream_t stream) {
  if (W < 1 || W > 1024 || phase < 0) return mok::set_error("ep_wait: bad arguments W=%d phase=%d", W, phase);
  ep_wait_k<<<1, W, 0, stream>>>(flags, W, epoch, timeout_ns, rank, phase);
  MOK_CHECK_LAUNCH("ep_wait");
  return 0;
}

// The FP8 recipe's quantisers (docs/numerics.md "FP8 recipe", mok/reference/_fp8.py), bit for bit: a block's amax is
// the integer maximum of its finite elements' bf16 bits with the sign cleared (any order gives the same), its scale
// 2^n with n = max(E - 135 + [M > 96], -126) from amax's exponent E and mantissa M, and each value
// e4m3(x * 2^-n): an exact fp32 product (or one below e4m3's half-ulp of 0, which rounds to a signed zero either way)
// rounded once to nearest even by cvt.rn; non-finite elements give NaN (0x7F). Padding columns are written as zeros,
// so the GEMMs that read them (K a multiple of 128) add exact zeros.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "mok_fast.h"
#include "mok_status.h"

namespace {

constexpr int kBlock = 128;

__device__ __forceinline__ int abs_bits(uint16_t b) {  // |x|'s bits, 0 for NaN and ±inf
  const int a = b & 0x7FFF;
  return a >= 0x7F80 ? 0 : a;
}

__device__ __forceinline__ int scale_exponent(int amax_bits) {
  const int n = (amax_bits >> 7) - 135 + ((amax_bits & 0x7F) > 96 ? 1 : 0);
  return n < -126 ? -126 : n;
}

__device__ __forceinline__ float pow2(int n) { return __int_as_float((n + 127) << 23); }  // n in [-126, 127]

__device__ __forceinline__ uint8_t to_e4m3(uint16_t b, float inv) {
  if ((b & 0x7FFF) >= 0x7F80) return 0x7F;
  const float y = __uint_as_float(static_cast<uint32_t>(b) << 16) * inv;
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(y, __NV_SATFINITE, __NV_E4M3));
}

// One warp per (row, part, block of 128): lane l holds columns 4l .. 4l + 3 of the block.
__global__ void quant_rows_k(const uint16_t* __restrict__ x, int64_t ld_x, int rows, int parts, int P, int Pb,
                             const int* count, uint8_t* __restrict__ q, float* __restrict__ scales) {
  const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  const int per_row = parts * Pb;
  const int64_t row = w / per_row;
  const int rest = static_cast<int>(w - row * per_row), part = rest / Pb, blk = rest - part * Pb;
  const int limit = count != nullptr ? min(*count, rows) : rows;
  if (row >= limit) return;
  const int c0 = blk * kBlock + lane * 4;  // within the part
  const uint16_t* src = x + row * ld_x + static_cast<int64_t>(part) * P + c0;
  uint16_t v[4];
  if (c0 + 4 <= P && (reinterpret_cast<uintptr_t>(src) & 7) == 0) {
    const uint2 u = *reinterpret_cast<const uint2*>(src);
    v[0] = u.x & 0xFFFF; v[1] = u.x >> 16; v[2] = u.y & 0xFFFF; v[3] = u.y >> 16;
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = c0 + i < P ? src[i] : 0;
  }
  int amax = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) amax = max(amax, abs_bits(v[i]));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = max(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
  const int n = scale_exponent(amax);
  const float inv = pow2(-n);
  uint32_t packed = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) packed |= static_cast<uint32_t>(c0 + i < P ? to_e4m3(v[i], inv) : 0) << (8 * i);
  const int64_t ld_q = static_cast<int64_t>(parts) * Pb * kBlock;
  *reinterpret_cast<uint32_t*>(q + row * ld_q + static_cast<int64_t>(part) * Pb * kBlock + c0) = packed;
  if (lane == 0) scales[row * per_row + rest] = pow2(n);
}

// One CTA of 256 threads per 128x128 block (grid: K blocks, N blocks, experts); thread t holds 8 columns
// (t % 16) * 8 of rows t / 16 + 16 i, i < 8.
__global__ void __launch_bounds__(256) quant_blocks_k(const uint16_t* __restrict__ w, int N, int K,
                                                      uint8_t* __restrict__ q, float* __restrict__ s,
                                                      uint8_t* __restrict__ qT, int64_t ld_qT, int64_t off_qT,
                                                      float* __restrict__ sT, int64_t ld_sT, int64_t off_sT) {
  __shared__ uint8_t tile[kBlock][kBlock + 8];  // the block's e4m3 values, [n][k]
  __shared__ int warp_max[8];
  const int kb = blockIdx.x, nb = blockIdx.y, l = blockIdx.z;
  const int Kb = gridDim.x, Nb = gridDim.y;
  const int t = threadIdx.x, cc = (t & 15) * 8, r0 = t >> 4;
  const int64_t Kp = static_cast<int64_t>(Kb) * kBlock;
  const uint16_t* wl = w + static_cast<int64_t>(l) * N * K;
  uint16_t v[8][8];
  int amax = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int n = nb * kBlock + r0 + 16 * i, k = kb * kBlock + cc;
    const uint16_t* src = wl + static_cast<int64_t>(n) * K + k;
    if (n < N && k + 8 <= K && (reinterpret_cast<uintptr_t>(src) & 15) == 0) {
      const uint4 u = *reinterpret_cast<const uint4*>(src);
      const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) { v[i][2 * j] = words[j] & 0xFFFF; v[i][2 * j + 1] = words[j] >> 16; }
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) v[i][j] = (n < N && k + j < K) ? src[j] : 0;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) amax = max(amax, abs_bits(v[i][j]));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = max(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
  if ((t & 31) == 0) warp_max[t >> 5] = amax;
  __syncthreads();
  amax = warp_max[0];
#pragma unroll
  for (int i = 1; i < 8; ++i) amax = max(amax, warp_max[i]);
  const int e = scale_exponent(amax);
  const float inv = pow2(-e);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int r = r0 + 16 * i, n = nb * kBlock + r, k = kb * kBlock + cc;
    uint32_t lo = 0, hi = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t b = (n < N && k + j < K) ? to_e4m3(v[i][j], inv) : 0;
      if (j < 4) lo |= b << (8 * j); else hi |= b << (8 * (j - 4));
    }
    *reinterpret_cast<uint2*>(&tile[r][cc]) = make_uint2(lo, hi);
    if (q != nullptr && n < N)
      *reinterpret_cast<uint2*>(q + (static_cast<int64_t>(l) * N + n) * Kp + k) = make_uint2(lo, hi);
  }
  if (t == 0) {
    if (s != nullptr) s[(static_cast<int64_t>(l) * Nb + nb) * Kb + kb] = pow2(e);
    if (sT != nullptr) sT[(static_cast<int64_t>(l) * Kb + kb) * ld_sT + off_sT + nb] = pow2(e);
  }
  if (qT == nullptr) return;
  __syncthreads();
#pragma unroll
  for (int i = 0; i < 8; ++i) {  // qT row k = kb * 128 + r, columns nb * 128 + cc .. + 7
    const int r = r0 + 16 * i, k = kb * kBlock + r;
    if (k >= K) continue;
    uint32_t lo = 0, hi = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const uint32_t b = tile[cc + j][r];
      if (j < 4) lo |= b << (8 * j); else hi |= b << (8 * (j - 4));
    }
    *reinterpret_cast<uint2*>(qT + (static_cast<int64_t>(l) * K + k) * ld_qT + off_qT + nb * kBlock + cc) =
        make_uint2(lo, hi);
  }
}

}  // namespace

extern "C" int mok_fp8_quant_rows(const void* x, int64_t ld_x, int rows, int parts, int P, const int* count, void* q,
                                  float* scales, cudaStream_t stream) {
  if (rows < 0 || parts < 1 || P < 1 || ld_x < static_cast<int64_t>(parts) * P)
    return mok::set_error("fp8_quant_rows: rows %d, parts %d, P %d, ld_x %lld", rows, parts, P,
                          static_cast<long long>(ld_x));
  const int Pb = (P + kBlock - 1) / kBlock;
  const int64_t warps = static_cast<int64_t>(rows) * parts * Pb;
  if (warps == 0) return 0;
  const int64_t blocks = (warps + 7) / 8;
  if (blocks > 0x7FFFFFFF) return mok::set_error("fp8_quant_rows: %lld blocks of 128 is too many", (long long)warps);
  quant_rows_k<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(static_cast<const uint16_t*>(x), ld_x, rows, parts,
                                                                   P, Pb, count, static_cast<uint8_t*>(q), scales);
  MOK_CHECK_LAUNCH("fp8_quant_rows");
  return 0;
}

extern "C" int mok_fp8_quant_blocks(const void* w, int L, int N, int K, void* q, float* s, void* qT, int64_t ld_qT,
                                    int64_t off_qT, float* sT, int64_t ld_sT, int64_t off_sT, cudaStream_t stream) {
  if (L < 0 || N < 0 || K < 0) return mok::set_error("fp8_quant_blocks: L %d, N %d, K %d", L, N, K);
  const int Nb = (N + kBlock - 1) / kBlock, Kb = (K + kBlock - 1) / kBlock;
  if (L == 0 || Nb == 0 || Kb == 0) return 0;
  if (L > 65535 || Nb > 65535)
    return mok::set_error("fp8_quant_blocks: L %d and ceil(N/128) %d must be at most 65535", L, Nb);
  if (qT != nullptr && (ld_qT % 8 != 0 || off_qT % 8 != 0 || ld_qT < off_qT + static_cast<int64_t>(Nb) * kBlock))
    return mok::set_error("fp8_quant_blocks: qT's ld %lld and offset %lld must be multiples of 8 holding %d columns",
                          static_cast<long long>(ld_qT), static_cast<long long>(off_qT), Nb * kBlock);
  quant_blocks_k<<<dim3(Kb, Nb, L), 256, 0, stream>>>(static_cast<const uint16_t*>(w), N, K, static_cast<uint8_t*>(q),
                                                       s, static_cast<uint8_t*>(qT), ld_qT, off_qT, sT, ld_sT, off_sT);
  MOK_CHECK_LAUNCH("fp8_quant_blocks");
  return 0;
}

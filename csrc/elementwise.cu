// Memory-bound kernels of the fast path: row gather, SwiGLU forward/backward, the forward
// combine, the backward pre-combine (d_topk_weight and go), the d_x combine, and the helpers that
// zero weight gradients of empty experts or poison outputs when the routing flag is set, and the
// rounding of a float32 gate/up pair into one stacked bf16 tensor.
// Every reduction has a fixed order (docs/layer.md); the combines' products and sums are separate
// fp32 roundings (__fmul_rn / __fadd_rn). SwiGLU uses expf and lets nvcc contract FMAs: it is
// deterministic and within the 2x rule, not the reference's bits. bf16 values are raw 16-bit words.
#include <cuda_bf16.h>

#include <cstdint>

#include "mok_fast.h"
#include "mok_status.h"
#include "swiglu_math.cuh"

namespace {

using bf16 = __nv_bfloat16;

// Threads for a per-token kernel: the token's H / 8 vectors spread evenly over at most kTokenThreads threads (a
// multiple of 32, at least 64). A model constant (H) only, so batch invariant. At most 256 rather than one vector
// per thread: more, smaller blocks per SM keep loads in flight while other blocks wait on their per-token tables
// (DeepSeek-V3's H = 7168 combine 0.31 -> 0.28 ms against one vector a thread, Mixtral-8x7B's 0.098 -> 0.085 ms).
constexpr int kTokenThreads = 256;
inline int token_threads(int H) {
  const int n = H / 8, per = (n + kTokenThreads - 1) / kTokenThreads;
  const int t = (((n + per - 1) / per + 31) / 32) * 32;
  return t < 64 ? 64 : t;
}

__device__ __forceinline__ float nanf_() { return __int_as_float(0x7fc00000); }
using mok::swiglu_fwd_one;
using mok::swiglu_bwd_one;

// Rows a per-row kernel covers: the schedule's placed rows (offsets[L]) or a fixed count.
__device__ __forceinline__ int n_rows_(const int* offsets, int L, int fixed_rows) {
  return offsets ? offsets[L] : fixed_rows;
}

// 8 bf16 in a 16-byte vector.
union Vec8 {
  uint4 u;
  bf16 h[8];
};

// Row loads the combine kernels keep in flight per thread (each 16 bytes) before summing them in k order.
constexpr int kLoadsAhead = 8;
// Per-token tables in dynamic shared memory (rows, weights) get kLoadsAhead entries past K: the compiler may
// read a few entries ahead of a guarded loop (compute-sanitizer flags such a read past the allocation).
__host__ __device__ inline int padded_k(int K) { return K + kLoadsAhead; }

// x_RH[pair_row[t*K + k]] = x[t] for each placed pair (pair_row >= 0), one block per token: the token's row is
// read once and written to its K rows (reading it once per row instead re-reads x from DRAM K times when x
// does not fit in L2).
__global__ void gather_rows_k(const uint4* __restrict__ x, const int* pair_row, int K, int H8, int capacity,
                              uint4* __restrict__ out) {
  extern __shared__ int rows_[];
  int t = blockIdx.x;
  for (int k = threadIdx.x; k < K; k += blockDim.x) rows_[k] = pair_row[(int64_t)t * K + k];
  __syncthreads();
  const uint4* src = x + (int64_t)t * H8;
  for (int i = threadIdx.x; i < H8; i += blockDim.x) {
    uint4 v = src[i];
    for (int k = 0; k < K; ++k) {
      int r = rows_[k];
      if (r >= 0 && r < capacity) out[(int64_t)r * H8 + i] = v;
    }
  }
}

// a[r, i] = bf16(silu(g) * u), g = gu[r, i], u = gu[r, I + i] (fp32, row stride ld); gu[r] becomes [p | q] in
// place, p = u * silu'(g), q = silu(g) (swiglu_fwd_one): what the backward reads. 4 per thread.
__global__ void swiglu_fwd_k(float* gu, int64_t ld, const int* offsets, int L, int fixed_rows, int I, bf16* a) {
  int r = blockIdx.x;
  if (r >= n_rows_(offsets, L, fixed_rows)) return;
  float* row = gu + (int64_t)r * ld;
  for (int i = 4 * threadIdx.x; i < I; i += 4 * blockDim.x) {
    float4 g = *reinterpret_cast<const float4*>(row + i);
    float4 u = *reinterpret_cast<const float4*>(row + I + i);
    float4 p, q;
    const float a0 = swiglu_fwd_one(g.x, u.x, p.x, q.x), a1 = swiglu_fwd_one(g.y, u.y, p.y, q.y);
    const float a2 = swiglu_fwd_one(g.z, u.z, p.z, q.z), a3 = swiglu_fwd_one(g.w, u.w, p.w, q.w);
    *reinterpret_cast<float4*>(row + i) = p;
    *reinterpret_cast<float4*>(row + I + i) = q;
    __nv_bfloat162 lo = __floats2bfloat162_rn(a0, a1);
    __nv_bfloat162 hi = __floats2bfloat162_rn(a2, a3);
    uint2 v;
    v.x = *reinterpret_cast<unsigned*>(&lo);
    v.y = *reinterpret_cast<unsigned*>(&hi);
    *reinterpret_cast<uint2*>(a + (int64_t)r * I + i) = v;
  }
}

// out[t] = bf16(((first + w_0*r_0) + w_1*r_1) + ...), r_k the row pair_row[t*K + k] of r; fp32, `first` (if
// given) first, then k ascending; every product and sum separately rounded; NaN when the flag is set or a
// pair is not placed. kWeighted: the forward combine (first = s, r = o, weights w); else the d_x combine
// (first = dx_s, r = dx rows, no products). 8 h per thread; each thread issues the loads of up to kLoadsAhead
// rows before summing them. Dynamic shared memory: padded_k(K) ints (rows), then (kWeighted) padded_k(K)
// floats (weights).
template <bool kWeighted>
__global__ void __launch_bounds__(1024)
combine_rows_k(const bf16* __restrict__ first, const bf16* __restrict__ r, const float* w, const int* pair_row,
               const int* flag, int K, int H, bf16* __restrict__ out) {
  extern __shared__ int smem[];
  int* rows = smem;
  float* ws = reinterpret_cast<float*>(smem + padded_k(K));
  const int t = blockIdx.x;
  bool bad = *flag != 0;
  for (int k = threadIdx.x; k < K; k += blockDim.x) {
    rows[k] = pair_row[(int64_t)t * K + k];
    if (kWeighted) ws[k] = w[(int64_t)t * K + k];
  }
  __syncthreads();
  for (int k = 0; k < K; ++k) bad |= rows[k] < 0;
  for (int h = 8 * threadIdx.x; h < H; h += 8 * blockDim.x) {
    float acc[8];
    Vec8 v;
    if (first) v.u = *reinterpret_cast<const uint4*>(first + (int64_t)t * H + h);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] = first ? __bfloat162float(v.h[j]) : 0.0f;
    for (int k0 = 0; k0 < K; k0 += kLoadsAhead) {
      Vec8 rv[kLoadsAhead];  // the loads of up to kLoadsAhead rows in flight, then summed in k order
#pragma unroll
      for (int c = 0; c < kLoadsAhead; ++c)
        if (k0 + c < K && rows[k0 + c] >= 0)
          rv[c].u = *reinterpret_cast<const uint4*>(r + (int64_t)rows[k0 + c] * H + h);
#pragma unroll
      for (int c = 0; c < kLoadsAhead; ++c) {
        const int k = k0 + c;
        if (k >= K || rows[k] < 0) continue;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float x = __bfloat162float(rv[c].h[j]);
          acc[j] = __fadd_rn(acc[j], kWeighted ? __fmul_rn(ws[k], x) : x);
        }
      }
    }
    Vec8 o8;
#pragma unroll
    for (int j = 0; j < 8; ++j) o8.h[j] = __float2bfloat16_rn(bad ? nanf_() : acc[j]);
    *reinterpret_cast<uint4*>(out + (int64_t)t * H + h) = o8.u;
  }
}

// d_w[t,k] = sum_h dy[t,h] * o_k[h] and go[row(t,k)] = bf16(w[t,k] * dy[t]); 8 h per thread.
// Fixed reduction order: each thread sums its h in increasing order, then a butterfly over the
// warp's lanes, then the warps' sums in warp order. All K slots are reduced together (kChunk at
// a time), so a token costs two barriers per chunk, not a tree per slot.
template <int kChunk, int kPreLoads = 4>
__global__ void __launch_bounds__(1024)
combine_bwd_pre_k(const bf16* __restrict__ dy, const bf16* __restrict__ o, const float* w, const int* pair_row,
                  const int* flag, int K, int H, float* d_w, bf16* __restrict__ go) {
  static_assert(kChunk % kPreLoads == 0, "slots are loaded kPreLoads at a time");
  __shared__ float warp_sum[32][kChunk];
  const int kThreads = blockDim.x, kWarps = blockDim.x / 32;
  const int t = blockIdx.x;
  const bool bad = *flag != 0;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int k0 = 0; k0 < K; k0 += kChunk) {
    const int kn = min(kChunk, K - k0);
    float acc[kChunk];
    int rows[kChunk];
    float wk[kChunk];
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      acc[j] = 0.0f;
      rows[j] = j < kn ? pair_row[(int64_t)t * K + k0 + j] : -1;
      wk[j] = j < kn ? w[(int64_t)t * K + k0 + j] : 0.0f;
    }
    for (int h = 8 * threadIdx.x; h < H; h += 8 * kThreads) {
      Vec8 d;
      d.u = *reinterpret_cast<const uint4*>(dy + (int64_t)t * H + h);
      float df[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) df[i] = __bfloat162float(d.h[i]);
#pragma unroll
      for (int j0 = 0; j0 < kChunk; j0 += kPreLoads) {
        Vec8 ov[kPreLoads];  // these slots' loads issued before their first use (o and go never alias)
#pragma unroll
        for (int c = 0; c < kPreLoads; ++c)
          if (rows[j0 + c] >= 0) ov[c].u = *reinterpret_cast<const uint4*>(o + (int64_t)rows[j0 + c] * H + h);
#pragma unroll
        for (int c = 0; c < kPreLoads; ++c) {
          const int j = j0 + c;
          if (rows[j] < 0) continue;
          Vec8 g;
#pragma unroll
          for (int i = 0; i < 8; ++i) {
            acc[j] = __fadd_rn(acc[j], __fmul_rn(df[i], __bfloat162float(ov[c].h[i])));
            g.h[i] = __float2bfloat16_rn(bad ? nanf_() : __fmul_rn(wk[j], df[i]));
          }
          *reinterpret_cast<uint4*>(go + (int64_t)rows[j] * H + h) = g.u;
        }
      }
    }
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
      float v = acc[j];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, off));
      if (lane == 0) warp_sum[warp][j] = v;
    }
    __syncthreads();
    if (threadIdx.x < kn) {
      float v = 0.0f;
      for (int wi = 0; wi < kWarps; ++wi) v = __fadd_rn(v, warp_sum[wi][threadIdx.x]);
      const bool missing = pair_row[(int64_t)t * K + k0 + threadIdx.x] < 0;
      d_w[(int64_t)t * K + k0 + threadIdx.x] = (bad || missing) ? nanf_() : v;
    }
    __syncthreads();
  }
}

// dg = bf16(da * p), du = bf16(da * q) of the forward's pq[r] = [p | q] (fp32, row stride ld; swiglu_bwd_one);
// dgu[r] = [dg | du] (row stride 2I).
__global__ void swiglu_bwd_k(const float* da, const float* pq, int64_t ld, const int* offsets, int L,
                             int fixed_rows, int I, bf16* dgu) {
  int r = blockIdx.x;
  if (r >= n_rows_(offsets, L, fixed_rows)) return;
  const float* row = pq + (int64_t)r * ld;
  for (int i = 4 * threadIdx.x; i < I; i += 4 * blockDim.x) {
    float4 p4 = *reinterpret_cast<const float4*>(row + i);
    float4 q4 = *reinterpret_cast<const float4*>(row + I + i);
    float4 d4 = *reinterpret_cast<const float4*>(da + (int64_t)r * I + i);
    float p[4] = {p4.x, p4.y, p4.z, p4.w}, q[4] = {q4.x, q4.y, q4.z, q4.w}, d[4] = {d4.x, d4.y, d4.z, d4.w};
    bf16 dg[4], du[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) swiglu_bwd_one(d[j], p[j], q[j], dg[j], du[j]);
    *reinterpret_cast<uint2*>(dgu + (int64_t)r * 2 * I + i) = *reinterpret_cast<uint2*>(dg);
    *reinterpret_cast<uint2*>(dgu + (int64_t)r * 2 * I + I + i) = *reinterpret_cast<uint2*>(du);
  }
}

__global__ void zero_empty_k(uint16_t* d, const int* offsets, int64_t per_expert) {
  int e = blockIdx.y;
  if (offsets[e + 1] != offsets[e]) return;
  uint16_t* p = d + e * per_expert;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < per_expert;
       i += (int64_t)gridDim.x * blockDim.x)
    p[i] = 0;
}

__global__ void poison_k(void* p, int64_t n, int is_bf16, const int* flag) {
  if (*flag == 0) return;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    if (is_bf16) static_cast<bf16*>(p)[i] = __float2bfloat16_rn(nanf_());
    else static_cast<float*>(p)[i] = nanf_();
  }
}

// out[b] = [bf16(first[b]) | bf16(second[b])] for b < blocks, each part n elements (n % 8 == 0):
// float32 gate/up weights rounded into one stacked [L, 2I, H] tensor with 16-byte stores (the
// rounding is __float2bfloat16_rn, the conversion PyTorch's CUDA cast uses: the same bits).
__global__ void cast_pair_bf16_k(const float4* first, const float4* second, int64_t blocks, int64_t n8,
                                 uint4* out) {
  const int64_t total = 2 * blocks * n8;
  for (int64_t v = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; v < total; v += (int64_t)gridDim.x * blockDim.x) {
    const int64_t b = v / (2 * n8), rem = v % (2 * n8), half = rem / n8, i = rem % n8;
    const float4* src = (half ? second : first) + 2 * (b * n8 + i);
    const float4 lo = src[0], hi = src[1];
    Vec8 o;
    o.h[0] = __float2bfloat16_rn(lo.x); o.h[1] = __float2bfloat16_rn(lo.y);
    o.h[2] = __float2bfloat16_rn(lo.z); o.h[3] = __float2bfloat16_rn(lo.w);
    o.h[4] = __float2bfloat16_rn(hi.x); o.h[5] = __float2bfloat16_rn(hi.y);
    o.h[6] = __float2bfloat16_rn(hi.z); o.h[7] = __float2bfloat16_rn(hi.w);
    out[v] = o.u;
  }
}

// The same one element at a time, for n not a multiple of 8 or pointers not 16-byte aligned.
__global__ void cast_pair_bf16_scalar_k(const float* first, const float* second, int64_t blocks, int64_t n,
                                        bf16* out) {
  const int64_t total = 2 * blocks * n;
  for (int64_t v = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; v < total; v += (int64_t)gridDim.x * blockDim.x) {
    const int64_t b = v / (2 * n), rem = v % (2 * n);
    out[v] = __float2bfloat16_rn((rem < n ? first : second)[b * n + rem % n]);
  }
}

}  // namespace

extern "C" {

int mok_gather_rows(const void* x_TH, const int* pair_row, int T, int K, int H, int capacity, void* x_RH,
                    cudaStream_t stream) {
  if (H % 8) return mok::set_error("gather_rows: H=%d not a multiple of 8", H);
  if (T == 0 || capacity == 0) return 0;
  gather_rows_k<<<T, 128, padded_k(K) * sizeof(int), stream>>>(static_cast<const uint4*>(x_TH), pair_row, K, H / 8,
                                                     capacity, static_cast<uint4*>(x_RH));
  MOK_CHECK_LAUNCH("gather_rows");
  return 0;
}

int mok_swiglu_fwd(float* gu, int64_t ld_gu, const int* offsets, int L, int fixed_rows, int I,
                   int capacity, void* a, cudaStream_t stream) {
  if (capacity == 0) return 0;
  swiglu_fwd_k<<<capacity, 256, 0, stream>>>(gu, ld_gu, offsets, L, fixed_rows, I,
                                             static_cast<bf16*>(a));
  MOK_CHECK_LAUNCH("swiglu_fwd");
  return 0;
}

int mok_combine_fwd(const void* s_TH, const void* o_RH, const float* w_TK, const int* pair_row,
                    const int* flag, int T, int K, int H, void* y_TH, cudaStream_t stream) {
  if (T == 0) return 0;
  combine_rows_k<true><<<T, token_threads(H), (size_t)padded_k(K) * 8, stream>>>(
      static_cast<const bf16*>(s_TH), static_cast<const bf16*>(o_RH), w_TK, pair_row, flag, K, H,
      static_cast<bf16*>(y_TH));
  MOK_CHECK_LAUNCH("combine_fwd");
  return 0;
}

int mok_combine_bwd_pre(const void* dy_TH, const void* o_RH, const float* w_TK,
                        const int* pair_row, const int* flag, int T, int K, int H, float* d_w_TK,
                        void* go_RH, cudaStream_t stream) {
  if (T == 0) return 0;
  combine_bwd_pre_k<8><<<T, token_threads(H), 0, stream>>>(static_cast<const bf16*>(dy_TH),
                                                static_cast<const bf16*>(o_RH), w_TK, pair_row,
                                                flag, K, H, d_w_TK, static_cast<bf16*>(go_RH));
  MOK_CHECK_LAUNCH("combine_bwd_pre");
  return 0;
}

int mok_swiglu_bwd(const float* da, const float* pq, int64_t ld_pq, const int* offsets, int L,
                   int fixed_rows, int I, int capacity, void* dgu, cudaStream_t stream) {
  if (capacity == 0) return 0;
  swiglu_bwd_k<<<capacity, 256, 0, stream>>>(da, pq, ld_pq, offsets, L, fixed_rows, I,
                                             static_cast<bf16*>(dgu));
  MOK_CHECK_LAUNCH("swiglu_bwd");
  return 0;
}

int mok_combine_bwd_dx(const void* dxs_TH, const void* dx_RH, const int* pair_row,
                       const int* flag, int T, int K, int H, void* dx_TH, cudaStream_t stream) {
  if (T == 0) return 0;
  combine_rows_k<false><<<T, token_threads(H), (size_t)padded_k(K) * sizeof(int), stream>>>(
      static_cast<const bf16*>(dxs_TH), static_cast<const bf16*>(dx_RH), nullptr, pair_row, flag, K, H,
      static_cast<bf16*>(dx_TH));
  MOK_CHECK_LAUNCH("combine_bwd_dx");
  return 0;
}

int mok_zero_empty(void* d, const int* offsets, int L, int64_t per_expert, const int* flag,
                   cudaStream_t stream) {
  (void)flag;
  dim3 grid(64, L);
  zero_empty_k<<<grid, 256, 0, stream>>>(static_cast<uint16_t*>(d), offsets, per_expert);
  MOK_CHECK_LAUNCH("zero_empty");
  return 0;
}

int mok_poison(void* p, int64_t n, int is_bf16, const int* flag, cudaStream_t stream) {
  if (n == 0) return 0;
  poison_k<<<264, 256, 0, stream>>>(p, n, is_bf16, flag);
  MOK_CHECK_LAUNCH("poison");
  return 0;
}

int mok_cast_pair_bf16(const float* first, const float* second, int64_t blocks, int64_t n, void* out,
                       cudaStream_t stream) {
  if (blocks == 0 || n == 0) return 0;
  const bool vec = n % 8 == 0 && ((uintptr_t)first | (uintptr_t)second | (uintptr_t)out) % 16 == 0;
  const int64_t items = 2 * blocks * (vec ? n / 8 : n), want = (items + 255) / 256;
  const int grid = (int)(want < 132 * 16 ? want : 132 * 16);
  if (vec)
    cast_pair_bf16_k<<<grid, 256, 0, stream>>>(reinterpret_cast<const float4*>(first),
                                               reinterpret_cast<const float4*>(second), blocks, n / 8,
                                               static_cast<uint4*>(out));
  else
    cast_pair_bf16_scalar_k<<<grid, 256, 0, stream>>>(first, second, blocks, n, static_cast<bf16*>(out));
  MOK_CHECK_LAUNCH("cast_pair_bf16");
  return 0;
}

}  // extern "C"

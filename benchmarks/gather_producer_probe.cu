// How fast can the producer warps of a warp-specialised Hopper GEMM fill the pipeline stages with GATHERED rows?
//
// A probe, not a GEMM: the kernel has the shape of the grouped GEMMs' ping-pong kernel (384 threads: a producer
// warpgroup at 40 registers, consumer warpgroups at 232, `setmaxnreg`, one CTA per SM, STAGES stages of a
// 128 x 64 bf16 A tile on full/empty mbarriers), but the consumer only waits for each stage and releases it (after
// `--consume-ns` of spinning, to stand in for the tensor cores), so the time per stage is the producer's.
//
// Producers (--mode):
//   tma      one lane of warp 0 loads the tile of a contiguous x_RH [R, H] with one 2D TMA (what the GEMMs do now);
//   cpasync  NW producer warps (--warps 1, 2 or 4) each copy 128 / NW rows of the tile with 16-byte cp.async.cg from
//            x_TH [T, H] through a row -> token table (the gather), 8 lanes per 128-byte row, completing on the
//            stage's full barrier with cp.async.mbarrier.arrive.noinc (arrival count 32 NW);
//   --contiguous  cpasync reading row r of x_RH instead (no gather: isolates the gather's cost).
// Tiles are walked as the GEMM's persistent scheduler walks them: CTA c takes tiles c, c + #SMs, ...; tile t reads
// row block t / N_TILES (N_TILES output tiles share a row block, so its rows come from L2 after the first read).
//
// Build: nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -o gather_probe gather_producer_probe.cu
// Run:   ./gather_probe --mode tma | --mode cpasync --warps N [--contiguous] [--tokens 16384 --hidden 2048 --topk 8
//        --n-tiles 8 --consume-ns 0 --reps 20]
// Prints: mode, warps, us per stage (per CTA), GB/s of tile bytes delivered to shared memory in all.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#define CK(x)                                                                                   \
  do {                                                                                          \
    cudaError_t e_ = (x);                                                                       \
    if (e_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));  \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

constexpr int kBlkM = 128, kBlkK = 64, kStages = 5, kThreads = 384;
constexpr int kTileBytes = kBlkM * kBlkK * 2;  // 16 KiB

struct Args {
  const uint16_t* x;       // x_TH [T, H] (cpasync gather) or x_RH [R, H] (tma, contiguous)
  const int32_t* token;    // [R]: row -> token (gather)
  int64_t ld;              // H
  int n_tiles;             // output tiles per row block
  int k_tiles;             // H / 64
  int tiles;               // (R / 128) * n_tiles
  int gather;              // 1: rows through token[], 0: row r of x
  long long consume_ns;    // consumer spin per stage
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* b, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count));
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, int parity) {
  asm volatile(
      "{\n.reg .pred p;\nW: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W;\n}\n" ::"r"(smem_u32(b)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* b) {
  asm volatile("{\n.reg .b64 s;\nmbarrier.arrive.shared::cta.b64 s, [%0];\n}\n" ::"r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ void mbar_arrive_tx(uint64_t* b, int bytes) {
  asm volatile("{\n.reg .b64 s;\nmbarrier.arrive.expect_tx.shared::cta.b64 s, [%0], %1;\n}\n" ::"r"(smem_u32(b)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_arrive_noinc(uint64_t* b) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ void tma_2d(uint32_t dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
      : "memory");
}
// 128-byte swizzle of a byte offset inside a tile whose 128-byte lines are rows (K-major A, 64 bf16 a row).
__device__ __forceinline__ uint32_t sw128(uint32_t off) { return off ^ (((off >> 7) & 7u) << 4); }

template <bool kTma, int kWarps>
__global__ void __launch_bounds__(kThreads, 1) probe(Args a, const __grid_constant__ CUtensorMap map) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* tiles = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* full = reinterpret_cast<uint64_t*>(tiles + kStages * kTileBytes);
  uint64_t* empty = full + kStages;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], kTma ? 1 : 32 * kWarps);
      mbar_init(&empty[s], 1);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const int my_tiles = (a.tiles - int(blockIdx.x) + int(gridDim.x) - 1) / int(gridDim.x);
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (kTma ? warp != 0 : warp >= kWarps) return;
    constexpr int rows = kBlkM / kWarps;  // 128, 64 or 32 rows a warp
    const int r_begin = rows * warp;
    int it = 0;
    for (int i = 0; i < my_tiles; ++i) {
      const int tile = int(blockIdx.x) + i * int(gridDim.x);
      const int m0 = (tile / a.n_tiles) * kBlkM;
      // Each lane holds the tokens of rows r_begin + lane + 32 j (j < 4) of the tile; lanes copy chunk lane % 8 of
      // rows r_begin + lane / 8 + 4 q.
      int32_t tok[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = r_begin + lane + 32 * j;
        tok[j] = (32 * j < rows) ? (a.gather ? a.token[m0 + r] : m0 + r) : 0;
      }
      for (int kt = 0; kt < a.k_tiles; ++kt, ++it) {
        const int s = it % kStages, ph = (it / kStages) & 1;
        mbar_wait(&empty[s], ph ^ 1);
        const uint32_t st = smem_u32(tiles + s * kTileBytes);
        if constexpr (kTma) {
          if (lane == 0) {
            mbar_arrive_tx(&full[s], kTileBytes);
            tma_2d(st, &map, &full[s], kt * kBlkK, m0);
          }
        } else {
          const int chunk = lane % 8;
          const int k = kt * kBlkK + chunk * 8;
#pragma unroll 1
          for (int j = 0; j < rows / 32; ++j) {
            const int32_t tj = j == 0 ? tok[0] : j == 1 ? tok[1] : j == 2 ? tok[2] : tok[3];  // registers, no stack
            // rows r_begin + 32 j + lane / 8 + 4 q: their tokens are held by lanes lane / 8 + 4 q in tok[j]
#pragma unroll
            for (int q = 0; q < 8; ++q) {
              const int r_rel = 32 * j + lane / 8 + 4 * q;
              const int32_t t = __shfl_sync(0xffffffffu, tj, r_rel % 32);
              cp_async_16(st + sw128(uint32_t((r_begin + r_rel) * 128 + chunk * 16)), a.x + int64_t(t) * a.ld + k);
            }
          }
          cp_async_arrive_noinc(&full[s]);
        }
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    if (wg != 1) return;  // one consumer warpgroup
    int it = 0;
    for (int i = 0; i < my_tiles; ++i) {
      for (int kt = 0; kt < a.k_tiles; ++kt, ++it) {
        const int s = it % kStages, ph = (it / kStages) & 1;
        mbar_wait(&full[s], ph);
        if (a.consume_ns > 0) {
          uint64_t t0, t1;
          asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
          do {
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
          } while (int64_t(t1 - t0) < a.consume_ns);
        }
        asm volatile("bar.sync 1, 128;");  // the whole warpgroup has seen the stage
        if (threadIdx.x == 128) mbar_arrive(&empty[s]);
      }
    }
  }
}

static int arg_int(int argc, char** argv, const char* name, int dflt) {
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], name)) return std::atoi(argv[i + 1]);
  return dflt;
}
static const char* arg_str(int argc, char** argv, const char* name, const char* dflt) {
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], name)) return argv[i + 1];
  return dflt;
}
static bool arg_flag(int argc, char** argv, const char* name) {
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], name)) return true;
  return false;
}

int main(int argc, char** argv) {
  const char* mode = arg_str(argc, argv, "--mode", "cpasync");
  const bool tma = !std::strcmp(mode, "tma");
  if (!tma && std::strcmp(mode, "cpasync")) {
    std::fprintf(stderr, "--mode must be tma or cpasync, got %s\n", mode);
    return 2;
  }
  const int T = arg_int(argc, argv, "--tokens", 16384), H = arg_int(argc, argv, "--hidden", 2048);
  const int K = arg_int(argc, argv, "--topk", 8), n_tiles = arg_int(argc, argv, "--n-tiles", 8);
  const int warps = tma ? 1 : arg_int(argc, argv, "--warps", 1), reps = arg_int(argc, argv, "--reps", 20);
  const long long consume_ns = arg_int(argc, argv, "--consume-ns", 0);
  const bool contiguous = arg_flag(argc, argv, "--contiguous");
  if ((warps != 1 && warps != 2 && warps != 4) || H % 64 || (int64_t(T) * K) % kBlkM) {
    std::fprintf(stderr, "need --warps 1, 2 or 4, --hidden a multiple of 64, tokens * topk a multiple of 128\n");
    return 2;
  }
  const int64_t R = int64_t(T) * K;
  const bool gather = !tma && !contiguous;
  const int64_t x_rows = gather ? T : R;
  uint16_t* x;
  int32_t* token;
  CK(cudaMalloc(&x, x_rows * H * 2));
  CK(cudaMemset(x, 0x3c, x_rows * H * 2));
  CK(cudaMalloc(&token, R * 4));
  {  // rows grouped by expert as the schedule places them: each expert's rows are its tokens in increasing order
    const int E = 128;
    std::mt19937 rng(0);
    std::vector<std::vector<int32_t>> per(E);
    for (int t = 0; t < T; ++t) {
      std::vector<int> ex(E);
      for (int e = 0; e < E; ++e) ex[e] = e;
      for (int k = 0; k < K; ++k) {
        std::uniform_int_distribution<int> d(k, E - 1);
        std::swap(ex[k], ex[d(rng)]);
        per[ex[k]].push_back(t);
      }
    }
    std::vector<int32_t> h;
    for (auto& v : per) h.insert(h.end(), v.begin(), v.end());
    CK(cudaMemcpy(token, h.data(), R * 4, cudaMemcpyHostToDevice));
  }
  CUtensorMap map;
  std::memset(&map, 0, sizeof(map));
  if (tma) {
    cuuint64_t dims[2] = {cuuint64_t(H), cuuint64_t(R)}, strides[1] = {cuuint64_t(H) * 2};
    cuuint32_t box[2] = {64, kBlkM}, es[2] = {1, 1};
    // the driver's entry point through the runtime (no -lcuda at link time)
    using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
    CUresult r = reinterpret_cast<Encode>(fn)(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, x, dims, strides, box, es,
                                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                        CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
      std::fprintf(stderr, "cuTensorMapEncodeTiled failed: %d\n", int(r));
      return 1;
    }
  }
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  Args a{x, token, H, n_tiles, H / kBlkK, int(R / kBlkM) * n_tiles, gather ? 1 : 0, consume_ns};
  const size_t smem = kStages * kTileBytes + 2 * kStages * 8 + 1024;
  auto kern = tma ? probe<true, 1> : warps == 1 ? probe<false, 1> : warps == 2 ? probe<false, 2> : probe<false, 4>;
  CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  kern<<<sms, kThreads, smem>>>(a, map);  // warm-up
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<float> ms(reps);
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(e0));
    kern<<<sms, kThreads, smem>>>(a, map);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms[i], e0, e1));
  }
  std::sort(ms.begin(), ms.end());
  const float med = ms[reps / 2];
  const double stages_per_cta = double(a.tiles) * a.k_tiles / sms;
  const double bytes = double(a.tiles) * a.k_tiles * kTileBytes;
  std::printf("mode=%s warps=%d gather=%d T=%d H=%d K=%d n_tiles=%d consume_ns=%lld: %.3f ms, %.3f us/stage, %.0f GB/s\n",
              mode, warps, a.gather, T, H, K, n_tiles, consume_ns, med, med * 1e3 / stages_per_cta,
              bytes / (med * 1e-3) / 1e9);
  return 0;
}

// How fast can the producer warps of a warp-specialised Hopper GEMM fill the pipeline stages with GATHERED rows?
//
// A probe, not a GEMM: the kernel has the shape of the grouped GEMMs' ping-pong kernel (384 threads: a producer
// warpgroup at 40 registers, consumer warpgroups at 232, `setmaxnreg`, one CTA per SM, STAGES stages of a
// 128 x 64 bf16 A tile on full/empty mbarriers). Two consumers (--consumer):
//   spin   waits for each stage and releases it (after `--consume-ns` of spinning, to stand in for the tensor cores),
//          so the time per stage is the producer's (run 14);
//   wgmma  the ping-pong tile's mainloop for real: each stage also holds a 192 x 64 bf16 B tile (one 2D TMA from a
//          weight [n_tiles * 192, H], lane 0 of warp 0), and one consumer warpgroup multiplies the 128 x 192 tile with
//          wgmma m64n192k16 (two 64-row halves, four k-steps a stage, fp32 accumulators), releasing a stage once the
//          wgmma that read it are done (`wgmma.wait_group 1`), draining at each tile's end as an epilogue would. Rows
//          copied by cp.async are made visible to wgmma's async proxy with `fence.proxy.async` after the full
//          barrier. The time per stage then includes whatever the copies and the products cost each other on one
//          SM (what the spin consumer cannot show; run 33 found it more than the slower of the two alone). No
//          epilogue, no output: the accumulators are kept live by one store.
// Tiles (--tile, wgmma only):
//   pingpong  the above: 128 x 192, one consumer warpgroup, 5 stages of 40 KiB (runs 33);
//   coop      the cooperative 128 x 256 tile (SonicMoE's gathered gate/up tile, run 40): B 256 x 64, two consumer
//             warpgroups, each its 64-row half with wgmma m64n256k16, a stage released by all eight consumer warps;
//             4 stages of 48 KiB. No cluster (SonicMoE runs it in 2x1 clusters, B multicast): each CTA loads its B.
//
// Producers (--mode):
//   tma      one lane of warp 0 loads the tile of a contiguous x_RH [R, H] with one 2D TMA (what the GEMMs do now);
//   cpasync  NW producer warps (--warps 1, 2 or 4) each copy 128 / NW rows of the tile with 16-byte cp.async.cg from
//            x_TH [T, H] through a row -> token table (the gather), 8 lanes per 128-byte row, completing on the
//            stage's full barrier with cp.async.mbarrier.arrive.noinc (arrival count 32 NW, one more for B's TMA);
//   --contiguous  cpasync reading row r of x_RH instead (no gather: isolates the gather's cost).
// Tiles are walked as the GEMM's persistent scheduler walks them: CTA c takes tiles c, c + #SMs, ...; tile t reads
// row block t / N_TILES (N_TILES output tiles share a row block, so its rows come from L2 after the first read) and,
// with wgmma, B's column block t % N_TILES.
//
// Build (CuTe's wgmma atoms; from the repo root):
//   nvcc $(python -c "from mok.fast import _build; print(' '.join(_build.compile_flags()))") \
//     -o gather_probe benchmarks/gather_producer_probe.cu
// Run:   ./gather_probe --mode tma | --mode cpasync --warps N [--contiguous] [--consumer spin|wgmma]
//        [--tile pingpong|coop] [--tokens 16384 --hidden 2048 --topk 8 --n-tiles 8 --consume-ns 0 --reps 20]
// Prints: mode, consumer, warps, us per stage (per CTA), GB/s of A tile bytes delivered to shared memory in all,
// and with wgmma the tensor cores' TFLOP/s.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#define CK(x)                                                                                   \
  do {                                                                                          \
    cudaError_t e_ = (x);                                                                       \
    if (e_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));  \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

constexpr int kBlkM = 128, kBlkK = 64, kThreads = 384;
constexpr int kTileBytes = kBlkM * kBlkK * 2;   // A: 16 KiB
// B's rows a tile and the stages, ping-pong 128 x 192 (5 stages of 16 + 24 KiB) or cooperative 128 x 256 (4 of 16 + 32)
template <bool kCoop> constexpr int kBlkN = kCoop ? 256 : 192;
template <bool kCoop> constexpr int kStages = kCoop ? 4 : 5;
template <bool kCoop> constexpr int kTileBBytes = kBlkN<kCoop> * kBlkK * 2;  // B (wgmma consumer only)

struct Args {
  const uint16_t* x;       // x_TH [T, H] (cpasync gather) or x_RH [R, H] (tma, contiguous)
  const int32_t* token;    // [R]: row -> token (gather)
  int64_t ld;              // H
  int n_tiles;             // output tiles per row block
  int k_tiles;             // H / 64
  int tiles;               // (R / 128) * n_tiles
  int gather;              // 1: rows through token[], 0: row r of x
  long long consume_ns;    // consumer spin per stage
  float* sink;             // one accumulator, stored so that the wgmma results stay live
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

namespace gmma = cute::SM90::GMMA;
// Descriptor of a K-major bf16 tile of 64-element (128-byte) rows, 128-byte swizzle, at shared address `addr`
// (1024-byte aligned for the tile's first row): 8-row groups 1024 bytes apart (CuTe's make_gmma_desc<Major::K>).
__device__ __forceinline__ uint64_t desc_k_sw128(uint32_t addr) {
  cute::GmmaDescriptor d;
  d.bitfield.start_address_ = uint16_t(addr >> 4);
  d.bitfield.leading_byte_offset_ = 1;
  d.bitfield.stride_byte_offset_ = 1024 >> 4;
  d.bitfield.base_offset_ = 0;
  d.bitfield.layout_type_ = uint8_t(gmma::LayoutType::B128);
  return d.desc_;
}
template <size_t... I>
__device__ __forceinline__ void mma_64x192x16(uint64_t da, uint64_t db, float (&acc)[96], gmma::ScaleOut scale,
                                              std::index_sequence<I...>) {
  gmma::MMA_64x192x16_F32BF16BF16_SS<gmma::Major::K, gmma::Major::K>::fma(da, db, acc[I]..., scale);
}
template <size_t... I>
__device__ __forceinline__ void mma_64x256x16(uint64_t da, uint64_t db, float (&acc)[128], gmma::ScaleOut scale,
                                              std::index_sequence<I...>) {
  gmma::MMA_64x256x16_F32BF16BF16_SS<gmma::Major::K, gmma::Major::K>::fma(da, db, acc[I]..., scale);
}

template <bool kTma, int kWarps, bool kMma, bool kCoop>
__global__ void __launch_bounds__(kThreads, 1)
    probe(Args a, const __grid_constant__ CUtensorMap map, const __grid_constant__ CUtensorMap map_b) {
  static_assert(kMma || !kCoop, "the cooperative tile needs the wgmma consumer");
  constexpr int kStages = ::kStages<kCoop>, kBlkN = ::kBlkN<kCoop>, kTileBBytes = ::kTileBBytes<kCoop>;
  constexpr int kStageBytes = kTileBytes + (kMma ? kTileBBytes : 0);  // A, then B; both 1024-byte aligned
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  uint8_t* tiles = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* full = reinterpret_cast<uint64_t*>(tiles + kStages * kStageBytes);
  uint64_t* empty = full + kStages;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      // the A copies' arrivals, and one more for B's TMA (its arrive carries the expected bytes)
      mbar_init(&full[s], kTma ? 1 : 32 * kWarps + (kMma ? 1 : 0));
      mbar_init(&empty[s], kMma ? (kCoop ? 8 : 4) : 1);  // wgmma: each consumer warp once its wgmma are done
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
        const uint32_t st = smem_u32(tiles + s * kStageBytes);
        if (warp == 0 && lane == 0 && (kTma || kMma)) {
          mbar_arrive_tx(&full[s], (kTma ? kTileBytes : 0) + (kMma ? kTileBBytes : 0));
          if constexpr (kMma) tma_2d(st + kTileBytes, &map_b, &full[s], kt * kBlkK, (tile % a.n_tiles) * kBlkN);
          if constexpr (kTma) tma_2d(st, &map, &full[s], kt * kBlkK, m0);
        }
        if constexpr (!kTma) {
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
  } else if constexpr (kMma) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    // ping-pong: one consumer warpgroup multiplies both 64-row halves of the 192 columns (the mainloop back to back,
    // as if the epilogues were free); cooperative: warpgroups 1 and 2, each its 64-row half of the 256 columns
    if (!kCoop && wg != 1) return;
    constexpr int kHalves = kCoop ? 1 : 2, kAcc = kBlkN / 2;  // halves a warpgroup, accumulators a thread per half
    const int h0 = kCoop ? wg - 1 : 0;
    float acc[kHalves][kAcc];
#pragma unroll
    for (int h = 0; h < kHalves; ++h)
#pragma unroll
      for (int j = 0; j < kAcc; ++j) acc[h][j] = 0.f;
    int it = 0;
    for (int i = 0; i < my_tiles; ++i) {
      for (int kt = 0; kt < a.k_tiles; ++kt, ++it) {
        const int s = it % kStages, ph = (it / kStages) & 1;
        mbar_wait(&full[s], ph);
        if constexpr (!kTma) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        const uint32_t sa = smem_u32(tiles + s * kStageBytes), sb = sa + kTileBytes;
        cute::warpgroup_arrive();
#pragma unroll
        for (int k = 0; k < kBlkK / 16; ++k) {  // 16 elements = 32 bytes along each 128-byte row
          const gmma::ScaleOut scale = (kt == 0 && k == 0) ? gmma::ScaleOut::Zero : gmma::ScaleOut::One;
#pragma unroll
          for (int h = 0; h < kHalves; ++h) {  // rows [64 h, 64 h + 64): 8 groups of 8 rows, 1024 bytes each
            const uint64_t da = desc_k_sw128(sa + (h0 + h) * 8192 + k * 32), db = desc_k_sw128(sb + k * 32);
            if constexpr (kCoop) mma_64x256x16(da, db, acc[h], scale, std::make_index_sequence<kAcc>{});
            else mma_64x192x16(da, db, acc[h], scale, std::make_index_sequence<kAcc>{});
          }
        }
        cute::warpgroup_commit_batch();
        cute::warpgroup_wait<1>();  // the previous stage's wgmma are done: release it
        if (kt > 0 && lane == 0) mbar_arrive(&empty[(it - 1) % kStages]);
      }
      cute::warpgroup_wait<0>();  // the tile's end: an epilogue would read the accumulators here
      if (lane == 0) mbar_arrive(&empty[(it - 1) % kStages]);
    }
    if (blockIdx.x == 0 && threadIdx.x % 128 == 0) a.sink[wg - 1] = acc[0][0] + acc[kHalves - 1][kAcc - 1];
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
  const char* consumer = arg_str(argc, argv, "--consumer", "spin");
  const bool mma = !std::strcmp(consumer, "wgmma");
  if (!mma && std::strcmp(consumer, "spin")) {
    std::fprintf(stderr, "--consumer must be spin or wgmma, got %s\n", consumer);
    return 2;
  }
  if (mma && consume_ns) {
    std::fprintf(stderr, "--consume-ns is the spin consumer's\n");
    return 2;
  }
  uint16_t* w = nullptr;  // the wgmma consumer's B: [n_tiles * 192, H]
  const char* tile_name = arg_str(argc, argv, "--tile", "pingpong");
  const bool coop = !std::strcmp(tile_name, "coop");
  if ((!coop && std::strcmp(tile_name, "pingpong")) || (coop && !mma)) {
    std::fprintf(stderr, "--tile must be pingpong or coop (coop with --consumer wgmma), got %s\n", tile_name);
    return 2;
  }
  const int blk_n = coop ? kBlkN<true> : kBlkN<false>;
  float* sink;
  CK(cudaMalloc(&sink, 8));
  if (mma) {
    CK(cudaMalloc(&w, int64_t(n_tiles) * blk_n * H * 2));
    CK(cudaMemset(w, 0x3c, int64_t(n_tiles) * blk_n * H * 2));
  }
  // 2D tensormaps, 128-byte swizzle, boxes of 64 elements by `box_rows` rows (the driver's entry point through the
  // runtime: no -lcuda at link time)
  auto encode = [&](CUtensorMap* map, void* base, int64_t rows, int box_rows) {
    std::memset(map, 0, sizeof(*map));
    if (!base) return true;
    cuuint64_t dims[2] = {cuuint64_t(H), cuuint64_t(rows)}, strides[1] = {cuuint64_t(H) * 2};
    cuuint32_t box[2] = {64, cuuint32_t(box_rows)}, es[2] = {1, 1};
    using Encode = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
    CUresult r = reinterpret_cast<Encode>(fn)(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, dims, strides, box, es,
                                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                        CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) std::fprintf(stderr, "cuTensorMapEncodeTiled failed: %d\n", int(r));
    return r == CUDA_SUCCESS;
  };
  CUtensorMap map, map_b;
  if (!encode(&map, tma ? x : nullptr, R, kBlkM) || !encode(&map_b, w, int64_t(n_tiles) * blk_n, blk_n)) return 1;
  int sms;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  Args a{x, token, H, n_tiles, H / kBlkK, int(R / kBlkM) * n_tiles, gather ? 1 : 0, consume_ns, sink};
  const int stages = coop ? kStages<true> : kStages<false>;
  const size_t smem = stages * (kTileBytes + (mma ? blk_n * kBlkK * 2 : 0)) + 2 * stages * 8 + 1024;
  auto pick = [&](auto m, auto c) {
    constexpr bool kM = decltype(m)::value, kC = decltype(c)::value;
    return tma ? probe<true, 1, kM, kC> : warps == 1 ? probe<false, 1, kM, kC> : warps == 2 ? probe<false, 2, kM, kC>
                                                                                       : probe<false, 4, kM, kC>;
  };
  auto kern = coop ? pick(std::true_type{}, std::true_type{})
              : mma ? pick(std::true_type{}, std::false_type{}) : pick(std::false_type{}, std::false_type{});
  CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  kern<<<sms, kThreads, smem>>>(a, map, map_b);  // warm-up
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::vector<float> ms(reps);
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(e0));
    kern<<<sms, kThreads, smem>>>(a, map, map_b);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms[i], e0, e1));
  }
  std::sort(ms.begin(), ms.end());
  const float med = ms[reps / 2];
  const double stages_per_cta = double(a.tiles) * a.k_tiles / sms;
  const double bytes = double(a.tiles) * a.k_tiles * kTileBytes;
  const double tflops = mma ? 2.0 * kBlkM * blk_n * kBlkK * double(a.tiles) * a.k_tiles / (med * 1e-3) / 1e12 : 0;
  std::printf("mode=%s consumer=%s tile=%s warps=%d gather=%d T=%d H=%d K=%d n_tiles=%d consume_ns=%lld: %.3f ms, "
              "%.3f us/stage, %.0f GB/s of A, %.0f TFLOP/s\n",
              mode, consumer, tile_name, warps, a.gather, T, H, K, n_tiles, consume_ns, med,
              med * 1e3 / stages_per_cta, bytes / (med * 1e-3) / 1e9, tflops);
  return 0;
}

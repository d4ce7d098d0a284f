// The SwiGLU-backward epilogue of the d_a GEMM (GEMM kind MOK_GEMM_NN_SWIGLU_BWD) in the ping-pong tiles, with the
// forward's [p | q] loaded by the kernel's epilogue load warp. The math and bits of epilogue_swiglu_bwd.cuh and of
// the swiglu_bwd kernel: for group l with problem (M, N), da = the fp32 accumulator at (r, c), p = C_l[r, c] (the
// forward's u * silu'(g)), q = C_l[r, N + c] (silu(g)),
//   D_l[r, c] = bf16(da * p), D_l[r, N + c] = bf16(da * q).
// CUTLASS's ping-pong kernel runs an epilogue load warp (the producer warpgroup's third warp) when the epilogue says
// is_producer_load_needed(). That warp walks the same tiles as the consumer warpgroups, in the same order, and copies
// each tile's [p | q] with 16-byte cp.async into a ring of kStages sub-tiles in shared memory (64 rows x 32 columns
// of p and of q, 16 KiB a sub-tile). Each lane's copies arrive on the sub-tile's full barrier when they land
// (cp.async.mbarrier.arrive.noinc); the consumer warpgroup waits on it, stores its products and releases the
// sub-tile. So a tile's first sub-tiles are in shared memory before its mainloop ends (against the consumer
// warpgroup making the copies itself once its accumulators are done: the d_a step alone 0.6-9% faster, and no
// register spills). The products go back into the sub-tile once every thread has read it (dg and du in place of its
// p) and one thread stores them by TMA through the segment's ragged map (ragged_store_map.cuh), 4-7% faster than
// stores from registers, which hold their source registers until the memory system takes the data; that thread
// releases the sub-tile once the TMA unit has read it, one sub-tile later. Groups no ragged map covers store from
// registers. The copies carry an evict-first L2 policy: [p | q] is read once, and the GEMM's A and B tiles stay in
// L2 longer (L2 hit rate 52 -> 59% on Qwen3-30B-A3B's launch). Each output element still comes from one CTA's
// accumulator walking K in order: bitwise reproducible and batch invariant.
#pragma once
#include <cuda_bf16.h>

#include "cute/arch/copy_sm90_tma.hpp"
#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/cutlass.h"
#include "cutlass/pipeline/pipeline.hpp"
#include "epilogue_array_base.cuh"
#include "ragged_store_map.cuh"
#include "swiglu_math.cuh"

namespace mok {

// One segment's output, as the host knows it: row 0 of [dg | du] (bf16, row stride ld), N columns each of dg and du,
// and how many consecutive groups (from group `first`) the segment has.
struct SwigluBwdStoreTarget {
  cutlass::bfloat16_t* d = nullptr;
  int64_t ld = 0;
  int N = 0, first = 0, groups = 0;
};

template <class StrideCD_>  // pointer to the per-group row-major stride (ld, _1, _0)
class SwigluBwdLoadedEpilogueArray : public EpilogueArrayBase<StrideCD_, float, cutlass::bfloat16_t, const float> {
  using Base = EpilogueArrayBase<StrideCD_, float, cutlass::bfloat16_t, const float>;

 public:
  struct Arguments : Base::Arguments {
    SwigluBwdStoreTarget targets[kMaxStoreTargets];  // set by run_grouped for segments that are rows of one buffer
    int n_targets = 0;
  };
  struct Params : Base::Arguments {
    cute::TmaDescriptor map_g[kMaxStoreTargets], map_u[kMaxStoreTargets];  // ragged maps of dg and of du
    SwigluBwdStoreTarget targets[kMaxStoreTargets];
    int staged[kMaxStoreTargets];  // 1: the target's maps are built (else its tiles store from registers)
    int n_targets;
  };
  static constexpr int kSubM = 64, kSubN = 32;  // one sub-tile: 64 rows x 32 columns of p and of q (16 KiB)
  static constexpr int kStages = 4;             // sub-tiles in shared memory
  static constexpr int kProducerThreads = 32;   // the epilogue load warp (the kernel's producer_arv_count)
  static constexpr int kConsumerThreads = 128;  // one consumer warpgroup (the kernel's consumer_arv_count)

  // What CUTLASS's sm90 kernels ask of a collective epilogue (as Sm90TmaWarpSpecializedAdapter answers it), with a
  // cp.async load pipeline in place of the TMA one and no store pipeline.
  using LoadPipeline = cutlass::PipelineAsync<kStages>;
  using LoadPipelineState = cutlass::PipelineState<kStages>;
  static constexpr uint32_t TmaTransactionBytes = 0;
  static constexpr bool RequiresTransactionBytes = false;
  using StorePipeline = cutlass::PipelineTmaStore<0>;
  using StorePipelineState = cutlass::PipelineState<0>;
  // A used sub-tile's p (8 KiB) then holds the boxes of dg and du it gives (4 KiB each, 64-byte TMA swizzle, whose
  // pattern repeats every 512 bytes: hence the alignment).
  struct SharedStorage {
    alignas(1024) float p[kStages][kSubM * kSubN];
    alignas(1024) float q[kStages][kSubM * kSubN];
  };
  static constexpr int kBoxBytes = kSubM * kSubN * 2;  // one bf16 box of dg or du
  using TensorStorage = SharedStorage;
  struct TensorMapStorage {};
  using PipelineStorage = typename LoadPipeline::SharedStorage;

  // Sub-tiles a tile loads (the kernel advances each consumer warpgroup's load state by this for the other's tile).
  template <class CtaTileMNK>
  CUTLASS_HOST_DEVICE static constexpr int get_load_pipe_increment(CtaTileMNK) {
    return (cute::size<0>(CtaTileMNK{}) / kSubM) * (cute::size<1>(CtaTileMNK{}) / kSubN);
  }
  template <class CtaTileMNK>
  CUTLASS_HOST_DEVICE static constexpr int get_store_pipe_increment(CtaTileMNK) {
    return 1;
  }
  CUTLASS_DEVICE static void prefetch_tma_descriptors(Params const&) {}

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return ragged_store_params<Params, typename Base::Arguments>(
        args, [](Params& p, int t, SwigluBwdStoreTarget const& g) {
          return encode_ragged_store_map(p.map_g[t], g.d, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, g.ld, g.N, kSubM,
                                         kSubN, CU_TENSOR_MAP_SWIZZLE_64B) &&
                 encode_ragged_store_map(p.map_u[t], g.d + g.N, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, g.ld, g.N,
                                         kSubM, kSubN, CU_TENSOR_MAP_SWIZZLE_64B);
        });
  }

  CUTLASS_HOST_DEVICE explicit SwigluBwdLoadedEpilogueArray(Params const& params_) : params(params_) {}
  CUTLASS_HOST_DEVICE SwigluBwdLoadedEpilogueArray(Params const& params_, TensorStorage&) : params(params_) {}

  CUTLASS_DEVICE bool is_source_needed() { return true; }
  CUTLASS_DEVICE bool is_producer_load_needed() const { return true; }

  // Float offset of column c (0..31) of sub-tile row r: 16-byte chunks permuted within the row so that the 4 rows
  // a half-warp reads (float2 at columns 8j + 2(lane % 4)) fall in distinct banks.
  CUTLASS_DEVICE static int smem_at(int r, int c) { return r * kSubN + (((c >> 2) ^ ((r & 3) << 1)) << 2) + (c & 3); }

  CUTLASS_DEVICE auto load_init(Params const&, TensorMapStorage&, int32_t, int32_t) { return cute::make_tuple(nullptr); }

  // The epilogue load warp, once per tile in the consumers' order: the tile's sub-tiles, row block by row block.
  // Lane t copies chunk t % 8 (4 floats) of sub-tile rows t / 8 + 4 i, i < 16, of p and of q; rows past M and
  // columns past N are zero-filled without reading (cp.async with source size 0).
  template <class ProblemShapeMNKL, class TileShapeMNK, class TileCoordMNKL, class TiledMma, class TensorMapC>
  CUTLASS_DEVICE auto load(LoadPipeline load_pipeline, LoadPipelineState state, ProblemShapeMNKL problem_shape_mnkl,
                           TileShapeMNK, TileCoordMNKL tile_coord_mnkl, TiledMma, int lane, TensorStorage& ss,
                           TensorMapC const&, int = -1, bool = false) {
    using namespace cute;
    constexpr int kBlkM = size<0>(TileShapeMNK{}), kBlkN = size<1>(TileShapeMNK{});
    static_assert(kBlkM % kSubM == 0 && kBlkN % kSubN == 0, "sub-tiles split the tile");
    constexpr int kQ = kBlkN / kSubN, kSubtiles = (kBlkM / kSubM) * kQ;
    constexpr int kRowsPerPass = kProducerThreads / (kSubN / 4), kPasses = kSubM / kRowsPerPass;
    const int M = get<0>(problem_shape_mnkl), N = get<1>(problem_shape_mnkl);
    auto [m_coord, n_coord, k_coord, l_coord] = tile_coord_mnkl;
    const int64_t ldc = get<0>(params.dC[l_coord]);
    const int m0 = m_coord * kBlkM, n0 = n_coord * kBlkN;
    const int cp_row = lane / (kSubN / 4), cp_col = (lane % (kSubN / 4)) * 4;
    const float* __restrict__ src0 = params.ptr_C[l_coord] + (m0 + cp_row) * ldc + (n0 + cp_col);
    const uint32_t dst0 = static_cast<uint32_t>(__cvta_generic_to_shared(&ss.p[0][smem_at(cp_row, cp_col)]));
    constexpr uint32_t kQBytes = sizeof(ss.p), kStageBytes = sizeof(ss.p[0]);
    static_assert(kRowsPerPass % 4 == 0, "rows t / 8 + 4 i keep the chunk permutation of row t / 8");
    // [p | q] is read once: its lines go first from L2, so they do not push out the GEMM's A and B tiles.
    uint64_t evict_first;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(evict_first));
    CUTLASS_PRAGMA_NO_UNROLL
    for (int s = 0; s < kSubtiles; ++s) {
      const int dr = (s / kQ) * kSubM, dc = (s % kQ) * kSubN;
      const bool col_in = n0 + cp_col + dc < N;
      load_pipeline.producer_acquire(state);
      const uint32_t dst_s = dst0 + state.index() * kStageBytes;
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < kPasses; ++i) {
        const int r = dr + cp_row + i * kRowsPerPass;
        const bool in = col_in && m0 + r < M;
        const float* src = in ? src0 + (r - cp_row) * ldc + dc : src0;
        const uint32_t bytes = in ? 16 : 0;
        const uint32_t dst = dst_s + (i * kRowsPerPass * kSubN) * static_cast<uint32_t>(sizeof(float));
        asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;" ::"r"(dst), "l"(src),
                     "r"(bytes), "l"(evict_first) : "memory");
        asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;" ::"r"(dst + kQBytes),
                     "l"(in ? src + N : src), "r"(bytes), "l"(evict_first) : "memory");
      }
      cutlass::arch::cpasync_barrier_arrive_noinc(load_pipeline.producer_get_barrier(state));
      ++state;
    }
    return state;
  }

  // The load warp's last step: every sub-tile it filled has been used (so no copy is in flight at exit).
  CUTLASS_DEVICE auto load_tail(LoadPipeline load_pipeline, LoadPipelineState state) {
    load_pipeline.producer_tail(state);
    return state;
  }

  CUTLASS_DEVICE auto store_init(Params const&, TensorMapStorage&, int32_t, int32_t, int32_t) {
    return cute::make_tuple(nullptr);
  }

  // A consumer warpgroup's epilogue: wait for each sub-tile, store its products, release it.
  template <class ProblemShapeMNKL, class TileShapeMNK, class TileCoordMNKL, class AccEngine, class AccLayout,
            class TiledMma, class TensorMapD>
  CUTLASS_DEVICE auto store(LoadPipeline load_pipeline, LoadPipelineState state, StorePipeline,
                            StorePipelineState store_state, ProblemShapeMNKL problem_shape_mnkl, TileShapeMNK,
                            TileCoordMNKL tile_coord_mnkl, cute::Tensor<AccEngine, AccLayout> accumulators, TiledMma,
                            int thread_idx, TensorStorage& ss, TensorMapD const&, int = -1) {
    using namespace cute;
    using FrgLayout = AccLayout;
    constexpr int kBlkM = size<0>(TileShapeMNK{}), kBlkN = size<1>(TileShapeMNK{});
    constexpr int kThreads = size(TiledMma{});
    // One warpgroup owns the whole tile (ping-pong): its fragment is ((2 columns, 2 row halves, BLK_N / 8 column
    // blocks), BLK_M / 64, 1), and sub-tile (m, q) holds column blocks 4q .. 4q + 3 of row block m.
    static_assert(kThreads == kConsumerThreads, "the loaded epilogue runs in tiles one warpgroup owns (ping-pong)");
    static_assert(is_static<FrgLayout>::value && rank(FrgLayout{}) == 3 && size<2>(FrgLayout{}) == 1,
                  "one MMA along N covers the tile");
    static_assert(size<0, 0>(FrgLayout{}) == 2 && size<0, 1>(FrgLayout{}) == 2 &&
                  size<0, 2>(FrgLayout{}) == kBlkN / 8 && size<1>(FrgLayout{}) * kSubM == kBlkM,
                  "wgmma accumulator fragment ((2, 2, BLK_N / 8), BLK_M / 64, 1)");
    constexpr int kQ = kBlkN / kSubN, kSubtiles = (kBlkM / kSubM) * kQ;
    const int M = get<0>(problem_shape_mnkl), N = get<1>(problem_shape_mnkl);
    auto [m_coord, n_coord, k_coord, l_coord] = tile_coord_mnkl;
    const int64_t ldd = get<0>(params.dD[l_coord]);
    const int m0 = m_coord * kBlkM, n0 = n_coord * kBlkN;
    // Reads: thread t holds rows 16 (t / 32) + (t % 32) / 4 (+ 8) and columns 8b + 2 (t % 4) (+ 1) of each
    // 64-row block (the wgmma accumulator layout; tCcD in epilogue_swiglu_bwd.cuh gives the same coordinates).
    const int lane = thread_idx % 32, rd_row = (thread_idx / 32) * 16 + lane / 4, rd_col = 2 * (lane % 4);
    __nv_bfloat16* __restrict__ out0 = reinterpret_cast<__nv_bfloat16*>(params.ptr_D[l_coord]) +
                                       (m0 + rd_row) * ldd + (n0 + rd_col);
    // Staged: the group is rows [row_s, row_s + M) of a target with ragged maps; else stores from registers.
    const int t = ragged_target_of(params.targets, params.n_targets, l_coord);
    int64_t row_s = -1;
    if (t >= 0 && params.staged[t] && ldd == params.targets[t].ld && N == params.targets[t].N)
      row_s = ragged_first_row(params.ptr_D[l_coord], params.targets[t].d, ldd, M);
    const uint32_t bar = cutlass::canonical_warp_group_idx();  // a named barrier of this warpgroup's own
    const bool issuer = thread_idx == 0;
    LoadPipelineState held = state;  // the issuer's sub-tile whose boxes the TMA unit may still be reading
    CUTLASS_PRAGMA_UNROLL
    for (int s = 0; s < kSubtiles; ++s) {
      load_pipeline.consumer_wait(state);
      const int st = state.index(), mb = s / kQ, q = s % kQ;
      // The math runs on every pair (rows past M and columns past N hold zeros and are not stored), so only the
      // stores are predicated and the compiler can overlap the pairs' chains.
      __nv_bfloat162 dg[2][kSubN / 8], du[2][kSubN / 8];
      CUTLASS_PRAGMA_UNROLL
      for (int half = 0; half < 2; ++half) {
        CUTLASS_PRAGMA_UNROLL
        for (int b = 0; b < kSubN / 8; ++b) {
          auto i0 = make_coord(make_coord(0, half, q * (kSubN / 8) + b), mb, 0);
          auto i1 = make_coord(make_coord(1, half, q * (kSubN / 8) + b), mb, 0);
          const int at = smem_at(rd_row + 8 * half, 8 * b + rd_col);
          const float2 pv = *reinterpret_cast<const float2*>(&ss.p[st][at]);
          const float2 qv = *reinterpret_cast<const float2*>(&ss.q[st][at]);
          swiglu_bwd_one(accumulators(i0), pv.x, qv.x, dg[half][b].x, du[half][b].x);
          swiglu_bwd_one(accumulators(i1), pv.y, qv.y, dg[half][b].y, du[half][b].y);
        }
      }
      if (row_s < 0) {
        CUTLASS_PRAGMA_UNROLL
        for (int half = 0; half < 2; ++half) {
          const bool row_in = m0 + mb * kSubM + rd_row + 8 * half < M;
          CUTLASS_PRAGMA_UNROLL
          for (int b = 0; b < kSubN / 8; ++b) {
            if (row_in && n0 + q * kSubN + 8 * b + rd_col < N) {  // N is a multiple of 8: the pair is in or out
              __nv_bfloat16* out = out0 + (mb * kSubM + 8 * half) * ldd + (q * kSubN + 8 * b);
              *reinterpret_cast<__nv_bfloat162*>(out) = dg[half][b];
              *reinterpret_cast<__nv_bfloat162*>(out + N) = du[half][b];
            }
          }
        }
        load_pipeline.consumer_release(state);
      } else {
        // Once every thread has read the sub-tile's p and q, its p holds the dg and du boxes.
        cutlass::arch::NamedBarrier::sync(kConsumerThreads, bar);
        char* box = reinterpret_cast<char*>(ss.p[st]);
        CUTLASS_PRAGMA_UNROLL
        for (int half = 0; half < 2; ++half) {
          CUTLASS_PRAGMA_UNROLL
          for (int b = 0; b < kSubN / 8; ++b) {
            // 64-byte rows, 64-byte swizzle: 16-byte chunk bits [4, 5] ^= bits [7, 8] of the offset
            const int o = (rd_row + 8 * half) * (kSubN * 2) + (8 * b + rd_col) * 2;
            const int sw = o ^ (((o >> 7) & 3) << 4);
            *reinterpret_cast<__nv_bfloat162*>(box + sw) = dg[half][b];
            *reinterpret_cast<__nv_bfloat162*>(box + kBoxBytes + sw) = du[half][b];
          }
        }
        cutlass::arch::fence_view_async_shared();  // the writes, seen by the TMA unit
        cutlass::arch::NamedBarrier::sync(kConsumerThreads, bar);
        if (issuer) {
          const int r0 = m0 + mb * kSubM;  // the box's first row in the group
          if (r0 < M) {
            SM90_TMA_STORE_3D::copy(&params.map_g[t], box, n0 + q * kSubN, ragged_y(M, r0), ragged_z(row_s, M));
            SM90_TMA_STORE_3D::copy(&params.map_u[t], box + kBoxBytes, n0 + q * kSubN, ragged_y(M, r0),
                                    ragged_z(row_s, M));
          }
          cute::tma_store_arrive();
          // The sub-tile before has been read by the TMA unit: the load warp may refill it. (The issuer's arrival
          // is one of the kConsumerThreads each release waits for.)
          cute::tma_store_wait<1>();
          if (s > 0) load_pipeline.consumer_release(held);
          held = state;
        } else {
          load_pipeline.consumer_release(state);
        }
      }
      ++state;
    }
    if (row_s >= 0 && issuer) {
      cute::tma_store_wait<0>();
      load_pipeline.consumer_release(held);
    }
    return cute::make_tuple(state, store_state);
  }

  CUTLASS_DEVICE auto store_tail(LoadPipeline, LoadPipelineState state, StorePipeline, StorePipelineState store_state) {
    return cute::make_tuple(state, store_state);
  }

  // No tensor maps: the copies address memory through the per-group pointers.
  template <bool IsLoad, class ProblemShapeMNKL>
  CUTLASS_DEVICE void tensormaps_perform_update(TensorMapStorage&, Params const&, cute::TmaDescriptor const*,
                                                ProblemShapeMNKL, int32_t, int32_t) {}
  template <bool IsLoad>
  CUTLASS_DEVICE void tensormaps_cp_fence_release(TensorMapStorage&, cute::TmaDescriptor const*, int32_t) {}
  template <bool IsLoad>
  CUTLASS_DEVICE void tensormaps_fence_acquire(cute::TmaDescriptor const*) {}

 private:
  Params const& params;  // the kernel's: TMA reads the store maps from parameter space
};

}  // namespace mok

// The fused gate/up + SwiGLU epilogue of the ping-pong tiles, with its outputs staged in shared memory and written by
// TMA stores (the cooperative tiles keep epilogue_swiglu_fwd.cuh, which stores column pairs from registers; the same
// values and bits). A consumer warpgroup takes its 128-row tile in sub-tiles of 64 rows x 16 intermediate columns:
// each thread writes its p, q (fp32) and a (bf16) of the sub-tile into one of two staging buffers, and one thread
// stores the three boxes with cp.async.bulk.tensor, so the warps go on to the next sub-tile while the TMA unit writes.
// Each output of a segment has one ragged map (ragged_store_map.cuh), so no map is rewritten when a tile is in
// another group. Tiles that do not fit one (a segment whose groups are not rows of one buffer, rows not 16-byte
// aligned, kRaggedRows rows or more) take swiglu_fwd_store_pairs, the register stores.
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>

#include "cute/arch/copy_sm90_tma.hpp"
#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/detail.hpp"
#include "epilogue_array_base.cuh"
#include "epilogue_swiglu_fwd.cuh"
#include "ragged_store_map.cuh"
#include "swiglu_math.cuh"

namespace mok {

constexpr int kStagedRows = 64, kStagedCols = 16;  // a staged sub-tile: one 64-row MMA block, two 8-column blocks

// One segment's outputs, as the host knows them: row 0 of [p | q] (fp32, row stride ld_pq) and of a (bf16, ld_a),
// I columns each of p, q and a, and how many consecutive groups (from group `first`) the segment has.
struct SwigluFwdStoreTarget {
  float* pq = nullptr;
  cutlass::bfloat16_t* a = nullptr;
  int64_t ld_pq = 0, ld_a = 0;
  int I = 0, first = 0, groups = 0;
};

template <class StrideCD_>  // pointer to the per-group row-major stride (ld, _1, _0)
class SwigluFwdStagedEpilogueArray : public EpilogueArrayBase<StrideCD_, cutlass::bfloat16_t, float> {
  using Base = EpilogueArrayBase<StrideCD_, cutlass::bfloat16_t, float>;

 public:
  struct Arguments : Base::Arguments {
    SwigluFwdStoreTarget targets[kMaxStoreTargets];
    int n_targets = 0;
  };
  struct Params : Base::Arguments {
    cute::TmaDescriptor map_p[kMaxStoreTargets], map_q[kMaxStoreTargets], map_a[kMaxStoreTargets];
    SwigluFwdStoreTarget targets[kMaxStoreTargets];
    int staged[kMaxStoreTargets];  // 1: the target's maps are built (else its tiles store from registers)
    int n_targets;
  };
  // Two staging buffers of a sub-tile each, aligned for the TMA's 64- and 32-byte swizzles.
  struct SharedStorage {
    alignas(1024) float p[2][kStagedRows * kStagedCols];
    alignas(1024) float q[2][kStagedRows * kStagedCols];
    alignas(1024) __nv_bfloat16 a[2][kStagedRows * kStagedCols];
  };

  template <class ProblemShape>
  static Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    // (a null or misaligned row 0, q's included, fails the encoding: those tiles store from registers)
    return ragged_store_params<Params, typename Base::Arguments>(
        args, [](Params& p, int t, SwigluFwdStoreTarget const& g) {
          return encode_ragged_store_map(p.map_p[t], g.pq, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, g.ld_pq, g.I,
                                         kStagedRows, kStagedCols, CU_TENSOR_MAP_SWIZZLE_64B) &&
                 encode_ragged_store_map(p.map_q[t], g.pq + g.I, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, g.ld_pq, g.I,
                                         kStagedRows, kStagedCols, CU_TENSOR_MAP_SWIZZLE_64B) &&
                 encode_ragged_store_map(p.map_a[t], g.a, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, g.ld_a, g.I,
                                         kStagedRows, kStagedCols, CU_TENSOR_MAP_SWIZZLE_32B);
        });
  }

  CUTLASS_HOST_DEVICE explicit SwigluFwdStagedEpilogueArray(Params const& params_) : params(params_) {}

  CUTLASS_DEVICE bool is_source_needed() { return false; }

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
            class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_MNK,
                                 BlockCoordMNKL blk_coord_mnkl, cute::Tensor<FrgEngine, FrgLayout> const& accumulators,
                                 TiledMma tiled_mma, ResidueMNK, int thread_idx, char* smem) {
    using namespace cute;
    constexpr int kBlkN = size<1>(BlockShapeMNK{});
    constexpr int kPairs = kBlkN / 16;  // 8-column blocks per half tile
    static_assert(kPairs % 2 == 0, "sub-tiles of two 8-column blocks");
    static_assert(size<0, 0>(FrgLayout{}) == 2 && size<0, 1>(FrgLayout{}) == 2 && size<0, 2>(FrgLayout{}) == kBlkN / 8 &&
                  size<2>(FrgLayout{}) == 1, "wgmma accumulator fragment ((2, 2, BLK_N / 8), M, 1)");
    static_assert(size<0>(BlockShapeMNK{}) == kStagedRows * size<1>(FrgLayout{}), "one 64-row MMA block a sub-tile");
    const int M = get<0>(problem_shape_mnkl), I = get<1>(problem_shape_mnkl) / 2;
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord_mnkl;
    float* pq = params.ptr_D[l_coord];
    __nv_bfloat16* a = reinterpret_cast<__nv_bfloat16*>(params.ptr_C[l_coord]);
    const int64_t ldd = get<0>(params.dD[l_coord]), ldc = get<0>(params.dC[l_coord]);
    // Which target holds group l, and the group's first row s in it.
    const int t = ragged_target_of(params.targets, params.n_targets, l_coord);
    int64_t s = -1;
    if (t >= 0 && params.staged[t] && ldd == params.targets[t].ld_pq && ldc == params.targets[t].ld_a &&
        I == params.targets[t].I) {
      s = ragged_first_row(pq, static_cast<const float*>(params.targets[t].pq), ldd, M);
      if (a - reinterpret_cast<const __nv_bfloat16*>(params.targets[t].a) != s * ldc) s = -1;
    }
    if (s < 0) {
      swiglu_fwd_store_pairs(problem_shape_mnkl, blk_shape_MNK, blk_coord_mnkl, accumulators, tiled_mma, thread_idx,
                             pq, a, ldd, ldc);
      return;
    }
    SharedStorage& st = *reinterpret_cast<SharedStorage*>(smem);
    Tensor cD = local_tile(make_identity_tensor(make_shape(M, get<1>(problem_shape_mnkl))),
                           take<0, 2>(blk_shape_MNK), make_coord(m_coord, n_coord));
    Tensor tCcD = tiled_mma.get_thread_slice(thread_idx).partition_C(cD);
    const uint32_t bar = cutlass::canonical_warp_group_idx();  // a named barrier of this warpgroup's own
    const bool issuer = thread_idx == 0;
    const int lane_t = thread_idx % 4;
    int buf = 0;
    CUTLASS_PRAGMA_UNROLL
    for (int m = 0; m < size<1>(FrgLayout{}); ++m) {
      const int row0 = m_coord * size<0>(BlockShapeMNK{}) + m * kStagedRows;
      if (row0 >= M) continue;  // the same for the whole warpgroup
      CUTLASS_PRAGMA_UNROLL
      for (int c = 0; c < kPairs / 2; ++c) {
        const int j0 = n_coord * (kBlkN / 2) + c * kStagedCols;
        if (j0 >= I) continue;
        if (issuer) cute::tma_store_wait<1>();  // buffer buf's last stores have read it
        cutlass::arch::NamedBarrier::sync(128, bar);
        char* sp = reinterpret_cast<char*>(st.p[buf]);
        char* sq = reinterpret_cast<char*>(st.q[buf]);
        char* sa = reinterpret_cast<char*>(st.a[buf]);
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < 2; ++i) {
          CUTLASS_PRAGMA_UNROLL
          for (int half = 0; half < 2; ++half) {
            const int b = 2 * c + i;
            auto ig = make_coord(make_coord(0, half, b), m, 0);
            auto ig1 = make_coord(make_coord(1, half, b), m, 0);
            auto iu = make_coord(make_coord(0, half, b + kPairs), m, 0);
            auto iu1 = make_coord(make_coord(1, half, b + kPairs), m, 0);
            float2 p, q;
            const float a0 = swiglu_fwd_one(accumulators(ig), accumulators(iu), p.x, q.x);
            const float a1 = swiglu_fwd_one(accumulators(ig1), accumulators(iu1), p.y, q.y);
            const int lr = get<0>(tCcD(ig)) - row0;  // row in the sub-tile
            const int lc = 8 * i + 2 * lane_t;       // column in the sub-tile
            // 64-byte rows, 64-byte swizzle: 16-byte chunk bits [4, 5] ^= bits [7, 8] of the offset
            const int o4 = lr * 64 + lc * 4;
            const int s4 = o4 ^ (((o4 >> 7) & 3) << 4);
            *reinterpret_cast<float2*>(sp + s4) = p;
            *reinterpret_cast<float2*>(sq + s4) = q;
            // 32-byte rows, 32-byte swizzle: bit 4 ^= bit 7
            const int o2 = lr * 32 + lc * 2;
            const int s2 = o2 ^ (((o2 >> 7) & 1) << 4);
            *reinterpret_cast<__nv_bfloat162*>(sa + s2) = __floats2bfloat162_rn(a0, a1);
          }
        }
        cutlass::arch::fence_view_async_shared();  // the writes, seen by the TMA unit
        cutlass::arch::NamedBarrier::sync(128, bar);
        if (issuer) {
          const int y = ragged_y(M, row0), z = ragged_z(s, M);
          SM90_TMA_STORE_3D::copy(&params.map_p[t], sp, j0, y, z);
          SM90_TMA_STORE_3D::copy(&params.map_q[t], sq, j0, y, z);
          SM90_TMA_STORE_3D::copy(&params.map_a[t], sa, j0, y, z);
          cute::tma_store_arrive();
        }
        buf ^= 1;
      }
    }
    // The next epilogue (this warpgroup's or the other's, after the kernel's order barrier) reuses the buffers.
    if (issuer) cute::tma_store_wait<0>();
  }

 private:
  Params const& params;
};

// Sm90TmaWarpSpecializedAdapter with no tensor-map storage: its own would be a second SharedStorage (the staging
// buffers), and this epilogue keeps its maps in the kernel's parameters.
template <class EpilogueOp>
class StagedAdapter : public cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<EpilogueOp> {
  using Adapter = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<EpilogueOp>;

 public:
  using TensorMapStorage = cute::tuple<>;
  using Adapter::Adapter;

  CUTLASS_DEVICE auto load_init(typename EpilogueOp::Params const&, TensorMapStorage&, int32_t, int32_t) {
    return cute::make_tuple(nullptr);
  }
  CUTLASS_DEVICE auto store_init(typename EpilogueOp::Params const&, TensorMapStorage&, int32_t, int32_t, int32_t) {
    return cute::make_tuple(nullptr);
  }
  template <bool IsLoad, class ProblemShapeMNKL>
  CUTLASS_DEVICE void tensormaps_perform_update(TensorMapStorage&, typename EpilogueOp::Params const&,
                                                cute::TmaDescriptor const*, ProblemShapeMNKL, int32_t, int32_t) {}
  template <bool IsLoad>
  CUTLASS_DEVICE void tensormaps_cp_fence_release(TensorMapStorage&, cute::TmaDescriptor const*, int32_t) {}
};

}  // namespace mok

// Mainloop of the d_x GEMM (GEMM kind MOK_GEMM_NN_BF16): CUTLASS's sm90 ptr-array TMA mainloop (the collective the
// builder picks, `Base`), except that B [K, N] (N-major) may be two tensors: K rows [0, K/2) at the group's b (the
// gate weights) and [K/2, K) at its b_up (the up weights), so that [dg | du] · [W_gate; W_up] needs no concatenated
// copy of the weights. B's tensormap is rank 3, (N, K/2, 2 halves), the halves |up - gate| elements apart from
// whichever comes first in memory (TMA strides are unsigned), and K tile k reads half k / (K/2 / BLK_K). Each
// accumulator is still one CTA walking K in order: the same bits as the GEMM against the concatenation. K/2 must be
// a multiple of BLK_K (the C side checks; the caller concatenates otherwise). Without b_up (null) B is the one
// [K, N] tensor, read as half 0 with K rows. TMA multicast across a cluster as in CUTLASS.
#pragma once
#include <climits>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/collective/collective_builder.hpp"

#include "mainloop_tensormaps.cuh"

namespace mok {

template <class Base>
struct KHalvesMainloop : Base {
  using TileShape = typename Base::TileShape;
  using DispatchPolicy = typename Base::DispatchPolicy;
  using InternalElementA = typename Base::InternalElementA;
  using InternalElementB = typename Base::InternalElementB;
  using InternalStrideB = typename Base::InternalStrideB;
  using SmemLayoutA = typename Base::SmemLayoutA;
  using SmemLayoutB = typename Base::SmemLayoutB;
  using GmemTiledCopyA = typename Base::GmemTiledCopyA;
  using GmemTiledCopyB = typename Base::GmemTiledCopyB;
  using TensorStorage = typename Base::TensorStorage;
  using TensorMapStorage = typename Base::TensorMapStorage;
  using MainloopPipeline = typename Base::MainloopPipeline;
  using PipelineState = typename Base::PipelineState;
  using ClusterShape = typename DispatchPolicy::ClusterShape;

  static constexpr int kBlkK = cute::size<2>(TileShape{});
  static_assert(cute::is_static<cute::remove_cvref_t<decltype(cute::get<0>(InternalStrideB{}))>>::value,
                "B is N-major (its N mode has the static unit stride)");

  // B as (N, K rows of a half, half): unit N stride, then ld, then the distance between the halves (elements).
  using StrideBHalves = cute::Stride<cute::Int<1>, int64_t, int64_t>;
  using TMA_BK = decltype(cute::make_tma_copy(
      GmemTiledCopyB{},
      cute::make_tensor(static_cast<InternalElementB const*>(nullptr),
                        cute::make_layout(cute::make_shape(int32_t(0), int32_t(0), int32_t(0)), StrideBHalves{})),
      SmemLayoutB{}(cute::_, cute::_, cute::Int<0>{}),
      cute::make_shape(cute::shape<1>(TileShape{}), cute::shape<2>(TileShape{})),
      cute::size<0>(ClusterShape{})));

  // CUTLASS's arguments, and each group's second half of B's K rows (null: B is one tensor).
  struct Arguments : Base::Arguments {
    typename Base::ElementB const** ptr_B_up;
  };

  struct Params : Base::Params {
    TMA_BK tma_load_bk;
    InternalElementB const** ptr_B_up;
  };

  // Set with the current group's tensormap: which tensormap half holds K rows [0, K/2) (0: b is first in memory),
  // and the K tiles in a half (INT_MAX when B is one tensor).
  int first_half_ = 0;
  int half_k_tiles_ = INT_MAX;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape problem_shapes, Arguments const& args,
                                                  void* workspace) {
    static_assert(Base::IsGroupedGemmKernel, "grouped GEMMs only: B's shape and strides are set per group");
    typename Base::Params base = Base::to_underlying_arguments(problem_shapes, args, workspace);
    // As CUTLASS does for B: a placeholder address and shape, replaced on the device before the first load.
    auto ptr_b = reinterpret_cast<InternalElementB const*>(reinterpret_cast<uint64_t>(args.ptr_B) &
                                                           0xFFFFFFFFFFFFFFF0);
    cute::Tensor tensor_b = cute::make_tensor(
        ptr_b, cute::make_layout(cute::make_shape(int32_t(1), int32_t(1), int32_t(1)),
                                 StrideBHalves{cute::Int<1>{}, int64_t(8), int64_t(8)}));  // 16-byte strides
    TMA_BK tma_bk = cute::make_tma_copy(GmemTiledCopyB{}, tensor_b, SmemLayoutB{}(cute::_, cute::_, cute::Int<0>{}),
                                        cute::make_shape(cute::shape<1>(TileShape{}), cute::shape<2>(TileShape{})),
                                        cute::size<0>(ClusterShape{}));
    return Params{base, tma_bk, reinterpret_cast<InternalElementB const**>(args.ptr_B_up)};
  }

  // (gA_mkl, gB_nkl) with B's halves as its last mode: (BLK_N, BLK_K, n, k, half). The TMA coordinates do not depend
  // on the extents, so this group's shape serves every group (as in CUTLASS).
  template <class ProblemShape_MNKL>
  CUTLASS_DEVICE auto load_init(ProblemShape_MNKL const& problem_shape_MNKL, Params const& p) const {
    using X = cute::Underscore;
    auto [M, N, K, L] = problem_shape_MNKL;
    cute::Tensor mA_mkl = p.tma_load_a.get_tma_tensor(cute::make_shape(M, K, int32_t(1)));
    cute::Tensor mB_nkl = p.tma_load_bk.get_tma_tensor(cute::make_shape(N, K, int32_t(2)));
    cute::Tensor gA_mkl = cute::local_tile(mA_mkl, TileShape{}, cute::make_coord(cute::_, cute::_, cute::_),
                                           cute::Step<cute::_1, X, cute::_1>{});
    cute::Tensor gB_nkl = cute::local_tile(mB_nkl, TileShape{}, cute::make_coord(cute::_, cute::_, cute::_),
                                           cute::Step<X, cute::_1, cute::_1>{});
    return cute::make_tuple(gA_mkl, gB_nkl);
  }

  // Producer: CUTLASS's loads, with K tile k of B from the first half's tile k or the second half's tile
  // k - half_k_tiles_.
  template <class TensorA, class TensorB, class TensorMapA, class TensorMapB, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& p, MainloopPipeline pipeline, PipelineState smem_pipe_write,
                           cute::tuple<TensorA, TensorB> const& load_inputs,
                           cute::tuple<TensorMapA, TensorMapB> const& input_tensormaps, BlockCoord const& blk_coord,
                           KTileIterator k_tile_iter, int k_tile_count, int, uint32_t block_rank_in_cluster,
                           TensorStorage& shared_tensors) {
    using namespace cute;
    if (!cute::elect_one_sync()) return;
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), SmemLayoutA{});  // (BLK_M, BLK_K, PIPE)
    Tensor sB = make_tensor(make_smem_ptr(shared_tensors.smem_B.data()), SmemLayoutB{});  // (BLK_N, BLK_K, PIPE)
    constexpr uint32_t cluster_shape_x = get<0>(ClusterShape{});
    uint2 cluster_local_block_id = {block_rank_in_cluster % cluster_shape_x, block_rank_in_cluster / cluster_shape_x};
    auto block_tma_a = p.tma_load_a.get_slice(cluster_local_block_id.y);
    auto block_tma_b = p.tma_load_bk.get_slice(cluster_local_block_id.x);
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord;
    Tensor tAgA = block_tma_a.partition_S(get<0>(load_inputs)(_, _, m_coord, _, l_coord));  // (TMA, TMA_M, TMA_K, k)
    Tensor tAsA = block_tma_a.partition_D(sA);
    Tensor tBgB0 = block_tma_b.partition_S(get<1>(load_inputs)(_, _, n_coord, _, first_half_));  // K rows [0, K/2)
    Tensor tBgB1 = block_tma_b.partition_S(get<1>(load_inputs)(_, _, n_coord, _, 1 - first_half_));  // [K/2, K)
    Tensor tBsB = block_tma_b.partition_D(sB);
    uint16_t mcast_mask_a = 0, mcast_mask_b = 0;
    if constexpr (cute::is_same_v<GmemTiledCopyA, SM90_TMA_LOAD_MULTICAST>) {
      auto block_layout = Layout<ClusterShape>{};  // (m, n) -> block id
      for (int n = 0; n < size<1>(block_layout); ++n)
        mcast_mask_a |= (uint16_t(1) << block_layout(cluster_local_block_id.x, n, Int<0>{}));
    }
    if constexpr (cute::is_same_v<GmemTiledCopyB, SM90_TMA_LOAD_MULTICAST>) {
      auto block_layout = Layout<ClusterShape>{};
      for (int m = 0; m < size<0>(block_layout); ++m)
        mcast_mask_b |= (uint16_t(1) << block_layout(m, cluster_local_block_id.y, Int<0>{}));
    }
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count) {
      pipeline.producer_acquire(smem_pipe_write);
      auto* tma_barrier = pipeline.producer_get_barrier(smem_pipe_write);
      const int stage = smem_pipe_write.index();
      const int k = *k_tile_iter;
      copy(p.tma_load_a.with(get<0>(input_tensormaps), *tma_barrier, mcast_mask_a), tAgA(_, _, _, k),
           tAsA(_, _, _, stage));
      if (k < half_k_tiles_)
        copy(p.tma_load_bk.with(get<1>(input_tensormaps), *tma_barrier, mcast_mask_b), tBgB0(_, _, _, k),
             tBsB(_, _, _, stage));
      else
        copy(p.tma_load_bk.with(get<1>(input_tensormaps), *tma_barrier, mcast_mask_b),
             tBgB1(_, _, _, k - half_k_tiles_), tBsB(_, _, _, stage));
      ++k_tile_iter;
      ++smem_pipe_write;
    }
  }

  // The per-SM tensormaps start from the rank-3 TMA of B (and CUTLASS's TMA of A).
  CUTLASS_DEVICE auto tensormaps_init(Params const& p, TensorMapStorage& shared_tensormaps, int32_t sm_count,
                                      int32_t sm_idx) {
    return tensormaps_init_ab(p.tma_load_a, p.tma_load_bk, p.tensormaps, shared_tensormaps, sm_count, sm_idx);
  }

  // A new group: its addresses, shapes and strides into the tensormaps. With b_up, B's base is whichever half comes
  // first in memory, its K extent K/2 and its third mode the distance to the other half; without, B is [K, N].
  template <class TensorMapA, class TensorMapB, class ProblemShape_MNKL>
  CUTLASS_DEVICE void tensormaps_perform_update(TensorMapStorage& shared_tensormaps, Params const& p,
                                                cute::tuple<TensorMapA, TensorMapB> const&,
                                                ProblemShape_MNKL problem_shape_mnkl, int32_t next_batch) {
    using namespace cute;
    const uint32_t M = get<0>(problem_shape_mnkl), N = get<1>(problem_shape_mnkl), K = get<2>(problem_shape_mnkl);
    InternalElementB const* lo = p.ptr_B[next_batch];
    InternalElementB const* hi = p.ptr_B_up[next_batch];
    const bool split = hi != nullptr;
    first_half_ = split && hi < lo ? 1 : 0;
    half_k_tiles_ = split ? static_cast<int>(K / 2) / kBlkK : INT_MAX;
    if (cute::elect_one_sync()) {
      InternalElementB const* base = first_half_ ? hi : lo;
      const int64_t apart = !split ? int64_t(8) : first_half_ ? lo - hi : hi - lo;  // unused (half 0 only) unsplit
      tensormaps_replace_addr_ab(shared_tensormaps, p.ptr_A[next_batch], base);
      Tensor tensor_a = make_tensor(static_cast<InternalElementA const*>(nullptr), make_shape(M, K, Int<1>{}),
                                    p.dA[next_batch]);
      Tensor tensor_b = make_tensor(
          static_cast<InternalElementB const*>(nullptr),
          make_layout(make_shape(int32_t(N), int32_t(split ? K / 2 : K), int32_t(split ? 2 : 1)),
                      StrideBHalves{Int<1>{}, get<1>(p.dB[next_batch]), apart}));
      tensormaps_replace_dims_ab<InternalElementA, InternalElementB>(shared_tensormaps, p.tma_load_a, tensor_a,
                                                                     p.tma_load_bk, tensor_b);
    }
  }
};

}  // namespace mok

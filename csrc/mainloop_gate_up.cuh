// Mainloop of the fused gate/up + SwiGLU GEMM (GEMM kind MOK_GEMM_TN_SWIGLU_FWD): CUTLASS's sm90 ptr-array TMA
// mainloop (the collective the builder picks, `Base`), except that the B tile of an output tile n is loaded as two
// half tiles: rows [n*h, n*h + h) of the group's gate rows and the same rows of its up rows, h = half the tile's N.
// Columns [0, h) of every output tile are then gate pre-activations and columns [h, 2h) the up pre-activations of
// the same h intermediate columns, so the epilogue (epilogue_swiglu_fwd.cuh) finds g and u of an element in one
// thread's registers. Gate and up rows ([N/2, K] each) may be the halves of one [N, K] tensor or two tensors: B's
// tensormap is rank 3, (N/2 rows, K, 2 halves), the halves |up - gate| elements apart (from whichever comes first
// in memory). Only which B rows land in which shared-memory rows changes: each accumulator is still one CTA walking
// K in order (the same bits as the plain GEMM of the same B rows). N / 2 need not be a multiple of h: the last
// tile's halves then run past row N/2 (TMA fills those with zeros); the epilogue stores none of those columns.
// K-major B. In a cluster of C x 1 CTAs (C = 1 or 2; the CTAs of a cluster compute the same column tile of C
// adjacent row tiles of one group, as CUTLASS's group scheduler assigns them) B is shared by TMA multicast as
// CUTLASS does it: each CTA loads its 1/C of each half tile's rows into every CTA of the cluster, and each CTA's stage
// barrier expects the whole tile. Which CTA loads which rows changes nothing in any accumulator.
#pragma once
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/gemm/collective/collective_builder.hpp"

#include "mainloop_tensormaps.cuh"

namespace mok {

template <class Base>
struct GateUpPairMainloop : Base {
  using TileShape = typename Base::TileShape;
  using InternalElementB = typename Base::InternalElementB;
  using InternalStrideB = typename Base::InternalStrideB;
  using SmemLayoutAtomB = typename Base::SmemLayoutAtomB;
  using SmemLayoutB = typename Base::SmemLayoutB;
  using GmemTiledCopyB = typename Base::GmemTiledCopyB;
  using TensorStorage = typename Base::TensorStorage;
  using TensorMapStorage = typename Base::TensorMapStorage;
  using MainloopPipeline = typename Base::MainloopPipeline;
  using PipelineState = typename Base::PipelineState;

  static constexpr int kBlkN = cute::size<1>(TileShape{});
  static constexpr int kBlkK = cute::size<2>(TileShape{});
  static constexpr int kHalf = kBlkN / 2;  // B rows per half tile
  static_assert(kBlkN % 16 == 0, "each half tile is whole 8-row swizzle atoms");
  using ClusterShape = typename Base::DispatchPolicy::ClusterShape;
  static constexpr int kClusterM = cute::size<0>(ClusterShape{});
  static_assert(cute::size<1>(ClusterShape{}) == 1 && (kClusterM == 1 || kClusterM == 2),
                "clusters of 1 or 2 CTAs along M (B shared, A not)");
  static_assert(cute::is_same_v<GmemTiledCopyB, cute::conditional_t<kClusterM == 1, cute::SM90_TMA_LOAD,
                                                                    cute::SM90_TMA_LOAD_MULTICAST>>,
                "B by plain TMA without a cluster, by TMA multicast in one");
  static_assert(cute::is_same_v<typename Base::GmemTiledCopyA, cute::SM90_TMA_LOAD>, "A by plain TMA");
  static_assert((kBlkN / 2) % (8 * kClusterM) == 0, "each CTA's share of a half tile is whole 8-row swizzle atoms");
  static_assert(cute::is_static<cute::remove_cvref_t<decltype(cute::get<1>(InternalStrideB{}))>>::value,
                "B is K-major (a stage's row n starts n * BLK_K elements in)");
  static_assert(cute::size<0>(SmemLayoutAtomB{}) == 8 && cute::size<1>(SmemLayoutAtomB{}) == kBlkK,
                "one swizzle atom spans the K tile, 8 rows");

  // One half tile of B in shared memory (one stage), and its TMA (box h / C x BLK_K, C = the cluster's CTAs) over B
  // as (rows, K, half): row stride ld, then the distance between the two halves, both in elements.
  using StrideBHalves = cute::Stride<int64_t, cute::Int<1>, int64_t>;
  using SmemLayoutBHalf = decltype(cute::tile_to_shape(SmemLayoutAtomB{},
                                                       cute::make_shape(cute::Int<kHalf>{}, cute::Int<kBlkK>{})));
  using HalfTileShape = cute::Shape<decltype(cute::get<0>(TileShape{})), cute::Int<kHalf>, cute::Int<kBlkK>>;
  using TMA_BH = decltype(cute::make_tma_copy(
      GmemTiledCopyB{},
      cute::make_tensor(static_cast<InternalElementB const*>(nullptr),
                        cute::make_layout(cute::make_shape(int32_t(0), int32_t(0), int32_t(0)), StrideBHalves{})),
      SmemLayoutBHalf{}, cute::make_shape(cute::Int<kHalf>{}, cute::Int<kBlkK>{}), cute::Int<kClusterM>{}));

  // CUTLASS's arguments, and each group's up rows (ptr_B: its gate rows).
  struct Arguments : Base::Arguments {
    typename Base::ElementB const** ptr_B_up;
  };

  struct Params : Base::Params {
    TMA_BH tma_load_bh;
    InternalElementB const** ptr_B_up;
  };

  // Which half of the current group's B tensormap holds the gate rows (0: gate first in memory, 1: up first); set
  // with the group's tensormap.
  int gate_half_ = 0;

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
                                 StrideBHalves{int64_t(8), cute::Int<1>{}, int64_t(8)}));  // 16-byte strides
    TMA_BH tma_bh = cute::make_tma_copy(GmemTiledCopyB{}, tensor_b, SmemLayoutBHalf{},
                                        cute::make_shape(cute::Int<kHalf>{}, cute::Int<kBlkK>{}),
                                        cute::Int<kClusterM>{});
    return Params{base, tma_bh, reinterpret_cast<InternalElementB const**>(args.ptr_B_up)};
  }

  // (gA_mkl, gB_nkl) with B in half tiles: (h, BLK_K, n_half_tiles, k, half). The TMA coordinates do not depend on
  // the extents, so this group's shape serves every group (as in CUTLASS).
  template <class ProblemShape_MNKL>
  CUTLASS_DEVICE auto load_init(ProblemShape_MNKL const& problem_shape_MNKL, Params const& p) const {
    using X = cute::Underscore;
    auto [M, N, K, L] = problem_shape_MNKL;
    cute::Tensor mA_mkl = p.tma_load_a.get_tma_tensor(cute::make_shape(M, K, int32_t(1)));
    cute::Tensor mB_nkl = p.tma_load_bh.get_tma_tensor(cute::make_shape(int32_t(N) / 2, K, int32_t(2)));
    cute::Tensor gA_mkl = cute::local_tile(mA_mkl, TileShape{}, cute::make_coord(cute::_, cute::_, cute::_),
                                           cute::Step<cute::_1, X, cute::_1>{});
    cute::Tensor gB_nkl = cute::local_tile(mB_nkl, HalfTileShape{}, cute::make_coord(cute::_, cute::_, cute::_),
                                           cute::Step<X, cute::_1, cute::_1>{});
    return cute::make_tuple(gA_mkl, gB_nkl);
  }

  // Producer: per K tile, A's tile and the two halves of B's (gate rows, then up rows) on one barrier; in a
  // cluster, this CTA's share of each half's rows into every CTA of the cluster.
  template <class TensorA, class TensorB, class TensorMapA, class TensorMapB, class KTileIterator, class BlockCoord>
  CUTLASS_DEVICE void load(Params const& p, MainloopPipeline pipeline, PipelineState smem_pipe_write,
                           cute::tuple<TensorA, TensorB> const& load_inputs,
                           cute::tuple<TensorMapA, TensorMapB> const& input_tensormaps, BlockCoord const& blk_coord,
                           KTileIterator k_tile_iter, int k_tile_count, int, uint32_t block_rank_in_cluster,
                           TensorStorage& shared_tensors) {
    using namespace cute;
    if (!cute::elect_one_sync()) return;
    Tensor sA = make_tensor(make_smem_ptr(shared_tensors.smem_A.data()), typename Base::SmemLayoutA{});
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord;
    Tensor gA = get<0>(load_inputs)(_, _, m_coord, _, l_coord);                   // (BLK_M, BLK_K, k)
    Tensor gBg = get<1>(load_inputs)(_, _, n_coord, _, gate_half_);               // (h, BLK_K, k): gate rows
    Tensor gBu = get<1>(load_inputs)(_, _, n_coord, _, 1 - gate_half_);           // (h, BLK_K, k): up rows
    auto tma_a = p.tma_load_a.get_slice(0);
    // With clusters of kClusterM x 1 CTAs the block's rank is its M position; every CTA of the cluster gets B.
    auto tma_b = p.tma_load_bh.get_slice(block_rank_in_cluster % kClusterM);
    const uint16_t mcast_mask_b = uint16_t((1u << kClusterM) - 1);
    Tensor tAgA = tma_a.partition_S(gA);
    Tensor tAsA = tma_a.partition_D(sA);
    Tensor tBgBg = tma_b.partition_S(gBg);
    Tensor tBgBu = tma_b.partition_S(gBu);
    auto* smem_b = shared_tensors.smem_B.data();
    CUTLASS_PRAGMA_NO_UNROLL
    for (; k_tile_count > 0; --k_tile_count) {
      pipeline.producer_acquire(smem_pipe_write);
      auto* tma_barrier = pipeline.producer_get_barrier(smem_pipe_write);
      const int stage = smem_pipe_write.index();
      // A stage of B holds BLK_N rows of BLK_K elements in order (K-major, whole swizzle atoms): the gate half is
      // its first h rows, the up half the next h.
      auto* stage_b = smem_b + stage * (kBlkN * kBlkK);
      Tensor tBsBg = tma_b.partition_D(make_tensor(make_smem_ptr(stage_b), SmemLayoutBHalf{}));
      Tensor tBsBu = tma_b.partition_D(make_tensor(make_smem_ptr(stage_b + kHalf * kBlkK), SmemLayoutBHalf{}));
      copy(p.tma_load_a.with(get<0>(input_tensormaps), *tma_barrier, uint16_t(0)), tAgA(_, _, _, *k_tile_iter),
           tAsA(_, _, _, stage));
      copy(p.tma_load_bh.with(get<1>(input_tensormaps), *tma_barrier, mcast_mask_b), tBgBg(_, _, _, *k_tile_iter),
           tBsBg);
      copy(p.tma_load_bh.with(get<1>(input_tensormaps), *tma_barrier, mcast_mask_b), tBgBu(_, _, _, *k_tile_iter),
           tBsBu);
      ++k_tile_iter;
      ++smem_pipe_write;
    }
  }

  // The per-SM tensormaps start from the half-tile TMA of B (and CUTLASS's TMA of A).
  CUTLASS_DEVICE auto tensormaps_init(Params const& p, TensorMapStorage& shared_tensormaps, int32_t sm_count,
                                      int32_t sm_idx) {
    return tensormaps_init_ab(p.tma_load_a, p.tma_load_bh, p.tensormaps, shared_tensormaps, sm_count, sm_idx);
  }

  // A new group: its addresses, shapes and strides into the tensormaps. B's base is whichever of the group's gate
  // and up rows comes first in memory, its third mode the distance to the other (TMA strides are unsigned).
  template <class TensorMapA, class TensorMapB, class ProblemShape_MNKL>
  CUTLASS_DEVICE void tensormaps_perform_update(TensorMapStorage& shared_tensormaps, Params const& p,
                                                cute::tuple<TensorMapA, TensorMapB> const&,
                                                ProblemShape_MNKL problem_shape_mnkl, int32_t next_batch) {
    using namespace cute;
    InternalElementB const* gate = p.ptr_B[next_batch];
    InternalElementB const* up = p.ptr_B_up[next_batch];
    gate_half_ = up < gate ? 1 : 0;
    if (cute::elect_one_sync()) {
      tensormaps_replace_addr_ab(shared_tensormaps, p.ptr_A[next_batch], gate_half_ ? up : gate);
      const int64_t apart = gate_half_ ? gate - up : up - gate;
      const uint32_t M = get<0>(problem_shape_mnkl), N = get<1>(problem_shape_mnkl), K = get<2>(problem_shape_mnkl);
      Tensor tensor_a = make_tensor(static_cast<typename Base::InternalElementA const*>(nullptr),
                                    make_shape(M, K, Int<1>{}), p.dA[next_batch]);
      Tensor tensor_b = make_tensor(static_cast<InternalElementB const*>(nullptr),
                                    make_layout(make_shape(int32_t(N / 2), int32_t(K), int32_t(2)),
                                                StrideBHalves{get<0>(p.dB[next_batch]), Int<1>{}, apart}));
      tensormaps_replace_dims_ab<typename Base::InternalElementA, InternalElementB>(shared_tensormaps, p.tma_load_a,
                                                                                   tensor_a, p.tma_load_bh, tensor_b);
    }
  }
};

}  // namespace mok

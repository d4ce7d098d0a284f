// Epilogue of the fused gate/up + SwiGLU GEMM (GEMM kind MOK_GEMM_TN_SWIGLU_FWD), after the mainloop of
// mainloop_gate_up.cuh: in output tile n (BLK_N columns, h = BLK_N / 2) column c < h holds the gate pre-activation
// g and column h + c the up pre-activation u of intermediate column j = n * h + c. For group l with problem
// (M, N = 2I), each consumer thread stores from registers, for rows r < M and columns j < I (h need not split I: in
// the last tile the columns past I are no intermediate column and are not stored)
//   D_l[r, j] = p, D_l[r, I + j] = q          (fp32 [p | q] = [u * silu'(g) | silu(g)], row stride ldd: what
//                                              the backward reads; swiglu_math.cuh)
//   C_l[r, j] = bf16(silu(g) * u)             (bf16 a, row stride ldc)
// (the bits of the gate/up GEMM followed by the swiglu_fwd kernel, which turns [g | u] into [p | q] in place).
// An operator-style CUTLASS epilogue (the interface of CUTLASS's DefaultEpilogueArray, run by the sm90 ptr-array
// kernels through Sm90TmaWarpSpecializedAdapter); C is an output here, not an input.
#pragma once
#include <cuda_bf16.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "epilogue_array_base.cuh"
#include "swiglu_math.cuh"

namespace mok {

// One consumer thread's share of the tile: each column pair of p, q (fp32) and a (bf16) stored from registers.
// problem_shape_mnkl, blk_shape_MNK, blk_coord_mnkl, accumulators, tiled_mma: as the epilogue's operator() gets them;
// pq, a: group l's row 0 of [p | q] (row stride ldd) and of a (row stride ldc).
template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
          class TiledMma>
CUTLASS_DEVICE void swiglu_fwd_store_pairs(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_MNK,
                                           BlockCoordMNKL blk_coord_mnkl,
                                           cute::Tensor<FrgEngine, FrgLayout> const& accumulators, TiledMma tiled_mma,
                                           int thread_idx, float* __restrict__ pq, __nv_bfloat16* __restrict__ a,
                                           int64_t ldd, int64_t ldc) {
  using namespace cute;
  static_assert(is_static<FrgLayout>::value, "accumulator layout must be static");
  constexpr int kBlkN = size<1>(BlockShapeMNK{});
  constexpr int kPairs = kBlkN / 16;  // 8-column blocks per half tile
  // A wgmma accumulator fragment: ((2 adjacent columns, 2 row halves, BLK_N / 8 column blocks), MMA_M, MMA_N):
  // block b holds columns 8b + (0, 1) of the thread's column pair, so block b + kPairs is h columns further.
  static_assert(rank(FrgLayout{}) == 3 && size<2>(FrgLayout{}) == 1, "one MMA along N covers the tile");
  static_assert(size<0, 0>(FrgLayout{}) == 2 && size<0, 1>(FrgLayout{}) == 2 &&
                size<0, 2>(FrgLayout{}) == kBlkN / 8, "wgmma accumulator fragment ((2, 2, BLK_N / 8), M, 1)");
  const int M = get<0>(problem_shape_mnkl), I = get<1>(problem_shape_mnkl) / 2;
  auto [m_coord, n_coord, k_coord, l_coord] = blk_coord_mnkl;
  Tensor cD = local_tile(make_identity_tensor(make_shape(M, get<1>(problem_shape_mnkl))),
                         take<0, 2>(blk_shape_MNK), make_coord(m_coord, n_coord));
  Tensor tCcD = tiled_mma.get_thread_slice(thread_idx).partition_C(cD);
  const int shift = n_coord * (kBlkN / 2);  // column c of this tile's gate half: intermediate column c - shift
  CUTLASS_PRAGMA_UNROLL
  for (int m = 0; m < size<1>(FrgLayout{}); ++m) {
    CUTLASS_PRAGMA_UNROLL
    for (int half = 0; half < 2; ++half) {
      CUTLASS_PRAGMA_UNROLL
      for (int b = 0; b < kPairs; ++b) {
        auto ig = make_coord(make_coord(0, half, b), m, 0);
        auto ig1 = make_coord(make_coord(1, half, b), m, 0);
        auto iu = make_coord(make_coord(0, half, b + kPairs), m, 0);
        auto iu1 = make_coord(make_coord(1, half, b + kPairs), m, 0);
        const int r = get<0>(tCcD(ig)), j = get<1>(tCcD(ig)) - shift;
        if (r < M && j < I) {  // j even, I a multiple of 8 (the caller checks): j + 1 < I too
          float2 p, q;
          const float a0 = swiglu_fwd_one(accumulators(ig), accumulators(iu), p.x, q.x);
          const float a1 = swiglu_fwd_one(accumulators(ig1), accumulators(iu1), p.y, q.y);
          float* row = pq + r * ldd + j;
          *reinterpret_cast<float2*>(row) = p;
          *reinterpret_cast<float2*>(row + I) = q;
          *reinterpret_cast<__nv_bfloat162*>(a + r * ldc + j) = __floats2bfloat162_rn(a0, a1);
        }
      }
    }
  }
}

// C: a of row 0; D: p of row 0 (q is I columns further).
template <class StrideCD_>  // pointer to the per-group row-major stride (ld, _1, _0)
class SwigluFwdEpilogueArray : public EpilogueArrayBase<StrideCD_, cutlass::bfloat16_t, float> {
 public:
  using Params = typename EpilogueArrayBase<StrideCD_, cutlass::bfloat16_t, float>::Params;

  CUTLASS_HOST_DEVICE explicit SwigluFwdEpilogueArray(Params const& params_) : params(params_) {}

  CUTLASS_DEVICE bool is_source_needed() { return false; }

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
            class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_MNK,
                                 BlockCoordMNKL blk_coord_mnkl, cute::Tensor<FrgEngine, FrgLayout> const& accumulators,
                                 TiledMma tiled_mma, ResidueMNK, int thread_idx, char*) {
    const int l = cute::get<3>(blk_coord_mnkl);
    swiglu_fwd_store_pairs(problem_shape_mnkl, blk_shape_MNK, blk_coord_mnkl, accumulators, tiled_mma, thread_idx,
                           params.ptr_D[l], reinterpret_cast<__nv_bfloat16*>(params.ptr_C[l]),
                           cute::get<0>(params.dD[l]), cute::get<0>(params.dC[l]));
  }

 private:
  Params params;
};

}  // namespace mok

// Epilogue of the FP8 gate/up + SwiGLU GEMM (GEMM kind MOK_GEMM_FP8_TN_SWIGLU_FWD, grouped_gemm_fp8.cuh): the
// register stores of epilogue_swiglu_fwd.cuh (swiglu_fwd_store_pairs, the same code and bits), for a GEMM whose B
// rows come in groups of h = BLK_N / 2 = 64: gate rows [64j, 64j + 64) then up rows [64j, 64j + 64), the
// intermediate size I of each group padded with zero rows to a multiple of 64 (mok/fast/_fp8.py builds that B). The
// GEMM's N is then 2 * ceil(I / 64) * 64, not 2I, so I comes per group (Arguments::cols), and the stores see the
// problem (M, 2I): column c < 64 of output tile n is gate and column 64 + c up of intermediate column 64n + c, and
// only columns below I are stored (D fp32 [p | q] with q I columns after p, C bf16 a).
#pragma once
#include "epilogue_swiglu_fwd.cuh"

namespace mok {

template <class StrideCD_>  // pointer to the per-group row-major stride (ld, _1, _0)
class SwigluFwdColsEpilogueArray : public EpilogueArrayBase<StrideCD_, cutlass::bfloat16_t, float> {
  using Base = EpilogueArrayBase<StrideCD_, cutlass::bfloat16_t, float>;

 public:
  // C: a of row 0; D: p of row 0 (q is I columns further); cols: I of each group.
  struct Arguments : Base::Arguments {
    int const* cols = nullptr;
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const& problem_shape, Arguments const& args) {
    return Base::can_implement(problem_shape, args) && args.cols != nullptr;
  }

  CUTLASS_HOST_DEVICE explicit SwigluFwdColsEpilogueArray(Params const& params_) : params(params_) {}

  CUTLASS_DEVICE bool is_source_needed() { return false; }

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
            class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_MNK,
                                 BlockCoordMNKL blk_coord_mnkl, cute::Tensor<FrgEngine, FrgLayout> const& accumulators,
                                 TiledMma tiled_mma, ResidueMNK, int thread_idx, char*) {
    const int l = cute::get<3>(blk_coord_mnkl);
    // The group's problem as the stores see it: N = 2I (only where that differs from the GEMM's N does it matter:
    // which columns are stored and where q starts).
    const auto stored = cute::make_shape(cute::get<0>(problem_shape_mnkl), 2 * params.cols[l],
                                         cute::get<2>(problem_shape_mnkl), cute::get<3>(problem_shape_mnkl));
    swiglu_fwd_store_pairs(stored, blk_shape_MNK, blk_coord_mnkl, accumulators, tiled_mma, thread_idx,
                           params.ptr_D[l], reinterpret_cast<__nv_bfloat16*>(params.ptr_C[l]),
                           cute::get<0>(params.dD[l]), cute::get<0>(params.dC[l]));
  }

 private:
  Params params;
};

}  // namespace mok

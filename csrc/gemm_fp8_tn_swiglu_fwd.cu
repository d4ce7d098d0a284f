// FP8 grouped GEMM with block scales fused with the SwiGLU forward: A [M,K] e4m3 row-major, B [2 * ceil(I/64) * 64, K]
// e4m3 row-major (K-major) = the interleaved [gate; up] (64 gate rows, then the same 64 up rows, ...; scales per 64
// rows), giving D fp32 [M, 2I] = [p | q] and aux bf16 [M, I] = a (grouped_gemm_fp8.cuh, epilogue_swiglu_fwd_cols.cuh).
// The FP8 recipe's forward gate/up + SwiGLU in one launch.
#include "gemm_kinds.h"
#include "grouped_gemm_fp8.cuh"

// CUTLASS's blockwise mainloop with B scales per 64 columns of a 128-column tile (ScaleNsPerTile = 2) and A scales
// per row promotes each K block's sum with GmmaFP8Accumulation::scale_core(sfa, sfb), which (CUTLASS 4.2,
// cutlass/gemm/collective/fp8_accumulation.hpp, the two-scale scale_core) static_asserts that each scale fragment has
// the accumulator's shape: the B fragment's column blocks come as (8, 2) (8 column blocks of 8 in each 64-column
// half), the accumulator's as 16, the same 16 values in the same (colexicographic) order, so the assertion fails
// although the loop over a flat index i is right. And that loop computes accum += (sum * sfa) * sfb, where the
// kinds with 128x128 B scales compute accum += sum * (sfa * sfb). This explicit specialization, for this kind's
// accumulator and scale fragments only (tile 128x128x128, two consumer warpgroups; any other fragment type takes
// CUTLASS's own, whose assertion then fails the build), keeps the loop over the flat index and multiplies the two
// scales first: the same fp32 operations, in the same order, as the linear FP8 kinds, so the accumulators are theirs
// bit for bit.
namespace cutlass::gemm::collective {
namespace mok_fp8_n64 {
using AccEngine = cute::ArrayEngine<float, 64>;
using AccLayout = cute::Layout<cute::Shape<cute::Shape<cute::_2, cute::_2, cute::_16>, cute::_1, cute::_1>,
                               cute::Stride<cute::Stride<cute::_1, cute::_2, cute::_4>, cute::_0, cute::_0>>;
using ScaleEngine = cute::ArrayEngine<float, 2>;
using ScaleALayout = cute::Layout<cute::Shape<cute::Shape<cute::_2, cute::_2, cute::_16>, cute::_1, cute::_1>,
                                  cute::Stride<cute::Stride<cute::_0, cute::_1, cute::_0>, cute::_0, cute::_0>>;
using ScaleBLayout =
    cute::Layout<cute::Shape<cute::Shape<cute::_2, cute::_2, cute::Shape<cute::_8, cute::_2>>, cute::_1, cute::_1>,
                 cute::Stride<cute::Stride<cute::_0, cute::_0, cute::Stride<cute::_0, cute::_1>>, cute::_0, cute::_0>>;
static_assert(cute::size(AccLayout{}) == cute::size(ScaleBLayout{}) &&
                  cute::size(AccLayout{}) == cute::size(ScaleALayout{}),
              "one scale of each per accumulator element");
}  // namespace mok_fp8_n64

template <>
template <>
CUTLASS_DEVICE void
GmmaFP8Accumulation<mok_fp8_n64::AccEngine, mok_fp8_n64::AccLayout>::scale_core<
    mok_fp8_n64::ScaleEngine, mok_fp8_n64::ScaleALayout, mok_fp8_n64::ScaleEngine, mok_fp8_n64::ScaleBLayout>(
    const cute::Tensor<mok_fp8_n64::ScaleEngine, mok_fp8_n64::ScaleALayout>& scaleA,
    const cute::Tensor<mok_fp8_n64::ScaleEngine, mok_fp8_n64::ScaleBLayout>& scaleB) {
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < size(accum_); ++i) {
    accum_(i) += accum_temp_(i) * (scaleA(i) * scaleB(i));  // the linear kinds': scale = sfa * sfb, then the FFMA
  }
}
}  // namespace cutlass::gemm::collective

MOK_DEFINE_FP8_KIND_EPI(gemm_fp8_tn_swiglu_fwd, float, mok::Fp8Epi::kSwigluFwd)

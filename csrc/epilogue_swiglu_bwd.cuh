// Epilogue of the d_a grouped GEMM fused with the SwiGLU backward (GEMM kind MOK_GEMM_NN_SWIGLU_BWD), so
// d_a [R, I] fp32 is never written and read back. An operator-style CUTLASS epilogue (the interface of
// CUTLASS's DefaultEpilogueArray), run by the sm90 ptr-array kernels through Sm90TmaWarpSpecializedAdapter:
// each consumer thread turns its accumulator fragment into outputs and stores them from registers.
// For group l with problem (M, N) and da = the fp32 accumulator at (r, c):
//   p = C_l[r, c], q = C_l[r, N + c]   (fp32, row stride ldc: the forward's u * silu'(g) and silu(g))
//   D_l[r, c] = bf16(da * p), D_l[r, N + c] = bf16(da * q)   (row stride ldd)
// (swiglu_math.cuh: the bits of swiglu_bwd_k applied to the d_a GEMM's result). Each output element
// still comes from one CTA's accumulator walking K in order: bitwise reproducible, batch invariant.
// The kind's cooperative variants (0, 1) run it; the ping-pong variants, which the tile rule picks, run
// epilogue_swiglu_bwd_loaded.cuh (docs/fast_path.md).
#pragma once
#include <cuda_bf16.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "epilogue_array_base.cuh"
#include "swiglu_math.cuh"

namespace mok {

// C: p of row 0 (q is N columns further); D: dg of row 0 (du is N columns further).
template <class StrideCD_>  // pointer to the per-group row-major stride (ld, _1, _0)
class SwigluBwdEpilogueArray : public EpilogueArrayBase<StrideCD_, float, cutlass::bfloat16_t, const float> {
 public:
  using Params = typename EpilogueArrayBase<StrideCD_, float, cutlass::bfloat16_t, const float>::Params;

  CUTLASS_HOST_DEVICE explicit SwigluBwdEpilogueArray(Params const& params_) : params(params_) {}

  CUTLASS_DEVICE bool is_source_needed() { return true; }

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
            class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_MNK,
                                 BlockCoordMNKL blk_coord_mnkl, cute::Tensor<FrgEngine, FrgLayout> const& accumulators,
                                 TiledMma tiled_mma, ResidueMNK, int thread_idx, char*) {
    using namespace cute;
    static_assert(is_static<FrgLayout>::value, "accumulator layout must be static");
    static_assert(size(FrgLayout{}) % 2 == 0, "accumulator fragments hold column pairs");
    const int M = get<0>(problem_shape_mnkl), N = get<1>(problem_shape_mnkl);
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord_mnkl;
    const float* __restrict__ pq = params.ptr_C[l_coord];
    __nv_bfloat16* __restrict__ dgu = reinterpret_cast<__nv_bfloat16*>(params.ptr_D[l_coord]);
    const int64_t ldc = get<0>(params.dC[l_coord]), ldd = get<0>(params.dD[l_coord]);
    // Coordinates of this thread's accumulators in the group's (M, N) output. A wgmma fragment holds its
    // values in column pairs (c, c + 1), c even: accumulators(i), accumulators(i + 1) for even i.
    Tensor cD = local_tile(make_identity_tensor(make_shape(M, N)), take<0, 2>(blk_shape_MNK),
                           make_coord(m_coord, n_coord));
    Tensor tCcD = tiled_mma.get_thread_slice(thread_idx).partition_C(cD);
    // Pairs go in chunks whose [p | q] loads are all issued before the chunk's stores (a store may alias a
    // later load for all the compiler knows, so otherwise each pair waits for its own loads in turn); with
    // registers to spare (the cooperative tile: 128 accumulators a thread) the next chunk's loads are issued
    // before this chunk's math too. The ping-pong tile (192 accumulators a thread) takes smaller chunks.
    constexpr int kPairs = size(FrgLayout{}) / 2;
    constexpr bool kPrefetch = kPairs <= 64;
    constexpr int kChunk = kPrefetch ? 8 : 4;
    static_assert(kPairs % kChunk == 0, "accumulator pairs come in chunks");
    float2 p[kPairs], q[kPairs];
    bool in[kPairs];
    auto load = [&](int p0) {
      CUTLASS_PRAGMA_UNROLL
      for (int j = p0; j < p0 + kChunk; ++j) {
        const int r = get<0>(tCcD(2 * j)), c = get<1>(tCcD(2 * j));
        in[j] = r < M && c < N;  // N is even (a multiple of 8): the pair is in or out together
        const float* row = pq + r * ldc + c;
        p[j] = in[j] ? __ldg(reinterpret_cast<const float2*>(row)) : make_float2(0.f, 0.f);
        q[j] = in[j] ? __ldg(reinterpret_cast<const float2*>(row + N)) : make_float2(0.f, 0.f);
      }
    };
    // First ask L2 for every 128-byte line of the tile's [p | q] (the threads split the lines; nothing held in
    // registers): the chunked loads below then mostly wait for L2, not DRAM.
    {
      constexpr int kBlkM = size<0>(BlockShapeMNK{}), kBlkN = size<1>(BlockShapeMNK{});
      constexpr int kLinesPerRow = 2 * kBlkN / 32;  // p and q: kBlkN fp32 each
      const int m0 = m_coord * kBlkM, n0 = n_coord * kBlkN;
      const int threads = size(tiled_mma);
      CUTLASS_PRAGMA_NO_UNROLL
      for (int line = thread_idx; line < kBlkM * kLinesPerRow; line += threads) {
        const int r = m0 + line / kLinesPerRow, k = line % kLinesPerRow;
        const int c = n0 + (k % (kLinesPerRow / 2)) * 32;
        if (r < M && c < N) {
          asm volatile("prefetch.global.L2 [%0];" ::"l"(pq + r * ldc + c + (k < kLinesPerRow / 2 ? 0 : N)));
        }
      }
    }
    if constexpr (kPrefetch) load(0);
    CUTLASS_PRAGMA_UNROLL
    for (int p0 = 0; p0 < kPairs; p0 += kChunk) {
      if constexpr (kPrefetch) {
        if (p0 + kChunk < kPairs) load(p0 + kChunk);
      } else {
        load(p0);
      }
      CUTLASS_PRAGMA_UNROLL
      for (int j = p0; j < p0 + kChunk; ++j) {
        if (in[j]) {
          const int r = get<0>(tCcD(2 * j)), c = get<1>(tCcD(2 * j));
          __nv_bfloat162 dg, du;
          swiglu_bwd_one(accumulators(2 * j), p[j].x, q[j].x, dg.x, du.x);
          swiglu_bwd_one(accumulators(2 * j + 1), p[j].y, q[j].y, dg.y, du.y);
          __nv_bfloat16* out = dgu + r * ldd + c;
          *reinterpret_cast<__nv_bfloat162*>(out) = dg;
          *reinterpret_cast<__nv_bfloat162*>(out + N) = du;
        }
      }
    }
  }

 private:
  Params params;
};

}  // namespace mok

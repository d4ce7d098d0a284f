// The SwiGLU-backward epilogue of the d_a GEMM (GEMM kind MOK_GEMM_NN_SWIGLU_BWD) in the ping-pong tiles, with
// the forward's [p | q] staged through shared memory. The math and bits of epilogue_swiglu_bwd.cuh and of the
// swiglu_bwd kernel: for group l with problem (M, N), da = the fp32 accumulator at (r, c), p = C_l[r, c] (the
// forward's u * silu'(g)), q = C_l[r, N + c] (silu(g)),
//   D_l[r, c] = bf16(da * p), D_l[r, N + c] = bf16(da * q).
// The consumer warpgroup's 128 threads copy [p | q] into shared memory with 16-byte cp.async, 64 rows x 32 columns
// of p and of q a sub-tile, three sub-tiles in flight while a fourth is used (64 KiB; the ping-pong mainloop keeps
// its 4 stages). Loading into registers instead (epilogue_swiglu_bwd.cuh) had only the registers the 192
// accumulators of a ping-pong tile leave free to keep loads in flight, so that epilogue waited on memory and did
// not hide behind the other warpgroup's mainloop; cp.async needs no registers for bytes in flight.
// In the ping-pong kernel the two consumer warpgroups' epilogues run one after the other (CUTLASS's math order
// barrier), so they share one staging buffer; each call waits for its last copies and syncs its warpgroup before
// returning. Each output element still comes from one CTA's accumulator walking K in order: bitwise
// reproducible and batch invariant.
#pragma once
#include <cuda_bf16.h>

#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/detail.hpp"
#include "epilogue_array_base.cuh"
#include "swiglu_math.cuh"

namespace mok {

template <class StrideCD_>  // pointer to the per-group row-major stride (ld, _1, _0)
class SwigluBwdStagedEpilogueArray
    : public EpilogueArrayBase<StrideCD_, float, cutlass::bfloat16_t, const float> {
  using Base = EpilogueArrayBase<StrideCD_, float, cutlass::bfloat16_t, const float>;

 public:
  using Params = typename Base::Params;
  static constexpr int kSubM = 64, kSubN = 32;  // one sub-tile: 64 rows x 32 columns of p and of q (16 KiB)
  static constexpr int kStages = 4;             // sub-tiles in shared memory: three in flight, one in use
  struct SharedStorage {
    alignas(128) float p[kStages][kSubM * kSubN];
    alignas(128) float q[kStages][kSubM * kSubN];
  };

  CUTLASS_HOST_DEVICE explicit SwigluBwdStagedEpilogueArray(Params const& params_) : params(params_) {}

  CUTLASS_DEVICE bool is_source_needed() { return true; }

  // Float offset of column c (0..31) of sub-tile row r: 16-byte chunks permuted within the row so that the 4 rows
  // a half-warp reads (float2 at columns 8j + 2(lane % 4)) fall in distinct banks.
  CUTLASS_DEVICE static int smem_at(int r, int c) { return r * kSubN + (((c >> 2) ^ ((r & 3) << 1)) << 2) + (c & 3); }

  template <class ProblemShapeMNKL, class BlockShapeMNK, class BlockCoordMNKL, class FrgEngine, class FrgLayout,
            class TiledMma, class ResidueMNK>
  CUTLASS_DEVICE void operator()(ProblemShapeMNKL problem_shape_mnkl, BlockShapeMNK blk_shape_MNK,
                                 BlockCoordMNKL blk_coord_mnkl, cute::Tensor<FrgEngine, FrgLayout> const& accumulators,
                                 TiledMma, ResidueMNK, int thread_idx, char* smem_buf) {
    using namespace cute;
    constexpr int kBlkM = size<0>(BlockShapeMNK{}), kBlkN = size<1>(BlockShapeMNK{});
    constexpr int kThreads = size(TiledMma{});
    // One warpgroup owns the whole tile (ping-pong): its fragment is ((2 columns, 2 row halves, BLK_N / 8 column
    // blocks), BLK_M / 64, 1), and sub-tile (m, q) holds column blocks 4q .. 4q + 3 of row block m.
    static_assert(kThreads == 128, "the staged epilogue runs in tiles one warpgroup owns (ping-pong)");
    static_assert(is_static<FrgLayout>::value && rank(FrgLayout{}) == 3 && size<2>(FrgLayout{}) == 1,
                  "one MMA along N covers the tile");
    static_assert(size<0, 0>(FrgLayout{}) == 2 && size<0, 1>(FrgLayout{}) == 2 &&
                  size<0, 2>(FrgLayout{}) == kBlkN / 8 && size<1>(FrgLayout{}) * kSubM == kBlkM,
                  "wgmma accumulator fragment ((2, 2, BLK_N / 8), BLK_M / 64, 1)");
    static_assert(kBlkN % kSubN == 0, "sub-tiles split the tile's columns");
    constexpr int kQ = kBlkN / kSubN, kSubtiles = (kBlkM / kSubM) * kQ;
    constexpr int kCopies = kSubM * kSubN / 4 / kThreads;  // 16-byte copies a thread makes per sub-tile, of p and of q
    static_assert(kSubtiles >= kStages - 1, "the pipeline's prologue fits in the tile");

    auto& ss = *reinterpret_cast<SharedStorage*>(smem_buf);
    const int M = get<0>(problem_shape_mnkl), N = get<1>(problem_shape_mnkl);
    auto [m_coord, n_coord, k_coord, l_coord] = blk_coord_mnkl;
    const int64_t ldc = get<0>(params.dC[l_coord]), ldd = get<0>(params.dD[l_coord]);
    const int m0 = m_coord * kBlkM, n0 = n_coord * kBlkN;
    // The warpgroup's own named barrier (ids above CUTLASS's reserved ones).
    const uint32_t bar_id = static_cast<uint32_t>(cutlass::canonical_warp_group_idx());
    auto wg_sync = [&] { cutlass::arch::NamedBarrier::sync(kThreads, bar_id); };

    // Copies: thread t takes chunk t % 8 (4 floats) of sub-tile rows t / 8 + 16 i, i < kCopies.
    const int cp_row = thread_idx / (kSubN / 4), cp_col = (thread_idx % (kSubN / 4)) * 4;
    const float* __restrict__ cp_src = params.ptr_C[l_coord] + (m0 + cp_row) * ldc + (n0 + cp_col);
    const uint32_t cp_dst = static_cast<uint32_t>(__cvta_generic_to_shared(&ss.p[0][smem_at(cp_row, cp_col)]));
    constexpr uint32_t kQBytes = sizeof(ss.p), kStageBytes = sizeof(ss.p[0]);
    static_assert(sizeof(ss.p) == sizeof(ss.q), "p and q stages alike");
    static_assert((kThreads / (kSubN / 4)) % 4 == 0, "rows t / 8 + 16 i keep the chunk permutation of row t / 8");
    // Sub-tile s into stage s % kStages; rows past M and columns past N are zero-filled without reading (cp.async
    // with source size 0), so no branch splits the copies. One commit group per sub-tile, empty past the last.
    auto issue = [&](int s) {
      if (s < kSubtiles) {
        const int dr = (s / kQ) * kSubM, dc = (s % kQ) * kSubN;
        const bool col_in = n0 + cp_col + dc < N;
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < kCopies; ++i) {
          const int r = dr + cp_row + i * (kThreads / (kSubN / 4));
          const bool in = col_in && m0 + r < M;
          const float* src = in ? cp_src + (r - cp_row) * ldc + dc : cp_src;
          const uint32_t bytes = in ? 16 : 0;
          const uint32_t dst = cp_dst + (s % kStages) * kStageBytes +
                               (i * (kThreads / (kSubN / 4)) * kSubN) * static_cast<uint32_t>(sizeof(float));
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst + kQBytes), "l"(in ? src + N : src),
                       "r"(bytes) : "memory");
        }
      }
      asm volatile("cp.async.commit_group;" ::: "memory");
    };

    // Reads: thread t holds rows 16 (t / 32) + (t % 32) / 4 (+ 8) and columns 8b + 2 (t % 4) (+ 1) of each
    // 64-row block (the wgmma accumulator layout; tCcD in epilogue_swiglu_bwd.cuh gives the same coordinates).
    const int lane = thread_idx % 32, rd_row = (thread_idx / 32) * 16 + lane / 4, rd_col = 2 * (lane % 4);
    __nv_bfloat16* __restrict__ out0 = reinterpret_cast<__nv_bfloat16*>(params.ptr_D[l_coord]) +
                                       (m0 + rd_row) * ldd + (n0 + rd_col);

    wg_sync();  // the other warpgroup's epilogue, or this one's last, has finished reading the buffer
    CUTLASS_PRAGMA_UNROLL
    for (int s = 0; s < kStages - 1; ++s) issue(s);
    CUTLASS_PRAGMA_UNROLL
    for (int s = 0; s < kSubtiles; ++s) {
      asm volatile("cp.async.wait_group %0;" ::"n"(kStages - 2) : "memory");  // this thread's copies of s landed
      wg_sync();                  // everyone's copies of s landed; everyone has finished with sub-tile s - 1
      issue(s + kStages - 1);     // into the stage of s - 1
      const int st = s % kStages, mb = s / kQ, q = s % kQ;
      // The math runs on every pair (rows past M and columns past N hold zeros or stale values and are not
      // stored), so only the stores are predicated and the compiler can overlap the pairs' chains.
      CUTLASS_PRAGMA_UNROLL
      for (int half = 0; half < 2; ++half) {
        const int rl = rd_row + 8 * half;  // row in the sub-tile
        const bool row_in = m0 + mb * kSubM + rl < M;
        CUTLASS_PRAGMA_UNROLL
        for (int b = 0; b < kSubN / 8; ++b) {
          const int cl = 8 * b + rd_col;  // column in the sub-tile
          auto i0 = make_coord(make_coord(0, half, q * (kSubN / 8) + b), mb, 0);
          auto i1 = make_coord(make_coord(1, half, q * (kSubN / 8) + b), mb, 0);
          const int at = smem_at(rl, cl);
          const float2 pv = *reinterpret_cast<const float2*>(&ss.p[st][at]);
          const float2 qv = *reinterpret_cast<const float2*>(&ss.q[st][at]);
          __nv_bfloat162 dg, du;
          swiglu_bwd_one(accumulators(i0), pv.x, qv.x, dg.x, du.x);
          swiglu_bwd_one(accumulators(i1), pv.y, qv.y, dg.y, du.y);
          if (row_in && n0 + q * kSubN + cl < N) {  // N is a multiple of 8: the pair is in or out together
            __nv_bfloat16* out = out0 + (mb * kSubM + 8 * half) * ldd + (q * kSubN + 8 * b);
            *reinterpret_cast<__nv_bfloat162*>(out) = dg;
            *reinterpret_cast<__nv_bfloat162*>(out + N) = du;
          }
        }
      }
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    wg_sync();  // every thread is done with the buffer before the other warpgroup's epilogue may refill it
  }

 private:
  Params params;
};

// Sm90TmaWarpSpecializedAdapter names the epilogue's SharedStorage as its TensorMapStorage too, so the kernel would
// reserve the staging buffer twice; this adapter's tensor-map storage is empty (the epilogue has no tensor maps).
template <class EpilogueOp>
class StagedEpilogueAdapter : public cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<EpilogueOp> {
  using Base = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<EpilogueOp>;

 public:
  using Base::Base;
  struct TensorMapStorage {};

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

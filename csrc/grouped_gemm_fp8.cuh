// Grouped (ptr-array) FP8 GEMM with block scales on sm_90a through CUTLASS's blockwise-scaled mainloop
// (KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise): A [M, K] and B [N, K] e4m3, both K-major, A scaled per
// row and 128 columns of K, B per 128x128 block, both scale tensors K-major, the layout of the FP8 recipe's
// quantisers (csrc/fp8_quant.cu). For each K block of 128 the wgmma products are summed into a fresh fp32
// accumulator, which is then multiplied by sfa * sfb (powers of two: exact) and added to the running one, K blocks in
// order. One fixed tile (128x128x128, 1x2 clusters), one CTA per output tile walking its whole K range (no split-K,
// no atomics): bitwise reproducible and batch invariant, like grouped_gemm.cuh's kinds, whose segments and
// per-group argument arrays this reuses (MokSegment operands a, b, d and sfa, sfb).
// Fp8Epi::kSwigluFwd (GEMM kind MOK_GEMM_FP8_TN_SWIGLU_FWD): the gate/up GEMM with the SwiGLU forward in its
// epilogue. B is the interleaved [gate; up] of mok/fast/_fp8.py: rows in groups of 64, gate rows [64j, 64j + 64) then
// up rows [64j, 64j + 64), I padded with zero rows to a multiple of 64, so every 128-column output tile holds 64 gate
// columns and then the 64 up columns of the same intermediate columns; B's scales are per 64 rows (each 128x128 block
// scale given once for each of its two 64-row halves), the mainloop's scale granularity along N 64
// (ScaleNsPerTile = 2), whose two-scale promotion gemm_fp8_tn_swiglu_fwd.cu specialises so that each K block's sum is
// multiplied by sfa * sfb as in the linear kinds (the same accumulators, bit for bit). The segment's n is 2I (D fp32
// [M, 2I] = [p | q], aux bf16 [M, I] = a, as MOK_GEMM_TN_SWIGLU_FWD's), the GEMM's N 2 * ceil(I / 64) * 64
// (epilogue_swiglu_fwd_cols.cuh).
#pragma once
#include "cutlass/detail/blockwise_scale_layout.hpp"
#include "epilogue_swiglu_fwd_cols.cuh"
#include "grouped_gemm.cuh"

namespace mok {

// The FP8 kinds' epilogues: D = the accumulator (CUTLASS's TMA epilogue), or the SwiGLU forward.
enum class Fp8Epi { kLinear, kSwigluFwd };

// CUTLASS's blockwise mainloop (`Base`) with the accumulator cleared before it runs. CUTLASS 4.2's mainloop adds the
// first K block's scaled sum to an accumulator it never initialises (GmmaFP8Accumulation::scale_core reads
// accum_ before any write); nvcc 13.0 compiles that read as +0, but nothing in the source guarantees it. Cleared
// here, every output tile starts from +0 by construction (the same SASS but for register names): the same bits.
template <class Base>
struct ZeroedAccumulators : Base {
  template <class FrgTensorC>
  CUTLASS_DEVICE void mma(typename Base::MainloopPipeline pipeline, typename Base::PipelineState smem_pipe_read,
                          FrgTensorC& accum, int k_tile_count, int thread_idx,
                          typename Base::TensorStorage& shared_tensors, typename Base::Params const& mainloop_params) {
    cute::clear(accum);
    Base::mma(pipeline, smem_pipe_read, accum, k_tile_count, thread_idx, shared_tensors, mainloop_params);
  }
};

template <class ElementD_, Fp8Epi kEpi = Fp8Epi::kLinear>
struct GroupedGemmFp8 {
  static constexpr bool kSwigluFwd = kEpi == Fp8Epi::kSwigluFwd;
  static_assert(!kSwigluFwd || cute::is_same_v<ElementD_, float>, "the SwiGLU forward writes fp32 [p | q]");
  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
  using ElementA = cutlass::float_e4m3_t;
  using ElementB = cutlass::float_e4m3_t;
  using ElementD = ElementD_;
  using LayoutA = cutlass::layout::RowMajor;
  using LayoutB = cutlass::layout::ColumnMajor;
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int AlignAB = 16;
  static constexpr int AlignD = 128 / cutlass::sizeof_bits<ElementD>::value;
  using TileShape = Shape<_128, _128, _128>;
  using ClusterShape = Shape<_1, _2, _1>;
  // Scale granularity 1 x 128 for A (per row), 128 x 128 for B (64 x 128 for the interleaved [gate; up]); both
  // K-major.
  static constexpr int kScaleN = kSwigluFwd ? MOK_FP8_SWIGLU_GROUP : 128;
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, kScaleN, 128, cute::GMMA::Major::K,
                                                                cute::GMMA::Major::K>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

  using LinearEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD*, AlignD, ElementD, LayoutD*,
      AlignD, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float, void, float>>::CollectiveOp;
  // The SwiGLU forward stores from registers (the cooperative tile's register stores of the bf16 fused kind).
  using SwigluFwdEpilogue = cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<
      SwigluFwdColsEpilogueArray<cutlass::detail::TagToStrideC_t<LayoutD*>>>;
  using CollectiveEpilogue = cute::conditional_t<kSwigluFwd, SwigluFwdEpilogue, LinearEpilogue>;
  using CollectiveMainloop = ZeroedAccumulators<typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, cute::tuple<LayoutA*, LayoutSFA*>, AlignAB,
      ElementB, cute::tuple<LayoutB*, LayoutSFB*>, AlignAB, float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise>::CollectiveOp>;
  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  static_assert(sizeof(typename GemmKernel::SharedStorage) <= cutlass::gemm::collective::detail::sm90_smem_capacity_bytes,
                "the kernel's shared memory exceeds the SM's");
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
  using StrideA = typename GemmKernel::InternalStrideA;
  using StrideB = typename GemmKernel::InternalStrideB;
  using StrideD = typename GemmKernel::InternalStrideD;
  using Shape3 = typename ProblemShape::UnderlyingProblemShape;

  struct Arrays {  // device-side argument arrays, carved from the front of the workspace
    Shape3* shapes;
    const ElementA** a;
    const ElementB** b;
    ElementD** d;
    const float** sfa;
    const float** sfb;
    cutlass::bfloat16_t** c;  // the SwiGLU forward's a (operand aux)
    int* cols;                // the SwiGLU forward's I
    StrideA* sa;
    StrideB* sb;
    StrideD* sd;
    StrideD* sc;
    LayoutSFA* lsfa;  // not read by the kernel (it derives each group's scale layout from its M, N, K)
    LayoutSFB* lsfb;
  };

  static size_t align16(size_t n) { return (n + 15) & ~size_t(15); }
  static size_t arrays_bytes(int g) {
    return align16(g * sizeof(Shape3)) + 6 * align16(g * sizeof(void*)) + align16(g * sizeof(int)) +
           align16(g * sizeof(StrideA)) + align16(g * sizeof(StrideB)) + 2 * align16(g * sizeof(StrideD)) +
           align16(g * sizeof(LayoutSFA)) + align16(g * sizeof(LayoutSFB));
  }
  static Arrays carve(void* ws, int g) {
    char* p = static_cast<char*>(ws);
    Arrays r;
    r.shapes = reinterpret_cast<Shape3*>(p); p += align16(g * sizeof(Shape3));
    r.a = reinterpret_cast<const ElementA**>(p); p += align16(g * sizeof(void*));
    r.b = reinterpret_cast<const ElementB**>(p); p += align16(g * sizeof(void*));
    r.d = reinterpret_cast<ElementD**>(p); p += align16(g * sizeof(void*));
    r.sfa = reinterpret_cast<const float**>(p); p += align16(g * sizeof(void*));
    r.sfb = reinterpret_cast<const float**>(p); p += align16(g * sizeof(void*));
    r.c = reinterpret_cast<cutlass::bfloat16_t**>(p); p += align16(g * sizeof(void*));
    r.cols = reinterpret_cast<int*>(p); p += align16(g * sizeof(int));
    r.sa = reinterpret_cast<StrideA*>(p); p += align16(g * sizeof(StrideA));
    r.sb = reinterpret_cast<StrideB*>(p); p += align16(g * sizeof(StrideB));
    r.sd = reinterpret_cast<StrideD*>(p); p += align16(g * sizeof(StrideD));
    r.sc = reinterpret_cast<StrideD*>(p); p += align16(g * sizeof(StrideD));
    r.lsfa = reinterpret_cast<LayoutSFA*>(p); p += align16(g * sizeof(LayoutSFA));
    r.lsfb = reinterpret_cast<LayoutSFB*>(p);
    return r;
  }

  // The SwiGLU forward's arguments (C: the a output, cols: each group's I), or the linear epilogue's.
  static typename GemmKernel::EpilogueArguments epilogue_args(Arrays arr) {
    if constexpr (kSwigluFwd) {
      typename GemmKernel::EpilogueArguments args{};
      args.ptr_C = arr.c;
      args.dC = arr.sc;
      args.ptr_D = arr.d;
      args.dD = arr.sd;
      args.cols = arr.cols;
      return args;
    } else {
      return linear_epilogue_args<typename GemmKernel::EpilogueArguments>(arr.d, arr.sd);
    }
  }

  static typename Gemm::Arguments make_args(Arrays arr, int groups, int device) {
    return typename Gemm::Arguments{cutlass::gemm::GemmUniversalMode::kGrouped,
                                    {groups, arr.shapes, nullptr},
                                    {arr.a, arr.sa, arr.b, arr.sb, arr.sfa, arr.lsfa, arr.sfb, arr.lsfb},
                                    epilogue_args(arr),
                                    hw_info(device)};
  }

  static size_t workspace_bytes(int groups, int device) {
    Arrays dummy{};
    auto args = make_args(dummy, groups, device);
    return arrays_bytes(groups) + align16(Gemm::get_workspace_size(args)) + 256;
  }
};

template <class G>
__global__ void fill_group_args_fp8(typename G::Arrays arr, SegmentList segs) {
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  const GroupAt grp = group_at(segs, g);
  if (grp.s == nullptr) return;
  const MokSegment& s = *grp.s;
  // The SwiGLU forward's segment n is 2I, its GEMM's N the interleaved B's rows.
  const int m = grp.rows > 0 ? grp.rows : 0, n = G::kSwigluFwd ? static_cast<int>(mok_fp8_swiglu_rows(s.n / 2)) : s.n,
            k = s.k;
  arr.shapes[g] = typename G::Shape3(m, n, k);
  auto at = [&](const MokOperand& o) { return grp.at(o); };
  arr.a[g] = static_cast<const typename G::ElementA*>(s.a.base) + at(s.a);
  arr.b[g] = static_cast<const typename G::ElementB*>(s.b.base) + at(s.b);
  arr.d[g] = static_cast<typename G::ElementD*>(s.d.base) + at(s.d);
  arr.sfa[g] = static_cast<const float*>(s.sfa.base) + at(s.sfa);
  arr.sfb[g] = static_cast<const float*>(s.sfb.base) + at(s.sfb);
  arr.c[g] = s.aux.base == nullptr ? nullptr : static_cast<cutlass::bfloat16_t*>(s.aux.base) + at(s.aux);
  arr.cols[g] = s.n / 2;
  arr.sa[g] = stride_with_ld<typename G::StrideA>(s.a.ld);
  arr.sb[g] = stride_with_ld<typename G::StrideB>(s.b.ld);
  arr.sd[g] = stride_with_ld<typename G::StrideD>(s.d.ld);
  arr.sc[g] = stride_with_ld<typename G::StrideD>(s.aux.ld);
  arr.lsfa[g] = G::ScaleConfig::tile_atom_to_shape_SFA(make_shape(m, n, k, 1));
  arr.lsfb[g] = G::ScaleConfig::tile_atom_to_shape_SFB(make_shape(m, n, k, 1));
}

template <class G>
int run_grouped_fp8(const MokSegment* segs, int n_segs, void* workspace, size_t ws_bytes, int device,
                    cudaStream_t stream) {
  if (n_segs < 1 || n_segs > MOK_MAX_SEGMENTS)
    return set_error("n_segs %d not in [1, %d]", n_segs, MOK_MAX_SEGMENTS);
  SegmentList list{};
  list.n = n_segs;
  int groups = 0;
  for (int j = 0; j < n_segs; ++j) {
    const MokSegment& s = segs[j];
    list.s[j] = s;
    groups += s.num_groups;
    if (s.sfa.base == nullptr || s.sfb.base == nullptr)
      return set_error("segment %d: the FP8 kinds need operands sfa and sfb (the block scales)", j);
    if (s.b_up.base != nullptr) return set_error("segment %d: the FP8 kinds have no operand b_up", j);
    if ((s.aux.base != nullptr) != G::kSwigluFwd)
      return set_error(G::kSwigluFwd ? "segment %d: operand aux (the a output) is null"
                                     : "segment %d: operand aux is set but this kind has none", j);
    if (G::kSwigluFwd && (s.n < 16 || s.n % 16 != 0 || s.d.ld % 2 != 0 || s.aux.ld % 2 != 0))
      return set_error("segment %d: the FP8 SwiGLU forward needs n = 2I = %d a positive multiple of 16 and even lds "
                       "of [p | q] and a (%lld, %lld)", j, s.n, static_cast<long long>(s.d.ld),
                       static_cast<long long>(s.aux.ld));
    if (s.rows_dim != 0 || s.k % 128 != 0 || s.k < 128 || s.a.ld % 16 != 0 || s.b.ld % 16 != 0 ||
        s.d.ld % G::AlignD != 0 || s.n % G::AlignD != 0)
      return set_error("segment %d: the FP8 kinds need rows as M, k = %d a positive multiple of 128, A's and B's ld "
                       "multiples of 16 and D's ld and n = %d multiples of %d", j, s.k, s.n, G::AlignD);
    const int kb = s.k / 128;
    if (s.sfa.ld != kb || (s.offsets != nullptr && s.sfa.row_stride != kb) || s.sfb.ld != kb)
      return set_error("segment %d: the scales must be K-major with ld k / 128 = %d (sfa: one row per row of A), got "
                       "sfa ld %lld, row_stride %lld, sfb ld %lld", j, kb, static_cast<long long>(s.sfa.ld),
                       static_cast<long long>(s.sfa.row_stride), static_cast<long long>(s.sfb.ld));
  }
  size_t need = G::workspace_bytes(groups, device);
  if (ws_bytes < need) return set_error("workspace %zu bytes < %zu needed", ws_bytes, need);
  auto arr = G::carve(workspace, groups);
  fill_group_args_fp8<G><<<(groups + 127) / 128, 128, 0, stream>>>(arr, list);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return set_error("fill_group_args_fp8: %s", cudaGetErrorString(err));
  auto args = G::make_args(arr, groups, device);
  return run_cutlass<typename G::Gemm>(args, workspace, G::arrays_bytes(groups), stream, "fp8 grouped gemm");
}

}  // namespace mok

// NAME's entry points (one tile whatever the variant) for D type ED and epilogue EPI (a mok::Fp8Epi).
#define MOK_DEFINE_FP8_KIND(NAME, ED) MOK_DEFINE_FP8_KIND_EPI(NAME, ED, mok::Fp8Epi::kLinear)
#define MOK_DEFINE_FP8_KIND_EPI(NAME, ED, EPI)                                                          \
  namespace mok {                                                                                       \
  size_t NAME##_workspace_bytes(int, int groups, int device) {                                          \
    return GroupedGemmFp8<ED, EPI>::workspace_bytes(groups, device);                                    \
  }                                                                                                     \
  int NAME##_run(int, const MokSegment* segs, int n_segs, void* ws, size_t ws_bytes, int device,        \
                 cudaStream_t stream) {                                                                 \
    return run_grouped_fp8<GroupedGemmFp8<ED, EPI>>(segs, n_segs, ws, ws_bytes, device, stream);        \
  }                                                                                                     \
  }

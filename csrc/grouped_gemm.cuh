// Grouped (ptr-array) bf16 GEMM on sm_90a through CUTLASS 3.x: TMA loads, wgmma, warp-specialised
// persistent kernel, per-group problem sizes, pointers and strides read on the device.
// One instantiation per (layout A, layout B, D type, epilogue). The tile shape is fixed per instantiation and
// never chosen from the problem size, and every output tile is owned by one CTA walking its whole K
// range in order (no split-K, no atomics): results are bitwise reproducible and batch invariant.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/collective/detail.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/dispatch_policy.hpp"
#include "cutlass/gemm/group_array_problem_shape.hpp"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

#include "epilogue_swiglu_bwd.cuh"
#include "epilogue_swiglu_bwd_loaded.cuh"
#include "epilogue_swiglu_fwd.cuh"
#include "epilogue_swiglu_fwd_staged.cuh"
#include "gemm_kinds.h"
#include "mainloop_gate_up.cuh"
#include "mainloop_k_halves.cuh"
#include "mok_fast.h"
#include "mok_status.h"

namespace mok {

using namespace cute;

// The order in which the persistent CTAs walk the output tiles (CUTLASS's group tile scheduler: raster along M
// or N inside each group, swizzle 1/2/4/8). Only which CTA computes which tile changes, never how a tile is
// computed, so every choice gives the same bits. CUTLASS's default (along M, swizzle 1) unless
// MOK_FAST_GEMM_RASTER=M|N or MOK_FAST_GEMM_SWIZZLE=1|2|4|8 say otherwise (a benchmark knob: along N made whole
// steps 19-39% slower); read at each launch. Returns false for any other value. The swizzle is passed on but
// never takes effect: the group scheduler lays the tiles of all groups out as one row, (CTAs, 1), and takes a
// swizzle of 1 for a problem one tile wide.
template <class SchedulerArgs>
inline bool tile_order(SchedulerArgs& sched) {
  using cutlass::gemm::kernel::detail::RasterOrderOptions;
  const char* r = std::getenv("MOK_FAST_GEMM_RASTER");
  if (r != nullptr && *r != 0) {
    if (std::strcmp(r, "N") == 0) sched.raster_order = RasterOrderOptions::AlongN;
    else if (std::strcmp(r, "M") == 0) sched.raster_order = RasterOrderOptions::AlongM;
    else return false;
  }
  const char* z = std::getenv("MOK_FAST_GEMM_SWIZZLE");
  if (z != nullptr && *z != 0) {
    if (std::strlen(z) != 1 || (z[0] != '1' && z[0] != '2' && z[0] != '4' && z[0] != '8')) return false;
    sched.max_swizzle_size = z[0] - '0';
  }
  return true;
}

// The SM count CUTLASS's persistent scheduler sizes its grid by, queried once per device.
inline cutlass::KernelHardwareInfo hw_info(int device) {
  static std::mutex mu;
  static int sms[64] = {0};
  std::lock_guard<std::mutex> lock(mu);
  if (sms[device] == 0) sms[device] = cutlass::KernelHardwareInfo::query_device_multiprocessor_count(device);
  cutlass::KernelHardwareInfo hw;
  hw.device_id = device;
  hw.sm_count = sms[device];
  return hw;
}

// Run one CUTLASS grouped GEMM whose per-group argument arrays take the first `arrays_bytes` of `workspace` (the
// rest, 128-byte aligned, is CUTLASS's own): the tile order of the environment, can_implement, initialize, run.
// 0, or -1 with the error set (`what` names the GEMM in a launch failure).
template <class Gemm>
int run_cutlass(typename Gemm::Arguments& args, void* workspace, size_t arrays_bytes, cudaStream_t stream,
                const char* what) {
  if (!tile_order(args.scheduler))
    return set_error("MOK_FAST_GEMM_RASTER / MOK_FAST_GEMM_SWIZZLE: expected M or N / 1, 2, 4 or 8");
  char* cutlass_ws = static_cast<char*>(workspace) + arrays_bytes;
  cutlass_ws = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(cutlass_ws) + 127) & ~uintptr_t(127));
  Gemm gemm;
  cutlass::Status st = gemm.can_implement(args);
  if (st != cutlass::Status::kSuccess) return set_error("cutlass can_implement: %s", cutlassGetStatusString(st));
  st = gemm.initialize(args, cutlass_ws, stream);
  if (st != cutlass::Status::kSuccess) return set_error("cutlass initialize: %s", cutlassGetStatusString(st));
  st = gemm.run(stream);
  if (st != cutlass::Status::kSuccess) return set_error("cutlass run: %s", cutlassGetStatusString(st));
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return set_error("%s launch: %s", what, cudaGetErrorString(err));
  return 0;
}

// The linear epilogue's arguments (the bf16 and FP8 grouped GEMMs alike): D = the accumulator (alpha 1, beta 0, no
// C), at the per-group pointers `d` with strides `sd`.
template <class EpilogueArguments, class PtrD, class StrideD>
EpilogueArguments linear_epilogue_args(PtrD d, StrideD sd) {
  EpilogueArguments args{};
  args.thread.alpha = 1.0f;
  args.thread.beta = 0.0f;
  args.thread.alpha_ptr = nullptr;
  args.thread.beta_ptr = nullptr;
  args.ptr_C = nullptr;
  args.dC = sd;
  args.ptr_D = d;
  args.dD = sd;
  return args;
}

// Epilogues: D = the accumulator rounded to D's type (CUTLASS's TMA epilogue), the SwiGLU backward of
// it (epilogue_swiglu_bwd.cuh: D bf16 [dg | du], reading C = the fp32 [p | q] the forward kept), or the SwiGLU
// forward (epilogue_swiglu_fwd.cuh, after the paired-B mainloop of mainloop_gate_up.cuh: D fp32 [p | q] and
// C = bf16 a, both written).
enum class Epi { kLinear, kSwigluBwd, kSwigluFwd };

// kKHalves: B's K rows may be two tensors (segment operand b_up; mainloop_k_halves.cuh), for the d_x GEMM.
template <class LayoutA_, class LayoutB_, class ElementD_, class TileShape_, class ClusterShape_,
          class KernelSchedule_, class EpilogueSchedule_, Epi kEpi = Epi::kLinear, bool kKHalves_ = false>
struct GroupedGemm {
  static constexpr bool kKHalves = kKHalves_;
  using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;
  using ElementA = cutlass::bfloat16_t;
  using ElementB = cutlass::bfloat16_t;
  using ElementD = ElementD_;
  using LayoutA = LayoutA_;
  using LayoutB = LayoutB_;
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int AlignA = 8, AlignB = 8;
  static constexpr int AlignD = 128 / cutlass::sizeof_bits<ElementD>::value;

  static constexpr bool kSwigluBwd = kEpi == Epi::kSwigluBwd;
  static constexpr bool kSwigluFwd = kEpi == Epi::kSwigluFwd;
  static constexpr bool kHasAux = kSwigluBwd || kSwigluFwd;  // segments carry operand aux (MokSegment.aux)
  static_assert(!kSwigluBwd || cute::is_same_v<ElementD, cutlass::bfloat16_t>, "the SwiGLU backward writes bf16");
  static_assert(!kSwigluFwd || cute::is_same_v<ElementD, float>, "the SwiGLU forward writes fp32 [p | q]");
  // Operand aux: the fp32 [p | q] the SwiGLU backward reads, or the bf16 a the SwiGLU forward writes.
  using ElementAux = cute::conditional_t<kSwigluFwd, cutlass::bfloat16_t, const float>;
  using LinearEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape_, ClusterShape_,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, LayoutD*, AlignD, ElementD, LayoutD*, AlignD, EpilogueSchedule_,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float, void, float>>::CollectiveOp;
  // The SwiGLU backward: in the ping-pong tiles [p | q] comes through shared memory, copied there by the kernel's
  // epilogue load warp ahead of each tile's epilogue (one warpgroup's epilogue at a time, overlapping the other's
  // mainloop); in the cooperative ones each thread loads it into registers.
  static constexpr bool kPingpongSchedule =
      cute::is_same_v<KernelSchedule_, cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong>;
  static constexpr bool kStagedBwd = kSwigluBwd && kPingpongSchedule;  // the loaded epilogue's TMA stores
  using SwigluEpilogue = cute::conditional_t<
      kPingpongSchedule, SwigluBwdLoadedEpilogueArray<cutlass::detail::TagToStrideC_t<LayoutD*>>,
      cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<
          SwigluBwdEpilogueArray<cutlass::detail::TagToStrideC_t<LayoutD*>>>>;
  // The SwiGLU forward: in the ping-pong tiles staged in shared memory and stored by TMA
  // (epilogue_swiglu_fwd_staged.cuh), in the cooperative ones stored from registers.
  static constexpr bool kStagedFwd = kSwigluFwd && kPingpongSchedule;
  using SwigluFwdEpilogue = cute::conditional_t<
      kPingpongSchedule, StagedAdapter<SwigluFwdStagedEpilogueArray<cutlass::detail::TagToStrideC_t<LayoutD*>>>,
      cutlass::epilogue::collective::detail::Sm90TmaWarpSpecializedAdapter<
          SwigluFwdEpilogueArray<cutlass::detail::TagToStrideC_t<LayoutD*>>>>;
  using CollectiveEpilogue = cute::conditional_t<
      kSwigluBwd, SwigluEpilogue, cute::conditional_t<kSwigluFwd, SwigluFwdEpilogue, LinearEpilogue>>;

  using BuiltMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, LayoutA*, AlignA, ElementB,
      LayoutB*, AlignB, float, TileShape_, ClusterShape_,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      KernelSchedule_>::CollectiveOp;
  static_assert(!(kKHalves && kSwigluFwd), "one mainloop: the gate/up halves or the K halves of B");
  static constexpr bool kBUp = kSwigluFwd || kKHalves;  // segments may carry operand b_up (MokSegment.b_up)
  using CollectiveMainloop = cute::conditional_t<
      kSwigluFwd, GateUpPairMainloop<BuiltMainloop>,
      cute::conditional_t<kKHalves, KHalvesMainloop<BuiltMainloop>, BuiltMainloop>>;

  using GemmKernel =
      cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  // CUTLASS finds an over-full shared memory only at launch ("initialize: Error Internal"); catch it here.
  static_assert(sizeof(typename GemmKernel::SharedStorage) <=
                    cutlass::gemm::collective::detail::sm90_smem_capacity_bytes,
                "the kernel's shared memory exceeds the SM's");
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
  using StrideA = typename GemmKernel::InternalStrideA;
  using StrideB = typename GemmKernel::InternalStrideB;
  using StrideD = typename GemmKernel::InternalStrideD;
  using Shape3 = typename ProblemShape::UnderlyingProblemShape;

  // Device-side argument arrays, carved from the front of the workspace.
  struct Arrays {
    Shape3* shapes;
    const ElementA** a;
    const ElementB** b;
    ElementD** d;
    ElementAux** c;  // operand aux of the SwiGLU epilogues (null for the linear epilogue)
    const ElementB** bu;  // B's second half: the fused gate/up kind's up rows, the d_x kind's K rows [k/2, k)
    StrideA* sa;
    StrideB* sb;
    StrideD* sd;
    StrideD* sc;
  };

  static size_t align16(size_t n) { return (n + 15) & ~size_t(15); }
  static size_t arrays_bytes(int g) {
    return align16(g * sizeof(Shape3)) + 5 * align16(g * sizeof(void*)) +
           align16(g * sizeof(StrideA)) + align16(g * sizeof(StrideB)) +
           2 * align16(g * sizeof(StrideD));
  }
  static Arrays carve(void* ws, int g) {
    char* p = static_cast<char*>(ws);
    Arrays r;
    r.shapes = reinterpret_cast<Shape3*>(p); p += align16(g * sizeof(Shape3));
    r.a = reinterpret_cast<const ElementA**>(p); p += align16(g * sizeof(void*));
    r.b = reinterpret_cast<const ElementB**>(p); p += align16(g * sizeof(void*));
    r.d = reinterpret_cast<ElementD**>(p); p += align16(g * sizeof(void*));
    r.c = reinterpret_cast<ElementAux**>(p); p += align16(g * sizeof(void*));
    r.bu = reinterpret_cast<const ElementB**>(p); p += align16(g * sizeof(void*));
    r.sa = reinterpret_cast<StrideA*>(p); p += align16(g * sizeof(StrideA));
    r.sb = reinterpret_cast<StrideB*>(p); p += align16(g * sizeof(StrideB));
    r.sd = reinterpret_cast<StrideD*>(p); p += align16(g * sizeof(StrideD));
    r.sc = reinterpret_cast<StrideD*>(p);
    return r;
  }

  // CUTLASS's mainloop arguments, with B's second half for the mainloops that read one (kBUp).
  static typename GemmKernel::MainloopArguments mainloop_args(Arrays arr) {
    if constexpr (kBUp) {
      return {{arr.a, arr.sa, arr.b, arr.sb}, arr.bu};
    } else {
      return {arr.a, arr.sa, arr.b, arr.sb};
    }
  }

  // The SwiGLU epilogues' arguments (C: operand aux), or the linear epilogue's D = the accumulator (no C).
  static typename GemmKernel::EpilogueArguments epilogue_args(Arrays arr) {
    if constexpr (kHasAux) {
      typename GemmKernel::EpilogueArguments args{};
      args.ptr_C = arr.c;
      args.dC = arr.sc;
      args.ptr_D = arr.d;
      args.dD = arr.sd;
      return args;  // the staged epilogues' store targets: run_grouped sets them from the segments
    } else {
      return linear_epilogue_args<typename GemmKernel::EpilogueArguments>(arr.d, arr.sd);
    }
  }

  static typename Gemm::Arguments make_args(Arrays arr, int groups, int device) {
    return typename Gemm::Arguments{cutlass::gemm::GemmUniversalMode::kGrouped,
                                    {groups, arr.shapes, nullptr},
                                    mainloop_args(arr),
                                    epilogue_args(arr),
                                    hw_info(device)};
  }

  static size_t workspace_bytes(int groups, int device) {
    Arrays dummy{};
    auto args = make_args(dummy, groups, device);
    return arrays_bytes(groups) + align16(Gemm::get_workspace_size(args)) + 256;
  }
};

// A staged epilogue's store targets (epilogue arguments `epi`): one for each segment (at most kMaxStoreTargets in
// the launch) whose groups are row ranges of one D buffer, and of one aux buffer too when `with_aux`, filled by
// fill(target, segment) and given the consecutive groups it covers. The other segments' tiles store from registers.
template <class EpilogueArguments, class Fill>
inline void set_store_targets(EpilogueArguments& epi, const MokSegment* segs, int n_segs, bool with_aux, Fill fill) {
  auto rows = [](const MokOperand& o) { return o.expert_stride == 0 && o.row_stride == o.ld; };
  int first = 0;
  for (int j = 0; j < n_segs && n_segs <= kMaxStoreTargets; first += segs[j++].num_groups) {
    const MokSegment& s = segs[j];
    if (s.num_groups != 1 && !(rows(s.d) && (!with_aux || rows(s.aux)))) continue;
    auto& t = epi.targets[epi.n_targets++];
    fill(t, s);
    t.first = first;
    t.groups = s.num_groups;
  }
}

// The leading dimension goes into whichever of the first two stride modes is dynamic.
template <class Stride>
__device__ inline Stride stride_with_ld(int64_t ld) {
  Stride s{};
  if constexpr (cute::is_static<cute::remove_cvref_t<decltype(get<0>(s))>>::value) {
    get<1>(s) = ld;
  } else {
    get<0>(s) = ld;
  }
  return s;
}

struct SegmentList {
  MokSegment s[MOK_MAX_SEGMENTS];
  int n;
};

// Group g of a segment list: its segment (null past the last group), the expert e within it, its first row and its
// row count (the segment's offsets, else its fixed rows); at(o) is where the group starts in operand o (elements).
struct GroupAt {
  const MokSegment* s;
  int e;
  int64_t off;
  int rows;
  __device__ int64_t at(const MokOperand& o) const { return o.offset + e * o.expert_stride + off * o.row_stride; }
};

__device__ inline GroupAt group_at(const SegmentList& segs, int g) {
  int e = g, j = 0;
  while (j < segs.n && e >= segs.s[j].num_groups) { e -= segs.s[j].num_groups; ++j; }
  if (j >= segs.n) return GroupAt{nullptr, 0, 0, 0};
  const MokSegment& s = segs.s[j];
  if (s.offsets == nullptr) return GroupAt{&s, e, 0, s.fixed_rows};
  return GroupAt{&s, e, s.offsets[e], s.offsets[e + 1] - s.offsets[e]};
}

template <class G>
__global__ void fill_group_args(typename G::Arrays arr, SegmentList segs) {
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  const GroupAt grp = group_at(segs, g);
  if (grp.s == nullptr) return;
  const MokSegment& s = *grp.s;
  const int rows = grp.rows;
  int m = s.m, n = s.n, k = s.k;
  if (s.rows_dim == 0) m = rows; else k = rows;
  if (rows <= 0) { m = 0; k = (k > 0 ? k : 1); }
  arr.shapes[g] = typename G::Shape3(m, n, k);
  using EA = typename G::ElementA;
  using EB = typename G::ElementB;
  using ED = typename G::ElementD;
  arr.a[g] = static_cast<const EA*>(s.a.base) + grp.at(s.a);
  arr.b[g] = static_cast<const EB*>(s.b.base) + grp.at(s.b);
  // B's second half: b_up's rows, or for the fused gate/up kind with one [gate; up] tensor the n / 2 rows after
  // the gate rows; null otherwise (the d_x kind's B is then b alone).
  arr.bu[g] = s.b_up.base != nullptr ? static_cast<const EB*>(s.b_up.base) + grp.at(s.b_up)
              : G::kSwigluFwd ? arr.b[g] + int64_t(n / 2) * s.b.ld
                              : nullptr;
  arr.d[g] = static_cast<ED*>(s.d.base) + grp.at(s.d);
  using EX = typename G::ElementAux;
  arr.c[g] = s.aux.base == nullptr ? nullptr
             : static_cast<EX*>(s.aux.base) + grp.at(s.aux);
  arr.sa[g] = stride_with_ld<typename G::StrideA>(s.a.ld);
  arr.sb[g] = stride_with_ld<typename G::StrideB>(s.b.ld);
  arr.sd[g] = stride_with_ld<typename G::StrideD>(s.d.ld);
  arr.sc[g] = stride_with_ld<typename G::StrideD>(s.aux.ld);
}

template <class G>
int run_grouped(const MokSegment* segs, int n_segs, void* workspace, size_t ws_bytes, int device,
                cudaStream_t stream) {
  if (n_segs < 1 || n_segs > MOK_MAX_SEGMENTS)
    return set_error("n_segs %d not in [1, %d]", n_segs, MOK_MAX_SEGMENTS);
  SegmentList list{};
  list.n = n_segs;
  int groups = 0;
  for (int j = 0; j < n_segs; ++j) {
    list.s[j] = segs[j];
    groups += segs[j].num_groups;
    if (G::kHasAux && segs[j].aux.base == nullptr)
      return set_error("segment %d: operand aux (%s) is null", j, G::kSwigluFwd ? "the a output" : "the [p | q] input");
    if (!G::kHasAux && segs[j].aux.base != nullptr)
      return set_error("segment %d: operand aux is set but this kind has none", j);
    if (G::kSwigluBwd && (segs[j].n % 8 != 0 || segs[j].aux.ld % 4 != 0 || segs[j].aux.offset % 4 != 0 ||
                          segs[j].aux.expert_stride % 4 != 0 || segs[j].aux.row_stride % 4 != 0 ||
                          reinterpret_cast<uintptr_t>(segs[j].aux.base) % 16 != 0))
      return set_error("segment %d: the SwiGLU backward needs n = %d a multiple of 8 and [p | q] rows 16-byte "
                       "aligned (base, offset, strides and ld in whole 4-float chunks)", j, segs[j].n);
    if (G::kSwigluFwd && (segs[j].rows_dim != 0 || segs[j].n % 16 != 0))
      return set_error("segment %d: n = %d must be a multiple of 16 (gate and up halves of whole 8-column blocks) "
                       "with rows as M", j, segs[j].n);
    if (!G::kBUp && segs[j].b_up.base != nullptr)
      return set_error("segment %d: operand b_up is set but only the fused gate/up and d_x kinds have it", j);
    if (G::kKHalves && segs[j].b_up.base != nullptr && (segs[j].rows_dim != 0 || segs[j].k % 128 != 0))
      return set_error("segment %d: with operand b_up, k = %d must be a multiple of 128 (each half of B whole K "
                       "tiles of 64) with rows as M", j, segs[j].k);
    if (G::kBUp && segs[j].b_up.base != nullptr) {
      const MokOperand &b = segs[j].b, &u = segs[j].b_up;
      const long long apart = static_cast<long long>(reinterpret_cast<intptr_t>(u.base) -
                                                     reinterpret_cast<intptr_t>(b.base)) +
                              2 * (static_cast<long long>(u.offset) - b.offset);  // bytes, bf16 elements
      const long long mag = apart < 0 ? -apart : apart;
      if (u.ld != b.ld || u.expert_stride != b.expert_stride || u.row_stride != b.row_stride || apart == 0 ||
          apart % 16 != 0 || mag >= (1LL << 40))
        return set_error("segment %d: operand b_up (B's second half) must have b's ld, expert_stride and "
                         "row_stride and lie a nonzero whole number of 16 bytes under 2^40 from b; %lld bytes "
                         "apart", j, apart);
    }
  }
  size_t need = G::workspace_bytes(groups, device);
  if (ws_bytes < need) return set_error("workspace %zu bytes < %zu needed", ws_bytes, need);
  auto arr = G::carve(workspace, groups);
  fill_group_args<G><<<(groups + 127) / 128, 128, 0, stream>>>(arr, list);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return set_error("fill_group_args: %s", cudaGetErrorString(err));
  auto args = G::make_args(arr, groups, device);
  if constexpr (G::kStagedFwd) {  // [p | q] (D) and a (aux) row ranges of one buffer each
    set_store_targets(args.epilogue, segs, n_segs, true, [](SwigluFwdStoreTarget& t, const MokSegment& s) {
      t.pq = static_cast<float*>(s.d.base) + s.d.offset;
      t.a = static_cast<cutlass::bfloat16_t*>(s.aux.base) + s.aux.offset;
      t.ld_pq = s.d.ld;
      t.ld_a = s.aux.ld;
      t.I = s.n / 2;
    });
  }
  if constexpr (G::kStagedBwd) {  // [dg | du] (D) row ranges of one buffer
    set_store_targets(args.epilogue, segs, n_segs, false, [](SwigluBwdStoreTarget& t, const MokSegment& s) {
      t.d = static_cast<cutlass::bfloat16_t*>(s.d.base) + s.d.offset;
      t.ld = s.d.ld;
      t.N = s.n;
    });
  }
  return run_cutlass<typename G::Gemm>(args, workspace, G::arrays_bytes(groups), stream, "grouped gemm");
}

// Tile variants (MOK_GEMM_NUM_VARIANTS), each a fixed instantiation; the caller picks one per layer from
// model constants (mok/fast/_tiles.py), never from the token count. All give the same bits:
// every variant walks K in the same order, one CTA per output tile.
//   0: cooperative (two consumer warpgroups share a 128x256x64 tile), no cluster;
//   1: the same in 2x1 clusters (the two CTAs of a cluster share B tiles by TMA multicast);
//   2: ping-pong 128x192x64 (each consumer warpgroup owns a tile, one's epilogue overlaps the other's
//      mainloop) in 2x1 clusters;
//   3: the same without clusters;
//   4: for the weight-gradient kinds (A M-major: K runs over an expert's rows, M and N are model constants),
//      ping-pong 192x128x64 in 1x2 clusters (the two CTAs share A tiles): the same loads and registers a tile as
//      variant 2 with the tile's sides swapped, so an output whose N is a multiple of 256 but not of 192 (2048,
//      4096) and whose M is a multiple of 192 (768, 1536) has no part-empty tiles. Variant 3 for the other kinds.
//   5: for the plain row-tiled kinds with bf16 output (down, d_x), cooperative 256x128x64 in 1x2 clusters (the two
//      CTAs compute two column tiles of the same 256 rows and share the A tiles by TMA multicast): the same stage
//      size and accumulators a thread as variant 0, a third less traffic from L2 a tile. Variant 0 for the others.
using KernelCoop = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
using EpiCoop = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
using KernelPingpong = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
using EpiPingpong = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;

// The fused gate/up + SwiGLU kind shares B in variants 1 and 2 too (mainloop_gate_up.cuh multicasts each CTA's
// share of both half tiles). (A ping-pong 128x128 tile for it, halves of 64, was 1-7% slower end to end on four
// of five shapes.)
template <class LA, class LB, class ED, int V, Epi kEpi = Epi::kLinear, bool kKHalves = false>
struct VariantOf {
  static_assert(V >= 0 && V < MOK_GEMM_NUM_VARIANTS, "tile variant out of range");
  static constexpr bool kWgrad = cute::is_same_v<LA, cutlass::layout::ColumnMajor>;  // A M-major: rows are K
  static constexpr bool kSwapped = V == 4 && kWgrad;
  static constexpr bool kTall = V == 5 && !kWgrad && kEpi == Epi::kLinear && cute::is_same_v<ED, cutlass::bfloat16_t>;
  static constexpr bool kPingpong = V >= 2 && V != 5;
  static constexpr int kClusterM = (V == 1 || V == 2) ? 2 : 1;
  static constexpr int kClusterN = (kSwapped || kTall) ? 2 : 1;
  using Tile = cute::conditional_t<
      kSwapped, Shape<_192, _128, _64>,
      cute::conditional_t<kTall, Shape<_256, _128, _64>,
                          cute::conditional_t<kPingpong, Shape<_128, _192, _64>, Shape<_128, _256, _64>>>>;
  using type = GroupedGemm<LA, LB, ED, Tile, Shape<Int<kClusterM>, Int<kClusterN>, _1>,
                           cute::conditional_t<kPingpong, KernelPingpong, KernelCoop>,
                           cute::conditional_t<kPingpong, EpiPingpong, EpiCoop>, kEpi, kKHalves>;
};
static_assert(MOK_GEMM_NUM_VARIANTS == 6, "gemm_kinds.h: MOK_DEFINE_KIND dispatches variants 0..5");

}  // namespace mok

// One entry point per grouped-GEMM instantiation (each in its own translation unit, so they
// compile in parallel); csrc/gemm_dispatch.cu picks one by MokGemmKind.
#pragma once
#include "mok_fast.h"

namespace mok {
#define MOK_DECLARE_KIND(NAME)                                                                 \
  size_t NAME##_workspace_bytes(int variant, int groups, int device);                          \
  int NAME##_run(int variant, const MokSegment* segs, int n_segs, void* ws, size_t ws_bytes,   \
                 int device, cudaStream_t stream);
MOK_DECLARE_KIND(gemm_tn_f32)
MOK_DECLARE_KIND(gemm_tn_bf16)
MOK_DECLARE_KIND(gemm_nn_f32)
MOK_DECLARE_KIND(gemm_nn_bf16)
MOK_DECLARE_KIND(gemm_tt_f32)
MOK_DECLARE_KIND(gemm_tt_bf16)
MOK_DECLARE_KIND(gemm_nn_swiglu_bwd)
MOK_DECLARE_KIND(gemm_tn_swiglu_fwd)
MOK_DECLARE_KIND(gemm_tt_f32_small)
MOK_DECLARE_KIND(gemm_fp8_tn_f32)
MOK_DECLARE_KIND(gemm_fp8_tn_bf16)
MOK_DECLARE_KIND(gemm_fp8_tn_swiglu_fwd)
#undef MOK_DECLARE_KIND
}  // namespace mok

// NAME's entry points over the tile variants of grouped_gemm.cuh (layouts LA, LB; D type ED; epilogue
// EPI, a mok::Epi; KH: B's K rows may be two tensors); the caller (gemm_dispatch.cu) has checked variant in
// [0, MOK_GEMM_NUM_VARIANTS).
#define MOK_DEFINE_KIND(NAME, LA, LB, ED, EPI) MOK_DEFINE_KIND_KH(NAME, LA, LB, ED, EPI, false)
#define MOK_DEFINE_KIND_KH(NAME, LA, LB, ED, EPI, KH)                                           \
  namespace mok {                                                                               \
  template <int V>                                                                              \
  using NAME##_v = typename VariantOf<LA, LB, ED, V, EPI, KH>::type;                            \
  size_t NAME##_workspace_bytes(int variant, int groups, int device) {                          \
    switch (variant) {                                                                          \
      case 1: return NAME##_v<1>::workspace_bytes(groups, device);                              \
      case 2: return NAME##_v<2>::workspace_bytes(groups, device);                              \
      case 3: return NAME##_v<3>::workspace_bytes(groups, device);                              \
      case 4: return NAME##_v<4>::workspace_bytes(groups, device);                              \
      case 5: return NAME##_v<5>::workspace_bytes(groups, device);                              \
      default: return NAME##_v<0>::workspace_bytes(groups, device);                             \
    }                                                                                           \
  }                                                                                             \
  int NAME##_run(int variant, const MokSegment* segs, int n_segs, void* ws, size_t ws_bytes,    \
                 int device, cudaStream_t stream) {                                             \
    switch (variant) {                                                                          \
      case 1: return run_grouped<NAME##_v<1>>(segs, n_segs, ws, ws_bytes, device, stream);      \
      case 2: return run_grouped<NAME##_v<2>>(segs, n_segs, ws, ws_bytes, device, stream);      \
      case 3: return run_grouped<NAME##_v<3>>(segs, n_segs, ws, ws_bytes, device, stream);      \
      case 4: return run_grouped<NAME##_v<4>>(segs, n_segs, ws, ws_bytes, device, stream);      \
      case 5: return run_grouped<NAME##_v<5>>(segs, n_segs, ws, ws_bytes, device, stream);      \
      default: return run_grouped<NAME##_v<0>>(segs, n_segs, ws, ws_bytes, device, stream);    \
    }                                                                                           \
  }                                                                                             \
  }

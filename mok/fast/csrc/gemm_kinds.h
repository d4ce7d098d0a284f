// One entry point per grouped-GEMM instantiation (each in its own translation unit, so they
// compile in parallel); csrc/gemm_dispatch.cu picks one by MokGemmKind.
#pragma once
#include "mok_fast.h"

namespace mok {
#define MOK_DECLARE_KIND(NAME)                                                              \
  size_t NAME##_workspace_bytes(int groups, int device);                                    \
  int NAME##_run(const MokSegment* segs, int n_segs, void* ws, size_t ws_bytes, int device, \
                 cudaStream_t stream);
MOK_DECLARE_KIND(gemm_tn_f32)
MOK_DECLARE_KIND(gemm_tn_bf16)
MOK_DECLARE_KIND(gemm_nn_f32)
MOK_DECLARE_KIND(gemm_nn_bf16)
MOK_DECLARE_KIND(gemm_tt_f32)
MOK_DECLARE_KIND(gemm_tt_bf16)
#undef MOK_DECLARE_KIND
}  // namespace mok

#define MOK_DEFINE_KIND(NAME, GEMM)                                                         \
  namespace mok {                                                                           \
  size_t NAME##_workspace_bytes(int groups, int device) {                                   \
    return GEMM::workspace_bytes(groups, device);                                           \
  }                                                                                         \
  int NAME##_run(const MokSegment* segs, int n_segs, void* ws, size_t ws_bytes, int device, \
                 cudaStream_t stream) {                                                     \
    return run_grouped<GEMM>(segs, n_segs, ws, ws_bytes, device, stream);                   \
  }                                                                                         \
  }

// C ABI entry points for the grouped GEMMs and the error message store.
#include <cstdarg>
#include <cstdio>

#include "gemm_kinds.h"
#include "mok_fast.h"
#include "mok_status.h"

namespace mok {
static thread_local char g_error[1024] = "";
int set_error(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_error, sizeof(g_error), fmt, ap);
  va_end(ap);
  return 1;
}
}  // namespace mok

extern "C" const char* mok_last_error() { return mok::g_error; }

extern "C" size_t mok_gemm_workspace_bytes(int kind, int variant, int groups, int device) {
  if (variant < 0 || variant >= MOK_GEMM_NUM_VARIANTS) return 0;
  switch (kind) {
    case MOK_GEMM_TN_F32: return mok::gemm_tn_f32_workspace_bytes(variant, groups, device);
    case MOK_GEMM_TN_BF16: return mok::gemm_tn_bf16_workspace_bytes(variant, groups, device);
    case MOK_GEMM_NN_F32: return mok::gemm_nn_f32_workspace_bytes(variant, groups, device);
    case MOK_GEMM_NN_BF16: return mok::gemm_nn_bf16_workspace_bytes(variant, groups, device);
    case MOK_GEMM_TT_F32: return mok::gemm_tt_f32_workspace_bytes(variant, groups, device);
    case MOK_GEMM_TT_BF16: return mok::gemm_tt_bf16_workspace_bytes(variant, groups, device);
    case MOK_GEMM_NN_SWIGLU_BWD: return mok::gemm_nn_swiglu_bwd_workspace_bytes(variant, groups, device);
    case MOK_GEMM_TN_SWIGLU_FWD: return mok::gemm_tn_swiglu_fwd_workspace_bytes(variant, groups, device);
    case MOK_GEMM_TT_F32_SMALL: return mok::gemm_tt_f32_small_workspace_bytes(variant, groups, device);
    case MOK_GEMM_FP8_TN_F32: return mok::gemm_fp8_tn_f32_workspace_bytes(variant, groups, device);
    case MOK_GEMM_FP8_TN_BF16: return mok::gemm_fp8_tn_bf16_workspace_bytes(variant, groups, device);
    case MOK_GEMM_FP8_TN_SWIGLU_FWD: return mok::gemm_fp8_tn_swiglu_fwd_workspace_bytes(variant, groups, device);
    default: return 0;
  }
}

extern "C" int mok_grouped_gemm(int kind, int variant, const MokSegment* segs, int n_segs, void* ws,
                                size_t ws_bytes, int device, cudaStream_t stream) {
  if (variant < 0 || variant >= MOK_GEMM_NUM_VARIANTS)
    return mok::set_error("gemm variant %d not in [0, %d)", variant, MOK_GEMM_NUM_VARIANTS);
  switch (kind) {
    case MOK_GEMM_TN_F32: return mok::gemm_tn_f32_run(variant, segs, n_segs, ws, ws_bytes, device, stream);
    case MOK_GEMM_TN_BF16: return mok::gemm_tn_bf16_run(variant, segs, n_segs, ws, ws_bytes, device, stream);
    case MOK_GEMM_NN_F32: return mok::gemm_nn_f32_run(variant, segs, n_segs, ws, ws_bytes, device, stream);
    case MOK_GEMM_NN_BF16: return mok::gemm_nn_bf16_run(variant, segs, n_segs, ws, ws_bytes, device, stream);
    case MOK_GEMM_TT_F32: return mok::gemm_tt_f32_run(variant, segs, n_segs, ws, ws_bytes, device, stream);
    case MOK_GEMM_TT_BF16: return mok::gemm_tt_bf16_run(variant, segs, n_segs, ws, ws_bytes, device, stream);
    case MOK_GEMM_NN_SWIGLU_BWD:
      return mok::gemm_nn_swiglu_bwd_run(variant, segs, n_segs, ws, ws_bytes, device, stream);
    case MOK_GEMM_TN_SWIGLU_FWD:
      return mok::gemm_tn_swiglu_fwd_run(variant, segs, n_segs, ws, ws_bytes, device, stream);
    case MOK_GEMM_TT_F32_SMALL: return mok::gemm_tt_f32_small_run(variant, segs, n_segs, ws, ws_bytes, device, stream);
    case MOK_GEMM_FP8_TN_F32: return mok::gemm_fp8_tn_f32_run(variant, segs, n_segs, ws, ws_bytes, device, stream);
    case MOK_GEMM_FP8_TN_BF16: return mok::gemm_fp8_tn_bf16_run(variant, segs, n_segs, ws, ws_bytes, device, stream);
    case MOK_GEMM_FP8_TN_SWIGLU_FWD:
      return mok::gemm_fp8_tn_swiglu_fwd_run(variant, segs, n_segs, ws, ws_bytes, device, stream);
    default: return mok::set_error("unknown gemm kind %d", kind);
  }
}

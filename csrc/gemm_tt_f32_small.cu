// Grouped GEMM: A [K,M] row-major (M-major), B [K,N] row-major (N-major), D fp32 [M,N], in a ping-pong 64x128x64
// tile without clusters whatever the variant. The router's weight gradient: its output [E, H] (E ~ 8-256) over a
// reduction of all T tokens makes few of the layer's 128x256 tiles (16 on Qwen3-30B-A3B: 16 of 132 SMs busy, each
// walking 16384 tokens); a quarter-size tile gives four times as many CTAs. The same bits as GEMM_TT_F32: each
// output element is still one warpgroup's accumulator walking K in 64-wide steps in order.
#include "gemm_kinds.h"
#include "grouped_gemm.cuh"

namespace mok {
using TtF32Small = GroupedGemm<cutlass::layout::ColumnMajor, cutlass::layout::RowMajor, float, Shape<_64, _128, _64>,
                               Shape<_1, _1, _1>, KernelPingpong, EpiPingpong>;

size_t gemm_tt_f32_small_workspace_bytes(int, int groups, int device) {
  return TtF32Small::workspace_bytes(groups, device);
}

int gemm_tt_f32_small_run(int, const MokSegment* segs, int n_segs, void* ws, size_t ws_bytes, int device,
                          cudaStream_t stream) {
  return run_grouped<TtF32Small>(segs, n_segs, ws, ws_bytes, device, stream);
}
}  // namespace mok

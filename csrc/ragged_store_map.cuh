// TMA store maps that need no rewrite when a tile is in another group: the staged epilogues
// (epilogue_swiglu_fwd_staged.cuh, epilogue_swiglu_bwd_loaded.cuh) store each output through one "ragged" map per
// segment, built on the host at each launch.
//
// A segment's output is one buffer whose groups are row ranges of it (the routed rows of every expert, or the shared
// expert's T rows). Its map is 3D: dims (cols, kRaggedRows, kRaggedRows), both row strides ld, base kRaggedRows rows
// before row 0 of the buffer. A box of rows [r0, r0 + box_rows) of a group whose rows are [s, s + M) is stored at
// coordinates (c0, kRaggedRows - M + r0, s + M): its address is row s + r0 + i, and the TMA unit drops every row with
// r0 + i >= M, where the second coordinate reaches its dim, and every column past cols.
#pragma once
#include <cuda.h>

#include <cstdint>
#include <cstdio>

#include "cute/arch/copy_sm90_desc.hpp"
#include "cutlass/cuda_host_adapter.hpp"
#include "cutlass/cutlass.h"

namespace mok {

constexpr int64_t kRaggedRows = int64_t(1) << 24;  // the ragged maps' row and group dims (rows of a buffer: fewer)
constexpr int kMaxStoreTargets = 2;                // segments of a launch with a map each: routed, shared

// A ragged map of one output: elements of elem_bytes, row stride ld (elements), cols columns from row0, boxes of
// box_rows x box_cols. False (the caller then stores from registers) where row0 or the row stride is not 16-byte
// aligned or the driver refuses the map; the latter is said once on stderr.
inline bool encode_ragged_store_map(cute::TmaDescriptor& map, void* row0, CUtensorMapDataType type, int elem_bytes,
                                    int64_t ld, int cols, int box_rows, int box_cols, CUtensorMapSwizzle swizzle) {
  const uint64_t below = static_cast<uint64_t>(kRaggedRows) * ld * elem_bytes;
  if (row0 == nullptr || reinterpret_cast<uintptr_t>(row0) % 16 != 0 || (ld * elem_bytes) % 16 != 0 || cols <= 0)
    return false;
  if (reinterpret_cast<uintptr_t>(row0) < below) {
    std::fprintf(stderr, "mok: a staged-store map would start below address 0 (row 0 at %p)\n", row0);
    return false;
  }
  void* base = static_cast<char*>(row0) - below;
  cuuint64_t dims[3] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(kRaggedRows),
                        static_cast<cuuint64_t>(kRaggedRows)};
  cuuint64_t strides[2] = {static_cast<cuuint64_t>(ld * elem_bytes), static_cast<cuuint64_t>(ld * elem_bytes)};
  cuuint32_t box[3] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows), 1};
  cuuint32_t estrides[3] = {1, 1, 1};
  CUresult r = CUTLASS_CUDA_DRIVER_WRAPPER_CALL(cuTensorMapEncodeTiled)(
      &map, type, 3, base, dims, strides, box, estrides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
      CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {  // the launch still runs (register stores); say so once
    static bool said = false;
    if (!said) std::fprintf(stderr, "mok: cuTensorMapEncodeTiled refused a staged-store map (CUresult %d)\n", int(r));
    said = true;
  }
  return r == CUDA_SUCCESS;
}

// A staged epilogue's kernel parameters from its arguments: the base arguments (BaseArguments) and the targets copied,
// and staged[t] = encode(p, t, target t) for each of the n_targets (true: target t's maps are built; else its tiles
// store from registers).
template <class Params, class BaseArguments, class Arguments, class Encode>
inline Params ragged_store_params(Arguments const& args, Encode encode) {
  Params p{};
  static_cast<BaseArguments&>(p) = args;
  p.n_targets = args.n_targets;
  for (int t = 0; t < kMaxStoreTargets; ++t) {
    p.targets[t] = args.targets[t];
    p.staged[t] = t < args.n_targets && encode(p, t, args.targets[t]);
  }
  return p;
}

// Which of the n targets (each with fields first and groups: consecutive groups from group `first`) holds group l;
// -1 if none.
template <class Target>
CUTLASS_HOST_DEVICE int ragged_target_of(Target const* targets, int n, int l) {
  int t = -1;
  CUTLASS_PRAGMA_UNROLL
  for (int i = 0; i < kMaxStoreTargets; ++i)
    if (i < n && l >= targets[i].first && l < targets[i].first + targets[i].groups) t = i;
  return t;
}

// The first row s of a group of M rows whose row 0 is group_row0, in the buffer whose row 0 is buffer_row0 (row
// stride ld elements); -1 where the group is not a whole-row range of it that the map's dims reach.
template <class T>
CUTLASS_DEVICE int64_t ragged_first_row(T const* group_row0, T const* buffer_row0, int64_t ld, int M) {
  const int64_t d = group_row0 - buffer_row0;
  return d >= 0 && d % ld == 0 && d / ld + M < kRaggedRows ? d / ld : -1;
}

// The store coordinates (after the column) of rows [r0, ...) of a group of M rows from buffer row s.
CUTLASS_DEVICE int ragged_y(int M, int r0) { return static_cast<int>(kRaggedRows - M + r0); }
CUTLASS_DEVICE int ragged_z(int64_t s, int M) { return static_cast<int>(s + M); }

}  // namespace mok

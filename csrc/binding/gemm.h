// The grouped GEMMs: Operand, Segment, their checks and the launch.
// Part of the binding's one translation unit (csrc/python_api.cpp includes it; nothing else does).
#pragma once
#include "common.h"

namespace {

// ---------------------------------------------------------------- grouped GEMMs

// One matrix operand (MokOperand, with the tensor instead of its address): group e starts at element
// offset + e * expert_stride + row_offset(e) * row_stride of tensor; leading dimension ld.
struct Operand {
  at::Tensor tensor;
  int64_t expert_stride, row_stride, ld, offset;
};

// A run of groups sharing one formula (MokSegment): the named constructors below make the four kinds the layer uses.
struct Segment {
  int64_t num_groups, rows_dim, m, n, k, fixed_rows;
  std::optional<at::Tensor> offsets;
  Operand a, b, d;
  std::optional<Operand> aux, b_up;
  std::optional<Operand> sfa, sfb;  // the FP8 kinds' block scales
};

bool fused_kind(int64_t kind) {
  return kind == MOK_GEMM_NN_SWIGLU_BWD || kind == MOK_GEMM_TN_SWIGLU_FWD || kind == MOK_GEMM_FP8_TN_SWIGLU_FWD;
}
bool b_up_kind(int64_t kind) { return kind == MOK_GEMM_TN_SWIGLU_FWD || kind == MOK_GEMM_NN_BF16; }
bool fp8_kind(int64_t kind) {
  return kind == MOK_GEMM_FP8_TN_F32 || kind == MOK_GEMM_FP8_TN_BF16 || kind == MOK_GEMM_FP8_TN_SWIGLU_FWD;
}
constexpr int64_t kBUpKTile = 64;  // the d_x kind's K tile (csrc/mainloop_k_halves.cuh)

at::ScalarType d_dtype(int64_t kind) {
  switch (kind) {
    case MOK_GEMM_TN_BF16: case MOK_GEMM_NN_BF16: case MOK_GEMM_TT_BF16: case MOK_GEMM_NN_SWIGLU_BWD:
    case MOK_GEMM_FP8_TN_BF16:
      return at::kBFloat16;
    default: return at::kFloat;
  }
}

// "segments[j]" in a message, formatted only when one is made.
struct Where {
  size_t j;
};
std::ostream& operator<<(std::ostream& o, const Where& w) { return o << "segments[" << w.j << "]"; }

// Stored rows and columns of each operand of a segment of `kind` (M, N, K in the header's sense; rows(e) the
// segment's row count, -1 when it comes from the device's offsets), B's halves when b_up is set.
struct Extents {
  int64_t rows, cols;
};

Extents operand_extents(int64_t kind, const Segment& s, char which) {
  const bool dynamic = s.offsets.has_value();
  const int64_t rows = dynamic ? -1 : s.fixed_rows;
  const int64_t M = s.rows_dim == 0 ? rows : s.m, K = s.rows_dim == 0 ? s.k : rows, N = s.n;
  const bool tn = kind == MOK_GEMM_TN_F32 || kind == MOK_GEMM_TN_BF16 || kind == MOK_GEMM_TN_SWIGLU_FWD || fp8_kind(kind);
  const bool tt = kind == MOK_GEMM_TT_F32 || kind == MOK_GEMM_TT_BF16 || kind == MOK_GEMM_TT_F32_SMALL;
  const bool halves = s.b_up.has_value();
  switch (which) {
    case 'a': return tt ? Extents{K, M} : Extents{M, K};
    case 'b': case 'u':
      if (kind == MOK_GEMM_FP8_TN_SWIGLU_FWD) return {mok_fp8_swiglu_rows(N / 2), K};  // the interleaved [gate; up]
      if (tn) return {halves && kind == MOK_GEMM_TN_SWIGLU_FWD ? N / 2 : N, K};
      return {halves && kind == MOK_GEMM_NN_BF16 && K > 0 ? K / 2 : K, N};
    case 'd': return {M, kind == MOK_GEMM_NN_SWIGLU_BWD ? 2 * N : N};
    case 's': return {M, K / 128};  // sfa: one scale per row and 128 columns of K
    case 't':  // sfb: one per 128x128 block of B [N, K], or per 64 rows and 128 columns of the interleaved B
      if (kind == MOK_GEMM_FP8_TN_SWIGLU_FWD) return {mok_fp8_swiglu_rows(N / 2) / MOK_FP8_SWIGLU_GROUP, K / 128};
      return {(N + 127) / 128, K / 128};
    default: return {M, kind == MOK_GEMM_NN_SWIGLU_BWD ? 2 * N : N / 2};  // aux
  }
}

// ld at least the stored columns, and, where neither the rows nor the start depend on the device's offsets, every
// group's last element inside the tensor.
void check_operand_extent(const Where& where, const char* which, const Operand& op, const Extents& x,
                          int64_t groups, bool dynamic_start) {
  TORCH_CHECK_VALUE(op.offset >= 0 && op.expert_stride >= 0 && op.row_stride >= 0 && op.ld >= 1, where,
                    ": operand ", which, " needs offset, expert_stride, row_stride >= 0 and ld >= 1, got ", op.offset,
                    ", ", op.expert_stride, ", ", op.row_stride, ", ", op.ld);
  if (x.cols <= 0 || x.rows == 0) return;  // nothing stored, or rows that only the device knows (checked below)
  TORCH_CHECK_VALUE(op.ld >= x.cols, where, ": operand ", which, " has rows of ", x.cols,
                    " elements (from m, n, k), so ld must be at least that, got ld = ", op.ld);
  if (x.rows < 0 || dynamic_start) return;
  const int64_t last = op.offset + (groups - 1) * op.expert_stride + (x.rows - 1) * op.ld + x.cols;
  TORCH_CHECK_VALUE(last <= op.tensor.numel(), where, ": operand ", which, " of ", groups, " group(s) of ", x.rows,
                    " x ", x.cols, " elements (offset ", op.offset, ", expert_stride ", op.expert_stride, ", ld ",
                    op.ld, ") ends at element ", last, " of a tensor of ", op.tensor.numel());
}

void check_b_up(int64_t kind, const Segment& s, const Where& where) {
  TORCH_CHECK_VALUE(b_up_kind(kind), where, ": operand b_up is only for GEMM kinds (", int(MOK_GEMM_TN_SWIGLU_FWD),
                    ", ", int(MOK_GEMM_NN_BF16), ") (gate/up + SwiGLU, d_x), got kind ", kind);
  TORCH_CHECK_VALUE(kind != MOK_GEMM_NN_BF16 || s.k % (2 * kBUpKTile) == 0, where, ": with operand b_up, GEMM kind ",
                    kind, "'s k / 2 (the rows of each half of B) must be a multiple of ", kBUpKTile, ", got k = ",
                    s.k);
  const Operand &b = s.b, &u = *s.b_up;
  TORCH_CHECK_VALUE(u.tensor.scalar_type() == b.tensor.scalar_type() && u.ld == b.ld &&
                        u.expert_stride == b.expert_stride && u.row_stride == b.row_stride,
                    where, ": operand b_up must have operand b's dtype, ld, expert_stride and row_stride, got ",
                    dtype_name(u.tensor.scalar_type()), ", ", u.ld, ", ", u.expert_stride, ", ", u.row_stride,
                    " against ", dtype_name(b.tensor.scalar_type()), ", ", b.ld, ", ", b.expert_stride, ", ",
                    b.row_stride);
  const int64_t size = static_cast<int64_t>(b.tensor.element_size());
  for (const auto& [which, op] : {std::pair<const char*, const Operand*>{"b", &b}, {"b_up", &u}}) {
    TORCH_CHECK_VALUE(reinterpret_cast<uintptr_t>(op->tensor.data_ptr()) % 16 == 0 && op->offset * size % 16 == 0,
                      where, ": operand ", which, " must start on a whole number of 16 bytes when b_up is set (one "
                      "tensormap spans both halves)");
  }
  TORCH_CHECK_VALUE(!(u.tensor.data_ptr() == b.tensor.data_ptr() && u.offset == b.offset), where,
                    ": operand b_up must lie a nonzero distance from operand b (the gate rows)");
}

// The device a grouped GEMM call names: `device`, or, given without an index ("cuda"), the first segment's operand
// a's device of that type, as torch's "cuda" names a device the tensors are on. Every operand must be on it.
at::Device named_device(const at::Device& device, const std::vector<Segment*>& segments) {
  const at::Device a_dev = segments[0]->a.tensor.device();
  return device.has_index() || a_dev.type() != device.type() ? device : a_dev;
}

// Checks of a grouped GEMM's arguments (ValueError / TypeError naming the argument), before any launch.
void check_segments(int64_t kind, const std::vector<Segment*>& segments, const at::Device& device, int64_t variant) {
  TORCH_CHECK_VALUE(0 <= kind && kind < MOK_GEMM_NUM_KINDS, "kind: expected a GEMM kind in [0, ", MOK_GEMM_NUM_KINDS,
                    "), got ", kind);
  TORCH_CHECK_VALUE(segments.size() >= 1 && segments.size() <= MOK_MAX_SEGMENTS, "segments: expected 1 to ",
                    MOK_MAX_SEGMENTS, ", got ", segments.size());
  TORCH_CHECK_VALUE(0 <= variant && variant < MOK_GEMM_NUM_VARIANTS, "variant: expected an int in [0, ",
                    MOK_GEMM_NUM_VARIANTS, "), got ", variant);
  const bool fused = fused_kind(kind);
  for (size_t j = 0; j < segments.size(); ++j) {
    const Where where{j};
    TORCH_CHECK_TYPE(segments[j] != nullptr, where, ": expected a Segment, got None");
    const Segment& s = *segments[j];
    TORCH_CHECK_VALUE(s.aux.has_value() == fused, where, ": operand aux must be ", fused ? "given" : "None",
                      " for GEMM kind ", kind, " (only the fused kinds (", int(MOK_GEMM_NN_SWIGLU_BWD), ", ",
                      int(MOK_GEMM_TN_SWIGLU_FWD), ", ", int(MOK_GEMM_FP8_TN_SWIGLU_FWD), ") have it)");
    if (s.b_up) check_b_up(kind, s, where);
    const bool fp8 = fp8_kind(kind);
    TORCH_CHECK_VALUE(s.sfa.has_value() == fp8 && s.sfb.has_value() == fp8, where, ": operands sfa and sfb must be ",
                      fp8 ? "given" : "None", " for GEMM kind ", kind, " (only the FP8 kinds (",
                      int(MOK_GEMM_FP8_TN_F32), ", ", int(MOK_GEMM_FP8_TN_BF16), ", ", int(MOK_GEMM_FP8_TN_SWIGLU_FWD),
                      ") have them)");
    if (fp8) {
      TORCH_CHECK_VALUE(s.rows_dim == 0 && s.k >= 128 && s.k % 128 == 0 && s.a.ld % 16 == 0 && s.b.ld % 16 == 0, where,
                        ": GEMM kind ", kind, " needs rows as M, k a positive multiple of 128 and A's and B's ld "
                        "multiples of 16, got rows_dim ", s.rows_dim, ", k = ", s.k, ", ld ", s.a.ld, " and ", s.b.ld);
      const int64_t kb = s.k / 128;
      TORCH_CHECK_VALUE(s.sfa->ld == kb && s.sfb->ld == kb && (!s.offsets || s.sfa->row_stride == kb), where,
                        ": operands sfa and sfb must be K-major with ld = k / 128 = ", kb, " (sfa one row per row of "
                        "a), got ld ", s.sfa->ld, " (row_stride ", s.sfa->row_stride, ") and ", s.sfb->ld);
      for (const auto& [which, op] : {std::pair<const char*, const Operand*>{"sfa", &*s.sfa}, {"sfb", &*s.sfb}})
        TORCH_CHECK_TYPE(op->tensor.scalar_type() == at::kFloat, where, ": operand ", which, " is torch.float32, got ",
                         dtype_name(op->tensor.scalar_type()));
      if (kind == MOK_GEMM_FP8_TN_SWIGLU_FWD) {  // n = 2I; [p | q] and a stored in pairs of columns (8 and 4 bytes)
        TORCH_CHECK_VALUE(s.n >= 16 && s.n % 16 == 0, where, ": GEMM kind ", kind, " needs n = 2I a positive multiple "
                          "of 16 (I a multiple of 8), got n = ", s.n);
        for (const auto& [which, op] :
             {std::pair<const char*, const Operand*>{"d", &s.d}, {"aux", s.aux ? &*s.aux : nullptr}}) {
          if (op == nullptr) continue;
          TORCH_CHECK_VALUE(op->offset % 2 == 0 && op->expert_stride % 2 == 0 && op->row_stride % 2 == 0 &&
                                op->ld % 2 == 0, where, ": operand ", which, " of GEMM kind ", kind, " needs an even "
                            "offset, expert_stride, row_stride and ld (column pairs stored at once), got ", op->offset,
                            ", ", op->expert_stride, ", ", op->row_stride, ", ", op->ld);
        }
      }
    }
    // (name, operand or nullptr, its key in operand_extents)
    const std::tuple<const char*, const Operand*, char> ops[] = {
        {"a", &s.a, 'a'}, {"b", &s.b, 'b'}, {"d", &s.d, 'd'}, {"aux", s.aux ? &*s.aux : nullptr, 'x'},
        {"b_up", s.b_up ? &*s.b_up : nullptr, 'u'}, {"sfa", s.sfa ? &*s.sfa : nullptr, 's'},
        {"sfb", s.sfb ? &*s.sfb : nullptr, 't'}};
    const at::Device want = named_device(device, segments);
    for (const auto& [which, op, key] : ops) {
      if (op == nullptr) continue;
      TORCH_CHECK_VALUE(op->tensor.device() == want && op->tensor.is_contiguous(), where, ": operand ", which,
                        " must be a contiguous tensor on ", want, ", got one on ", op->tensor.device(),
                        op->tensor.is_contiguous() ? "" : " with strides " + shape(op->tensor.strides()));
    }
    if (fused) {
      const at::ScalarType want_aux = kind == MOK_GEMM_NN_SWIGLU_BWD ? at::kFloat : at::kBFloat16;
      TORCH_CHECK_TYPE(s.d.tensor.scalar_type() == d_dtype(kind) && s.aux->tensor.scalar_type() == want_aux, where,
                       ": GEMM kind ", kind, " takes d and aux of ", dtype_name(d_dtype(kind)), " and ",
                       dtype_name(want_aux), ", got ", dtype_name(s.d.tensor.scalar_type()), " and ",
                       dtype_name(s.aux->tensor.scalar_type()));
    }
    const at::ScalarType want_ab = fp8 ? at::kFloat8_e4m3fn : at::kBFloat16;
    for (const char* which : {"a", "b"}) {
      const at::Tensor& t = (*which == 'a' ? s.a : s.b).tensor;
      TORCH_CHECK_TYPE(t.scalar_type() == want_ab, where, ": operand ", which, " of GEMM kind ", kind, " is ",
                       dtype_name(want_ab), ", got ", dtype_name(t.scalar_type()));
    }
    TORCH_CHECK_TYPE(s.d.tensor.scalar_type() == d_dtype(kind), where, ": operand d of GEMM kind ", kind, " is ",
                     dtype_name(d_dtype(kind)), ", got ", dtype_name(s.d.tensor.scalar_type()));
    TORCH_CHECK_VALUE(s.num_groups >= 1 && s.num_groups <= INT32_MAX, where, ": num_groups must be at least 1, got ",
                      s.num_groups);
    TORCH_CHECK_VALUE(s.rows_dim == 0 || s.rows_dim == 2, where, ": rows_dim must be 0 (rows as M) or 2 (as K), got ",
                      s.rows_dim);
    for (const auto& [name, v] : {std::pair<const char*, int64_t>{"m", s.m}, {"n", s.n}, {"k", s.k},
                                  {"fixed_rows", s.fixed_rows}}) {
      TORCH_CHECK_VALUE(v >= 0 && v <= INT32_MAX, where, ": ", name, " must be in [0, 2^31), got ", v);
    }
    if (s.offsets) {
      const at::Tensor& o = *s.offsets;
      TORCH_CHECK_TYPE(o.scalar_type() == at::kInt, where, ": offsets must be torch.int32, got ",
                       dtype_name(o.scalar_type()));
      TORCH_CHECK_VALUE(o.device() == want && o.is_contiguous() && o.numel() >= s.num_groups + 1, where,
                        ": offsets must be a contiguous tensor on ", want, " of at least num_groups + 1 = ",
                        s.num_groups + 1, " entries, got ", o.numel(), " on ", o.device());
    }
    if (s.fixed_rows == 0 && !s.offsets) continue;  // no rows: nothing is read or written
    for (const auto& [which, op, key] : ops) {
      if (op == nullptr) continue;
      check_operand_extent(where, which, *op, operand_extents(kind, s, key), s.num_groups,
                           s.offsets.has_value() && op->row_stride != 0);
    }
  }
}

std::map<std::tuple<int64_t, int64_t, int64_t, int>, size_t> g_workspace;  // (kind, variant, groups, device)

void launch_gemm(int64_t kind, const std::vector<Segment*>& segments, const at::Device& device, int64_t variant) {
  TORCH_CHECK_VALUE(segments.size() >= 1 && segments.size() <= MOK_MAX_SEGMENTS, "segments: expected 1 to ",
                    MOK_MAX_SEGMENTS, ", got ", segments.size());
  for (size_t j = 0; j < segments.size(); ++j)
    TORCH_CHECK_TYPE(segments[j] != nullptr, Where{j}, ": expected a Segment, got None");
  const at::Device dev = segments[0]->a.tensor.device();
  TORCH_CHECK_VALUE(named_device(device, segments) == dev, "device: expected the operands' device ", dev, ", got ",
                    device);
  Launch l(dev, "segments[0]: operand a");
  MokSegment arr[MOK_MAX_SEGMENTS] = {};
  auto c_operand = [](const std::optional<Operand>& op) {
    return op ? MokOperand{op->tensor.data_ptr(), op->offset, op->expert_stride, op->row_stride, op->ld}
              : MokOperand{};
  };
  int64_t groups = 0;
  for (size_t j = 0; j < segments.size(); ++j) {
    const Segment& s = *segments[j];
    arr[j] = MokSegment{static_cast<int>(s.num_groups), static_cast<int>(s.rows_dim), static_cast<int>(s.fixed_rows),
                        static_cast<int>(s.m), static_cast<int>(s.n), static_cast<int>(s.k),
                        s.offsets ? s.offsets->data_ptr<int>() : nullptr, c_operand(s.a), c_operand(s.b),
                        c_operand(s.d), c_operand(s.aux), c_operand(s.b_up), c_operand(s.sfa), c_operand(s.sfb)};
    groups += s.num_groups;
  }
  const int index = dev.index();
  const auto key = std::make_tuple(kind, variant, groups, index);
  auto it = g_workspace.find(key);
  if (it == g_workspace.end())  // host only, but it asks the device's properties: once per shape
    it = g_workspace.emplace(key, l.k.mok_gemm_workspace_bytes(static_cast<int>(kind), static_cast<int>(variant),
                                                               as_int("groups", groups), index)).first;
  auto ws = empty_on(dev, at::kByte, static_cast<int64_t>(it->second));
  l.done(l.k.mok_grouped_gemm(static_cast<int>(kind), static_cast<int>(variant), arr,
                              static_cast<int>(segments.size()), ws.data_ptr(), it->second, index, l.stream),
         "mok_grouped_gemm");
}

void grouped_gemm(int64_t kind, const std::vector<Segment*>& segments, const at::Device& device, int64_t variant) {
  check_segments(kind, segments, device, variant);
  launch_gemm(kind, segments, device, variant);
}

std::string repr_operand(const Operand& o) {
  return c10::str("Operand(", dtype_name(o.tensor.scalar_type()), " ", shape(o.tensor.sizes()), ", expert_stride=",
                  o.expert_stride, ", row_stride=", o.row_stride, ", ld=", o.ld, ", offset=", o.offset, ")");
}

}  // namespace

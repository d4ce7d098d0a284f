// The layer's kernels: schedule, row gather, SwiGLU, combine, zero_empty, poison, cast_pair_bf16.
// Part of the binding's one translation unit (csrc/python_api.cpp includes it; nothing else does).
#pragma once
#include "common.h"

namespace {

// ---------------------------------------------------------------- schedule and per-row kernels

void schedule(const at::Tensor& topk_idx, int64_t E, int64_t e0, int64_t L, int64_t capacity,
              const at::Tensor& offsets, const at::Tensor& row_pair, const at::Tensor& pair_row,
              const at::Tensor& flag) {
  const auto dev = topk_idx.device();
  check_tensor("topk_idx", topk_idx, at::kLong, dev);
  check_dim("topk_idx", topk_idx, 2, "[T, K]");
  const int64_t T = topk_idx.size(0), K = topk_idx.size(1);
  check_at_least("E", E, 1);
  TORCH_CHECK_VALUE(e0 >= 0 && L >= 1 && e0 + L <= E, "e0, L: expected the local experts [e0, e0 + L) within [0, E) "
                    "= [0, ", E, "), got e0 = ", e0, ", L = ", L);
  check_at_least("capacity", capacity, 0);
  check_tensor("offsets", offsets, at::kInt, dev);
  check_shape("offsets", offsets, {2 * L + 1}, "(2L+1,)", "L local experts");
  check_tensor("row_pair", row_pair, at::kInt, dev);
  TORCH_CHECK_VALUE(row_pair.numel() >= capacity, "row_pair: expected at least capacity = ", capacity,
                    " entries, got ", row_pair.numel());
  check_tensor("pair_row", pair_row, at::kInt, dev);
  check_shape("pair_row", pair_row, {T * K}, "(T*K,)", "topk_idx [T, K]");
  check_flag(flag, dev);
  const int t = as_int("T", T), k = as_int("K", K);
  as_int("T*K", T * K);
  Launch l(dev, "topk_idx");
  auto scratch = empty_on(dev, at::kInt, static_cast<int64_t>(l.k.mok_schedule_scratch_ints(t, k, as_int("L", L))));
  MOK_CALL(l, mok_schedule, topk_idx.data_ptr<int64_t>(), t, k, as_int("E", E), as_int("e0", e0), as_int("L", L),
           as_int("capacity", capacity), offsets.data_ptr<int>(), row_pair.data_ptr<int>(), pair_row.data_ptr<int>(),
           flag.data_ptr<int>(), scratch.data_ptr<int>());
}

void gather_rows(const at::Tensor& x_TH, const at::Tensor& pair_row, int64_t capacity, const at::Tensor& x_RH) {
  const auto dev = x_TH.device();
  check_tensor("x_TH", x_TH, at::kBFloat16, dev);
  check_dim("x_TH", x_TH, 2, "[T, H]");
  const int64_t T = x_TH.size(0), H = x_TH.size(1);
  check_tensor("pair_row", pair_row, at::kInt, dev);
  TORCH_CHECK_VALUE(T == 0 || (pair_row.numel() >= T && pair_row.numel() % T == 0), "pair_row: expected T*K entries "
                    "(K >= 1) for T = ", T, " (x_TH's rows), got ", pair_row.numel());
  check_tensor("x_RH", x_RH, at::kBFloat16, dev);
  check_shape("x_RH", x_RH, {capacity, H}, "(capacity, H)");
  if (T == 0) return;
  Launch l(dev, "x_TH");
  MOK_CALL(l, mok_gather_rows, x_TH.data_ptr(), pair_row.data_ptr<int>(), as_int("T", T),
           as_int("K", pair_row.numel() / T), as_int("H", H), as_int("capacity", capacity), x_RH.data_ptr());
}

// The rows a per-row kernel covers: offsets[L] (rows placed; offsets int32 [>= L+1]) or fixed_rows.
void check_rows(const std::optional<at::Tensor>& offsets, int64_t L, int64_t fixed_rows, int64_t capacity,
                const at::Device& dev) {
  if (offsets) {
    check_at_least("L", L, 0);
    check_offsets(*offsets, L, dev);
  }
  TORCH_CHECK_VALUE(fixed_rows >= 0 && fixed_rows <= capacity, "fixed_rows: expected 0 <= fixed_rows <= capacity = ",
                    capacity, ", got ", fixed_rows);
}

void swiglu_fwd(const at::Tensor& gu, const std::optional<at::Tensor>& offsets, int64_t L, int64_t fixed_rows,
                int64_t I, int64_t capacity, const at::Tensor& a) {
  const auto dev = gu.device();
  check_tensor("gu", gu, at::kFloat, dev);
  check_shape("gu", gu, {capacity, 2 * I}, "(capacity, 2I)");
  check_rows(offsets, L, fixed_rows, capacity, dev);
  check_tensor("a", a, at::kBFloat16, dev);
  check_shape("a", a, {capacity, I}, "(capacity, I)");
  Launch l(dev, "gu");
  MOK_CALL(l, mok_swiglu_fwd, gu.data_ptr<float>(), 2 * I, static_cast<const int*>(ptr(offsets)), as_int("L", L),
           as_int("fixed_rows", fixed_rows), as_int("I", I), as_int("capacity", capacity), a.data_ptr());
}

void swiglu_bwd(const at::Tensor& da, const at::Tensor& pq, const std::optional<at::Tensor>& offsets, int64_t L,
                int64_t fixed_rows, int64_t I, int64_t capacity, const at::Tensor& dgu) {
  const auto dev = pq.device();
  check_tensor("da", da, at::kFloat, dev);
  check_shape("da", da, {capacity, I}, "(capacity, I)");
  check_tensor("pq", pq, at::kFloat, dev);
  check_shape("pq", pq, {capacity, 2 * I}, "(capacity, 2I)");
  check_rows(offsets, L, fixed_rows, capacity, dev);
  check_tensor("dgu", dgu, at::kBFloat16, dev);
  check_shape("dgu", dgu, {capacity, 2 * I}, "(capacity, 2I)");
  Launch l(dev, "pq");
  MOK_CALL(l, mok_swiglu_bwd, da.data_ptr<float>(), pq.data_ptr<float>(), 2 * I,
           static_cast<const int*>(ptr(offsets)), as_int("L", L), as_int("fixed_rows", fixed_rows), as_int("I", I),
           as_int("capacity", capacity), dgu.data_ptr());
}

// The (token, k) pairs' tensors of a combine: topk_weight [T, K] fp32 (K read from it when K < 0), pair_row
// int32 [T*K], flag int32 [1]; returns K.
int64_t check_pairs(const at::Device& dev, int64_t T, int64_t K, const at::Tensor* w_TK, const at::Tensor& pair_row,
                    const at::Tensor& flag) {
  if (w_TK != nullptr) {
    check_tensor("topk_weight", *w_TK, at::kFloat, dev);
    check_dim("topk_weight", *w_TK, 2, "[T, K]");
    K = w_TK->size(1);
    TORCH_CHECK_VALUE(w_TK->size(0) == T, "topk_weight: expected T = ", T, " rows (the token tensor's), got shape ",
                      shape(w_TK->sizes()));
  }
  check_tensor("pair_row", pair_row, at::kInt, dev);
  TORCH_CHECK_VALUE(pair_row.sizes().equals({T * K}), "pair_row: expected shape (T*K,) = (", T * K, ",) for T = ", T,
                    " and K = ", K, ", got ", shape(pair_row.sizes()));
  check_flag(flag, dev);
  return K;
}

// Rows of expert outputs (or their gradients): bf16 [R, H].
void check_rows_RH(const char* name, const at::Tensor& t, int64_t H, const at::Device& dev) {
  check_tensor(name, t, at::kBFloat16, dev);
  TORCH_CHECK_VALUE(t.dim() == 2 && t.size(1) == H, name, ": expected shape (R, H) with H = ", H,
                    " (the token tensor's columns), got ", shape(t.sizes()));
}

void combine_fwd(const std::optional<at::Tensor>& s_TH, const at::Tensor& o_RH, const at::Tensor& w_TK,
                 const at::Tensor& pair_row, const at::Tensor& flag, const at::Tensor& y_TH) {
  const auto dev = y_TH.device();
  check_tensor("y_TH", y_TH, at::kBFloat16, dev);
  check_dim("y_TH", y_TH, 2, "[T, H]");
  const int64_t T = y_TH.size(0), H = y_TH.size(1);
  const int64_t K = check_pairs(dev, T, -1, &w_TK, pair_row, flag);
  check_rows_RH("o_RH", o_RH, H, dev);
  if (s_TH) {
    check_tensor("s_TH", *s_TH, at::kBFloat16, dev);
    check_shape("s_TH", *s_TH, {T, H}, "(T, H)", "y_TH's");
  }
  Launch l(dev, "y_TH");
  MOK_CALL(l, mok_combine_fwd, ptr(s_TH), o_RH.data_ptr(), w_TK.data_ptr<float>(), pair_row.data_ptr<int>(),
           flag.data_ptr<int>(), as_int("T", T), as_int("K", K), as_int("H", H), y_TH.data_ptr());
}

void combine_bwd_pre(const at::Tensor& dy_TH, const at::Tensor& o_RH, const at::Tensor& w_TK,
                     const at::Tensor& pair_row, const at::Tensor& flag, const at::Tensor& d_w_TK,
                     const at::Tensor& go_RH) {
  const auto dev = dy_TH.device();
  check_tensor("dy_TH", dy_TH, at::kBFloat16, dev);
  check_dim("dy_TH", dy_TH, 2, "[T, H]");
  const int64_t T = dy_TH.size(0), H = dy_TH.size(1);
  const int64_t K = check_pairs(dev, T, -1, &w_TK, pair_row, flag);
  check_rows_RH("o_RH", o_RH, H, dev);
  check_tensor("d_w_TK", d_w_TK, at::kFloat, dev);
  check_shape("d_w_TK", d_w_TK, {T, K}, "(T, K)", "topk_weight's");
  check_tensor("go_RH", go_RH, at::kBFloat16, dev);
  TORCH_CHECK_VALUE(go_RH.sizes().equals(o_RH.sizes()), "go_RH: expected o_RH's shape ", shape(o_RH.sizes()),
                    ", got ", shape(go_RH.sizes()));
  Launch l(dev, "dy_TH");
  MOK_CALL(l, mok_combine_bwd_pre, dy_TH.data_ptr(), o_RH.data_ptr(), w_TK.data_ptr<float>(), pair_row.data_ptr<int>(),
           flag.data_ptr<int>(), as_int("T", T), as_int("K", K), as_int("H", H), d_w_TK.data_ptr<float>(),
           go_RH.data_ptr());
}

void combine_bwd_dx(const std::optional<at::Tensor>& dxs_TH, const at::Tensor& dx_RH, const at::Tensor& pair_row,
                    const at::Tensor& flag, int64_t K, const at::Tensor& dx_TH) {
  const auto dev = dx_TH.device();
  check_tensor("dx_TH", dx_TH, at::kBFloat16, dev);
  check_dim("dx_TH", dx_TH, 2, "[T, H]");
  const int64_t T = dx_TH.size(0), H = dx_TH.size(1);
  check_at_least("K", K, 1);
  check_rows_RH("dx_RH", dx_RH, H, dev);
  check_pairs(dev, T, K, nullptr, pair_row, flag);
  if (dxs_TH) {
    check_tensor("dxs_TH", *dxs_TH, at::kBFloat16, dev);
    check_shape("dxs_TH", *dxs_TH, {T, H}, "(T, H)", "dx_TH's");
  }
  Launch l(dev, "dx_TH");
  MOK_CALL(l, mok_combine_bwd_dx, ptr(dxs_TH), dx_RH.data_ptr(), pair_row.data_ptr<int>(), flag.data_ptr<int>(),
           as_int("T", T), as_int("K", K), as_int("H", H), dx_TH.data_ptr());
}

void check_fp32_or_bf16(const char* name, const at::Tensor& t) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16, name,
                   ": expected dtype torch.float32 or torch.bfloat16, got ", dtype_name(t.scalar_type()));
}

void zero_empty(const at::Tensor& d, const at::Tensor& offsets, int64_t L, const at::Tensor& flag) {
  const auto dev = d.device();
  check_fp32_or_bf16("d", d);
  check_tensor("d", d, d.scalar_type(), dev);
  check_at_least("L", L, 1);
  TORCH_CHECK_VALUE(d.dim() >= 1 && d.size(0) == L, "d: expected L = ", L, " expert blocks [L, ...], got shape ",
                    shape(d.sizes()));
  check_offsets(offsets, L, dev);
  check_flag(flag, dev);
  Launch l(dev, "d");
  MOK_CALL(l, mok_zero_empty, d.data_ptr(), offsets.data_ptr<int>(), as_int("L", L),
           d.numel() / L * static_cast<int64_t>(d.element_size()) / 2, flag.data_ptr<int>());
}

void poison(const at::Tensor& t, const at::Tensor& flag) {
  const auto dev = t.device();
  check_fp32_or_bf16("t", t);
  check_tensor("t", t, t.scalar_type(), dev);
  check_flag(flag, dev);
  Launch l(dev, "t");
  MOK_CALL(l, mok_poison, t.data_ptr(), t.numel(), t.scalar_type() == at::kBFloat16 ? 1 : 0, flag.data_ptr<int>());
}

void cast_pair_bf16(const at::Tensor& first, const at::Tensor& second, const at::Tensor& out) {
  const auto dev = out.device();
  check_tensor("first", first, at::kFloat, dev);
  check_tensor("second", second, at::kFloat, dev);
  TORCH_CHECK_VALUE(second.sizes().equals(first.sizes()), "second: expected shape ", shape(first.sizes()),
                    " (first's), got ", shape(second.sizes()));
  TORCH_CHECK_VALUE(first.dim() >= 2, "first: expected at least 2 dims [..., n, H], got shape ",
                    shape(first.sizes()));
  std::vector<int64_t> want(first.sizes().begin(), first.sizes().end());
  const int64_t n = want[want.size() - 2], H = want.back();
  want[want.size() - 2] = 2 * n;
  check_tensor("out", out, at::kBFloat16, dev);
  TORCH_CHECK_VALUE(out.sizes().equals(want), "out: expected shape (..., 2n, H) = ", shape(want), ", got ",
                    shape(out.sizes()));
  Launch l(dev, "out");
  MOK_CALL(l, mok_cast_pair_bf16, first.data_ptr<float>(), second.data_ptr<float>(),
           n * H == 0 ? 0 : first.numel() / (n * H), n * H, out.data_ptr());
}

}  // namespace

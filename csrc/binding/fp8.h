// The FP8 recipe's quantisers (csrc/fp8_quant.cu).
// Part of the binding's one translation unit (csrc/python_api.cpp includes it; nothing else does).
#pragma once
#include "common.h"

namespace {

// ---------------------------------------------------------------- FP8 recipe quantisers (csrc/fp8_quant.cu)

constexpr int64_t kFp8Block = 128;
int64_t blocks_of(int64_t n) { return (n + kFp8Block - 1) / kFp8Block; }

void fp8_quant_rows(const at::Tensor& x, int64_t parts, const std::optional<at::Tensor>& count, const at::Tensor& q,
                    const at::Tensor& scales) {
  const auto dev = x.device();
  check_tensor("x", x, at::kBFloat16, dev);
  check_dim("x", x, 2, "[rows, parts * P]");
  check_at_least("parts", parts, 1);
  const int64_t rows = x.size(0), cols = x.size(1);
  TORCH_CHECK_VALUE(cols >= parts && cols % parts == 0, "parts: expected a divisor of x's ", cols,
                    " columns (parts of P columns each), got ", parts);
  const int64_t P = cols / parts, Pb = blocks_of(P);
  check_tensor("q", q, at::kFloat8_e4m3fn, dev);
  check_shape("q", q, {rows, parts * Pb * kFp8Block}, "(rows, parts * ceil(P/128) * 128)");
  check_tensor("scales", scales, at::kFloat, dev);
  check_shape("scales", scales, {rows, parts * Pb}, "(rows, parts * ceil(P/128))");
  if (count) {
    check_tensor("count", *count, at::kInt, dev);
    TORCH_CHECK_VALUE(count->numel() >= 1, "count: expected at least 1 entry (the rows to quantise), got none");
  }
  Launch l(dev, "x");
  MOK_CALL(l, mok_fp8_quant_rows, x.data_ptr(), cols, as_int("rows", rows), as_int("parts", parts), as_int("P", P),
           count ? count->data_ptr<int>() : nullptr, q.data_ptr(), scales.data_ptr<float>());
}

// An optional output of fp8_quant_blocks: [L, rows, >= off + cols] (without L when the weight has no expert dim).
void check_quant_out(const char* name, const std::optional<at::Tensor>& t, at::ScalarType dtype, const at::Device& dev,
                     const std::vector<int64_t>& lead, int64_t rows, int64_t off, int64_t cols, int64_t align) {
  if (!t) return;
  check_tensor(name, *t, dtype, dev);
  const int64_t nd = static_cast<int64_t>(lead.size()) + 2;
  TORCH_CHECK_VALUE(t->dim() == nd, name, ": expected ", nd, " dimensions, got shape ", shape(t->sizes()));
  for (size_t i = 0; i < lead.size(); ++i)
    TORCH_CHECK_VALUE(t->size(i) == lead[i], name, ": expected ", lead[i], " experts (w's), got shape ",
                      shape(t->sizes()));
  const int64_t ld = t->size(nd - 1);
  TORCH_CHECK_VALUE(t->size(nd - 2) == rows && ld >= off + cols && off % align == 0 && ld % align == 0, name,
                    ": expected ", rows, " rows of at least offset + ", cols, " columns (offset ", off, "; offset "
                    "and row length multiples of ", align, "), got shape ", shape(t->sizes()));
}

void fp8_quant_blocks(const at::Tensor& w, const std::optional<at::Tensor>& q, const std::optional<at::Tensor>& s,
                      const std::optional<at::Tensor>& qT, int64_t off_qT, const std::optional<at::Tensor>& sT,
                      int64_t off_sT) {
  const auto dev = w.device();
  check_tensor("w", w, at::kBFloat16, dev);
  TORCH_CHECK_VALUE(w.dim() == 2 || w.dim() == 3, "w: expected 2 or 3 dimensions [(L,) N, K], got shape ",
                    shape(w.sizes()));
  const int64_t L = w.dim() == 3 ? w.size(0) : 1, N = w.size(-2), K = w.size(-1);
  std::vector<int64_t> lead;
  if (w.dim() == 3) lead.push_back(L);
  const int64_t Nb = blocks_of(N), Kb = blocks_of(K);
  check_at_least("off_qT", off_qT, 0);
  check_at_least("off_sT", off_sT, 0);
  check_quant_out("q", q, at::kFloat8_e4m3fn, dev, lead, N, 0, Kb * kFp8Block, 1);
  if (q) TORCH_CHECK_VALUE(q->size(-1) == Kb * kFp8Block, "q: expected rows of ceil(K/128) * 128 = ",
                           Kb * kFp8Block, " columns, got shape ", shape(q->sizes()));
  check_quant_out("s", s, at::kFloat, dev, lead, Nb, 0, Kb, 1);
  if (s) TORCH_CHECK_VALUE(s->size(-1) == Kb, "s: expected ceil(K/128) = ", Kb, " columns, got shape ",
                           shape(s->sizes()));
  check_quant_out("qT", qT, at::kFloat8_e4m3fn, dev, lead, K, off_qT, Nb * kFp8Block, 16);
  check_quant_out("sT", sT, at::kFloat, dev, lead, Kb, off_sT, Nb, 1);
  TORCH_CHECK_VALUE(L <= 65535 && Nb <= 65535, "w: expected at most 65535 experts and 65535 * 128 rows, got shape ",
                    shape(w.sizes()));
  Launch l(dev, "w");
  MOK_CALL(l, mok_fp8_quant_blocks, w.data_ptr(), as_int("L", L), as_int("N", N), as_int("K", K),
           q ? q->data_ptr() : nullptr, s ? s->data_ptr<float>() : nullptr, qT ? qT->data_ptr() : nullptr,
           qT ? qT->size(-1) : 0, off_qT, sT ? sT->data_ptr<float>() : nullptr, sT ? sT->size(-1) : 0, off_sT);
}

}  // namespace

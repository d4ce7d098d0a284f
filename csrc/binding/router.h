// The router's and the router losses' kernels.
// Part of the binding's one translation unit (csrc/python_api.cpp includes it; nothing else does).
#pragma once
#include "common.h"

namespace {

// ---------------------------------------------------------------- router and losses

void router_topk(const at::Tensor& logits, int64_t E, int64_t K, bool softmax, bool normalize,
                 const at::Tensor& scores, const at::Tensor& topk_idx, const at::Tensor& topk_w) {
  const auto dev = logits.device();
  check_tensor("logits", logits, at::kFloat, dev);
  check_dim("logits", logits, 2, "[T, ld]");
  const int64_t T = logits.size(0), ld = logits.size(1);
  TORCH_CHECK_VALUE(1 <= K && K <= E && E <= ld && E <= MOK_ROUTER_MAX_E, "E, K: expected 1 <= K <= E <= ",
                    MOK_ROUTER_MAX_E, " and E <= logits.shape[1] = ", ld, ", got E = ", E, ", K = ", K);
  check_tensor("scores", scores, at::kFloat, dev);
  check_shape("scores", scores, {T, E}, "(T, E)");
  check_tensor("topk_idx", topk_idx, at::kLong, dev);
  check_shape("topk_idx", topk_idx, {T, K}, "(T, K)");
  check_tensor("topk_w", topk_w, at::kFloat, dev);
  check_shape("topk_w", topk_w, {T, K}, "(T, K)");
  Launch l(dev, "logits");
  MOK_CALL(l, mok_router_topk, logits.data_ptr<float>(), as_int("T", T), as_int("E", E), as_int("ld", ld),
           as_int("K", K), softmax ? 1 : 0, normalize ? 1 : 0, scores.data_ptr<float>(), topk_idx.data_ptr<int64_t>(),
           topk_w.data_ptr<float>());
}

const float* fptr(const std::optional<at::Tensor>& t) { return t ? t->data_ptr<float>() : nullptr; }

void router_bwd(const at::Tensor& scores, const at::Tensor& topk_idx, const std::optional<at::Tensor>& d_w,
                const std::optional<at::Tensor>& d_scores, const std::optional<at::Tensor>& d_logits, bool softmax,
                bool normalize, const at::Tensor& hl) {
  const auto dev = scores.device();
  check_tensor("scores", scores, at::kFloat, dev);
  check_dim("scores", scores, 2, "[T, E]");
  const int64_t T = scores.size(0), E = scores.size(1);
  check_tensor("topk_idx", topk_idx, at::kLong, dev);
  check_dim("topk_idx", topk_idx, 2, "[T, K]");
  const int64_t K = topk_idx.size(1);
  check_shape("topk_idx", topk_idx, {T, K}, "(T, K)", "T: scores' rows");
  const std::tuple<const char*, const std::optional<at::Tensor>*, int64_t, const char*> grads[] = {
      {"d_topk_weight", &d_w, K, "(T, K)"}, {"d_scores", &d_scores, E, "(T, E)"}, {"d_logits", &d_logits, E, "(T, E)"}};
  for (const auto& [name, t, cols, formula] : grads) {
    if (*t) {
      check_tensor(name, **t, at::kFloat, dev);
      check_shape(name, **t, {T, cols}, formula);
    }
  }
  check_tensor("hl", hl, at::kBFloat16, dev);
  TORCH_CHECK_VALUE(hl.dim() == 2 && hl.size(0) == T && hl.size(1) % 2 == 0 && hl.size(1) >= 2 * E,
                    "hl: expected shape (T, 2 * ld_half) with T = ", T, " and ld_half >= E = ", E, ", got ",
                    shape(hl.sizes()));
  Launch l(dev, "scores");
  MOK_CALL(l, mok_router_bwd, scores.data_ptr<float>(), topk_idx.data_ptr<int64_t>(), fptr(d_w), fptr(d_scores),
           fptr(d_logits), as_int("T", T), as_int("E", E), as_int("K", K), softmax ? 1 : 0, normalize ? 1 : 0,
           as_int("ld_half", hl.size(1) / 2), hl.data_ptr());
}

// scores [T, E] (T >= 1), logits [T, E] fp32 and topk_idx [T, K] int64; returns (T, E, K).
std::tuple<int64_t, int64_t, int64_t> check_losses_inputs(const at::Tensor& scores, const at::Tensor& logits,
                                                          const at::Tensor& topk_idx, const at::Device& dev) {
  check_tensor("scores", scores, at::kFloat, dev);
  check_dim("scores", scores, 2, "[T, E]");
  const int64_t T = scores.size(0), E = scores.size(1);
  check_at_least("scores.shape[0] (T)", T, 1);
  check_tensor("logits", logits, at::kFloat, dev);
  check_shape("logits", logits, {T, E}, "(T, E)", "scores'");
  check_tensor("topk_idx", topk_idx, at::kLong, dev);
  check_dim("topk_idx", topk_idx, 2, "[T, K]");
  check_shape("topk_idx", topk_idx, {T, topk_idx.size(1)}, "(T, K)", "T: scores' rows");
  return {T, E, topk_idx.size(1)};
}

void check_scalar(const char* name, const at::Tensor& t, const at::Device& dev) {
  check_tensor(name, t, at::kFloat, dev);
  TORCH_CHECK_VALUE(t.dim() == 0, name, ": expected a scalar tensor, shape (), got ", shape(t.sizes()));
}

void router_losses(const at::Tensor& scores, const at::Tensor& logits, const at::Tensor& topk_idx,
                   bool normalize_rows, const at::Tensor& balance, const at::Tensor& z) {
  const auto dev = scores.device();
  const auto [T, E, K] = check_losses_inputs(scores, logits, topk_idx, dev);
  check_scalar("balance", balance, dev);
  check_scalar("z", z, dev);
  Launch l(dev, "scores");
  const int t = as_int("T", T), e = as_int("E", E);
  auto scratch = empty_on(dev, at::kByte, static_cast<int64_t>(l.k.mok_router_losses_scratch_bytes(t, e)));
  MOK_CALL(l, mok_router_losses, scores.data_ptr<float>(), logits.data_ptr<float>(), topk_idx.data_ptr<int64_t>(), t,
           e, as_int("K", K), normalize_rows ? 1 : 0, scratch.data_ptr(), balance.data_ptr<float>(),
           z.data_ptr<float>());
}

void router_losses_bwd(const at::Tensor& d_balance, const at::Tensor& d_z, const at::Tensor& scores,
                       const at::Tensor& logits, const at::Tensor& topk_idx, bool normalize_rows,
                       const at::Tensor& d_scores, const at::Tensor& d_logits) {
  const auto dev = scores.device();
  check_scalar("d_balance", d_balance, dev);
  check_scalar("d_z", d_z, dev);
  const auto [T, E, K] = check_losses_inputs(scores, logits, topk_idx, dev);
  check_tensor("d_scores", d_scores, at::kFloat, dev);
  check_shape("d_scores", d_scores, {T, E}, "(T, E)", "scores'");
  check_tensor("d_logits", d_logits, at::kFloat, dev);
  check_shape("d_logits", d_logits, {T, E}, "(T, E)", "scores'");
  Launch l(dev, "scores");
  const int t = as_int("T", T), e = as_int("E", E);
  auto scratch = empty_on(dev, at::kByte, static_cast<int64_t>(l.k.mok_router_losses_scratch_bytes(t, e)));
  MOK_CALL(l, mok_router_losses_bwd, d_balance.data_ptr<float>(), d_z.data_ptr<float>(), scores.data_ptr<float>(),
           logits.data_ptr<float>(), topk_idx.data_ptr<int64_t>(), t, e, as_int("K", K), normalize_rows ? 1 : 0,
           scratch.data_ptr(), d_scores.data_ptr<float>(), d_logits.data_ptr<float>());
}

}  // namespace

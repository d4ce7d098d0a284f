// The expert-parallel kernels (csrc/ep.cu).
// Part of the binding's one translation unit (csrc/python_api.cpp includes it; nothing else does).
#pragma once
#include "common.h"

namespace {

// ---------------------------------------------------------------- expert-parallel kernels (csrc/ep.cu)

// A device table of W >= 1 peer pointers (int64 [W]); returns W.
int64_t check_table(const char* name, const at::Tensor& table, const at::Device& dev) {
  check_tensor(name, table, at::kLong, dev);
  TORCH_CHECK_VALUE(table.dim() == 1 && table.numel() >= 1, name, ": expected a 1-d table of W >= 1 pointers, got "
                    "shape ", shape(table.sizes()));
  return table.numel();
}

// A row exchange's local rows (bf16 [capacity, H]) and schedule; returns (capacity, H, W).
std::tuple<int64_t, int64_t, int64_t> check_exchange(const char* name, const at::Tensor& rows,
                                                     const at::Tensor& peers, const at::Tensor& row_pair,
                                                     const at::Tensor& offsets, int64_t L, int64_t per_rank) {
  const auto dev = rows.device();
  check_tensor(name, rows, at::kBFloat16, dev);
  check_dim(name, rows, 2, "[capacity, H]");
  const int64_t W = check_table("peers", peers, dev);
  check_tensor("row_pair", row_pair, at::kInt, dev);
  TORCH_CHECK_VALUE(row_pair.numel() >= rows.size(0), "row_pair: expected at least capacity = ", rows.size(0),
                    " entries (one per row of ", name, "), got ", row_pair.numel());
  check_at_least("L", L, 1);
  check_offsets(offsets, L, dev);
  check_at_least("per_rank", per_rank, 1);
  return {rows.size(0), rows.size(1), W};
}

void ep_gather_rows(const at::Tensor& peers, int64_t per_rank, int64_t div, const at::Tensor& row_pair,
                    const at::Tensor& offsets, int64_t L, const at::Tensor& out) {
  const auto [capacity, H, W] = check_exchange("out", out, peers, row_pair, offsets, L, per_rank);
  check_at_least("div", div, 1);
  Launch l(out.device(), "out");
  MOK_CALL(l, mok_ep_gather_rows, reinterpret_cast<const void* const*>(peers.data_ptr<int64_t>()), as_int("W", W),
           per_rank, as_int("div", div), row_pair.data_ptr<int>(), offsets.data_ptr<int>(), as_int("L", L),
           as_int("H", H), as_int("capacity", capacity), out.data_ptr());
}

void ep_scatter_rows(const at::Tensor& rows, const at::Tensor& row_pair, const at::Tensor& offsets, int64_t L,
                     int64_t per_rank, const at::Tensor& peers) {
  const auto [capacity, H, W] = check_exchange("rows", rows, peers, row_pair, offsets, L, per_rank);
  Launch l(rows.device(), "rows");
  MOK_CALL(l, mok_ep_scatter_rows, rows.data_ptr(), row_pair.data_ptr<int>(), offsets.data_ptr<int>(),
           as_int("L", L), as_int("H", H), as_int("capacity", capacity), as_int("W", W), per_rank,
           reinterpret_cast<void* const*>(peers.data_ptr<int64_t>()));
}

void ep_concat(const at::Tensor& peers, const at::Tensor& out) {
  const auto dev = out.device();
  const int64_t W = check_table("peers", peers, dev);
  check_tensor("out", out, out.scalar_type(), dev);
  const int64_t nbytes = out.numel() * static_cast<int64_t>(out.element_size());
  TORCH_CHECK_VALUE(nbytes % (8 * W) == 0, "out: expected W = ", W, " regions of a multiple of 8 bytes, got ", nbytes,
                    " bytes");
  Launch l(dev, "out");
  MOK_CALL(l, mok_ep_concat, reinterpret_cast<const void* const*>(peers.data_ptr<int64_t>()), as_int("W", W),
           nbytes / W, out.data_ptr());
}

void ep_enable_peer_access(const at::Device& device, const at::Device& peer) {
  TORCH_CHECK_VALUE(device.is_cuda() && device.has_index(), "device: expected a CUDA device with an index, got ",
                    device);
  TORCH_CHECK_VALUE(peer.is_cuda() && peer.has_index(), "peer: expected a CUDA device with an index, got ", peer);
  const Kernels& k = Launch::require_cuda(device, "device");
  if (k.mok_ep_enable_peer_access(device.index(), peer.index()) != 0)
    throw std::runtime_error(std::string("mok.fast ep_enable_peer_access failed: ") + k.mok_last_error());
}

void check_epoch(const at::Tensor& epoch, const at::Device& dev) {
  check_tensor("epoch", epoch, at::kInt, dev);
  check_shape("epoch", epoch, {1}, nullptr);
}

void ep_next_epoch(const at::Tensor& epoch) {
  check_epoch(epoch, epoch.device());
  Launch l(epoch.device(), "epoch");
  MOK_CALL(l, mok_ep_next_epoch, epoch.data_ptr<int>());
}

void ep_signal(const at::Tensor& peer_flags, int64_t phase, int64_t rank, const at::Tensor& epoch) {
  const auto dev = epoch.device();
  const int64_t W = check_table("peer_flags", peer_flags, dev);
  check_epoch(epoch, dev);
  check_at_least("phase", phase, 0);
  TORCH_CHECK_VALUE(rank >= 0 && rank < W, "rank: expected 0 <= rank < W = ", W, " (peer_flags' entries), got ", rank);
  Launch l(dev, "epoch");
  MOK_CALL(l, mok_ep_signal, reinterpret_cast<int* const*>(peer_flags.data_ptr<int64_t>()), as_int("W", W),
           as_int("phase", phase), as_int("rank", rank), epoch.data_ptr<int>());
}

void ep_wait(const at::Tensor& flags, int64_t phase, int64_t rank, const at::Tensor& epoch, double timeout_s) {
  const auto dev = epoch.device();
  check_tensor("flags", flags, at::kInt, dev);
  check_epoch(epoch, dev);
  check_dim("flags", flags, 2, "[phases, W]");
  const int64_t W = flags.size(1);
  TORCH_CHECK_VALUE(phase >= 0 && phase < flags.size(0), "phase: expected 0 <= phase < ", flags.size(0),
                    " (flags' phases), got ", phase);
  TORCH_CHECK_VALUE(rank >= 0 && rank < W, "rank: expected 0 <= rank < W = ", W, " (flags' columns), got ", rank);
  TORCH_CHECK_VALUE(timeout_s >= 0, "timeout_s: expected a value >= 0 (0: no timeout), got ", timeout_s);
  Launch l(dev, "epoch");
  MOK_CALL(l, mok_ep_wait, flags.data_ptr<int>(), as_int("W", W), epoch.data_ptr<int>(),
           static_cast<int64_t>(timeout_s * 1e9), as_int("rank", rank), as_int("phase", phase));
}

}  // namespace

// The typed binding of the fast path's kernels (csrc/mok_fast.h) for Python: a pybind11 module built on first use
// with torch.utils.cpp_extension against the torch that runs it (mok/fast/_build.py), by the C++ compiler alone.
//
// Every function takes tensors as at::Tensor and sizes as named integers, derives what it can from the tensors'
// shapes, and checks dtype, device, shape and contiguity of every tensor, and every integer against the shapes it
// must agree with, before anything else: a TypeError (dtype) or ValueError (the rest) that names the argument and
// gives the expected and the actual value. Only then does it require a CUDA device, resolve the kernels, take the
// device guard and the current stream of the tensors' device, and call the kernel; a nonzero return becomes a
// RuntimeError with the library's message. Nothing synchronises the host.
//
// The kernels library (nvcc-built, C ABI) is opened with dlopen(RTLD_NOW | RTLD_LOCAL) on the first kernel call, at
// the path the Python side's locator returns (building it there if needed), and each entry point is resolved into a
// typed function pointer (decltype of the header's declaration). So this module builds and loads without nvcc, the
// CUDA headers or a GPU when torch has no CUDA (the launch then says so), and its checks run on CPU tensors.
#include <dlfcn.h>

#include <cstdint>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/version.h>
#ifdef MOK_TORCH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "mok_fast.h"

namespace py = pybind11;

namespace {

// ---------------------------------------------------------------- the kernels, resolved by name

#define MOK_ENTRY_POINTS(X)                                                                                        \
  X(mok_last_error) X(mok_gemm_workspace_bytes) X(mok_grouped_gemm) X(mok_schedule_scratch_ints) X(mok_schedule)   \
  X(mok_gather_rows) X(mok_swiglu_fwd) X(mok_combine_fwd) X(mok_combine_bwd_pre) X(mok_swiglu_bwd)                 \
  X(mok_combine_bwd_dx) X(mok_zero_empty) X(mok_poison) X(mok_cast_pair_bf16) X(mok_router_topk) X(mok_router_bwd) \
  X(mok_router_losses_scratch_bytes) X(mok_router_losses) X(mok_router_losses_bwd) X(mok_ep_gather_rows)           \
  X(mok_ep_scatter_rows) X(mok_ep_concat) X(mok_ep_enable_peer_access) X(mok_ep_next_epoch) X(mok_ep_signal)       \
  X(mok_ep_wait) X(mok_fp8_quant_rows) X(mok_fp8_quant_blocks)

struct Kernels {
#define MOK_FIELD(name) decltype(&::name) name = nullptr;
  MOK_ENTRY_POINTS(MOK_FIELD)
#undef MOK_FIELD
};

const Kernels* g_kernels = nullptr;  // set once, never freed (the library stays loaded)
py::object* g_locator = nullptr;     // Python callable () -> str: the kernels library's path (leaked on purpose:
                                     // no Python object may be destroyed after the interpreter)

const Kernels& kernels() {
  if (g_kernels != nullptr) return *g_kernels;
  TORCH_CHECK(g_locator != nullptr, "mok.fast: no kernels library locator set (mok.fast._build.binding sets it)");
  const std::string path = (*g_locator)().cast<std::string>();  // may build the library; its exceptions propagate
  if (g_kernels != nullptr) return *g_kernels;
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);  // never RTLD_GLOBAL: nothing of it joins the process
  TORCH_CHECK(handle != nullptr, "mok.fast: cannot load the kernels library ", path, ": ", dlerror());
  auto* k = new Kernels();
#define MOK_RESOLVE(name)                                                                                         \
  k->name = reinterpret_cast<decltype(&::name)>(dlsym(handle, #name));                                            \
  if (k->name == nullptr) {                                                                                       \
    delete k;                                                                                                     \
    TORCH_CHECK(false, "mok.fast: the kernels library ", path, " lacks ", #name, " (built from other sources: "  \
                "rebuild it, MOK_FAST_REBUILD=1, or point MOK_FAST_LIB at a library of this version)");          \
  }
  MOK_ENTRY_POINTS(MOK_RESOLVE)
#undef MOK_RESOLVE
  g_kernels = k;
  return *g_kernels;
}

// ---------------------------------------------------------------- messages and checks

std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "torch.float32";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kHalf: return "torch.float16";
    case at::kDouble: return "torch.float64";
    case at::kInt: return "torch.int32";
    case at::kLong: return "torch.int64";
    case at::kShort: return "torch.int16";
    case at::kChar: return "torch.int8";
    case at::kByte: return "torch.uint8";
    case at::kBool: return "torch.bool";
    case at::kFloat8_e4m3fn: return "torch.float8_e4m3fn";
    default: return std::string("torch.") + c10::toString(t);
  }
}

std::string shape(at::IntArrayRef s) {  // as Python prints a tuple
  std::ostringstream o;
  o << "(";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << (s.size() == 1 ? ",)" : ")");
  return o.str();
}

// `t`: dtype `dtype`, on `dev` (the call's device: its first tensor's), contiguous.
void check_tensor(const char* name, const at::Tensor& t, at::ScalarType dtype, const at::Device& dev) {
  TORCH_CHECK_TYPE(t.defined(), name, ": expected a tensor, got an undefined one");
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, name, ": expected dtype ", dtype_name(dtype), ", got ",
                   dtype_name(t.scalar_type()));
  TORCH_CHECK_VALUE(t.device() == dev, name, ": expected device ", dev, ", got ", t.device());
  TORCH_CHECK_VALUE(t.is_contiguous(), name, ": expected a contiguous tensor, got strides ", shape(t.strides()),
                    " for shape ", shape(t.sizes()));
}

// `t`'s shape is `want`: `formula` (e.g. "(T*K,)", or nullptr for a fixed shape) in the message, and where its
// sizes come from (`sizes`, or nullptr).
void check_shape(const char* name, const at::Tensor& t, std::initializer_list<int64_t> want, const char* formula,
                 const char* sizes = nullptr) {
  TORCH_CHECK_VALUE(t.sizes().equals(want), name, ": expected shape ", formula ? formula : "", formula ? " = " : "",
                    shape(want), sizes ? " (" : "", sizes ? sizes : "", sizes ? ")" : "", ", got ", shape(t.sizes()));
}

void check_dim(const char* name, const at::Tensor& t, int64_t dim, const char* dims) {
  TORCH_CHECK_VALUE(t.dim() == dim, name, ": expected ", dim, " dimensions ", dims, ", got shape ", shape(t.sizes()));
}

// An integer the C ABI takes as int.
int as_int(const char* name, int64_t v) {
  TORCH_CHECK_VALUE(v >= INT32_MIN && v <= INT32_MAX, name, ": expected a value that fits in 32 bits, got ", v);
  return static_cast<int>(v);
}

void check_at_least(const char* name, int64_t v, int64_t lo) {
  TORCH_CHECK_VALUE(v >= lo, name, ": expected at least ", lo, ", got ", v);
}

// ---------------------------------------------------------------- the launch

// What every kernel call needs once its arguments are checked: a CUDA device (the tensors'), the kernels, that
// device current (the guard) and its current stream.
struct Launch {
  const Kernels& k;
#ifdef MOK_TORCH_CUDA
  c10::cuda::CUDAGuard guard;
#endif
  cudaStream_t stream;

  Launch(const at::Device& dev, const char* what)
      : k(require_cuda(dev, what))
#ifdef MOK_TORCH_CUDA
        , guard(dev), stream(c10::cuda::getCurrentCUDAStream(dev.index()).stream())
#else
        , stream(nullptr)
#endif
  {}

  static const Kernels& require_cuda(const at::Device& dev, const char* what) {
    TORCH_CHECK_VALUE(dev.is_cuda(), what, ": expected a CUDA tensor (mok.fast runs on the GPU), got device ", dev);
#ifndef MOK_TORCH_CUDA
    TORCH_CHECK(false, "mok.fast: this torch (", TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR,
                ") was built without CUDA, so the binding was too");
#endif
    return kernels();
  }

  void done(int rc, const char* fn) const {
    if (rc != 0) throw std::runtime_error(std::string("mok.fast ") + fn + " failed: " + k.mok_last_error());
  }
};

#define MOK_CALL(launch, fn, ...) (launch).done((launch).k.fn(__VA_ARGS__, (launch).stream), #fn)

at::Tensor empty_on(const at::Device& dev, at::ScalarType dtype, int64_t n) {
  return at::empty({n}, at::TensorOptions().dtype(dtype).device(dev));
}

const void* ptr(const std::optional<at::Tensor>& t) { return t ? t->data_ptr() : nullptr; }

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
  check_tensor("flag", flag, at::kInt, dev);
  check_shape("flag", flag, {1}, nullptr);
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
    check_tensor("offsets", *offsets, at::kInt, dev);
    check_at_least("L", L, 0);
    TORCH_CHECK_VALUE(offsets->numel() >= L + 1, "offsets: expected at least L+1 = ", L + 1, " entries (L = ", L,
                      "), got ", offsets->numel());
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
  check_tensor("flag", flag, at::kInt, dev);
  check_shape("flag", flag, {1}, nullptr);
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
  check_tensor("offsets", offsets, at::kInt, dev);
  TORCH_CHECK_VALUE(offsets.numel() >= L + 1, "offsets: expected at least L+1 = ", L + 1, " entries (L = ", L,
                    "), got ", offsets.numel());
  check_tensor("flag", flag, at::kInt, dev);
  check_shape("flag", flag, {1}, nullptr);
  Launch l(dev, "d");
  MOK_CALL(l, mok_zero_empty, d.data_ptr(), offsets.data_ptr<int>(), as_int("L", L),
           d.numel() / L * static_cast<int64_t>(d.element_size()) / 2, flag.data_ptr<int>());
}

void poison(const at::Tensor& t, const at::Tensor& flag) {
  const auto dev = t.device();
  check_fp32_or_bf16("t", t);
  check_tensor("t", t, t.scalar_type(), dev);
  check_tensor("flag", flag, at::kInt, dev);
  check_shape("flag", flag, {1}, nullptr);
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
  check_tensor("offsets", offsets, at::kInt, dev);
  TORCH_CHECK_VALUE(offsets.numel() >= L + 1, "offsets: expected at least L+1 = ", L + 1, " entries (L = ", L,
                    "), got ", offsets.numel());
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

bool fused_kind(int64_t kind) { return kind == MOK_GEMM_NN_SWIGLU_BWD || kind == MOK_GEMM_TN_SWIGLU_FWD; }
bool b_up_kind(int64_t kind) { return kind == MOK_GEMM_TN_SWIGLU_FWD || kind == MOK_GEMM_NN_BF16; }
bool fp8_kind(int64_t kind) { return kind == MOK_GEMM_FP8_TN_F32 || kind == MOK_GEMM_FP8_TN_BF16; }
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
      if (tn) return {halves && kind == MOK_GEMM_TN_SWIGLU_FWD ? N / 2 : N, K};
      return {halves && kind == MOK_GEMM_NN_BF16 && K > 0 ? K / 2 : K, N};
    case 'd': return {M, kind == MOK_GEMM_NN_SWIGLU_BWD ? 2 * N : N};
    case 's': return {M, K / 128};  // sfa: one scale per row and 128 columns of K
    case 't': return {(N + 127) / 128, K / 128};  // sfb: one per 128x128 block of B [N, K]
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
                      int(MOK_GEMM_TN_SWIGLU_FWD), ") have it)");
    if (s.b_up) check_b_up(kind, s, where);
    const bool fp8 = fp8_kind(kind);
    TORCH_CHECK_VALUE(s.sfa.has_value() == fp8 && s.sfb.has_value() == fp8, where, ": operands sfa and sfb must be ",
                      fp8 ? "given" : "None", " for GEMM kind ", kind, " (only the FP8 kinds (",
                      int(MOK_GEMM_FP8_TN_F32), ", ", int(MOK_GEMM_FP8_TN_BF16), ") have them)");
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
    }
    // (name, operand or nullptr, its key in operand_extents)
    const std::tuple<const char*, const Operand*, char> ops[] = {
        {"a", &s.a, 'a'}, {"b", &s.b, 'b'}, {"d", &s.d, 'd'}, {"aux", s.aux ? &*s.aux : nullptr, 'x'},
        {"b_up", s.b_up ? &*s.b_up : nullptr, 'u'}, {"sfa", s.sfa ? &*s.sfa : nullptr, 's'},
        {"sfb", s.sfb ? &*s.sfb : nullptr, 't'}};
    // A device without an index ("cuda") names the first operand's, as the launch takes it: one device for all.
    const at::Device a_dev = segments[0]->a.tensor.device();
    const at::Device want = device.has_index() || a_dev.type() != device.type() ? device : a_dev;
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
      TORCH_CHECK_VALUE(o.device() == device && o.is_contiguous() && o.numel() >= s.num_groups + 1, where,
                        ": offsets must be a contiguous tensor on ", device, " of at least num_groups + 1 = ",
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
  TORCH_CHECK_VALUE(!device.has_index() || device == dev, "device: expected the operands' device ", dev, ", got ",
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

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "mok.fast's typed binding of the kernels (csrc/python_api.cpp)";
  m.attr("TORCH_VERSION") = c10::str(TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR, ".", TORCH_VERSION_PATCH);
  m.attr("MAX_SEGMENTS") = MOK_MAX_SEGMENTS;
  m.attr("ROUTER_MAX_E") = MOK_ROUTER_MAX_E;
  m.attr("NUM_GEMM_VARIANTS") = MOK_GEMM_NUM_VARIANTS;
  py::dict kinds;
#define MOK_KIND(name) kinds[#name] = static_cast<int>(name);
  MOK_KIND(MOK_GEMM_TN_F32) MOK_KIND(MOK_GEMM_TN_BF16) MOK_KIND(MOK_GEMM_NN_F32) MOK_KIND(MOK_GEMM_NN_BF16)
  MOK_KIND(MOK_GEMM_TT_F32) MOK_KIND(MOK_GEMM_TT_BF16) MOK_KIND(MOK_GEMM_NN_SWIGLU_BWD)
  MOK_KIND(MOK_GEMM_TN_SWIGLU_FWD) MOK_KIND(MOK_GEMM_TT_F32_SMALL) MOK_KIND(MOK_GEMM_FP8_TN_F32)
  MOK_KIND(MOK_GEMM_FP8_TN_BF16)
#undef MOK_KIND
  m.attr("GEMM_KINDS") = kinds;
  py::list entry_points;
#define MOK_NAME(name) entry_points.append(#name);
  MOK_ENTRY_POINTS(MOK_NAME)
#undef MOK_NAME
  m.attr("ENTRY_POINTS") = entry_points;

  m.def("set_kernels_locator", [](py::object locate) {
    if (g_locator == nullptr) g_locator = new py::object();
    *g_locator = std::move(locate);
  }, py::arg("locate"), "Set the callable () -> str giving the kernels library's path (called on the first kernel "
     "call).");
  m.def("kernels_loaded", [] { return g_kernels != nullptr; }, "Whether the kernels library is loaded.");
  m.def("load_kernels", [] { kernels(); }, "Load the kernels library now (what the first kernel call does).");

  py::class_<Operand>(m, "Operand", "A grouped GEMM's matrix operand: group e starts at element offset + e * "
                                    "expert_stride + row_offset(e) * row_stride of tensor; leading dimension ld.")
      .def(py::init([](at::Tensor tensor, int64_t expert_stride, int64_t row_stride, int64_t ld, int64_t offset) {
             return Operand{std::move(tensor), expert_stride, row_stride, ld, offset};
           }), py::arg("tensor"), py::arg("expert_stride"), py::arg("row_stride"), py::arg("ld"), py::arg("offset") = 0)
      .def_readonly("tensor", &Operand::tensor)
      .def_readonly("expert_stride", &Operand::expert_stride)
      .def_readonly("row_stride", &Operand::row_stride)
      .def_readonly("ld", &Operand::ld)
      .def_readonly("offset", &Operand::offset)
      .def("__repr__", &repr_operand);

  auto optional_operand = [](const std::optional<Operand>& o) -> py::object {
    return o ? py::cast(*o) : py::none();
  };
  py::class_<Segment>(m, "Segment",
                      "num_groups GEMMs sharing one formula; rows(e) = offsets[e + 1] - offsets[e] (offsets int32, "
                      "on the device) or fixed_rows, the M (rows_dim 0) or the K (rows_dim 2) of each; aux: the "
                      "fused kinds' extra operand; b_up: B's second half as another tensor (csrc/mok_fast.h).")
      .def_static("expert_rows", [](at::Tensor offsets, int64_t groups, int64_t n, int64_t k, const Operand& a,
                                    const Operand& b, const Operand& d, std::optional<Operand> aux,
                                    std::optional<Operand> b_up, std::optional<Operand> sfa,
                                    std::optional<Operand> sfb) {
        return Segment{groups, 0, 0, n, k, 0, std::move(offsets), a, b, d, std::move(aux), std::move(b_up),
                       std::move(sfa), std::move(sfb)};
      }, py::arg("offsets"), py::arg("groups"), py::arg("n"), py::arg("k"), py::arg("a"), py::arg("b"), py::arg("d"),
         py::arg("aux") = py::none(), py::arg("b_up") = py::none(), py::arg("sfa") = py::none(),
         py::arg("sfb") = py::none(),
         "Per-expert GEMM whose M is the expert's routed rows: D_e [rows(e), n] = A_e [rows(e), k] . B_e.")
      .def_static("all_rows", [](int64_t rows, int64_t n, int64_t k, const Operand& a, const Operand& b,
                                 const Operand& d, std::optional<Operand> aux, std::optional<Operand> b_up,
                                 std::optional<Operand> sfa, std::optional<Operand> sfb) {
        return Segment{1, 0, 0, n, k, rows, std::nullopt, a, b, d, std::move(aux), std::move(b_up), std::move(sfa),
                       std::move(sfb)};
      }, py::arg("rows"), py::arg("n"), py::arg("k"), py::arg("a"), py::arg("b"), py::arg("d"),
         py::arg("aux") = py::none(), py::arg("b_up") = py::none(), py::arg("sfa") = py::none(),
         py::arg("sfb") = py::none(),
         "One GEMM over a fixed row count: D [rows, n] = A [rows, k] . B.")
      .def_static("expert_wgrad", [](at::Tensor offsets, int64_t groups, int64_t m, int64_t n, const Operand& a,
                                     const Operand& b, const Operand& d) {
        return Segment{groups, 2, m, n, 0, 0, std::move(offsets), a, b, d, std::nullopt, std::nullopt, std::nullopt,
                       std::nullopt};
      }, py::arg("offsets"), py::arg("groups"), py::arg("m"), py::arg("n"), py::arg("a"), py::arg("b"), py::arg("d"),
         "Per-expert weight gradient reduced over the expert's rows in order: D_e [m, n] = A_e^T B_e.")
      .def_static("all_wgrad", [](int64_t rows, int64_t m, int64_t n, const Operand& a, const Operand& b,
                                  const Operand& d) {
        return Segment{1, 2, m, n, 0, rows, std::nullopt, a, b, d, std::nullopt, std::nullopt, std::nullopt,
                       std::nullopt};
      }, py::arg("rows"), py::arg("m"), py::arg("n"), py::arg("a"), py::arg("b"), py::arg("d"),
         "Weight gradient reduced over a fixed row count in order: D [m, n] = A^T B.")
      .def_readonly("num_groups", &Segment::num_groups)
      .def_readonly("rows_dim", &Segment::rows_dim)
      .def_readonly("m", &Segment::m)
      .def_readonly("n", &Segment::n)
      .def_readonly("k", &Segment::k)
      .def_readonly("fixed_rows", &Segment::fixed_rows)
      .def_readonly("offsets", &Segment::offsets)
      .def_readonly("a", &Segment::a)
      .def_readonly("b", &Segment::b)
      .def_readonly("d", &Segment::d)
      .def_property_readonly("aux", [optional_operand](const Segment& s) { return optional_operand(s.aux); })
      .def_property_readonly("b_up", [optional_operand](const Segment& s) { return optional_operand(s.b_up); })
      .def_property_readonly("sfa", [optional_operand](const Segment& s) { return optional_operand(s.sfa); })
      .def_property_readonly("sfb", [optional_operand](const Segment& s) { return optional_operand(s.sfb); })
      .def("__repr__", [](const Segment& s) {
        return c10::str("Segment(num_groups=", s.num_groups, ", rows_dim=", s.rows_dim, ", m=", s.m, ", n=", s.n,
                        ", k=", s.k, ", fixed_rows=", s.fixed_rows, ", offsets=", s.offsets ? "tensor" : "None",
                        ", a=", repr_operand(s.a), ", b=", repr_operand(s.b), ", d=", repr_operand(s.d), ", aux=",
                        s.aux ? repr_operand(*s.aux) : "None", ", b_up=", s.b_up ? repr_operand(*s.b_up) : "None",
                        ")");
      });

  m.def("check_segments", &check_segments, py::arg("kind"), py::arg("segments"), py::arg("device"),
        py::arg("variant"), "grouped_gemm's checks of its arguments, without a launch.");
  m.def("grouped_gemm", &grouped_gemm, py::arg("kind"), py::arg("segments"), py::arg("device"),
        py::arg("variant") = 0, "One grouped GEMM launch of GEMM kind `kind` over 1 to MAX_SEGMENTS segments, in tile "
        "variant `variant`, on the current stream of `device`.");
  m.def("_grouped_gemm_unchecked", &launch_gemm, py::arg("kind"), py::arg("segments"), py::arg("device"),
        py::arg("variant") = 0, "grouped_gemm without the binding's checks: for tests of the library's own.");

  m.def("schedule", &schedule, py::arg("topk_idx"), py::arg("E"), py::arg("e0"), py::arg("L"), py::arg("capacity"),
        py::arg("offsets"), py::arg("row_pair"), py::arg("pair_row"), py::arg("flag"));
  m.def("gather_rows", &gather_rows, py::arg("x_TH"), py::arg("pair_row"), py::arg("capacity"), py::arg("x_RH"));
  m.def("swiglu_fwd", &swiglu_fwd, py::arg("gu"), py::arg("offsets"), py::arg("L"), py::arg("fixed_rows"),
        py::arg("I"), py::arg("capacity"), py::arg("a"));
  m.def("swiglu_bwd", &swiglu_bwd, py::arg("da"), py::arg("pq"), py::arg("offsets"), py::arg("L"),
        py::arg("fixed_rows"), py::arg("I"), py::arg("capacity"), py::arg("dgu"));
  m.def("combine_fwd", &combine_fwd, py::arg("s_TH"), py::arg("o_RH"), py::arg("w_TK"), py::arg("pair_row"),
        py::arg("flag"), py::arg("y_TH"));
  m.def("combine_bwd_pre", &combine_bwd_pre, py::arg("dy_TH"), py::arg("o_RH"), py::arg("w_TK"), py::arg("pair_row"),
        py::arg("flag"), py::arg("d_w_TK"), py::arg("go_RH"));
  m.def("combine_bwd_dx", &combine_bwd_dx, py::arg("dxs_TH"), py::arg("dx_RH"), py::arg("pair_row"), py::arg("flag"),
        py::arg("K"), py::arg("dx_TH"));
  m.def("zero_empty", &zero_empty, py::arg("d"), py::arg("offsets"), py::arg("L"), py::arg("flag"));
  m.def("poison", &poison, py::arg("t"), py::arg("flag"));
  m.def("cast_pair_bf16", &cast_pair_bf16, py::arg("first"), py::arg("second"), py::arg("out"));
  m.def("fp8_quant_rows", &fp8_quant_rows, py::arg("x"), py::arg("parts"), py::arg("count"), py::arg("q"),
        py::arg("scales"), "The FP8 recipe's activations: each row's `parts` parts of x quantised in 1x128 blocks "
        "(csrc/mok_fast.h, mok_fp8_quant_rows); count: int32, its first entry the rows to quantise, or None (all).");
  m.def("fp8_quant_blocks", &fp8_quant_blocks, py::arg("w"), py::arg("q"), py::arg("s"), py::arg("qT"),
        py::arg("off_qT"), py::arg("sT"), py::arg("off_sT"), "The FP8 recipe's weights in 128x128 blocks, and the "
        "transpose's quantisation at column offsets (csrc/mok_fast.h, mok_fp8_quant_blocks); any output may be None.");
  m.def("router_topk", &router_topk, py::arg("logits"), py::arg("E"), py::arg("K"), py::arg("softmax"),
        py::arg("normalize"), py::arg("scores"), py::arg("topk_idx"), py::arg("topk_w"));
  m.def("router_bwd", &router_bwd, py::arg("scores"), py::arg("topk_idx"), py::arg("d_w"), py::arg("d_scores"),
        py::arg("d_logits"), py::arg("softmax"), py::arg("normalize"), py::arg("hl"));
  m.def("router_losses", &router_losses, py::arg("scores"), py::arg("logits"), py::arg("topk_idx"),
        py::arg("normalize_rows"), py::arg("balance"), py::arg("z"));
  m.def("router_losses_bwd", &router_losses_bwd, py::arg("d_balance"), py::arg("d_z"), py::arg("scores"),
        py::arg("logits"), py::arg("topk_idx"), py::arg("normalize_rows"), py::arg("d_scores"), py::arg("d_logits"));
  m.def("ep_gather_rows", &ep_gather_rows, py::arg("peers"), py::arg("per_rank"), py::arg("div"), py::arg("row_pair"),
        py::arg("offsets"), py::arg("L"), py::arg("out"));
  m.def("ep_scatter_rows", &ep_scatter_rows, py::arg("rows"), py::arg("row_pair"), py::arg("offsets"), py::arg("L"),
        py::arg("per_rank"), py::arg("peers"));
  m.def("ep_concat", &ep_concat, py::arg("peers"), py::arg("out"));
  m.def("ep_enable_peer_access", &ep_enable_peer_access, py::arg("device"), py::arg("peer"));
  m.def("ep_next_epoch", &ep_next_epoch, py::arg("epoch"));
  m.def("ep_signal", &ep_signal, py::arg("peer_flags"), py::arg("phase"), py::arg("rank"), py::arg("epoch"));
  m.def("ep_wait", &ep_wait, py::arg("flags"), py::arg("phase"), py::arg("rank"), py::arg("epoch"),
        py::arg("timeout_s"));
}

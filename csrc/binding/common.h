// The binding's shared pieces: the kernels library resolved by name, the messages and checks every function
// uses, and the launch (device guard, current stream).
// Part of the binding's one translation unit (csrc/python_api.cpp includes it; nothing else does).
#pragma once
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

// The device-side error flag every layer kernel reads or raises: int32 [1].
void check_flag(const at::Tensor& flag, const at::Device& dev) {
  check_tensor("flag", flag, at::kInt, dev);
  check_shape("flag", flag, {1}, nullptr);
}

// A schedule's offsets read for L local experts: int32 with at least L+1 entries.
void check_offsets(const at::Tensor& offsets, int64_t L, const at::Device& dev) {
  check_tensor("offsets", offsets, at::kInt, dev);
  TORCH_CHECK_VALUE(offsets.numel() >= L + 1, "offsets: expected at least L+1 = ", L + 1, " entries (L = ", L,
                    "), got ", offsets.numel());
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

}  // namespace

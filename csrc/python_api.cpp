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
//
// One translation unit: the functions live in csrc/binding/ by job (common.h, layer.h, router.h, ep.h, fp8.h,
// gemm.h); this file is the module's table of them.
#include "binding/common.h"
#include "binding/layer.h"
#include "binding/router.h"
#include "binding/ep.h"
#include "binding/fp8.h"
#include "binding/gemm.h"

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
  MOK_KIND(MOK_GEMM_FP8_TN_BF16) MOK_KIND(MOK_GEMM_FP8_TN_SWIGLU_FWD)
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

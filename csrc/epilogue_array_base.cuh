// What the SwiGLU epilogues share: the interface of CUTLASS's DefaultEpilogueArray (types, per-group C and D pointers
// and strides, no workspace). The two operator-style ones (epilogue_swiglu_bwd.cuh, epilogue_swiglu_fwd.cuh) run
// through Sm90TmaWarpSpecializedAdapter and add their constructor, is_source_needed() and operator(), which turns a
// consumer thread's accumulator fragment into outputs stored from registers; epilogue_swiglu_bwd_loaded.cuh adds the
// rest of a collective epilogue itself (its load warp's pipeline and shared memory).
#pragma once
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/cuda_host_adapter.hpp"
#include "cutlass/epilogue/dispatch_policy.hpp"

namespace mok {

// StrideCD_: pointer to the per-group row-major stride (ld, _1, _0); PtrC_: ElementC_, const when C is an input.
template <class StrideCD_, class ElementC_, class ElementD_, class PtrC_ = ElementC_>
struct EpilogueArrayBase {
  using EpilogueSchedule = cutlass::epilogue::PtrArrayNoSmemWarpSpecialized;
  using DispatchPolicy = EpilogueSchedule;
  using ElementAccumulator = float;
  using ElementCompute = float;
  using ElementScalar = float;
  using ElementC = ElementC_;
  using ElementD = ElementD_;
  using ElementOutput = ElementD;
  using StrideC = StrideCD_;
  using StrideD = StrideCD_;
  using InternalStrideC = cute::remove_pointer_t<StrideC>;
  using InternalStrideD = cute::remove_pointer_t<StrideD>;
  using GmemTiledCopyC = void;
  using GmemTiledCopyD = void;
  struct SharedStorage {};
  using TensorMapStorage = SharedStorage;
  // Named by CUTLASS's device adapter (GemmUniversalAdapter::EpilogueOutputOp); the math is the epilogue's operator().
  struct ThreadEpilogueOp {
    using ElementOutput = ElementD_;
    using ElementAccumulator = float;
    using ElementCompute = float;
  };

  struct Arguments {
    PtrC_** ptr_C = nullptr;     // per group, row 0 (what C is: see the epilogue)
    StrideC dC{};
    ElementD** ptr_D = nullptr;  // per group, row 0
    StrideD dD{};
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&, int) { return 0; }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              cutlass::CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const& args) {
    return args.ptr_C != nullptr && args.ptr_D != nullptr;
  }
};

}  // namespace mok

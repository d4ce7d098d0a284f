// The per-SM tensormaps of the ptr-array mainloops that load B through a TMA of their own (mainloop_gate_up.cuh,
// mainloop_k_halves.cuh): CUTLASS's steps, with the caller's TMAs and tensors. At the start the kernel-wide
// descriptors of A and B are copied into shared memory; for each new group one thread replaces their addresses and
// then their dims and strides.
#pragma once
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"

namespace mok {

// The CTA's tensormaps in global memory (A's at sm_idx, B's sm_count further), with shared memory holding copies of
// tma_a's and tma_b's descriptors.
template <class TmaA, class TmaB, class TensorMapStorage>
CUTLASS_DEVICE auto tensormaps_init_ab(TmaA const& tma_a, TmaB const& tma_b, void* tensormaps,
                                       TensorMapStorage& shared_tensormaps, int32_t sm_count, int32_t sm_idx) {
  using namespace cute;
  cute::TmaDescriptor* gmem_tensormap = reinterpret_cast<cute::TmaDescriptor*>(tensormaps);
  cute::TmaDescriptor* tma_desc_a = &gmem_tensormap[sm_idx];
  cute::TmaDescriptor* tma_desc_b = &gmem_tensormap[sm_idx + sm_count];
  if (cute::elect_one_sync()) {
    Tensor pA = make_tensor(tma_a.get_tma_descriptor(), Int<1>{}, Int<1>{});
    Tensor sA = make_tensor(make_smem_ptr(&shared_tensormaps.smem_tensormap_A), Int<1>{}, Int<1>{});
    Tensor pB = make_tensor(tma_b.get_tma_descriptor(), Int<1>{}, Int<1>{});
    Tensor sB = make_tensor(make_smem_ptr(&shared_tensormaps.smem_tensormap_B), Int<1>{}, Int<1>{});
    copy(recast<uint128_t>(pA), recast<uint128_t>(sA));
    copy(recast<uint128_t>(pB), recast<uint128_t>(sB));
  }
  __syncwarp();
  return cute::make_tuple(tma_desc_a, tma_desc_b);
}

// One thread, for a new group: first the shared-memory descriptors of A and B address a and b ...
template <class TensorMapStorage>
CUTLASS_DEVICE void tensormaps_replace_addr_ab(TensorMapStorage& shared_tensormaps, void const* a, void const* b) {
  cute::tma_descriptor_replace_addr_in_shared_mem(shared_tensormaps.smem_tensormap_A, a);
  cute::tma_descriptor_replace_addr_in_shared_mem(shared_tensormaps.smem_tensormap_B, b);
}

// ... then they take the dims and strides of tensor_a and tensor_b (element strides, of EA and EB, turned into bytes).
template <class EA, class EB, class TensorMapStorage, class TmaA, class TensorA, class TmaB, class TensorB>
CUTLASS_DEVICE void tensormaps_replace_dims_ab(TensorMapStorage& shared_tensormaps, TmaA const& tma_a,
                                               TensorA const& tensor_a, TmaB const& tma_b, TensorB const& tensor_b) {
  cute::array<uint32_t, 5> shape_a = {1, 1, 1, 1, 1}, shape_b = {1, 1, 1, 1, 1};
  cute::array<uint64_t, 5> stride_a = {0, 0, 0, 0, 0}, stride_b = {0, 0, 0, 0, 0};
  cute::detail::fill_tma_gmem_shape_stride(tma_a, tensor_a, shape_a, stride_a);
  cute::detail::fill_tma_gmem_shape_stride(tma_b, tensor_b, shape_b, stride_b);
  for (uint64_t& s : stride_a) s = (s * cute::sizeof_bits_v<EA>) / 8;
  for (uint64_t& s : stride_b) s = (s * cute::sizeof_bits_v<EB>) / 8;
  cute::tma_descriptor_replace_dims_strides_in_shared_mem(shared_tensormaps.smem_tensormap_A, shape_a, stride_a);
  cute::tma_descriptor_replace_dims_strides_in_shared_mem(shared_tensormaps.smem_tensormap_B, shape_b, stride_b);
}

}  // namespace mok

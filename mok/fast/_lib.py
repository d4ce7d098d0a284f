"""The fast path's kernels as Python calls them: every name not defined here is the typed binding's
(csrc/python_api.cpp, built on first access by `_build.binding`, PEP 562), which takes tensors and named integers,
checks them in C++ (TypeError / ValueError naming the argument), and launches on the current stream of the tensors'
device with that device set, never synchronising the host:

  grouped GEMMs   Operand, Segment (.expert_rows, .all_rows, .expert_wgrad, .all_wgrad), grouped_gemm,
                  check_segments (its checks alone), _grouped_gemm_unchecked (tests of the library's own checks)
  the layer       schedule, gather_rows, swiglu_fwd, swiglu_bwd, combine_fwd, combine_bwd_pre, combine_bwd_dx,
                  zero_empty, poison, cast_pair_bf16
  FP8 recipe      fp8_quant_rows, fp8_quant_blocks (the quantisers; GEMM_FP8_* kinds take segment operands sfa, sfb)
  the router      router_topk, router_bwd, router_losses, router_losses_bwd
  expert parallel ep_gather_rows, ep_scatter_rows, ep_concat, ep_enable_peer_access, ep_next_epoch, ep_signal,
                  ep_wait

Defined here: the GEMM kinds and limits of csrc/mok_fast.h, which the tile rules (_tiles.py) read without building
anything (tests/fast/test_binding.py checks them against the binding's), and `offsets_from_counts`.
"""
from __future__ import annotations

import torch

from . import _build

(GEMM_TN_F32, GEMM_TN_BF16, GEMM_NN_F32, GEMM_NN_BF16, GEMM_TT_F32, GEMM_TT_BF16, GEMM_NN_SWIGLU_BWD,
 GEMM_TN_SWIGLU_FWD, GEMM_TT_F32_SMALL, GEMM_FP8_TN_F32, GEMM_FP8_TN_BF16, GEMM_FP8_TN_SWIGLU_FWD) = range(12)
GEMM_KINDS = {"MOK_GEMM_TN_F32": GEMM_TN_F32, "MOK_GEMM_TN_BF16": GEMM_TN_BF16, "MOK_GEMM_NN_F32": GEMM_NN_F32,
              "MOK_GEMM_NN_BF16": GEMM_NN_BF16, "MOK_GEMM_TT_F32": GEMM_TT_F32, "MOK_GEMM_TT_BF16": GEMM_TT_BF16,
              "MOK_GEMM_NN_SWIGLU_BWD": GEMM_NN_SWIGLU_BWD, "MOK_GEMM_TN_SWIGLU_FWD": GEMM_TN_SWIGLU_FWD,
              "MOK_GEMM_TT_F32_SMALL": GEMM_TT_F32_SMALL, "MOK_GEMM_FP8_TN_F32": GEMM_FP8_TN_F32,
              "MOK_GEMM_FP8_TN_BF16": GEMM_FP8_TN_BF16, "MOK_GEMM_FP8_TN_SWIGLU_FWD": GEMM_FP8_TN_SWIGLU_FWD}
# the last kinds; one tile each, whatever the variant
GEMM_FP8_KINDS = (GEMM_FP8_TN_F32, GEMM_FP8_TN_BF16, GEMM_FP8_TN_SWIGLU_FWD)
MAX_SEGMENTS = 4
ROUTER_MAX_E = 8192
NUM_GEMM_VARIANTS = 6  # tile variants of every kind (csrc/grouped_gemm.cuh; chosen in _tiles.py)


def __getattr__(name: str):
    """The binding's `name` (built on first use), kept in this module's namespace so later lookups are plain."""
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        value = getattr(_build.binding(), name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def offsets_from_counts(counts_G: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The offsets array [2G + 1] int32 that Segment.expert_rows and Segment.expert_wgrad read, on `device`, for G
    groups of counts_G [G] (any integer dtype) rows laid end to end: entries 0 … G the first row of each group (entry
    G the total), entries G + 1 … 2G the rows of each. What the schedule kernels write for routed experts; for callers
    that choose the group sizes themselves (benchmarks, tests)."""
    if counts_G.dim() != 1 or counts_G.is_floating_point() or bool((counts_G < 0).any()):
        raise ValueError(f"counts_G: expected a 1-D tensor of non-negative integers, got {counts_G.dtype} "
                         f"{tuple(counts_G.shape)}")
    G = counts_G.numel()
    offsets = torch.zeros(2 * G + 1, dtype=torch.int32)
    offsets[1:G + 1] = counts_G.cpu().cumsum(0)
    offsets[G + 1:] = counts_G.cpu()
    return offsets.to(device)

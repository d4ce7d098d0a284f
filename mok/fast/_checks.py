"""Host-side validation of the fast path's inputs: the layer's shared checks
(`mok.reference.check_layer_args`: types, dtypes, shapes, devices, K) plus the fast path's own rules
(a CUDA tensor on an sm_90 GPU, contiguity, 16-byte rows for TMA). routed_gate and routed_up may
instead be the two halves of one [L, 2I, H] tensor (`stacked_gate_up`).

Expert ids are checked on the device (see docs/fast_path.md), never here, so nothing syncs.
"""
from __future__ import annotations

import torch

from ..reference import Dims, check_grad_out, check_layer_args, world
from ._build import sm90_problem

_NAMES = ("x", "topk_idx", "topk_weight", "shared_gate", "shared_up", "shared_down",
          "routed_gate", "routed_up", "routed_down")


def _contiguous(name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor, got strides {t.stride()} for shape {tuple(t.shape)}")


def stacked_gate_up(gate: torch.Tensor | None, up: torch.Tensor | None) -> torch.Tensor | None:
    """The one [L, 2I, H] (or [2S, H]) tensor, gate rows first, whose halves `gate` and `up` ([L, I, H] or
    [S, H]) are, e.g. `w[:, :I]` and `w[:, I:]` of transformers' `gate_up_proj`; None when they are not.
    The d_x GEMM reads it as is; otherwise backward concatenates gate and up each call."""
    if gate is None or up is None or gate.shape != up.shape or gate.dtype != up.dtype or gate.device != up.device:
        return None
    if gate.dim() not in (2, 3) or gate.numel() == 0:
        return None
    *lead, n, H = gate.shape
    stacked = (*lead, 2 * n, H)
    strides = (2 * n * H, H, 1)[-gate.dim():]
    if gate.stride() != strides or up.stride() != strides or up.storage_offset() != gate.storage_offset() + n * H:
        return None
    if up.untyped_storage().data_ptr() != gate.untyped_storage().data_ptr():
        return None
    return gate.as_strided(stacked, strides, gate.storage_offset())


def gate_up_halves(gate: torch.Tensor | None, up: torch.Tensor | None) -> tuple | None:
    """How the fused gate/up GEMM reads `gate` and `up` ([L, I, H] or [S, H] bf16) as its B's two halves:
    (b, b_up, expert_stride) with b the [gate; up] tensor and b_up None when they are the halves of one tensor
    (`stacked_gate_up`), else b = gate and b_up = up, two contiguous tensors of one shape that start at distinct
    16-byte aligned addresses (one tensormap spans both, csrc/mainloop_gate_up.cuh, which also asks them to lie
    under 2^40 bytes apart and says so if not); None when neither holds (the unfused gate/up GEMM reads them)."""
    both = stacked_gate_up(gate, up)
    if both is not None:
        return both, None, both.stride(0) if both.dim() == 3 else 0
    if gate is None or up is None or gate.shape != up.shape or gate.dtype != up.dtype or gate.device != up.device:
        return None
    if gate.dim() not in (2, 3) or gate.numel() == 0 or not (gate.is_contiguous() and up.is_contiguous()):
        return None
    if gate.data_ptr() % 16 or up.data_ptr() % 16 or gate.data_ptr() == up.data_ptr():
        return None
    return gate, up, gate.stride(0) if gate.dim() == 3 else 0


def sizes_problem(H: int, I: int, S: int) -> str | None:
    """Why the fast path cannot take these sizes (16-byte rows for TMA: multiples of 8; S = 0 allowed), or None."""
    if H % 8 or I % 8 or S % 8:
        return f"the fast path needs H, I, S multiples of 8, got H={H} I={I} S={S}"
    return None


def check_cuda(name: str, t: torch.Tensor) -> None:
    """ValueError naming `name` unless `t` is on a CUDA device."""
    if t.device.type != "cuda":
        raise ValueError(f"{name}: expected a CUDA tensor (mok.fast runs on the GPU), got device {t.device}")


def check_group(group) -> int:
    """World size W of `group` (1 for None); TypeError/ValueError for what is not a live process group."""
    return world(group)[0]


def check_inputs(x, topk_idx, topk_weight, shared_gate, shared_up, shared_down, routed_gate, routed_up,
                 routed_down, world_size: int = 1) -> Dims:
    """Validate the layer's inputs (docs/layer.md, docs/bad_input.md) for the fast path; returns their sizes
    (E = L * world_size)."""
    if isinstance(x, torch.Tensor):
        check_cuda("x", x)
    args = (x, topk_idx, topk_weight, shared_gate, shared_up, shared_down, routed_gate, routed_up, routed_down)
    d = check_layer_args(*args, world_size=world_size)
    problem = sm90_problem(x.device)
    if problem:
        raise RuntimeError(f"x: {problem}")
    halves = {"routed_gate", "routed_up"} if stacked_gate_up(routed_gate, routed_up) is not None else set()
    for name, t in zip(_NAMES, args):
        if t is not None and name not in halves:
            _contiguous(name, t)
    if d.T < 1:
        raise ValueError(f"x: expected at least one token (T >= 1), got T = {d.T}")
    if shared_gate is not None and (d.S == 0 or d.S % 8):
        raise ValueError(f"shared_gate: expected S a positive multiple of 8 (16-byte rows for TMA), got S = {d.S}")
    if d.H % 8:
        raise ValueError(f"x: expected H a multiple of 8 (16-byte rows for TMA), got H = {d.H}")
    if d.I % 8:
        raise ValueError(f"routed_gate: expected I a multiple of 8 (16-byte rows for TMA), got I = {d.I}")
    if d.T * d.K >= 2**31:
        raise ValueError(f"x: expected T*K < 2^31 routed rows, got T*K = {d.T * d.K}")
    return d


def check_dy(dy, T: int, H: int, device: torch.device) -> None:
    """dy must be bf16 [T, H], contiguous, on the forward's device."""
    check_grad_out(dy, T, H, device)
    _contiguous("dy", dy)

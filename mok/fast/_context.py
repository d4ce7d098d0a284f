"""The fast path's forward context as a flat list of tensors, so autograd can save it (`ctx.save_for_backward`) and
backward can rebuild it without running the forward again.

Layout: offsets int32 [2L+1], pair_row int32 [T*K] (W = 1) or row_pair int32 [R] (expert parallel), flag int32 [1],
x_RH bf16 [R, H], pq_R2I fp32 [R, 2I] ([u * silu'(g) | silu(g)]), a_RI bf16 [R, I], o_RH bf16 [T*K, H] (W = 1: the
rows; expert parallel: this rank's (t, k) slots), pq_s_T2S fp32 [T, 2S] and a_s_TS bf16 [T, S] ([0, 0] without a
shared expert); R = W*T*K.
"""
from __future__ import annotations

import torch

from . import _ep_buffer, _fp8
from ..reference import Dims, check_context_args, check_precision, forward_facts, preflight
from ._checks import check_group, check_inputs
from ._ep import EPContext
from ._forward import FastContext, Schedule

N_SAVED = 9


def save_context(ctx: FastContext) -> list[torch.Tensor]:
    """The tensors of `ctx` (from `mok.fast.forward`) that `load_context` needs, in the layout above."""
    dev = ctx.x_TH.device
    s = ctx.sched
    pq_s = ctx.pq_s_T2S if ctx.pq_s_T2S is not None else torch.empty(0, 0, dtype=torch.float32, device=dev)
    a_s = ctx.a_s_TS if ctx.a_s_TS is not None else torch.empty(0, 0, dtype=torch.bfloat16, device=dev)
    rows = s.row_pair if isinstance(ctx, EPContext) else s.pair_row
    return [s.offsets, rows, s.flag, ctx.x_RH, ctx.pq_R2I, ctx.a_RI, ctx.o_RH, pq_s, a_s]


def load_context(saved: list, x, topk_idx, topk_weight, shared: tuple, routed: tuple, group=None,
                 precision: str = "bf16") -> FastContext:
    """Rebuild the `FastContext` of `mok.fast.forward(x, topk_idx, topk_weight, *shared, *routed)` from
    `save_context`'s tensors (checked against the layout above).

    With W > 1 it begins with the pre-flight (`mok.reference.preflight`, op "load_context"), before the
    peer buffer is made or exchanged: a rank whose arguments fail their checks or differ makes every rank
    raise, and a rank in another mok call (a forward: ranks out of step) makes every rank raise a
    RuntimeError naming each rank's call, as the reference's `load_context` does.

    precision: the forward's recipe ("bf16" or "fp8"; fp8 with W = 1 only): with "fp8" the context carries the
    weights' quantisation (`_fp8.fp8_weights`: the cached one when the forward made it from these weights).
    """
    W = check_group(group)
    if check_precision(precision) != "bf16" and W > 1:
        raise ValueError(f"precision: {precision!r} runs on one GPU only (group=None) in mok.fast")
    dims, err = None, None
    try:
        dims = _check_saved_args(saved, x, topk_idx, topk_weight, shared, routed, W)
    except (TypeError, ValueError, RuntimeError) as e:  # W > 1: the pre-flight raises it on every rank
        if W == 1:
            raise
        err = e
    if W > 1:
        preflight("load_context", err, forward_facts(dims, x, "fast"), group)
    offsets, rows, flag, x_RH, pq, a_RI, o_RH, pq_s, a_s = saved
    has_shared = shared[0] is not None
    pq_s, a_s = (pq_s, a_s) if has_shared else (None, None)
    if W == 1:
        fp8 = _fp8.fp8_weights(*routed, *shared) if precision == "fp8" else None
        return FastContext(dims, x, topk_weight, Schedule(offsets, None, rows, flag), x_RH, pq, a_RI, o_RH,
                           (*routed, *shared), pq_s, a_s, fp8=fp8).record_versions()
    buf = _ep_buffer.get(group, x.device, dims.T, dims.H, dims.K, dims.S)
    return EPContext(dims, x, topk_weight, Schedule(offsets, rows, None, flag), x_RH, pq, a_RI, o_RH,
                     (*routed, *shared), pq_s, a_s, buf=buf, group=group).record_versions()


def _check_saved_args(saved, x, topk_idx, topk_weight, shared, routed, W: int) -> Dims:
    """The layer's inputs as `forward` checks them, and `saved` against the layout of a forward with their
    sizes (module docstring); returns the sizes."""
    check_context_args(saved, N_SAVED, shared, routed)
    d = check_inputs(x, topk_idx, topk_weight, *shared, *routed, world_size=W)
    R, TK, Ts = W * d.T * d.K, d.T * d.K, (d.T if shared[0] is not None else 0)
    i32, f32, b16 = torch.int32, torch.float32, torch.bfloat16
    layout = (("offsets", i32, (2 * d.L + 1,)), ("pair_row" if W == 1 else "row_pair", i32, (R,)),
              ("flag", i32, (1,)), ("x_RH", b16, (R, d.H)), ("pq_R2I", f32, (R, 2 * d.I)), ("a_RI", b16, (R, d.I)),
              ("o_RH", b16, (TK, d.H)), ("pq_s_T2S", f32, (Ts, 2 * d.S)), ("a_s_TS", b16, (Ts, d.S)))
    for i, ((name, dtype, shape), t) in enumerate(zip(layout, saved, strict=True)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"saved: expected tensor {i} ({name}) to be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != dtype or tuple(t.shape) != shape or t.device != x.device:
            exc = TypeError if t.dtype != dtype else ValueError  # docs/bad_input.md: a wrong dtype is a TypeError
            raise exc(f"saved: expected tensor {i} ({name}) of a forward with (T, H, K, L, I, S, W) = "
                      f"{(d.T, d.H, d.K, d.L, d.I, d.S, W)} to be {dtype} {list(shape)} on {x.device}, got "
                      f"{t.dtype} {list(t.shape)} on {t.device}")
    return d


def saved_fake(x, topk_idx, shared: tuple, routed: tuple, rows=None) -> list[torch.Tensor]:
    """Empty tensors shaped like `save_context`'s (for fake/meta implementations); rows: R (default
    T*K, W = 1; the expert-parallel layer's W*T*K)."""
    T, H = x.shape
    K = topk_idx.shape[1]
    E, I, _ = routed[0].shape
    S = shared[0].shape[0] if shared[0] is not None else 0
    Ts = T if S else 0
    R = T * K if rows is None else rows

    def e(dtype, *shape):
        return torch.empty(shape, dtype=dtype, device=x.device)

    i32, f32, b16 = torch.int32, torch.float32, torch.bfloat16
    return [e(i32, 2 * E + 1), e(i32, R), e(i32, 1), e(b16, R, H), e(f32, R, 2 * I), e(b16, R, I), e(b16, T * K, H),
            e(f32, Ts, 2 * S), e(b16, Ts, S)]

"""The router and the router losses as `torch.library.custom_op`s, on either backend (the layer's ops are in
`mok.nn.ops`, what they share in `mok.nn._op_common`, the eager path included). Ops (namespace `mok`):
  router_fwd / router_bwd         gate + scores + top-k (`mok.reference.router_forward` or `mok.fast`)
  router_losses_fwd / _bwd        load-balancing loss and z-loss
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..reference import check_devices, check_expert_ids, check_route_args, check_score
from . import losses
from ._op_common import (_WEIGHT_DTYPES, BACKENDS, _cast_plan, _casts, _empty, _fake_casts, _impl, _with_casts, apply,
                         check_tensors, eager_function)


# ---------------------------------------------------------------- router


def _router_fwd(x: Tensor, weight: Tensor, k: int, score: str, normalize: bool, backend: str) -> list[Tensor]:
    """[topk_weight, topk_idx, scores, logits, *bf16 copies of float32 x / weight]. See `router`."""
    if x.dim() != 2:
        raise ValueError(f"x: expected 2 dimensions [T, H], got shape {tuple(x.shape)}")
    if weight.dim() != 2 or weight.shape[1] != x.shape[1]:
        raise ValueError(f"weight: expected shape (E, {x.shape[1]}), got {tuple(weight.shape)}")
    plan = _cast_plan([("x", x), ("weight", weight)])
    casts = _casts([x, weight], plan)
    x16, w16 = _with_casts([x, weight], plan, casts)
    out = _impl(backend).router_forward(x16.contiguous(), w16.contiguous(), k, score, normalize)
    return [*out, *casts]  # a float first (opcheck sums outputs)


router_fwd = torch.library.custom_op("mok::router_fwd", mutates_args=())(_router_fwd)


@router_fwd.register_fake
def _(x, weight, k, score, normalize, backend):
    T, E = x.shape[0], weight.shape[0]
    f32, dev = torch.float32, x.device
    casts = _fake_casts([x, weight], _cast_plan([("x", x), ("weight", weight)]))
    return [_empty(f32, dev, T, k), _empty(torch.int64, dev, T, k), _empty(f32, dev, T, E), _empty(f32, dev, T, E),
            *casts]


def _router_bwd(x: Tensor, weight: Tensor, scores: Tensor, topk_idx: Tensor, d_topk_weight: Optional[Tensor],
               d_scores: Optional[Tensor], d_logits: Optional[Tensor], score: str, normalize: bool,
               backend: str) -> tuple[Tensor, Tensor]:
    """(d_x [T, H] bf16, d_weight [E, H] fp32) from bf16 x and weight (see `router`)."""
    return _impl(backend).router_backward(x.contiguous(), weight.contiguous(), scores, topk_idx, d_topk_weight,
                                          d_scores, d_logits, score, normalize)


router_bwd = torch.library.custom_op("mok::router_bwd", mutates_args=())(_router_bwd)


@router_bwd.register_fake
def _(x, weight, scores, topk_idx, d_topk_weight, d_scores, d_logits, score, normalize, backend):
    return torch.empty_like(x, dtype=torch.bfloat16), _empty(torch.float32, x.device, *weight.shape)


def _router_setup(ctx, inputs, output):
    x, weight, k, score, normalize, backend = inputs
    _, topk_idx, scores, _, *casts = output
    ctx.mark_non_differentiable(topk_idx, *casts)
    ctx.set_materialize_grads(False)  # no zero tensors for outputs that get no gradient
    x16, w16 = _with_casts([x, weight], _cast_plan([("x", x), ("weight", weight)]), casts)
    ctx.save_for_backward(x16, w16, scores, topk_idx)
    ctx.dtypes = (x.dtype, weight.dtype)
    ctx.args = (score, normalize, backend)


def _router_backward(ctx, grads, bwd=None):
    d_topk_weight, _, d_scores, d_logits = grads[:4]  # topk_idx and the casts get no gradient
    if d_topk_weight is None and d_scores is None and d_logits is None:
        return None, None, None, None, None, None
    x16, w16, scores, topk_idx = ctx.saved_tensors
    d_x, d_w = (bwd or router_bwd)(x16, w16, scores, topk_idx, d_topk_weight, d_scores, d_logits, *ctx.args)
    return d_x.to(ctx.dtypes[0]), d_w.to(ctx.dtypes[1]), None, None, None, None


router_fwd.register_autograd(_router_backward, setup_context=_router_setup)
_Router = eager_function("_Router", _router_fwd, _router_setup, lambda ctx, *g, bwd: _router_backward(ctx, g, bwd),
                          _router_bwd)


def _check_backend(backend) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")


def _check_router_args(x, weight, k, score, normalize, backend) -> None:
    """`router`'s arguments, for both backends, before dispatch (the fast path reads score as softmax or not and k
    as a C int, so "relu" would become sigmoid and True K = 1)."""
    _check_backend(backend)
    check_tensors([("x", x), ("weight", weight)])
    for name, t in (("x", x), ("weight", weight)):
        if t.dtype not in _WEIGHT_DTYPES:
            raise TypeError(f"{name}: expected dtype torch.float32 or torch.bfloat16, got {t.dtype}")
    if x.dim() != 2:
        raise ValueError(f"x: expected 2 dimensions [T, H], got shape {tuple(x.shape)}")
    if x.shape[1] < 1:
        raise ValueError(f"x: expected H >= 1, got shape {tuple(x.shape)}")
    if weight.dim() != 2 or weight.shape[1] != x.shape[1] or weight.shape[0] < 1:
        raise ValueError(f"weight: expected shape (E, {x.shape[1]}) with E >= 1, got {tuple(weight.shape)}")
    check_devices([("x", x), ("weight", weight)])
    check_route_args(weight.shape[0], k, score, normalize)


def router(x_TH: Tensor, weight_EH: Tensor, k: int, *, score: str = "softmax", normalize: bool = True,
           backend: str = "reference"):
    """Bias-free router gate + scores + top-k, differentiable, compile-safe.

    Args:
        x_TH: [T, H] bfloat16 tokens, or float32 (rounded to bf16 inside; d_x comes back in x's dtype).
        weight_EH: [E, H] float32 or bfloat16 gate weight (rounded to bf16 once per step; fp32 gradient
            for a float32 weight).
        k: experts per token; score: "softmax" or "sigmoid"; normalize: renormalise the k weights.
        backend: "reference" (`mok.reference.router_forward`, bit-exact) or "fast" (`mok.fast`, CUDA sm_90).
    Returns:
        (topk_idx [T, k] int64, topk_weight [T, k] fp32, scores [T, E] fp32, logits [T, E] fp32);
        gradients flow from topk_weight, scores and logits to x and weight.
    """
    _check_router_args(x_TH, weight_EH, k, score, normalize, backend)
    topk_weight, topk_idx, scores, logits, *_ = apply(router_fwd, _Router, x_TH, weight_EH, k, score, normalize,
                                                       backend)
    return topk_idx, topk_weight, scores, logits


# ---------------------------------------------------------------- router losses


def _losses_impl(backend: str):
    return losses if backend == "reference" else _impl(backend)


def _nan_if_bad_ids(outputs, topk_idx: Tensor, E: int) -> tuple:
    """The fast backend's id check, on the device without a host synchronisation (CUDA-graph safe), as the fast
    layer's: every output NaN when an id is outside [0, E) (its kernels would skip such ids, dropping them from the
    pick counts); the outputs' bits unchanged otherwise."""
    if topk_idx.numel() == 0:
        return tuple(outputs)
    lo, hi = topk_idx.aminmax()
    bad = (lo < 0) | (hi >= E)
    return tuple(torch.where(bad, float("nan"), t) for t in outputs)


def _router_losses_fwd(scores: Tensor, logits: Tensor, topk_idx: Tensor, score: str, backend: str,
                       check_ids: bool) -> tuple[Tensor, Tensor]:
    """(load_balance [] fp32, z [] fp32). See `router_losses`. check_ids False: the ids come from `router` (in
    range by construction), so their values are not checked (`router_losses_of_router`)."""
    if backend == "reference":
        if check_ids:  # reads the ids: a host synchronisation on CUDA, as the reference layer's own check
            check_expert_ids(topk_idx, scores.shape[1], distinct=False)
        return losses.router_losses(scores, logits, topk_idx, score)
    out = _impl(backend).router_losses(scores, logits, topk_idx, score)
    return _nan_if_bad_ids(out, topk_idx, scores.shape[1]) if check_ids else tuple(out)


router_losses_fwd = torch.library.custom_op("mok::router_losses_fwd", mutates_args=())(_router_losses_fwd)


@router_losses_fwd.register_fake
def _(scores, logits, topk_idx, score, backend, check_ids):
    return scores.new_empty(()), scores.new_empty(())


def _router_losses_bwd(d_balance: Tensor, d_z: Tensor, scores: Tensor, logits: Tensor, topk_idx: Tensor,
                       score: str, backend: str, check_ids: bool) -> tuple[Tensor, Tensor]:
    """(d_scores [T, E] fp32, d_logits [T, E] fp32)."""
    grads = _losses_impl(backend).router_losses_backward(d_balance, d_z, scores, logits, topk_idx, score)
    if backend == "reference" or not check_ids:
        return tuple(grads)
    return _nan_if_bad_ids(grads, topk_idx, scores.shape[1])


router_losses_bwd = torch.library.custom_op("mok::router_losses_bwd", mutates_args=())(_router_losses_bwd)


@router_losses_bwd.register_fake
def _(d_balance, d_z, scores, logits, topk_idx, score, backend, check_ids):
    return torch.empty_like(scores), torch.empty_like(logits)


def _losses_setup(ctx, inputs, output):
    scores, logits, topk_idx, score, backend, check_ids = inputs
    ctx.save_for_backward(scores, logits, topk_idx)
    ctx.set_materialize_grads(False)
    ctx.args = (score, backend, check_ids)


def _losses_backward(ctx, d_balance, d_z, bwd=None):
    if d_balance is None and d_z is None:
        return None, None, None, None, None, None
    scores, logits, topk_idx = ctx.saved_tensors
    zero = scores.new_zeros(())
    d_s, d_l = (bwd or router_losses_bwd)(d_balance if d_balance is not None else zero,
                                          d_z if d_z is not None else zero, scores, logits, topk_idx, *ctx.args)
    return d_s, d_l, None, None, None, None


router_losses_fwd.register_autograd(_losses_backward, setup_context=_losses_setup)
_Losses = eager_function("_Losses", _router_losses_fwd, _losses_setup, _losses_backward, _router_losses_bwd)


def _check_losses_args(scores, logits, topk_idx, score, backend) -> None:
    """`router_losses`' arguments: types, dtypes, shapes ([T, E], [T, E], [T, K], 1 <= K <= E), one device, score
    and backend. The ids' values are checked where the losses are computed (`check_expert_ids`, `_nan_if_bad_ids`)."""
    _check_backend(backend)
    check_score(score)
    named = [("scores", scores), ("logits", logits), ("topk_idx", topk_idx)]
    check_tensors(named)
    for (name, t), dtype in zip(named, (torch.float32, torch.float32, torch.int64)):
        if t.dtype != dtype:
            raise TypeError(f"{name}: expected dtype {dtype}, got {t.dtype}")
    if scores.dim() != 2 or scores.shape[1] < 1:
        raise ValueError(f"scores: expected 2 dimensions [T, E] with E >= 1, got shape {tuple(scores.shape)}")
    T, E = scores.shape
    if logits.shape != scores.shape:
        raise ValueError(f"logits: expected shape {(T, E)} (the shape of scores), got {tuple(logits.shape)}")
    if topk_idx.dim() != 2 or topk_idx.shape[0] != T or not 1 <= topk_idx.shape[1] <= E:
        raise ValueError(f"topk_idx: expected shape ({T}, K) with 1 <= K <= E = {E}, got {tuple(topk_idx.shape)}")
    check_devices(named)


def router_losses(scores_TE: Tensor, logits_TE: Tensor, topk_idx_TK: Tensor, *, score: str = "softmax",
                  backend: str = "reference"):
    """(load-balancing loss, z-loss) of one routing, both [] fp32, deterministic.

    Args:
        scores_TE, logits_TE: [T, E] fp32 from `router`; topk_idx_TK: [T, K] int64 from `router`.
        score: the router's score function ("softmax" or "sigmoid").
        backend: "reference" (`mok.nn.losses`, bit-exact) or "fast" (`mok.fast.router_losses`: one C call
            each way on the GPU, fixed-order sums, deterministic, not the reference's bits).
    """
    _check_losses_args(scores_TE, logits_TE, topk_idx_TK, score, backend)
    return apply(router_losses_fwd, _Losses, scores_TE, logits_TE, topk_idx_TK, score, backend, True)


def router_losses_of_router(scores_TE: Tensor, logits_TE: Tensor, topk_idx_TK: Tensor, *, score: str = "softmax",
                            backend: str = "reference"):
    """`router_losses` of a routing `router` has just made (mok.MoE's forward): the same values and checks but for
    the ids' range, which holds by construction. Checking it costs a host synchronisation on the reference
    backend and, on the fast one, six small kernels each way: 0.13 / 0.26 ms of host time a step (min / median of
    eight timings at DeepSeek-V2-Lite's shape, T = 64, the C calls stubbed on a CPU). Arguments as
    `router_losses`."""
    _check_losses_args(scores_TE, logits_TE, topk_idx_TK, score, backend)
    return apply(router_losses_fwd, _Losses, scores_TE, logits_TE, topk_idx_TK, score, backend, False)

"""The layer as `torch.library.custom_op`s, on either backend, and the functional API: `moe`, `moe_gate_up`, and
`router` / `router_losses` (from `mok.nn.router_ops`).

Each op has a fake (meta) implementation and a registered autograd formula, so
`torch.compile(..., fullgraph=True)` traces them as opaque nodes and a compiled model gives the same
bits as the eager one; plain eager calls skip the ops' autograd wrapper (`mok.nn._op_common`). Ops (namespace
`mok`):
  router_fwd / router_bwd         gate + scores + top-k (`mok.reference.router_forward` or `mok.fast`)
  moe_fwd / moe_bwd               the layer; forward hands backward its context as tensors
  router_losses_fwd / _bwd        load-balancing loss and z-loss

Backends: "reference" (`mok.reference`, bit-exact on any device) or "fast" (`mok.fast`, CUDA sm_90).
Each backend saves and loads its own context (`save_context` / `load_context`); with
`recompute=True` only the inputs are saved and backward runs the forward again.

Weights may be float32 (master weights) or bfloat16. float32 ones are rounded to bf16 once per
step, in the forward op, and the bf16 copies are saved for backward (a float32 gate/up pair into one
[gate; up] tensor, which the fast path's backward reads without concatenating); bf16 ones are used as
they are. Weight gradients are computed in float32 and cast to each weight's dtype (no rounding for
float32 weights). x likewise: float32 x is rounded to bf16 once; d_x comes back in x's dtype.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .. import reference
from ..reference import check_devices, check_precision
from ._op_common import (BACKENDS, _cast_plan, _casts, _empty, _fake_casts, _group, _impl, _with_casts, apply,
                         check_tensors, eager_function, group_name)
from .router_ops import router, router_bwd, router_fwd, router_losses, router_losses_bwd, router_losses_fwd

__all__ = ["moe", "moe_gate_up", "moe_fwd", "moe_bwd", "router", "router_fwd", "router_bwd", "router_losses",
           "router_losses_fwd", "router_losses_bwd", "BACKENDS", "group_name"]

_LAYER_PAIRS = ((1, 2), (4, 5))  # (gate, up) positions among (x, shared gate/up/down, routed gate/up/down)


def _halves(gate: Optional[Tensor], up: Optional[Tensor]) -> tuple[Optional[Tensor], Optional[Tensor]]:
    """(gate, up): a gate given with up None is one [gate; up] tensor ([L, 2I, H] or [2S, H], gate rows first):
    its two halves, views (the fast path reads them as one tensor)."""
    if gate is None or up is not None:
        return gate, up
    return tuple(gate.chunk(2, dim=-2))


def _joined(gate_grad: Tensor, up_grad: Tensor) -> Tensor:
    """The [gate; up] gradient of one stacked weight from its two halves' gradients: the one tensor they are
    halves of (the fast path writes them so), else their concatenation."""
    from ..fast._checks import stacked_gate_up

    joined = stacked_gate_up(gate_grad, up_grad)
    return joined if joined is not None else torch.cat([gate_grad, up_grad], dim=-2)


# ---------------------------------------------------------------- the layer

_W_NAMES = ("shared_gate", "shared_up", "shared_down", "routed_gate", "routed_up", "routed_down")


def _layer_plan(tensors: list) -> list[tuple[int, ...]]:
    """`_cast_plan` of (x, the 6 weights), float32 gate/up pairs stacked."""
    return _cast_plan(list(zip(("x", *_W_NAMES), tensors)), _LAYER_PAIRS)


def _saves(recompute: bool) -> bool:
    return not recompute


def _moe_fwd(x: Tensor, topk_idx: Tensor, topk_weight: Tensor, shared_gate: Optional[Tensor],
            shared_up: Optional[Tensor], shared_down: Optional[Tensor], routed_gate: Tensor, routed_up: Tensor,
            routed_down: Tensor, group_name: Optional[str], backend: str, recompute: bool,
            precision: str) -> list[Tensor]:
    """[y, *bf16 copies of the float32 ones among x and the 6 weights, *the backend's saved context].
    A gate with up None is one stacked [gate; up] tensor (`moe_gate_up`). precision: the recipe (docs/numerics.md)."""
    tensors = [x, shared_gate, shared_up, shared_down, routed_gate, routed_up, routed_down]
    plan = _layer_plan(tensors)
    impl = _impl(backend)
    casts = _casts(tensors, plan, getattr(impl, "cast_pair_bf16", None))
    x16, sg, su, sd, rg, ru, rd = _with_casts(tensors, plan, casts)
    y, ctx = impl.forward(x16, topk_idx, topk_weight, *_halves(sg, su), sd, *_halves(rg, ru), rd,
                          group=_group(group_name), precision=precision)
    return [y, *casts, *(impl.save_context(ctx) if _saves(recompute) else [])]


moe_fwd = torch.library.custom_op("mok::moe_fwd", mutates_args=())(_moe_fwd)


@moe_fwd.register_fake
def _(x, topk_idx, topk_weight, shared_gate, shared_up, shared_down, routed_gate, routed_up, routed_down,
      group_name, backend, recompute, precision):
    weights = [shared_gate, shared_up, shared_down, routed_gate, routed_up, routed_down]
    casts = _fake_casts([x, *weights], _layer_plan([x, *weights]))
    y = torch.empty_like(x, dtype=torch.bfloat16)
    if not _saves(recompute):
        return [y, *casts]
    W, _ = reference.world(_group(group_name))
    rows = x.shape[0] * topk_idx.shape[1] if W == 1 else torch.library.get_ctx().new_dynamic_size()
    shared = (*_halves(shared_gate, shared_up), shared_down)
    routed = (*_halves(routed_gate, routed_up), routed_down)
    saved = _impl(backend).saved_fake(x, topk_idx, shared, routed, rows)
    return [y, *casts, *saved]


def _moe_bwd_body(dy: Tensor, x: Tensor, topk_idx: Tensor, topk_weight: Tensor, shared_gate: Optional[Tensor],
                  shared_up: Optional[Tensor], shared_down: Optional[Tensor], routed_gate: Tensor, routed_up: Tensor,
                  routed_down: Tensor, saved: list[Tensor], group_name: Optional[str], backend: str,
                  recompute: bool, bf16_weight_grads: bool, stacked_shared: bool, stacked_routed: bool,
                  precision: str = "bf16", release_saved: bool = False) -> list[Tensor]:
    """[d_x, d_topk_weight, d_routed_gate, d_routed_up, d_routed_down, d_shared_gate, d_shared_up,
    d_shared_down] from bf16 x and weights; weight grads fp32, or bf16 (the fp32 values rounded once) when
    `bf16_weight_grads`; shared ones empty [0] without a shared expert. stacked_shared / stacked_routed: gate
    and up are the halves of one stacked tensor: d_gate is then the stacked [d_gate; d_up] and d_up empty [0].
    release_saved: the fast backend frees the saved context's largest tensors once read (`mok.fast.backward`);
    only the eager path asks, when autograd will not run this backward again (`_release_saved`); the registered
    op `moe_bwd` never does."""
    shared, routed = (shared_gate, shared_up, shared_down), (routed_gate, routed_up, routed_down)
    group = _group(group_name)
    impl = _impl(backend)
    if _saves(recompute):
        ctx = impl.load_context(saved, x, topk_idx, topk_weight, shared, routed, group, precision)
    else:
        _, ctx = impl.forward(x, topk_idx, topk_weight, *shared, *routed, group=group, precision=precision)
    wdt = torch.bfloat16 if bf16_weight_grads else torch.float32
    if backend == "fast":  # writes bf16 weight gradients straight from its GEMMs
        # separate gate and up inputs get two gradient tensors (never aliasing outputs), a stacked one one buffer
        grads = list(impl.backward(ctx, dy, weight_grad_dtype=wdt, separate_gate_up_grads=not stacked_routed,
                                   release_saved=release_saved))
    else:
        grads = list(impl.backward(ctx, dy))
        grads[2:] = [g.to(wdt) if g is not None else None for g in grads[2:]]
    for stacked, i in ((stacked_routed, 2), (stacked_shared, 5)):
        if stacked:
            grads[i], grads[i + 1] = _joined(grads[i], grads[i + 1]), None
    return [g if g is not None else _empty(wdt, x.device, 0) for g in grads]


def _moe_bwd(dy: Tensor, x: Tensor, topk_idx: Tensor, topk_weight: Tensor, shared_gate: Optional[Tensor],
             shared_up: Optional[Tensor], shared_down: Optional[Tensor], routed_gate: Tensor, routed_up: Tensor,
             routed_down: Tensor, saved: list[Tensor], group_name: Optional[str], backend: str,
             recompute: bool, bf16_weight_grads: bool, stacked_shared: bool, stacked_routed: bool,
             precision: str = "bf16") -> list[Tensor]:
    """`_moe_bwd_body` keeping the saved context whole (the registered op mutates none of its inputs)."""
    return _moe_bwd_body(dy, x, topk_idx, topk_weight, shared_gate, shared_up, shared_down, routed_gate, routed_up,
                         routed_down, saved, group_name, backend, recompute, bf16_weight_grads, stacked_shared,
                         stacked_routed, precision)


moe_bwd = torch.library.custom_op("mok::moe_bwd", mutates_args=())(_moe_bwd)


@moe_bwd.register_fake
def _(dy, x, topk_idx, topk_weight, shared_gate, shared_up, shared_down, routed_gate, routed_up, routed_down,
      saved, group_name, backend, recompute, bf16_weight_grads, stacked_shared, stacked_routed, precision="bf16"):
    wdt = torch.bfloat16 if bf16_weight_grads else torch.float32

    def like(w, rows=1):
        return _empty(wdt, x.device, *w.shape[:-2], rows * w.shape[-2], w.shape[-1]) if w is not None else \
            _empty(wdt, x.device, 0)

    routed = ([like(routed_gate, 2), like(None)] if stacked_routed else [like(routed_gate), like(routed_up)])
    shared = ([like(shared_gate, 2), like(None)] if stacked_shared else [like(shared_gate), like(shared_up)])
    return [torch.empty_like(x, dtype=torch.bfloat16), _empty(torch.float32, x.device, *topk_weight.shape),
            *routed, like(routed_down), *shared, like(shared_down)]


def _moe_setup(ctx, inputs, output):
    *tensors, group_name, backend, recompute, precision = inputs
    x, idx, w = tensors[:3]
    weights = tensors[3:]
    plan = _layer_plan([x, *weights])
    casts, saved = output[1:1 + len(plan)], output[1 + len(plan):]
    ctx.mark_non_differentiable(*output[1:])
    ctx.set_materialize_grads(False)  # else autograd fills a zero tensor per saved output (GBs) in backward
    ctx.has_shared = weights[0] is not None
    ctx.stacked = (ctx.has_shared and weights[1] is None, weights[4] is None)  # (shared, routed) [gate; up] given
    ctx.dtypes = [t.dtype if t is not None else None for t in tensors]
    x16, *w16 = _with_casts([x, *weights], plan, casts)
    ctx.save_for_backward(x16, idx, w, *[t if t is not None else x16.new_empty(0) for t in w16], *saved)
    ctx.args = (group_name, backend, recompute)
    ctx.precision, ctx.n_inputs = precision, len(inputs)


def _release_saved() -> bool:
    """Whether the backward running now may free the layer's saved context as it reads it: only when autograd
    keeps no graph (no retain_graph / create_graph), so no later backward reads it again. The eager path alone
    asks: a compiled graph's saved tensors belong to AOTAutograd, which may reuse their memory itself."""
    keep = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    return keep is not None and not keep()


def _moe_backward(ctx, grads, bwd=None):
    dy = grads[0]  # the casts and the saved context get no gradient
    if dy is None:
        return (None,) * ctx.n_inputs
    x, idx, w, sg, su, sd, rg, ru, rd, *saved = ctx.saved_tensors
    stacked_shared, stacked_routed = ctx.stacked
    if not ctx.has_shared:
        sg = su = sd = None
    elif stacked_shared:
        sg, su = _halves(sg, None)
    if stacked_routed:
        rg, ru = _halves(rg, None)
    dt = ctx.dtypes
    bf16_grads = all(t in (None, torch.bfloat16) for t in dt[3:])  # every weight bf16: no fp32 gradients
    release = {"release_saved": _release_saved()} if bwd is not None else {}  # the eager path's own body
    d_x, d_w, d_rg, d_ru, d_rd, d_sg, d_su, d_sd = (bwd or moe_bwd)(
        dy.contiguous(), x, idx, w, sg, su, sd, rg, ru, rd, saved, *ctx.args, bf16_grads, stacked_shared,
        stacked_routed, ctx.precision, **release)

    def cast(i, g):  # the gradient of input i in its dtype (None when that input was None)
        return None if dt[i] is None else g.to(dt[i])

    return (d_x.to(dt[0]), None, d_w, cast(3, d_sg), cast(4, d_su), cast(5, d_sd), cast(6, d_rg), cast(7, d_ru),
            cast(8, d_rd), *(None,) * (ctx.n_inputs - 9))


moe_fwd.register_autograd(_moe_backward, setup_context=_moe_setup)
_Layer = eager_function("_Layer", _moe_fwd, _moe_setup, lambda ctx, *g, bwd: _moe_backward(ctx, g, bwd),
                        _moe_bwd_body)


def _check_layer_options(backend, recompute) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    if not isinstance(recompute, bool):
        raise TypeError(f"recompute: expected a bool, got {recompute!r}")


def _check_layer_tensors(named, optional) -> None:
    """Every tensor argument a torch.Tensor (None allowed for `optional`), all on x's device (`check_devices`). All
    on meta (shape inference) or all fake (tracing) passes: only a mix is refused, which would send real tensors to
    the ops' fake implementations or meta ones to their bodies."""
    check_tensors(named, optional)
    check_devices(named)


def moe(x_TH, topk_idx_TK, topk_weight_TK, shared_gate_SH, shared_up_SH, shared_down_HS,
        routed_gate_LIH, routed_up_LIH, routed_down_LHI, *, group=None, backend: str = "reference",
        recompute: bool = False, precision: str = "bf16") -> Tensor:
    """Differentiable, compile-safe MoE layer (docs/layer.md), the arguments of `mok.reference.forward`.

    Args:
        x_TH: [T, H] bf16, or fp32 (rounded to bf16 inside; d_x comes back in x's dtype).
        topk_idx_TK: [T, K] int64; topk_weight_TK: [T, K] fp32.
        shared_gate_SH, shared_up_SH: [S, H]; shared_down_HS: [H, S]; or all None.
        routed_gate_LIH, routed_up_LIH: [L, I, H]; routed_down_LHI: [L, H, I].
            Weights fp32 or bf16 (fp32 ones rounded to bf16 once per step); their gradients are
            computed in fp32 and cast to each weight's dtype (no rounding for fp32 weights).
        group: torch.distributed process group for expert parallelism, or None.
        backend: "reference" or "fast" (`mok.fast`, CUDA sm_90).
        recompute: save only the inputs; run the forward again in backward (same bits, less memory).
        precision: "bf16" (default) or "fp8", the recipe of docs/numerics.md (the fast backend: one GPU only).
    Returns:
        y [T, H] bf16.
    """
    _check_layer_options(backend, recompute)
    check_precision(precision)
    for name, up, gate in (("routed_up_LIH", routed_up_LIH, routed_gate_LIH), ("shared_up_SH", shared_up_SH,
                                                                              shared_gate_SH)):
        if up is None and gate is not None:  # None would mean a stacked gate to moe_fwd: that is moe_gate_up
            raise ValueError(f"{name}: expected a tensor, got None (for one [gate; up] tensor use moe_gate_up)")
    _check_layer_tensors(list(zip(("x", "topk_idx", "topk_weight", *_W_NAMES), (
        x_TH, topk_idx_TK, topk_weight_TK, shared_gate_SH, shared_up_SH, shared_down_HS, routed_gate_LIH,
        routed_up_LIH, routed_down_LHI))), optional=_W_NAMES[:3])
    out = apply(moe_fwd, _Layer, x_TH, topk_idx_TK, topk_weight_TK, shared_gate_SH, shared_up_SH, shared_down_HS,
                 routed_gate_LIH, routed_up_LIH, routed_down_LHI, group_name(group), backend, recompute,
                 precision)
    return out[0]


def moe_gate_up(x_TH, topk_idx_TK, topk_weight_TK, shared_gate_up_2SH, shared_down_HS, routed_gate_up_L2IH,
                routed_down_LHI, *, group=None, backend: str = "reference", recompute: bool = False,
                precision: str = "bf16") -> Tensor:
    """`moe` with each expert's gate and up weights as one [gate; up] tensor (gate rows first), as
    transformers stores `gate_up_proj` and `mok.MoE` its parameters: the same bits as `moe` on its two
    halves, and one [gate; up] gradient per stacked tensor (the fast path writes it in one buffer, so nothing is
    concatenated per step).

    Args:
        shared_gate_up_2SH: [2S, H], with shared_down_HS [H, S]; or both None.
        routed_gate_up_L2IH: [L, 2I, H]; routed_down_LHI: [L, H, I].
        The rest as `moe` (precision included).
    Returns:
        y [T, H] bf16.
    """
    _check_layer_options(backend, recompute)
    check_precision(precision)
    for name, t, dims in (("routed_gate_up_L2IH", routed_gate_up_L2IH, 3),
                          ("shared_gate_up_2SH", shared_gate_up_2SH, 2)):
        if t is None and dims == 2:  # no shared expert
            continue
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != dims or t.shape[-2] % 2:
            raise ValueError(f"{name}: expected {dims} dimensions with an even row count (gate rows, then up "
                             f"rows), got shape {tuple(t.shape)}")
    if (shared_gate_up_2SH is None) != (shared_down_HS is None):
        raise ValueError("shared_gate_up_2SH, shared_down_HS: expected both tensors or both None, got "
                         f"{type(shared_gate_up_2SH).__name__} and {type(shared_down_HS).__name__}")
    _check_layer_tensors([("x", x_TH), ("topk_idx", topk_idx_TK), ("topk_weight", topk_weight_TK),
                          ("shared_gate_up_2SH", shared_gate_up_2SH), ("shared_down", shared_down_HS),
                          ("routed_gate_up_L2IH", routed_gate_up_L2IH), ("routed_down", routed_down_LHI)],
                         optional=("shared_gate_up_2SH", "shared_down"))
    out = apply(moe_fwd, _Layer, x_TH, topk_idx_TK, topk_weight_TK, shared_gate_up_2SH, None, shared_down_HS,
                 routed_gate_up_L2IH, None, routed_down_LHI, group_name(group), backend, recompute,
                 precision)
    return out[0]

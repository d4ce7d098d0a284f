"""Autograd wrapper over the reference forward/backward, so `y.backward()` works."""

from __future__ import annotations

import torch
from torch._C import _functions

from . import _layer as layer
from ._context import load_context, save_context


class MoEFunction(torch.autograd.Function):
    """y = MoE(...) with the reference backward. Arguments as `mok.reference.forward`.

    What backward needs goes through `save_for_backward` (PyTorch's version checks catch an
    in-place change of an input between forward and backward; `retain_graph=True` allows a
    second backward with the same bits). Double backward is not supported: with `create_graph=True`
    the gradients come back (same bits) as outputs of a node whose backward raises PyTorch's usual error
    ("trying to differentiate twice ..."), as `@once_differentiable` does. That node takes the layer's inputs
    that require grad (and dy, when it does) as its own inputs, so differentiating a gradient with respect
    to any of them reaches it and raises: `autograd.grad(g, x)` included, which would otherwise find x
    unused (an error, or None with `allow_unused=True`: a second derivative silently read as zero).
    The functional backward returns fp32 weight gradients; autograd casts each to its input's dtype.
    """

    @staticmethod
    def forward(fctx, x, topk_idx, topk_weight, shared_gate, shared_up, shared_down,
                routed_gate, routed_up, routed_down, group, precision="bf16"):
        y, ctx = layer.forward(x, topk_idx, topk_weight, shared_gate, shared_up, shared_down,
                               routed_gate, routed_up, routed_down, group=group, precision=precision)
        fctx.group = group
        fctx.precision = precision
        fctx.has_shared = shared_gate is not None
        shared = [t if t is not None else x.new_empty(0) for t in (shared_gate, shared_up, shared_down)]
        fctx.save_for_backward(x, topk_idx, topk_weight, *shared, routed_gate, routed_up, routed_down,
                               *save_context(ctx))
        return y

    @staticmethod
    def backward(fctx, dy):
        with torch.no_grad():
            x, idx, w, sg, su, sd, rg, ru, rd, *saved = fctx.saved_tensors
            shared = (sg, su, sd) if fctx.has_shared else (None, None, None)
            ctx = load_context(saved, x, idx, w, shared, (rg, ru, rd), fctx.group, fctx.precision)
            d_x, d_w, d_rg, d_ru, d_rd, d_sg, d_su, d_sd = layer.backward(ctx, dy.contiguous())
        grads = [d_x, None, d_w, d_sg, d_su, d_sd, d_rg, d_ru, d_rd, None, None]
        if torch.is_grad_enabled():  # create_graph=True
            anchors = [t for t in (x, w, sg, su, sd, rg, ru, rd, dy) if t.requires_grad]
            grads = _not_differentiable(grads, anchors)
        return tuple(grads)


def _not_differentiable(grads: list, anchors: list) -> list:
    """The tensors of `grads` (Nones kept) as outputs of a node whose backward raises PyTorch's
    once-differentiable error; the node's inputs are the tensors of `grads` (detached) and `anchors`
    (the tensors a second derivative may be taken with respect to), so the error is reached from any of them."""
    tensors = [g for g in grads if g is not None]
    err = _functions.DelayedError(b"trying to differentiate twice a function that was marked with "
                                  b"@once_differentiable (mok.reference.moe has no double backward)",
                                  len(tensors) + len(anchors))
    out = err(*[g.detach().requires_grad_() for g in tensors], *anchors)
    out = iter(out if isinstance(out, tuple) else (out,))
    return [next(out) if g is not None else None for g in grads]


def moe(x, topk_idx, topk_weight, shared_gate, shared_up, shared_down,
        routed_gate, routed_up, routed_down, *, group=None, precision="bf16"):
    """Differentiable reference layer: same arguments as `mok.reference.forward` (precision "bf16" or "fp8");
    returns y [T, H] bf16."""
    return MoEFunction.apply(x, topk_idx, topk_weight, shared_gate, shared_up, shared_down,
                             routed_gate, routed_up, routed_down, group, precision)

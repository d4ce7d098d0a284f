"""Autograd wrapper over the reference forward/backward, so `y.backward()` works."""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from . import _layer as layer
from ._context import load_context, save_context


class MoEFunction(torch.autograd.Function):
    """y = MoE(...) with the reference backward. Arguments as `mok.reference.forward`.

    What backward needs goes through `save_for_backward` (PyTorch's version checks catch an
    in-place change of an input between forward and backward; `retain_graph=True` allows a
    second backward). Double backward is not supported and raises PyTorch's usual error.
    The functional backward returns fp32 weight gradients; autograd casts each to its input's dtype.
    """

    @staticmethod
    def forward(fctx, x, topk_idx, topk_weight, shared_gate, shared_up, shared_down,
                routed_gate, routed_up, routed_down, group):
        y, ctx = layer.forward(x, topk_idx, topk_weight, shared_gate, shared_up, shared_down,
                               routed_gate, routed_up, routed_down, group=group)
        fctx.group = group
        fctx.has_shared = shared_gate is not None
        shared = [t if t is not None else x.new_empty(0) for t in (shared_gate, shared_up, shared_down)]
        fctx.save_for_backward(x, topk_idx, topk_weight, *shared, routed_gate, routed_up, routed_down,
                               *save_context(ctx))
        return y

    @staticmethod
    @once_differentiable
    def backward(fctx, dy):
        x, idx, w, sg, su, sd, rg, ru, rd, *saved = fctx.saved_tensors
        shared = (sg, su, sd) if fctx.has_shared else (None, None, None)
        ctx = load_context(saved, x, idx, w, shared, (rg, ru, rd), fctx.group)
        d_x, d_w, d_rg, d_ru, d_rd, d_sg, d_su, d_sd = layer.backward(ctx, dy.contiguous())
        return d_x, None, d_w, d_sg, d_su, d_sd, d_rg, d_ru, d_rd, None


def moe(x, topk_idx, topk_weight, shared_gate, shared_up, shared_down,
        routed_gate, routed_up, routed_down, *, group=None):
    """Differentiable reference layer: same arguments as `mok.reference.forward`; returns y [T, H] bf16."""
    return MoEFunction.apply(x, topk_idx, topk_weight, shared_gate, shared_up, shared_down,
                             routed_gate, routed_up, routed_down, group)

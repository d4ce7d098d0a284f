"""Autograd wrapper over the reference forward/backward, so `y.backward()` works."""

from __future__ import annotations

import torch

from . import layer


class MoEFunction(torch.autograd.Function):
    """y = MoE(...) with the reference backward. Arguments as `mok.reference.forward`.

    The functional backward returns fp32 weight gradients; PyTorch's autograd engine casts
    each gradient to its input's dtype (bf16 weights get bf16 gradients).
    """

    @staticmethod
    def forward(fctx, x, topk_idx, topk_weight, shared_gate, shared_up, shared_down,
                routed_gate, routed_up, routed_down, group):
        y, ctx = layer.forward(x, topk_idx, topk_weight, shared_gate, shared_up, shared_down,
                               routed_gate, routed_up, routed_down, group=group)
        fctx.ref_ctx = ctx
        return y

    @staticmethod
    def backward(fctx, dy):
        d_x, d_w, d_rg, d_ru, d_rd, d_sg, d_su, d_sd = layer.backward(fctx.ref_ctx, dy.contiguous())
        del fctx.ref_ctx
        return d_x, None, d_w, d_sg, d_su, d_sd, d_rg, d_ru, d_rd, None


def moe(x, topk_idx, topk_weight, shared_gate, shared_up, shared_down,
        routed_gate, routed_up, routed_down, *, group=None):
    """Differentiable reference layer: same arguments as `mok.reference.forward`; returns y [T, H] bf16."""
    return MoEFunction.apply(x, topk_idx, topk_weight, shared_gate, shared_up, shared_down,
                             routed_gate, routed_up, routed_down, group)

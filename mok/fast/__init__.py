"""Hopper (sm_90a) fast path of the MoE layer and its router: same signature, return order and
properties as `mok.reference` (docs/layer.md, docs/determinism.md), built from CUTLASS grouped GEMMs
and small deterministic kernels (csrc/, shipped inside this package, built on first use).

One GPU (W = 1). See docs/fast_path.md for the pipeline, the bad-id policy (NaN outputs) and the
expert-parallel plan. `is_available()` says whether it can run here without building anything.
"""
from __future__ import annotations

import torch

from ._backward import run_backward
from ._build import FastPathUnavailable, is_available
from ._checks import check_dy, check_group, check_inputs
from ._context import load_context, save_context, saved_fake
from ._forward import FastContext, run_forward
from ._router import (load_balance_loss, load_balance_loss_backward, router_backward, router_forward, z_loss,
                      z_loss_backward)

__all__ = ["forward", "backward", "FastContext", "FastPathUnavailable", "is_available", "save_context",
           "load_context", "saved_fake", "router_forward", "router_backward", "load_balance_loss",
           "load_balance_loss_backward", "z_loss", "z_loss_backward"]


def forward(x, topk_idx, topk_weight, shared_gate, shared_up, shared_down, routed_gate, routed_up,
            routed_down, *, group=None):
    """MoE forward on one Hopper GPU.

    Args:
        x: [T, H] bf16, CUDA, contiguous; H a multiple of 8.
        topk_idx: [T, K] int64 expert ids in [0, E), distinct per row (checked on the device:
            a bad id makes every output NaN, see docs/fast_path.md).
        topk_weight: [T, K] fp32, used as given.
        shared_gate, shared_up: [S, H] bf16 or None; shared_down: [H, S] bf16 or None (S % 8 == 0).
        routed_gate, routed_up: [E, I, H] bf16; routed_down: [E, H, I] bf16 (I % 8 == 0).
        group: None or a process group of size 1 (expert parallelism is not implemented yet).
    Returns:
        (y [T, H] bf16, ctx for `backward`).
    """
    check_group(group)
    dims = check_inputs(x, topk_idx, topk_weight, shared_gate, shared_up, shared_down, routed_gate,
                        routed_up, routed_down)
    return run_forward(x, topk_idx, topk_weight, shared_gate, shared_up, shared_down, routed_gate,
                       routed_up, routed_down, dims)


def backward(ctx: FastContext, dy, *, weight_grad_dtype=torch.float32):
    """MoE backward.

    Args:
        ctx: the context returned by `forward` (or rebuilt by `load_context`).
        dy: [T, H] bf16, contiguous, on the forward's device.
        weight_grad_dtype: torch.float32 (default) or torch.bfloat16 (the fp32 result rounded once, as
            `.to(torch.bfloat16)` would, without writing it in fp32 first).
    Returns:
        (d_x [T,H] bf16, d_topk_weight [T,K] fp32, d_routed_gate [E,I,H], d_routed_up [E,I,H],
         d_routed_down [E,H,I], d_shared_gate [S,H] | None, d_shared_up [S,H] | None,
         d_shared_down [H,S] | None), weight gradients in `weight_grad_dtype`.
    """
    if not isinstance(ctx, FastContext):
        raise ValueError(f"ctx: expected the FastContext from mok.fast.forward, got {type(ctx).__name__}")
    if weight_grad_dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"weight_grad_dtype: expected torch.float32 or torch.bfloat16, got {weight_grad_dtype}")
    check_dy(dy, ctx.dims.T, ctx.dims.H, ctx.x_TH.device)
    return run_backward(ctx, dy, weight_grad_dtype)

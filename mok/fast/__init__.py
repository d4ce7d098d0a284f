"""Hopper (sm_90a) fast path of the MoE layer and its router: same signature, return order and
properties as `mok.reference` (docs/layer.md, docs/determinism.md), built from CUTLASS grouped GEMMs
and small deterministic kernels (csrc/, shipped in the wheel as mok/_csrc, built on first use).

One GPU, or W ranks with expert parallelism (`group`; docs/expert_parallel.md: peer buffers over CUDA
IPC, ranks waiting for each other on the device, bits independent of W). See docs/fast_path.md for the
pipeline and the bad-id policy (NaN outputs). `is_available()` says whether it can run here without
building anything.
"""
from __future__ import annotations

import torch

from ..reference import backend_fact, check_precision, check_versions, forward_facts, preflight
from ._backward import run_backward
from ._build import FastPathUnavailable, is_available
from ._checks import check_dy, check_group, check_inputs
from ._context import load_context, save_context, saved_fake
from ._ep import EPContext, run_backward_ep, run_forward_ep
from ._ep_buffer import release as release_ep_buffers
from ._forward import FastContext, run_forward
from ._fp8_layer import run_backward_fp8, run_forward_fp8
from . import _lib
from ._router import router_backward, router_forward, router_losses, router_losses_backward

__all__ = ["forward", "backward", "FastContext", "EPContext", "FastPathUnavailable", "is_available", "save_context",
           "release_ep_buffers",
           "load_context", "saved_fake", "router_forward", "router_backward", "router_losses",
           "router_losses_backward", "cast_pair_bf16"]


def cast_pair_bf16(first, second, out) -> None:
    """out = [bf16(first); bf16(second)] stacked along dim -2: first, second fp32 [..., n, H] (the same shape,
    contiguous), out bf16 [..., 2n, H] contiguous, all on one CUDA device. Bitwise what
    `out.narrow(-2, 0, n).copy_(first)` (and the same for second) gives, with vector loads and stores."""
    _lib.cast_pair_bf16(first, second, out)


@torch.no_grad()
def forward(x, topk_idx, topk_weight, shared_gate, shared_up, shared_down, routed_gate, routed_up,
            routed_down, *, group=None, precision="bf16"):
    """MoE forward on Hopper GPUs: one GPU, or this rank's part of an expert-parallel layer. Like
    `mok.reference.forward`, it builds no autograd graph (torch.no_grad()) and `backward` raises if an input it
    reads (x, topk_weight, the weights) was changed in place in between.

    Args:
        x: [T, H] bf16, CUDA, contiguous; H a multiple of 8.
        topk_idx: [T, K] int64 expert ids in [0, E), distinct per row (checked on the device:
            a bad id makes every output NaN, see docs/fast_path.md).
        topk_weight: [T, K] fp32, used as given.
        shared_gate, shared_up: [S, H] bf16 or None; shared_down: [H, S] bf16 or None (S % 8 == 0).
        routed_gate, routed_up: [L, I, H] bf16, contiguous or the halves w[:, :I], w[:, I:] of one
            [L, 2I, H] tensor (backward reads w, or two contiguous tensors where 64 splits I and S, as they
            are; it concatenates other pairs once per call);
            routed_down: [L, H, I] bf16 (I % 8 == 0): the L = E / W experts this rank owns (experts
            [rank*L, (rank+1)*L) of the layer).
        group: None (W = 1), or the torch.distributed process group of the W expert-parallel ranks
            (gloo or nccl, used for the pre-flight and the one-time buffer exchange). Every rank calls
            forward together with the same T, H, K, L, I, S; a rank whose arguments fail or differ makes
            every rank raise. Token t of rank r is global token r*T + t; the outputs are bitwise those of
            W = 1 on the concatenated batch. Ranks wait for each other on the device: a rank that does
            not come traps the others' CUDA contexts after MOK_EP_TIMEOUT_S seconds (default 120).
        precision: "bf16" (default) or "fp8": the FP8 recipe of docs/numerics.md (the gate/up, down, d_a and d_x
            GEMMs on e4m3 operands with power-of-two block scales, quantised bit for bit as mok.reference does;
            the weights' quantisation made once per weight version and cached; W = 1 only). `backward` follows the
            forward's recipe. Any other value raises ValueError naming `precision`.
    Returns:
        (y [T, H] bf16, ctx for `backward`).
    """
    W = check_group(group)
    if W == 1:
        check_precision(precision)
        dims = check_inputs(x, topk_idx, topk_weight, shared_gate, shared_up, shared_down, routed_gate,
                            routed_up, routed_down)
        run = run_forward_fp8 if precision == "fp8" else run_forward
        y, ctx = run(x, topk_idx, topk_weight, shared_gate, shared_up, shared_down, routed_gate, routed_up,
                     routed_down, dims)
        return y, ctx.record_versions()
    dims, err = None, None
    try:
        if check_precision(precision) != "bf16":
            raise ValueError(f"precision: {precision!r} runs on one GPU only (group=None) in mok.fast; expert "
                             f"parallelism takes 'bf16'")
        dims = check_inputs(x, topk_idx, topk_weight, shared_gate, shared_up, shared_down, routed_gate,
                            routed_up, routed_down, world_size=W)
        if W * dims.T * dims.K >= 2**31:
            raise ValueError(f"x: expected W*T*K < 2^31 rows on an expert owner, got {W * dims.T * dims.K}")
    except (TypeError, ValueError, RuntimeError) as e:  # raised on every rank by the pre-flight
        err = e
    preflight("forward", err, forward_facts(dims, x, "fast"), group)
    y, ctx = run_forward_ep(x, topk_idx, topk_weight, shared_gate, shared_up, shared_down, routed_gate,
                            routed_up, routed_down, dims, group)
    return y, ctx.record_versions()


@torch.no_grad()
def backward(ctx: FastContext, dy, *, weight_grad_dtype=torch.float32, separate_gate_up_grads=False,
             release_saved=False):
    """MoE backward (no autograd graph). RuntimeError naming the input if x, topk_weight or a weight was changed in
    place since `forward` (or `load_context`), on every rank of the group.

    Args:
        ctx: the context returned by `forward` (or rebuilt by `load_context`).
        dy: [T, H] bf16, contiguous, on the forward's device.
        weight_grad_dtype: torch.float32 (default) or torch.bfloat16 (the fp32 result rounded once, as
            `.to(torch.bfloat16)` would, without writing it in fp32 first).
        separate_gate_up_grads: False (default): where gate and up were the halves of one [gate; up] tensor,
            their gradients are the halves of one new [gate; up] tensor too (the weights' layout); True: always
            two contiguous tensors.
        release_saved: False (default): `ctx` stays whole (backward may run on it again); True: the context's
            largest tensors are freed as soon as they are read for the last time (o after the pre-combine, the
            saved SwiGLU factors [p | q] fp32 [R, 2I] after the d_a step, the gathered x rows [R, H] after the
            gate/up weight gradients), lowering the backward's peak memory, and `ctx` is spent. `mok.nn` /
            `mok.MoE` pass True in eager autograd unless the graph is retained.
    Returns:
        (d_x [T,H] bf16, d_topk_weight [T,K] fp32, d_routed_gate [E,I,H], d_routed_up [E,I,H],
         d_routed_down [E,H,I], d_shared_gate [S,H] | None, d_shared_up [S,H] | None,
         d_shared_down [H,S] | None), weight gradients in `weight_grad_dtype`.
    """
    if not isinstance(ctx, FastContext):
        raise ValueError(f"ctx: expected the FastContext from mok.fast.forward, got {type(ctx).__name__}")
    if not isinstance(ctx, EPContext):
        _check_backward_args(ctx, dy, weight_grad_dtype, separate_gate_up_grads, release_saved)
        if ctx.fp8 is not None:
            return run_backward_fp8(ctx, dy, weight_grad_dtype, separate_gate_up_grads, release_saved)
        return run_backward(ctx, dy, weight_grad_dtype, separate_gate_up_grads, release_saved)
    err = None
    try:
        _check_backward_args(ctx, dy, weight_grad_dtype, separate_gate_up_grads, release_saved)
    except (TypeError, ValueError, RuntimeError) as e:  # raised on every rank by the pre-flight
        err = e
    preflight("backward", err, [backend_fact("fast")], ctx.group)
    return run_backward_ep(ctx, dy, weight_grad_dtype, separate_gate_up_grads, release_saved)


def _check_backward_args(ctx: FastContext, dy, weight_grad_dtype, separate_gate_up_grads, release_saved) -> None:
    if weight_grad_dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"weight_grad_dtype: expected torch.float32 or torch.bfloat16, got {weight_grad_dtype}")
    if not isinstance(separate_gate_up_grads, bool):
        raise TypeError(f"separate_gate_up_grads: expected a bool, got {separate_gate_up_grads!r}")
    if not isinstance(release_saved, bool):
        raise TypeError(f"release_saved: expected a bool, got {release_saved!r}")
    if ctx.pq_R2I.untyped_storage().nbytes() == 0 and ctx.pq_R2I.numel() > 0:
        raise ValueError("ctx: spent by an earlier backward with release_saved=True (its saved tensors are freed); "
                         "run the forward again")
    check_dy(dy, ctx.dims.T, ctx.dims.H, ctx.x_TH.device)
    check_versions(ctx.versions, "mok.fast.forward", "mok.fast.backward")

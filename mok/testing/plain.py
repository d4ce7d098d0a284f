"""A plain PyTorch MoE layer (torch.matmul per expert, autograd for gradients), W = 1.

Not bit-defining. Two uses:
- dtype=torch.float64, spec_rounding=True: an independent float64 evaluation of docs/layer.md's
  forward with its bf16 rounding points (the oracle the reference is tested against), and
  with spec_rounding=False the exact-math layer whose autograd gradients check the backward.
- dtype=torch.bfloat16: "a plain bf16 PyTorch implementation", whose error against the
  reference sets the fast path's tolerance (docs/numerics.md, flash-attention's rule).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _round_bf16(v: torch.Tensor) -> torch.Tensor:
    """Round to bf16 in value, keep dtype; gradient passes straight through."""
    return v + (v.to(torch.bfloat16).to(v.dtype) - v).detach()


def moe_plain(
    x, topk_idx, topk_weight, shared_gate, shared_up, shared_down,
    routed_gate, routed_up, routed_down, *, dtype: torch.dtype, spec_rounding: bool = False,
):
    """y = shared(x) + Σ_k w_k * expert_{idx_k}(x), computed in `dtype` with autograd.

    Args:
        x: [T, H] any float dtype (cast to `dtype`; gradients flow to the caller's tensor).
        topk_idx: [T, K] int64 expert ids in [0, E).
        topk_weight: [T, K] float.
        shared_gate, shared_up: [S, H] or None; shared_down: [H, S] or None.
        routed_gate, routed_up: [E, I, H]; routed_down: [E, H, I].
        dtype: compute dtype (torch.float64 or torch.bfloat16).
        spec_rounding: round a, o_k, s and y to bf16 where the layer's math (docs/layer.md) does.
    Returns:
        y [T, H] in `dtype` (bf16-valued when spec_rounding).
    """
    r = _round_bf16 if spec_rounding else (lambda v: v)
    x = x.to(dtype)
    w = topk_weight.to(dtype)
    T, H = x.shape
    K = topk_idx.shape[1]

    def expert(x_RH, gate_IH, up_IH, down_HI):
        a = r(F.silu(x_RH @ gate_IH.to(dtype).t()) * (x_RH @ up_IH.to(dtype).t()))
        return r(a @ down_HI.to(dtype).t())

    o_TKH = x.new_zeros(T, K, H)
    for e in range(routed_gate.shape[0]):
        t, k = (topk_idx == e).nonzero(as_tuple=True)
        if t.numel():
            o_TKH = o_TKH.index_put((t, k), expert(x[t], routed_gate[e], routed_up[e], routed_down[e]))
    y = expert(x, shared_gate, shared_up, shared_down) if shared_gate is not None else x.new_zeros(T, H)
    for k in range(K):
        y = y + w[:, k : k + 1] * o_TKH[:, k]
    return r(y)

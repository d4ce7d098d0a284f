"""The two baselines a user would write instead of mok (benchmarks/RESULTS.md), with autograd for the backward.

grouped_mm path: stable argsort of the flattened ids -> gather rows -> torch._grouped_mm gate and up
(int32 offsets) -> silu(g)*u -> torch._grouped_mm down -> scale by the routing weight in fp32 ->
index_add into fp32 [T,H] -> bf16. naive loop: per expert torch.where, three matmuls, index_add.
The shared expert (S > 0) is three plain matmuls added first in both.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _shared(x, sg, su, sd):
    if sg is None:
        return None
    return (F.silu(x @ sg.t()) * (x @ su.t())) @ sd.t()


def grouped_mm_path(x, topk_idx, topk_weight, sg, su, sd, rg, ru, rd):
    """y [T,H] bf16 (autograd-enabled)."""
    T, H = x.shape
    E, K = rg.shape[0], topk_idx.shape[1]
    flat = topk_idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=E)
    offs = torch.cumsum(counts, 0).to(torch.int32)
    tok = order // K
    xs = x[tok]
    g = torch._grouped_mm(xs, rg.transpose(1, 2), offs=offs)
    u = torch._grouped_mm(xs, ru.transpose(1, 2), offs=offs)
    a = F.silu(g) * u
    o = torch._grouped_mm(a, rd.transpose(1, 2), offs=offs)
    w = topk_weight.reshape(-1)[order].unsqueeze(1)
    contrib = o.float() * w
    acc = torch.zeros(T, H, dtype=torch.float32, device=x.device)
    s = _shared(x, sg, su, sd)
    if s is not None:
        acc = acc + s.float()
    acc = acc.index_add(0, tok, contrib)
    return acc.to(torch.bfloat16)


def naive_loop(x, topk_idx, topk_weight, sg, su, sd, rg, ru, rd):
    """y [T,H] bf16 (autograd-enabled)."""
    T, H = x.shape
    acc = torch.zeros(T, H, dtype=torch.float32, device=x.device)
    s = _shared(x, sg, su, sd)
    if s is not None:
        acc = acc + s.float()
    for e in range(rg.shape[0]):
        t, k = torch.where(topk_idx == e)
        xe = x[t]
        o = (F.silu(xe @ rg[e].t()) * (xe @ ru[e].t())) @ rd[e].t()
        acc = acc.index_add(0, t, o.float() * topk_weight[t, k].unsqueeze(1))
    return acc.to(torch.bfloat16)

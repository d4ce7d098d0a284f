"""The plain PyTorch implementation of the FP8 recipe (docs/numerics.md "FP8 recipe"), the yardstick of the fast
path's FP8 accuracy (the 2x rule against the reference's fp8 outputs): every quantised operand dequantised exactly
(`mok.reference.fp8_rows_1x128`, `fp8_blocks_128x128`), then torch.matmul in bf16 per expert (fp32 accumulation,
bf16 out), the recipe's rounding points in bf16, no autograd (the backward written out)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..reference import fp8_blocks_128x128 as q_b
from ..reference import fp8_rows_1x128 as q_r
from .cases import OUTPUT_NAMES


def _expert_fwd(x, gate, up, down):
    xq = q_r(x)
    g, u = xq @ q_b(gate).t(), xq @ q_b(up).t()
    a = (F.silu(g.float()) * u.float()).to(torch.bfloat16)
    return g, u, a, q_r(a) @ q_b(down).t()


def _expert_bwd(go, x, g, u, a, gate, up, down):
    """(dx, d_gate, d_up, d_down) bf16 of one expert's rows from its output gradient go (bf16 [R, H])."""
    da = (q_r(go) @ q_b(down)).float()
    s = torch.sigmoid(g.float())
    dg = (da * u.float() * s * (1 + g.float() * (1 - s))).to(torch.bfloat16)
    du = (da * F.silu(g.float())).to(torch.bfloat16)
    dx = q_r(dg) @ q_b(gate) + q_r(du) @ q_b(up)
    return dx, dg.t() @ x, du.t() @ x, go.t() @ a


@torch.no_grad()
def plain_fp8_outputs(inputs: dict) -> dict:
    """y and the 8 gradients of the plain FP8 implementation for `inputs` (make_inputs' dict: the layer's arguments
    and dy), {name: tensor or None} like `mok.testing.runner.run_layer`; weight gradients bf16."""
    x, idx, w = inputs["x"], inputs["topk_idx"], inputs["topk_weight"]
    rg, ru, rd = inputs["routed_gate"], inputs["routed_up"], inputs["routed_down"]
    sg, su, sd, dy = inputs["shared_gate"], inputs["shared_up"], inputs["shared_down"], inputs["dy"]
    T, H = x.shape
    K = idx.shape[1]
    y = torch.zeros(T, H, dtype=torch.float32, device=x.device)
    shared = None
    if sg is not None:
        shared = _expert_fwd(x, sg, su, sd)
        y += shared[3].float()
    saved, o_TKH = [], torch.zeros(T, K, H, dtype=torch.bfloat16, device=x.device)
    for e in range(rg.shape[0]):
        t, k = (idx == e).nonzero(as_tuple=True)
        fwd = _expert_fwd(x[t], rg[e], ru[e], rd[e]) if t.numel() else None
        if fwd is not None:
            o_TKH[t, k] = fwd[3]
        saved.append((t, k, fwd))
    for k in range(K):
        y += w[:, k:k + 1] * o_TKH[:, k].float()
    d_w = (dy.float()[:, None, :] * o_TKH.float()).sum(-1)
    d_x = torch.zeros(T, H, dtype=torch.float32, device=x.device)
    grads = [torch.zeros_like(rg), torch.zeros_like(ru), torch.zeros_like(rd)]
    for e, (t, k, fwd) in enumerate(saved):
        if fwd is None:
            continue
        go = (w[t, k][:, None] * dy[t].float()).to(torch.bfloat16)
        dx, *dws = _expert_bwd(go, x[t], *fwd[:3], rg[e], ru[e], rd[e])
        d_x.index_add_(0, t, dx.float())
        for g, dw in zip(grads, dws):
            g[e] = dw
    d_shared = (None, None, None)
    if shared is not None:
        dx, *d_shared = _expert_bwd(dy, x, *shared[:3], sg, su, sd)
        d_x += dx.float()
    return dict(zip(OUTPUT_NAMES, (y.to(torch.bfloat16), d_x.to(torch.bfloat16), d_w, *grads, *d_shared)))

"""The peers mok is measured against, on the same inputs (bench_moe.py, bench_module.py):

- `grouped_mm_path`: what a user would write with PyTorch alone: a stable argsort of the routed ids, the rows gathered,
  `torch._grouped_mm` for gate and up (int32 offsets), `silu(g) * u`, `torch._grouped_mm` for down, the routing weight
  applied in fp32, `index_add` into an fp32 [T, H], bf16; its backward by autograd.
- `naive_loop`: per expert, `torch.where(topk_idx == e)`, three matmuls, `index_add`.
- SonicMoE (sonic-moe 0.1.2.post1, Dao-AILab; QuACK / CuTe-DSL kernels): `sonic_leaves` + `sonic_forward`. Not a
  dependency of mok: `sonicmoe` is imported on the first call, and its kernels JIT-compile and autotune then
  (QUACK_CACHE_DIR and CUTE_DSL_CACHE_DIR keep them across processes). What runs is the expert part of its own top-K
  layer (`sonicmoe.moe_TC_softmax_topk_layer`), given the routing instead of computing it: its routing metadata kernel
  on topk_idx, its up-projection (gathered gate/up GEMM with SwiGLU in the epilogue) and down-projection (GEMM, then
  the weighted sum over each token's K rows) autograd functions. Same x, topk_idx, topk_weight (fp32, differentiable
  as in mok) and expert weights as the other methods, bf16 parameters (so bf16 weight gradients); its gate/up weights
  are one [E, 2I, H] tensor with gate row i at 2i and up row i at 2i + 1 (its default layout), copied once. It has no
  shared expert.

- `scaled_grouped_mm_fp8` (forward only, no autograd): the grouped_mm path on FP8 operands through
  `torch._scaled_grouped_mm`, rowwise scales (one per row of the activations, one per output column of each expert's
  weight: PyTorch's FP8 grouped GEMM recipe, coarser than mok's 1x128 / 128x128 blocks); the weights quantised in
  each call (as a layer without a cache would), the routed experts alone.

The grouped_mm path and the naive loop add a shared expert (S > 0) first, as three plain matmuls.
"""
from __future__ import annotations

import importlib.util

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


def _rowwise_fp8(t):
    """(e4m3 t, fp32 scale per row of the last dimension's rows) with amax / scale = 448."""
    scale = t.abs().amax(-1, keepdim=True).float().clamp_min(1e-12) / 448.0
    return (t.float() / scale).to(torch.float8_e4m3fn), scale.squeeze(-1)


def _scaled_gmm(a, w_ENK, offs):
    """torch._scaled_grouped_mm of bf16 a [M, K] and w [E, N, K] (each quantised rowwise) -> bf16 [M, N]."""
    aq, sa = _rowwise_fp8(a)
    wq, sw = _rowwise_fp8(w_ENK)
    return torch._scaled_grouped_mm(aq, wq.transpose(1, 2), sa, sw, offs=offs, out_dtype=torch.bfloat16)


@torch.no_grad()
def scaled_grouped_mm_fp8(x, topk_idx, topk_weight, sg, su, sd, rg, ru, rd):
    """y [T,H] bf16 of the routed experts on FP8 operands (module docstring); no autograd."""
    T, H = x.shape
    E, K = rg.shape[0], topk_idx.shape[1]
    flat = topk_idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    offs = torch.cumsum(torch.bincount(flat, minlength=E), 0).to(torch.int32)
    tok = order // K
    xs = x[tok]
    a = F.silu(_scaled_gmm(xs, rg, offs)) * _scaled_gmm(xs, ru, offs)
    o = _scaled_gmm(a, rd, offs)
    acc = torch.zeros(T, H, dtype=torch.float32, device=x.device)
    return acc.index_add(0, tok, o.float() * topk_weight.reshape(-1)[order].unsqueeze(1)).to(torch.bfloat16)


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


def sonic_available() -> bool:
    """Whether the `sonicmoe` package can be imported here."""
    return importlib.util.find_spec("sonicmoe") is not None



def require_sonic(what: str) -> None:
    """Before anything runs: RuntimeError naming `what` (the option or workload asking for SonicMoE) when the
    `sonicmoe` package cannot be imported here."""
    if importlib.util.find_spec("sonicmoe") is None:
        raise RuntimeError(f"{what}: SonicMoE (the sonicmoe package) is not importable here; "
                           "pip install sonic-moe==0.1.2.post1 (it brings quack-kernels and nvidia-cutlass-dsl)")


def sonic_leaves(inp: dict) -> dict:
    """SonicMoE's inputs from bench_moe's: x [T, H] bf16, w1_EFH [E, 2I, H] bf16 (routed_gate's row i at 2i,
    routed_up's at 2i + 1), w2_EHI [E, H, I] bf16 and score_TK [T, K] fp32 (topk_weight) as fresh autograd leaves;
    idx_TK [T, K] int32 (topk_idx). ValueError when `inp` has a shared expert, which SonicMoE's layer lacks."""
    if inp.get("shared_gate") is not None:
        raise ValueError("inp: SonicMoE's layer has no shared expert; give a shape with S = 0")
    gate_EIH, up_EIH = inp["routed_gate"], inp["routed_up"]
    E, I, H = gate_EIH.shape

    def leaf(t: torch.Tensor) -> torch.Tensor:
        return t.detach().clone().contiguous().requires_grad_(True)

    return {"x": leaf(inp["x"]), "w1_EFH": leaf(torch.stack([gate_EIH, up_EIH], dim=2).reshape(E, 2 * I, H)),
            "w2_EHI": leaf(inp["routed_down"]), "score_TK": leaf(inp["topk_weight"].float()),
            "idx_TK": inp["topk_idx"].to(torch.int32).contiguous()}


def sonic_forward(leaves: dict) -> torch.Tensor:
    """y [T, H] bf16: SonicMoE's routed SwiGLU experts on `sonic_leaves`' tensors, autograd through its kernels
    (the body of `sonicmoe.moe_TC_softmax_topk_layer` after its router, with the same arguments)."""
    from sonicmoe.enums import ActivationType
    from sonicmoe.functional import TC_topk_router_metadata_triton, _DownProjection, _UpProjection

    x, idx_TK = leaves["x"], leaves["idx_TK"]
    E = leaves["w1_EFH"].shape[0]
    T, K = idx_TK.shape
    i32 = {"dtype": torch.int32, "device": x.device}
    s_scatter, s_reverse_scatter, x_gather = (torch.empty(T * K, **i32) for _ in range(3))
    freq, freq_offset = torch.empty(E, **i32), torch.empty(E + 1, **i32)
    TC_topk_router_metadata_triton(idx_TK, E, freq, freq_offset, x_gather, s_scatter, s_reverse_scatter)
    a, h = _UpProjection.apply(x, leaves["w1_EFH"].permute(1, 2, 0), None, freq_offset, T * K, K, x_gather,
                               s_scatter, s_reverse_scatter, None, False, ActivationType.SWIGLU, False, False)
    return _DownProjection.apply(a, h, leaves["w2_EHI"].permute(1, 2, 0), None, leaves["score_TK"], freq_offset, T,
                                 K, x_gather, s_scatter, s_reverse_scatter, None, False, ActivationType.SWIGLU)


def sonic_forward_ref(leaves: dict) -> torch.Tensor:
    """What `sonic_forward` computes, in fp32 PyTorch, reading the weights in SonicMoE's layout: y [T, H] fp32,
    y[t] = sum over k of score_TK[t, k] · (silu(g) · u) @ w2[e]ᵀ, with h = w1[e] @ x[t], g = h[0::2], u = h[1::2],
    e = idx_TK[t, k]. A check of the layout conversion, not of SonicMoE."""
    x_TH = leaves["x"].float()
    y_TH = torch.zeros_like(x_TH)
    T, K = leaves["idx_TK"].shape
    for t in range(T):
        for k in range(K):
            e = int(leaves["idx_TK"][t, k])
            h_F = leaves["w1_EFH"][e].float() @ x_TH[t]
            a_I = F.silu(h_F[0::2]) * h_F[1::2]
            y_TH[t] += leaves["score_TK"][t, k].float() * (leaves["w2_EHI"][e].float() @ a_I)
    return y_TH

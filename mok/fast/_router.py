"""The fast path's router and router losses.

Router: the gate GEMM (logits = x · Wᵀ) and its two backward GEMMs run through the same CUTLASS
grouped GEMMs as the layer (fixed tiles, no split-K: bitwise reproducible and batch invariant);
scores, top-k, renormalisation and the logit gradient run in one kernel each (csrc/router.cu) with
the reference's formulas, so on the same logits they give the reference's bits. As in the
reference, the fp32 logit gradient enters the two backward GEMMs as two bf16 parts (hi + lo).
E is padded to a multiple of 8 inside (16-byte rows for TMA); the padding rows are zero.

Losses: the same definitions as `mok.nn.losses` (load balance E·Σ f_e P_e, z = mean lse²), forward and
backward each in one C call (csrc/router_losses.cu: fixed-order sums, integer pick counts, no host
synchronisation). Their bits are not the reference's.
"""
from __future__ import annotations

import torch

from ..reference import check_route_args, check_score
from . import _lib
from ._checks import check_cuda


_on_cuda = check_cuda  # the layer's device check; CPU tests with stand-in kernels (tests/fast/test_errors_cpu.py)
# replace this name for the router's functions


def _on_cuda_tensor(name: str, t) -> None:
    """What the C boundary (`_lib`) checks only after allocating outputs on `t`'s device: `t` a tensor on a CUDA
    device (TypeError / ValueError naming it). The options its kernels read as ints (score as "softmax or not",
    k, normalize) are checked by the reference's `check_route_args` / `check_score`."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    _on_cuda(name, t)


def _pad8(n: int) -> int:
    return (n + 7) // 8 * 8


def _padded_rows(w_EH: torch.Tensor, copies: int) -> torch.Tensor:
    """`copies` copies of w stacked, each padded with zero rows to a multiple of 8: [copies * Ep, H]."""
    E, H = w_EH.shape
    Ep = _pad8(E)
    if Ep == E and copies == 1:
        return w_EH
    out = torch.zeros(copies, Ep, H, dtype=w_EH.dtype, device=w_EH.device)
    out[:, :E] = w_EH
    return out.view(copies * Ep, H)


def router_forward(x_TH: torch.Tensor, w_EH: torch.Tensor, k: int, score: str, normalize: bool):
    """As `mok.reference.router_forward`, on the GPU.

    Args:
        x_TH: [T, H] bf16, contiguous, CUDA (H % 8 == 0). w_EH: [E, H] bf16, contiguous, same device.
        k: 1 <= k <= E. score: "softmax" or "sigmoid". normalize: renormalise the k weights.
    Returns:
        (topk_weight [T, k] fp32, topk_idx [T, k] int64, scores [T, E] fp32, logits [T, E] fp32).
    """
    _on_cuda_tensor("x_TH", x_TH)
    _on_cuda_tensor("w_EH", w_EH)
    check_route_args(w_EH.shape[0], k, score, normalize)
    T, H = x_TH.shape
    E = w_EH.shape[0]
    Ep = _pad8(E)
    dev = x_TH.device
    logits_p = torch.empty(T, Ep, dtype=torch.float32, device=dev)
    if T:
        _lib.grouped_gemm(_lib.GEMM_TN_F32, [_lib.Segment.all_rows(T, Ep, H, _lib.Operand(x_TH, 0, 0, H),
                                                                   _lib.Operand(_padded_rows(w_EH, 1), 0, 0, H),
                                                                   _lib.Operand(logits_p, 0, 0, Ep))], dev)
    scores = torch.empty(T, E, dtype=torch.float32, device=dev)
    topk_idx = torch.empty(T, k, dtype=torch.int64, device=dev)
    topk_w = torch.empty(T, k, dtype=torch.float32, device=dev)
    _lib.router_topk(logits_p, E, k, score == "softmax", normalize, scores, topk_idx, topk_w)
    logits = logits_p if Ep == E else logits_p[:, :E].contiguous()
    return topk_w, topk_idx, scores, logits


def router_backward(x_TH, w_EH, scores_TE, topk_idx_TK, d_topk_weight_TK, d_scores_TE, d_logits_TE,
                    score: str, normalize: bool):
    """As `mok.reference.router_backward`, on the GPU: (d_x [T, H] bf16, d_w [E, H] fp32)."""
    _on_cuda_tensor("x_TH", x_TH)
    _on_cuda_tensor("w_EH", w_EH)
    _on_cuda_tensor("topk_idx_TK", topk_idx_TK)
    check_route_args(w_EH.shape[0], topk_idx_TK.shape[1], score, normalize)
    T, H = x_TH.shape
    E = w_EH.shape[0]
    Ep = _pad8(E)
    dev = x_TH.device
    if T == 0:
        return torch.zeros(0, H, dtype=torch.bfloat16, device=dev), torch.zeros(E, H, dtype=torch.float32, device=dev)
    hl = torch.empty(T, 2 * Ep, dtype=torch.bfloat16, device=dev)
    _lib.router_bwd(scores_TE, topk_idx_TK, d_topk_weight_TK, d_scores_TE, d_logits_TE, score == "softmax",
                    normalize, hl)
    d_x = torch.empty(T, H, dtype=torch.bfloat16, device=dev)
    # d_x = [hi | lo] · [W; W]: one fp32 accumulation over 2Ep
    _lib.grouped_gemm(_lib.GEMM_NN_BF16, [_lib.Segment.all_rows(T, H, 2 * Ep, _lib.Operand(hl, 0, 0, 2 * Ep),
                                                                _lib.Operand(_padded_rows(w_EH, 2), 0, 0, H),
                                                                _lib.Operand(d_x, 0, 0, H))], dev)
    d_w2 = weight_grad_halves(hl, x_TH, Ep)
    return d_x, d_w2[0, :E] + d_w2[1, :E]


def weight_grad_halves(hl_T2E: torch.Tensor, x_TH: torch.Tensor, Ep: int, kind: int = _lib.GEMM_TT_F32_SMALL):
    """[hiᵀ x, loᵀ x]: [2, Ep, H] fp32, each reduced over the T tokens in order, in one launch of GEMM `kind` (the
    small-tile kind: [Ep, H] makes few of the layer's tiles; GEMM_TT_F32 gives the same bits, more slowly).

    Args:
        hl_T2E: [T, 2 Ep] bf16 = [hi | lo] of the logit gradient; x_TH: [T, H] bf16; both contiguous, CUDA.
    """
    T, H = x_TH.shape
    d_w2 = torch.empty(2, Ep, H, dtype=torch.float32, device=x_TH.device)
    _lib.grouped_gemm(kind, [
        _lib.Segment.all_wgrad(T, Ep, H, _lib.Operand(hl_T2E, 0, 0, 2 * Ep, offset=half * Ep),
                               _lib.Operand(x_TH, 0, 0, H),
                               _lib.Operand(d_w2, 0, 0, H, offset=half * Ep * H)) for half in (0, 1)], x_TH.device)
    return d_w2


# ---------------------------------------------------------------- losses


def router_losses(scores_TE, logits_TE, topk_idx_TK, score: str):
    """(load balance, z), both [] fp32, with `mok.nn.losses`' definitions (`router_losses` there): load balance
    = E · Σ_e f_e P_e, f_e = picks of e / (T·K), P_e = mean over tokens of the token's probability (softmax scores,
    or sigmoid scores over their row sum); z = mean over tokens of logsumexp(logits)². One C call (two kernels,
    fixed-order sums; csrc/router_losses.cu).

    Args:
        scores_TE, logits_TE: [T, E] fp32 on the GPU; topk_idx_TK: [T, K] int64; score: "softmax" or "sigmoid".
    """
    _on_cuda_tensor("scores_TE", scores_TE)
    check_score(score)
    if scores_TE.shape[0] == 0:
        return scores_TE.new_zeros(()), scores_TE.new_zeros(())
    balance, z = scores_TE.new_empty(()), scores_TE.new_empty(())  # the kernel writes both
    _lib.router_losses(scores_TE.contiguous(), logits_TE.contiguous(), topk_idx_TK.contiguous(), score != "softmax",
                       balance, z)
    return balance, z


def router_losses_backward(d_balance, d_z, scores_TE, logits_TE, topk_idx_TK, score: str):
    """(d_scores [T, E], d_logits [T, E]) fp32: the gradients of `router_losses` for the loss gradients d_balance
    and d_z ([] fp32 tensors on the GPU): d_scores = dq (softmax) or (dq - Σ_e q_e dq_e) / s, q = scores / s, s the
    row sum (sigmoid), dq_e = d_balance · E · f_e / T; d_logits = d_z · 2 · lse_t / T · softmax(l_t). One C call
    (two kernels, after a memset)."""
    _on_cuda_tensor("scores_TE", scores_TE)
    check_score(score)
    d_scores, d_logits = (torch.empty(scores_TE.shape, dtype=torch.float32, device=scores_TE.device) for _ in "sl")
    if scores_TE.shape[0]:
        _lib.router_losses_bwd(d_balance.float().contiguous(), d_z.float().contiguous(), scores_TE.contiguous(),
                               logits_TE.contiguous(), topk_idx_TK.contiguous(), score != "softmax", d_scores,
                               d_logits)
    return d_scores, d_logits

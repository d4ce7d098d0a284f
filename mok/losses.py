"""Deterministic router scores, their backward, and the router losses (load balancing, z-loss).

Everything is built from the reference's bit-defining primitives (elementwise IEEE operations,
`exp_exact`, `tree_sum`), so values and gradients are the same bits on every CPU, thread count
and GPU, and are batch-invariant per token. Backward passes are written out analytically (no
autograd through library reductions, whose order is the platform's choice).
"""

from __future__ import annotations

import torch

from .reference.exact import exp_exact, sigmoid_exact, tree_sum

# log on [1, inf): x = m * 2^e with m in [sqrt(1/2), sqrt(2)), log m = 2 atanh(s), s = (m-1)/(m+1).
_LN2_HI = 0.693145751953125  # 16 bits: e * _LN2_HI is exact for |e| < 2^8
_LN2_LO = 1.428606765330187045e-06
_SQRT2 = 1.41421353816986083984375  # fp32(sqrt 2)
_ATANH_COEF = (1 / 13, 1 / 11, 1 / 9, 1 / 7, 1 / 5, 1 / 3, 1.0)  # Horner in s², highest first


def log_exact_ge1(x: torch.Tensor) -> torch.Tensor:
    """Natural log of fp32 `x` >= 1 (finite) from basic IEEE operations; NaN stays NaN.

    Only the domain the z-loss needs (a log-sum-exp argument is >= 1). |rel. error| < 1e-7.

    Args:
        x: any shape, float32, values >= 1.
    Returns:
        same shape, float32.
    """
    bits = x.view(torch.int32)
    e = (bits >> 23) - 127
    m = ((bits & 0x7FFFFF) | (127 << 23)).view(torch.float32)  # [1, 2)
    big = m > _SQRT2
    m = torch.where(big, m * 0.5, m)
    e = (e + big.to(torch.int32)).to(torch.float32)
    s = (m - 1.0) / (m + 1.0)
    s2 = s * s
    p = torch.full_like(s, _ATANH_COEF[0])
    for c in _ATANH_COEF[1:]:
        p = p * s2 + c
    y = e * _LN2_HI + ((2.0 * s) * p + e * _LN2_LO)
    return torch.where(torch.isnan(x), x, y)


def scores(logits_TE: torch.Tensor, score: str) -> torch.Tensor:
    """The router's per-expert scores exactly as `mok.reference.route` computes them.

    Args:
        logits_TE: [T, E] float32.
        score: "softmax" or "sigmoid".
    Returns:
        [T, E] float32.
    """
    if score == "softmax":
        if logits_TE.shape[0] == 0:
            return logits_TE.clone()
        e = exp_exact(logits_TE - logits_TE.max(dim=1, keepdim=True).values)
        return e / tree_sum(e, dim=1)[:, None]
    return sigmoid_exact(logits_TE)


def route_backward(logits_TE, topk_idx_TK, d_topk_weight_TK, d_scores_TE, score: str, normalize: bool):
    """Gradient of (topk_weight, scores) of `route` with respect to the logits (analytic).

    softmax: dl = p * (dp - Σ_e p dp); sigmoid: dl = dp * p * (1 - p); normalize:
    d p_k = (dw_k - Σ_j w_j dw_j) / Σ_j p_j over the picked k. Every Σ is a `tree_sum`.

    Args:
        logits_TE: [T, E] float32; topk_idx_TK: [T, K] int64 (from `route`);
        d_topk_weight_TK: [T, K] float32; d_scores_TE: [T, E] float32.
    Returns:
        d_logits [T, E] float32.
    """
    p = scores(logits_TE, score)
    pk = torch.gather(p, 1, topk_idx_TK)
    if normalize:
        s = tree_sum(pk, dim=1)[:, None]
        w = pk / s
        dpk = (d_topk_weight_TK - tree_sum(w * d_topk_weight_TK, dim=1)[:, None]) / s
    else:
        dpk = d_topk_weight_TK
    dp = d_scores_TE + torch.zeros_like(p).scatter(1, topk_idx_TK, dpk)  # ids distinct per row
    if score == "softmax":
        return p * (dp - tree_sum(p * dp, dim=1)[:, None])
    return dp * (p * (1.0 - p))


def _balance_probs(scores_TE: torch.Tensor, score: str) -> torch.Tensor:
    """Per-token probabilities used by the balance loss: softmax scores, or sigmoid scores / their sum."""
    return scores_TE if score == "softmax" else scores_TE / tree_sum(scores_TE, dim=1)[:, None]


def _fraction(topk_idx_TK: torch.Tensor, E: int) -> torch.Tensor:
    """f_e = (slots routed to e) / (T * K), [E] float32 (integer counts, exact)."""
    counts = torch.zeros(E, dtype=torch.int64, device=topk_idx_TK.device)
    counts.scatter_add_(0, topk_idx_TK.reshape(-1), torch.ones_like(topk_idx_TK.reshape(-1)))
    return counts.to(torch.float32) / float(max(1, topk_idx_TK.numel()))


def load_balance_loss(scores_TE, topk_idx_TK, score: str) -> torch.Tensor:
    """Switch-Transformer balance loss E * Σ_e f_e * P_e; 1.0 for perfectly uniform routing.

    f_e: fraction of the T*K routed slots on expert e; P_e: mean over tokens of the token's
    probability of e. (transformers' Qwen3-MoE `load_balancing_loss_func` is K times this.)

    Args:
        scores_TE: [T, E] float32 (route's scores); topk_idx_TK: [T, K] int64.
    Returns:
        [] float32 (0 when T = 0).
    """
    T, E = scores_TE.shape
    if T == 0:
        return scores_TE.new_zeros(())
    P = tree_sum(_balance_probs(scores_TE, score), dim=0) / float(T)
    return tree_sum(_fraction(topk_idx_TK, E) * P, dim=0) * float(E)


def load_balance_loss_backward(d_loss, scores_TE, topk_idx_TK, score: str) -> torch.Tensor:
    """d load_balance_loss / d scores: [T, E] float32 (f is piecewise constant: no gradient)."""
    T, E = scores_TE.shape
    if T == 0:
        return torch.zeros_like(scores_TE)
    dq = (d_loss * float(E)) * _fraction(topk_idx_TK, E) / float(T)  # [E], same for every token
    dq = dq.expand(T, E)
    if score == "softmax":
        return dq.contiguous()
    s = tree_sum(scores_TE, dim=1)[:, None]
    q = scores_TE / s
    return (dq - tree_sum(q * dq, dim=1)[:, None]) / s


def _lse(logits_TE: torch.Tensor):
    """(log-sum-exp [T], softmax [T, E]) of each row, exact primitives."""
    mx = logits_TE.max(dim=1).values
    e = exp_exact(logits_TE - mx[:, None])
    s = tree_sum(e, dim=1)
    return mx + log_exact_ge1(s), e / s[:, None]


def z_loss(logits_TE: torch.Tensor) -> torch.Tensor:
    """Router z-loss (ST-MoE): mean over tokens of logsumexp(logits)^2. [] float32 (0 when T = 0)."""
    T = logits_TE.shape[0]
    if T == 0:
        return logits_TE.new_zeros(())
    lse, _ = _lse(logits_TE)
    return tree_sum(lse * lse, dim=0) / float(T)


def z_loss_backward(d_loss, logits_TE: torch.Tensor) -> torch.Tensor:
    """d z_loss / d logits = d * 2 * lse_t / T * softmax(l_t): [T, E] float32."""
    T = logits_TE.shape[0]
    if T == 0:
        return torch.zeros_like(logits_TE)
    lse, p = _lse(logits_TE)
    return ((d_loss * 2.0) * lse / float(T))[:, None] * p

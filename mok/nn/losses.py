"""The router losses (load balancing, z-loss) and their backward passes, bit-exact.

Everything is built from the reference's bit-defining primitives (elementwise IEEE operations,
`exp_exact`, `tree_sum`), so values and gradients are the same bits on every CPU, thread count
and GPU, and are batch-invariant per token. Backward passes are written out analytically (no
autograd through library reductions, whose order is the platform's choice).
"""

from __future__ import annotations

import torch

from ..reference import exp_exact, log_exact_ge1, tree_sum


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


def router_losses(scores_TE, logits_TE, topk_idx_TK, score: str):
    """(load_balance_loss, z_loss), both [] float32: the pair `mok.nn.ops.router_losses` computes (the fast
    backend's `mok.fast.router_losses` has the same signature)."""
    return load_balance_loss(scores_TE, topk_idx_TK, score), z_loss(logits_TE)


def router_losses_backward(d_balance, d_z, scores_TE, logits_TE, topk_idx_TK, score: str):
    """(d_scores [T, E], d_logits [T, E]) float32: the gradients of `router_losses` for d_balance and d_z."""
    return (load_balance_loss_backward(d_balance, scores_TE, topk_idx_TK, score),
            z_loss_backward(d_z, logits_TE))

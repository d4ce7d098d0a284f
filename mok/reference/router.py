"""Bit-exact router helper: scores, top-k with a fixed tie-break, optional renormalisation."""

from __future__ import annotations

import torch

from .exact import exp_exact, sigmoid_exact, tree_sum

SCORES = ("softmax", "sigmoid")


def route(logits, k: int, *, score: str = "softmax", normalize: bool = True):
    """Pick k experts per token from router logits, bit-exactly on every platform.

    Scores: softmax = exp(l - max) / tree_sum(exp(l - max)); sigmoid = 1 / (1 + exp(-l)),
    both with the contract's `exp_exact`. Top-k: the k largest scores; equal scores go to
    the lower expert id first (a stable descending sort). NaN scores sort first.
    Weights: the picked scores, divided by their tree_sum over k when `normalize`.

    Args:
        logits: [T, E] float32 or bfloat16 (bf16 is widened exactly to fp32).
        k: experts per token, 1 <= k <= E.
        score: "softmax" or "sigmoid".
        normalize: renormalise the k weights to sum to one.
    Returns:
        (topk_idx [T, k] int64, topk_weight [T, k] float32).
    """
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits: expected a torch.Tensor, got {type(logits).__name__}")
    if logits.dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"logits: expected dtype torch.float32 or torch.bfloat16, got {logits.dtype}")
    if logits.dim() != 2:
        raise ValueError(f"logits: expected 2 dimensions [T, E], got shape {tuple(logits.shape)}")
    E = logits.shape[1]
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= E:
        raise ValueError(f"k: expected an int in [1, E = {E}], got {k!r}")
    if score not in SCORES:
        raise ValueError(f"score: expected one of {SCORES}, got {score!r}")
    l = logits.float()
    if score == "softmax":
        e = exp_exact(l - l.max(dim=1, keepdim=True).values) if l.shape[0] else l
        p = e / tree_sum(e, dim=1)[:, None]
    else:
        p = sigmoid_exact(l)
    order = torch.sort(p, dim=1, descending=True, stable=True).indices
    topk_idx = order[:, :k].contiguous()
    w = torch.gather(p, 1, topk_idx)
    if normalize:
        w = w / tree_sum(w, dim=1)[:, None]
    return topk_idx, w.contiguous()

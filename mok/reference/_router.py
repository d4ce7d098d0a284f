"""The reference router, bit-exact: gate logits, scores, top-k with a fixed tie-break, optional
renormalisation, and their analytic backward passes."""

from __future__ import annotations

import torch

from ._exact import bf16, exp_exact, matmul_exact, rows_outer_sum, sigmoid_exact, tree_sum
from ._validate import _device, _shape, _tensor, check_expert_ids

SCORES = ("softmax", "sigmoid")
# normalize: a row whose picked scores sum below the smallest normal fp32 (2^-126; only sigmoid scores
# of logits all below about -87.3 get there) gets the weights 1/k, and no gradient (docs/reliability.md)
TINY_SUM = torch.finfo(torch.float32).tiny


def _check_gate_args(x_TH, w_EH) -> tuple[int, int, int]:
    """x_TH [T, H] bf16 and w_EH [E, H] bf16 on x's device (no float32: the logits are defined on bf16
    tokens, and mok.nn rounds float32 ones before calling). Returns (T, H, E)."""
    _tensor("x_TH", x_TH, torch.bfloat16, 2)
    _tensor("w_EH", w_EH, torch.bfloat16, 2)
    T, H = x_TH.shape
    E = w_EH.shape[0]
    _shape("w_EH", w_EH, (E, H))
    _device("w_EH", w_EH, x_TH.device)
    return T, H, E


def _check_f32(name: str, t, shape: tuple, device: torch.device) -> None:
    _tensor(name, t, torch.float32, len(shape))
    _shape(name, t, shape)
    _device(name, t, device)


def gate_logits(x_TH: torch.Tensor, w_EH: torch.Tensor) -> torch.Tensor:
    """Router logits x · wᵀ: exact bf16 products, the contract's tree over H.

    Args:
        x_TH: [T, H] bfloat16. w_EH: [E, H] bfloat16 (other dtypes, float32 included, raise TypeError).
    Returns:
        logits [T, E] float32.
    """
    _check_gate_args(x_TH, w_EH)
    return matmul_exact(x_TH, w_EH)


def split_hi_lo(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 `v` as two bf16 parts, hi = bf16(v), lo = bf16(v - hi): 16 significant bits of v."""
    hi = bf16(v)
    return hi, bf16(v - hi.float())


def gate_backward(x_TH: torch.Tensor, w_EH: torch.Tensor, d_logits_TE: torch.Tensor):
    """Gradients of `gate_logits`: the fp32 logit gradient split into hi + lo bf16 parts
    (`split_hi_lo`), then exact-product tree sums over those parts (hi terms first, then lo).

    Args:
        x_TH: [T, H] bfloat16. w_EH: [E, H] bfloat16. d_logits_TE: [T, E] float32.
    Returns:
        (d_x [T, H] bfloat16, d_w [E, H] float32).
    """
    T, _, E = _check_gate_args(x_TH, w_EH)
    _check_f32("d_logits_TE", d_logits_TE, (T, E), x_TH.device)
    hi, lo = split_hi_lo(d_logits_TE)
    d_x = bf16(matmul_exact(torch.cat([hi, lo], dim=1), torch.cat([w_EH, w_EH], dim=0).t().contiguous()))
    d_w = rows_outer_sum(torch.cat([hi, lo], dim=0), torch.cat([x_TH, x_TH], dim=0))
    return d_x, d_w


def router_scores(logits_TE: torch.Tensor, score: str) -> torch.Tensor:
    """Per-expert scores: softmax = exp(l - max) / tree_sum(exp(l - max)), sigmoid = 1 / (1 + exp(-l)),
    both with the contract's `exp_exact`.

    Args:
        logits_TE: [T, E] float32.
        score: "softmax" or "sigmoid" (anything else raises ValueError).
    Returns:
        [T, E] float32.
    """
    _tensor("logits_TE", logits_TE, torch.float32, 2)
    check_score(score)
    if score == "softmax":
        if logits_TE.shape[0] == 0:
            return logits_TE.clone()
        e = exp_exact(logits_TE - logits_TE.max(dim=1, keepdim=True).values)
        return e / tree_sum(e, dim=1)[:, None]
    return sigmoid_exact(logits_TE)


def route(logits, k: int, *, score: str = "softmax", normalize: bool = True):
    """Pick k experts per token from router logits, bit-exactly on every platform.

    Scores: `router_scores`. Top-k: the k largest scores; equal scores go to the lower expert id
    first (a stable descending sort). NaN scores sort first.
    Weights: the picked scores, divided by their tree_sum over k when `normalize`; when that sum is
    below 2^-126, the smallest normal fp32 (zero or subnormal: sigmoid scores of logits all below about
    -87.3), each weight is 1/k instead (no NaN, no gradient).

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
    check_route_args(logits.shape[1], k, score, normalize)
    return _topk(router_scores(logits.float(), score), k, normalize)


def check_route_args(E: int, k, score, normalize) -> None:
    """The router's options for E experts: k an int in [1, E] (TypeError for a wrong type, a bool included;
    ValueError for a value), score (`check_score`), normalize a bool (TypeError)."""
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k: expected an int in [1, E = {E}], got {type(k).__name__} {k!r}")
    if not 1 <= k <= E:
        raise ValueError(f"k: expected an int in [1, E = {E}], got {k!r}")
    _check_score_args(score, normalize)


def check_score(score) -> None:
    """ValueError unless `score` is one of SCORES (every kernel and op reads "softmax or not")."""
    if score not in SCORES:
        raise ValueError(f"score: expected one of {SCORES}, got {score!r}")


def _check_score_args(score, normalize) -> None:
    check_score(score)
    if not isinstance(normalize, bool):
        raise TypeError(f"normalize: expected a bool, got {normalize!r}")


def _topk(p_TE: torch.Tensor, k: int, normalize: bool):
    """(topk_idx [T, k] int64, topk_weight [T, k] fp32) of scores p: stable descending sort, NaN first.

    normalize: w = p / tree_sum(p) over the k picked; a row whose sum is below TINY_SUM (2^-126: zero
    or subnormal, as for sigmoid scores of logits all below about -87.3) gets w = fp32(1) / k on each.
    """
    order = torch.sort(p_TE, dim=1, descending=True, stable=True).indices
    topk_idx = order[:, :k].contiguous()
    w = torch.gather(p_TE, 1, topk_idx)
    if normalize:
        s = tree_sum(w, dim=1)[:, None]
        w = torch.where(s < TINY_SUM, torch.ones_like(s) / k, w / s)
    return topk_idx, w.contiguous()


def route_backward(scores_TE, topk_idx_TK, d_topk_weight_TK, d_scores_TE, score: str, normalize: bool):
    """Gradient of (topk_weight, scores) of `route` with respect to the logits (analytic).

    softmax: dl = p * (dp - Σ_e p dp); sigmoid: dl = dp * p * (1 - p); normalize:
    d p_k = (dw_k - Σ_j w_j dw_j) / Σ_j p_j over the picked k, and 0 in a row where Σ_j p_j < 2^-126
    (its weights are the constant 1/k, see `route`). Every Σ is a `tree_sum`.

    Args:
        scores_TE: [T, E] float32, `router_scores` of the logits; topk_idx_TK: [T, K] int64 (from `route`):
        ids in [0, E), distinct within each row (checked: this reads the ids, a host synchronisation on CUDA);
        d_topk_weight_TK: [T, K] float32; d_scores_TE: [T, E] float32. No broadcasting: every shape exact.
    Returns:
        d_logits [T, E] float32.
    """
    _check_score_args(score, normalize)
    _tensor("scores_TE", scores_TE, torch.float32, 2)
    T, E = scores_TE.shape
    dev = scores_TE.device
    _tensor("topk_idx_TK", topk_idx_TK, torch.int64, 2)
    K = topk_idx_TK.shape[1]
    _shape("topk_idx_TK", topk_idx_TK, (T, K))
    _device("topk_idx_TK", topk_idx_TK, dev)
    if not 1 <= K <= E:
        raise ValueError(f"topk_idx_TK: expected 1 <= K <= E = {E}, got K = {K}")
    _check_f32("d_topk_weight_TK", d_topk_weight_TK, (T, K), dev)
    _check_f32("d_scores_TE", d_scores_TE, (T, E), dev)
    check_expert_ids(topk_idx_TK, E, name="topk_idx_TK")
    p = scores_TE
    pk = torch.gather(p, 1, topk_idx_TK)
    if normalize:
        s = tree_sum(pk, dim=1)[:, None]
        w = pk / s
        dpk = (d_topk_weight_TK - tree_sum(w * d_topk_weight_TK, dim=1)[:, None]) / s
        dpk = torch.where(s < TINY_SUM, torch.zeros_like(dpk), dpk)
    else:
        dpk = d_topk_weight_TK
    dp = d_scores_TE + torch.zeros_like(p).scatter(1, topk_idx_TK, dpk)  # ids distinct per row
    if score == "softmax":
        return p * (dp - tree_sum(p * dp, dim=1)[:, None])
    return dp * (p * (1.0 - p))


def router_forward(x_TH: torch.Tensor, w_EH: torch.Tensor, k: int, score: str, normalize: bool):
    """The whole router: `gate_logits`, `router_scores`, top-k and renormalisation as `route`.

    Args:
        x_TH: [T, H] bfloat16 (float32 raises TypeError: `mok.router` / mok.nn round float32 tokens to bf16
            before calling this). w_EH: [E, H] bfloat16. k, score, normalize: as `route`.
    Returns:
        (topk_weight [T, k] fp32, topk_idx [T, k] int64, scores [T, E] fp32, logits [T, E] fp32).
    """
    _, _, E = _check_gate_args(x_TH, w_EH)
    check_route_args(E, k, score, normalize)
    logits = gate_logits(x_TH, w_EH)
    p = router_scores(logits, score)
    topk_idx, topk_weight = _topk(p, k, normalize)
    return topk_weight, topk_idx, p, logits


def router_backward(x_TH, w_EH, scores_TE, topk_idx_TK, d_topk_weight_TK, d_scores_TE, d_logits_TE,
                    score: str, normalize: bool):
    """Gradients of `router_forward`: `route_backward` + d_logits, then `gate_backward`.

    Args:
        x_TH: [T, H] bf16; w_EH: [E, H] bf16; scores_TE: [T, E] fp32 and topk_idx_TK: [T, K] int64 from
        `router_forward`; d_topk_weight_TK: [T, K], d_scores_TE, d_logits_TE: [T, E] fp32, each or None (zeros).
    Returns:
        (d_x [T, H] bf16, d_w [E, H] fp32).
    """
    T, _, E = _check_gate_args(x_TH, w_EH)
    _check_f32("scores_TE", scores_TE, (T, E), x_TH.device)
    _tensor("topk_idx_TK", topk_idx_TK, torch.int64, 2)  # its shape makes the default d_topk_weight_TK
    if d_logits_TE is not None:
        _check_f32("d_logits_TE", d_logits_TE, (T, E), x_TH.device)
    zeros = torch.zeros_like(scores_TE)
    d_tw = d_topk_weight_TK if d_topk_weight_TK is not None else zeros.new_zeros(topk_idx_TK.shape)
    dl = route_backward(scores_TE, topk_idx_TK, d_tw, d_scores_TE if d_scores_TE is not None else zeros,
                        score, normalize)
    dl = dl + (d_logits_TE if d_logits_TE is not None else zeros)
    return gate_backward(x_TH, w_EH, dl)

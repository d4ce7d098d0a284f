"""The layer, its router and the router losses as `torch.library.custom_op`s.

Each op has a fake (meta) implementation and a registered autograd formula, so
`torch.compile(..., fullgraph=True)` traces them as opaque nodes: the bit-defining math always
runs the eager reference code, and a compiled model gives the same bits as the eager one.

Ops (namespace `mok`):
  router_fwd / router_bwd   bias-free gate (exact matmul) + `mok.reference.route`
  moe_fwd / moe_bwd         the layer (SPEC §2), reference or fast backend, optional recompute
  router_losses_fwd / _bwd  load-balancing loss and z-loss (`mok.losses`)

Weights may be float32 (master weights) or bfloat16: the ops round them to bf16 for the math and
return float32 weight gradients, so float32 parameters get them without a bf16 rounding.
"""

from __future__ import annotations

import importlib
from typing import Optional

import torch
from torch import Tensor

from . import losses
from .reference import comm, layer
from .reference.exact import bf16, matmul_exact, rows_outer_sum
from .reference.router import route
from .reference.validate import check_layer_args

BACKENDS = ("reference", "fast")
_WEIGHT_DTYPES = (torch.float32, torch.bfloat16)


# ---------------------------------------------------------------- helpers


def _group(group_name: Optional[str]):
    if group_name is None:
        return None
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(group_name)


def group_name(group) -> Optional[str]:
    """The name the ops take for a process group (None for no expert parallelism)."""
    return None if group is None else group.group_name


def _impl(backend: str):
    if backend == "reference":
        from . import reference

        return reference
    if backend == "fast":
        return importlib.import_module("mok.fast")
    raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")


def _as_bf16(name: str, w: Optional[Tensor]) -> Optional[Tensor]:
    if w is None:
        return None
    if w.dtype not in _WEIGHT_DTYPES:
        raise TypeError(f"{name}: expected dtype torch.float32 or torch.bfloat16, got {w.dtype}")
    return w.to(torch.bfloat16)


def _empty(dtype, device, *shape):
    return torch.empty(shape, dtype=dtype, device=device)


def _or_none(t: Tensor, like: Optional[Tensor]) -> Optional[Tensor]:
    return None if like is None else t


# ---------------------------------------------------------------- router


@torch.library.custom_op("mok::router_fwd", mutates_args=())
def router_fwd(x: Tensor, weight: Tensor, k: int, score: str, normalize: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(topk_weight, topk_idx, scores, logits): logits = x · weightᵀ (exact products, tree sum),
    then `route`. See `router`."""
    if x.dim() != 2:
        raise ValueError(f"x: expected 2 dimensions [T, H], got shape {tuple(x.shape)}")
    x = _as_bf16("x", x)
    w = _as_bf16("weight", weight)
    if w.dim() != 2 or w.shape[1] != x.shape[1]:
        raise ValueError(f"weight: expected shape (E, {x.shape[1]}), got {tuple(weight.shape)}")
    logits = matmul_exact(x, w)
    topk_idx, topk_weight = route(logits, k, score=score, normalize=normalize)
    return topk_weight, topk_idx, losses.scores(logits, score), logits  # a float first (opcheck sums outputs)


@router_fwd.register_fake
def _(x, weight, k, score, normalize):
    T, E = x.shape[0], weight.shape[0]
    f32 = torch.float32
    return (_empty(f32, x.device, T, k), _empty(torch.int64, x.device, T, k),
            _empty(f32, x.device, T, E), _empty(f32, x.device, T, E))


@torch.library.custom_op("mok::router_bwd", mutates_args=())
def router_bwd(x: Tensor, weight: Tensor, logits: Tensor, topk_idx: Tensor, d_topk_weight: Tensor,
               d_scores: Tensor, d_logits: Tensor, score: str, normalize: bool) -> tuple[Tensor, Tensor]:
    """(d_x [T, H] in x's dtype (bf16-valued), d_weight [E, H] fp32).

    The fp32 logit gradient is split exactly into two bf16 parts (hi + lo, 16 significant bits);
    d_x and d_weight are exact-product tree sums over those parts (hi terms first, then lo).
    """
    dl = losses.route_backward(logits, topk_idx, d_topk_weight, d_scores, score, normalize) + d_logits
    hi = bf16(dl)
    lo = bf16(dl - hi.float())
    w = weight.to(torch.bfloat16)
    d_x = bf16(matmul_exact(torch.cat([hi, lo], dim=1), torch.cat([w, w], dim=0).t().contiguous()))
    x16 = x.to(torch.bfloat16)
    d_w = rows_outer_sum(torch.cat([hi, lo], dim=0), torch.cat([x16, x16], dim=0))
    return d_x.to(x.dtype), d_w


@router_bwd.register_fake
def _(x, weight, logits, topk_idx, d_topk_weight, d_scores, d_logits, score, normalize):
    return torch.empty_like(x), _empty(torch.float32, x.device, *weight.shape)


def _router_setup(ctx, inputs, output):
    x, weight, k, score, normalize = inputs
    _, topk_idx, _, logits = output
    ctx.mark_non_differentiable(topk_idx)
    ctx.save_for_backward(x, weight, logits, topk_idx)
    ctx.score, ctx.normalize = score, normalize


def _router_backward(ctx, d_topk_weight, d_idx, d_scores, d_logits):
    x, weight, logits, topk_idx = ctx.saved_tensors
    z = torch.zeros_like(logits)
    d_topk_weight = d_topk_weight if d_topk_weight is not None else z.new_zeros(topk_idx.shape)
    d_x, d_w = router_bwd(x, weight, logits, topk_idx, d_topk_weight,
                          d_scores if d_scores is not None else z, d_logits if d_logits is not None else z,
                          ctx.score, ctx.normalize)
    return d_x, d_w.to(weight.dtype), None, None, None


router_fwd.register_autograd(_router_backward, setup_context=_router_setup)


def router(x_TH: Tensor, weight_EH: Tensor, k: int, *, score: str = "softmax", normalize: bool = True):
    """Bias-free router gate + `mok.reference.route`, differentiable, compile-safe.

    Args:
        x_TH: [T, H] bfloat16 tokens, or float32 (rounded to bf16 inside; d_x comes back in x's dtype).
        weight_EH: [E, H] float32 or bfloat16 gate weight (rounded to bf16 for the products).
        k: experts per token; score: "softmax" or "sigmoid"; normalize: renormalise the k weights.
    Returns:
        (topk_idx [T, k] int64, topk_weight [T, k] fp32, scores [T, E] fp32, logits [T, E] fp32);
        gradients flow from topk_weight, scores and logits to x and weight.
    """
    topk_weight, topk_idx, scores, logits = router_fwd(x_TH, weight_EH, k, score, normalize)
    return topk_idx, topk_weight, scores, logits


# ---------------------------------------------------------------- the layer

# Saved by moe_fwd for the reference backward (empty when recomputing): o_TKH, then the local
# experts' rows concatenated in local-expert order (f [R] flat row ids, g, u [R, I] fp32,
# a [R, I] bf16, rows per expert [L]), then the shared expert's g, u [T, S] fp32, a [T, S] bf16.


def _pack(ctx: layer.Ctx) -> list:
    ex = ctx.experts
    rows = [torch.cat([getattr(r, n) for r in ex]) for n in ("f", "g", "u", "a")]
    counts = torch.tensor([r.f.numel() for r in ex], dtype=torch.int64, device=ctx.o_TKH.device)
    sh = ctx.shared_rows
    dev = ctx.o_TKH.device
    shared = ([sh.g, sh.u, sh.a] if sh is not None else
              [_empty(torch.float32, dev, 0, 0), _empty(torch.float32, dev, 0, 0), _empty(torch.bfloat16, dev, 0, 0)])
    o = ctx.o_TKH
    if o.untyped_storage().nbytes() != o.numel() * o.element_size():  # a slice of all ranks' rows (W > 1)
        o = o.clone()
    return [o, *rows, counts, *shared]


def _saved_empty(x: Tensor, K: int, I: int) -> list:
    d = x.device
    f32 = torch.float32
    return [_empty(torch.bfloat16, d, 0, K, x.shape[1]), _empty(torch.int64, d, 0), _empty(f32, d, 0, I),
            _empty(f32, d, 0, I), _empty(torch.bfloat16, d, 0, I), _empty(torch.int64, d, 0),
            _empty(f32, d, 0, 0), _empty(f32, d, 0, 0), _empty(torch.bfloat16, d, 0, 0)]


def _unpack(x, topk_idx, topk_weight, shared, routed, saved, group) -> layer.Ctx:
    W, rank = comm.world(group)
    dims = check_layer_args(x, topk_idx, topk_weight, *shared, *routed, world_size=W)
    o_TKH, f, g, u, a, counts, sg, su, sa = saved
    sizes = counts.tolist()
    experts = [layer.ExpertRows(f=ff, g=gg, u=uu, a=aa)
               for ff, gg, uu, aa in zip(*(t.split(sizes) for t in (f, g, u, a)))]
    shared_rows = None
    if shared[0] is not None:
        shared_rows = layer.ExpertRows(f=torch.arange(dims.T, device=x.device), g=sg, u=su, a=sa)
    return layer.Ctx(dims=dims, group=group, rank=rank,
                     x_NH=comm.all_gather_cat(x.contiguous(), group),
                     topk_idx_NK=comm.all_gather_cat(topk_idx.contiguous(), group),
                     topk_weight_NK=comm.all_gather_cat(topk_weight.contiguous(), group),
                     o_TKH=o_TKH, experts=experts, shared=tuple(shared), routed=tuple(routed),
                     shared_rows=shared_rows)


def _weights(shared_gate, shared_up, shared_down, routed_gate, routed_up, routed_down):
    shared = tuple(_as_bf16(n, w) for n, w in zip(("shared_gate", "shared_up", "shared_down"),
                                                  (shared_gate, shared_up, shared_down)))
    routed = tuple(_as_bf16(n, w) for n, w in zip(("routed_gate", "routed_up", "routed_down"),
                                                  (routed_gate, routed_up, routed_down)))
    return shared, routed


def _saves(backend: str, recompute: bool) -> bool:
    # Only the reference's context has a known tensor layout; the fast path recomputes.
    return backend == "reference" and not recompute


@torch.library.custom_op("mok::moe_fwd", mutates_args=())
def moe_fwd(x: Tensor, topk_idx: Tensor, topk_weight: Tensor, shared_gate: Optional[Tensor],
            shared_up: Optional[Tensor], shared_down: Optional[Tensor], routed_gate: Tensor, routed_up: Tensor,
            routed_down: Tensor, group_name: Optional[str], backend: str, recompute: bool) -> list[Tensor]:
    """[y, *saved]: the layer's output and the 9 tensors backward needs (see `_pack`). See `moe`."""
    shared, routed = _weights(shared_gate, shared_up, shared_down, routed_gate, routed_up, routed_down)
    x = _as_bf16("x", x)
    group = _group(group_name)
    y, ctx = _impl(backend).forward(x, topk_idx, topk_weight, *shared, *routed, group=group)
    if not _saves(backend, recompute):
        return [y, *_saved_empty(x, topk_idx.shape[1], routed_gate.shape[1])]
    return [y, *_pack(ctx)]


@moe_fwd.register_fake
def _(x, topk_idx, topk_weight, shared_gate, shared_up, shared_down, routed_gate, routed_up, routed_down,
      group_name, backend, recompute):
    T, H = x.shape
    K = topk_idx.shape[1]
    L, I, _ = routed_gate.shape
    y = torch.empty_like(x, dtype=torch.bfloat16)
    if not _saves(backend, recompute):
        return [y, *_saved_empty(x, K, I)]
    W, _ = comm.world(_group(group_name))
    R = T * K if W == 1 else torch.library.get_ctx().new_dynamic_size()
    S = shared_gate.shape[0] if shared_gate is not None else 0
    Ts = T if shared_gate is not None else 0
    d, f32, b16 = x.device, torch.float32, torch.bfloat16
    return [y, _empty(b16, d, T, K, H), _empty(torch.int64, d, R), _empty(f32, d, R, I), _empty(f32, d, R, I),
            _empty(b16, d, R, I), _empty(torch.int64, d, L), _empty(f32, d, Ts, S), _empty(f32, d, Ts, S),
            _empty(b16, d, Ts, S)]


@torch.library.custom_op("mok::moe_bwd", mutates_args=())
def moe_bwd(dy: Tensor, x: Tensor, topk_idx: Tensor, topk_weight: Tensor, shared_gate: Optional[Tensor],
            shared_up: Optional[Tensor], shared_down: Optional[Tensor], routed_gate: Tensor, routed_up: Tensor,
            routed_down: Tensor, saved: list[Tensor], group_name: Optional[str], backend: str,
            recompute: bool) -> list[Tensor]:
    """[d_x, d_topk_weight, d_routed_gate, d_routed_up, d_routed_down, d_shared_gate, d_shared_up,
    d_shared_down] (SPEC §2 order; weight grads fp32; shared ones empty [0] without a shared expert)."""
    shared, routed = _weights(shared_gate, shared_up, shared_down, routed_gate, routed_up, routed_down)
    x = _as_bf16("x", x)
    group = _group(group_name)
    impl = _impl(backend)
    if _saves(backend, recompute):
        ctx = _unpack(x, topk_idx, topk_weight, shared, routed, saved, group)
    else:
        _, ctx = impl.forward(x, topk_idx, topk_weight, *shared, *routed, group=group)
    grads = impl.backward(ctx, dy)
    return [g if g is not None else _empty(torch.float32, x.device, 0) for g in grads]


@moe_bwd.register_fake
def _(dy, x, topk_idx, topk_weight, shared_gate, shared_up, shared_down, routed_gate, routed_up, routed_down,
      saved, group_name, backend, recompute):
    f32 = torch.float32

    def like(w):
        return _empty(f32, x.device, *w.shape) if w is not None else _empty(f32, x.device, 0)

    return [torch.empty_like(x, dtype=torch.bfloat16), _empty(f32, x.device, *topk_weight.shape), like(routed_gate), like(routed_up),
            like(routed_down), like(shared_gate), like(shared_up), like(shared_down)]


def _moe_setup(ctx, inputs, output):
    *tensors, group_name, backend, recompute = inputs
    ctx.mark_non_differentiable(*output[1:])
    ctx.has_shared = tensors[3] is not None
    ctx.dtypes = [t.dtype if t is not None else None for t in tensors]
    saved_in = [t if t is not None else torch.empty(0) for t in tensors]
    ctx.save_for_backward(*saved_in, *output[1:])
    ctx.args = (group_name, backend, recompute)


def _moe_backward(ctx, grads):
    dy = grads[0]  # the saved outputs get no gradient
    x, idx, w, sg, su, sd, rg, ru, rd, *saved = ctx.saved_tensors
    if not ctx.has_shared:
        sg = su = sd = None
    d_x, d_w, d_rg, d_ru, d_rd, d_sg, d_su, d_sd = moe_bwd(
        dy.contiguous(), x, idx, w, sg, su, sd, rg, ru, rd, saved, *ctx.args)
    dt = ctx.dtypes
    shared = [_or_none(g.to(dt[i]) if dt[i] is not None else g, t)
              for i, g, t in ((3, d_sg, sg), (4, d_su, su), (5, d_sd, sd))]
    return (d_x.to(dt[0]), None, d_w, *shared, d_rg.to(dt[6]), d_ru.to(dt[7]), d_rd.to(dt[8]), None, None, None)


moe_fwd.register_autograd(_moe_backward, setup_context=_moe_setup)


def moe(x_TH, topk_idx_TK, topk_weight_TK, shared_gate_SH, shared_up_SH, shared_down_HS,
        routed_gate_LIH, routed_up_LIH, routed_down_LHI, *, group=None, backend: str = "reference",
        recompute: bool = False) -> Tensor:
    """Differentiable, compile-safe MoE layer (SPEC §2), the arguments of `mok.reference.forward`.

    Args:
        x_TH: [T, H] bf16, or fp32 (rounded to bf16 inside; d_x comes back in x's dtype).
        topk_idx_TK: [T, K] int64; topk_weight_TK: [T, K] fp32.
        shared_gate_SH, shared_up_SH: [S, H]; shared_down_HS: [H, S]; or all None.
        routed_gate_LIH, routed_up_LIH: [L, I, H]; routed_down_LHI: [L, H, I].
            Weights fp32 or bf16 (rounded to bf16 inside); their gradients are computed in fp32
            and cast to each weight's dtype (no rounding for fp32 weights).
        group: torch.distributed process group for expert parallelism, or None.
        backend: "reference" or "fast" (`mok.fast`, CUDA sm_90).
        recompute: save only the inputs; recompute the intermediates in backward (same bits).
    Returns:
        y [T, H] bf16.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    out = moe_fwd(x_TH, topk_idx_TK, topk_weight_TK, shared_gate_SH, shared_up_SH, shared_down_HS,
                  routed_gate_LIH, routed_up_LIH, routed_down_LHI, group_name(group), backend, bool(recompute))
    return out[0]


# ---------------------------------------------------------------- router losses


@torch.library.custom_op("mok::router_losses_fwd", mutates_args=())
def router_losses_fwd(scores: Tensor, logits: Tensor, topk_idx: Tensor, score: str) -> tuple[Tensor, Tensor]:
    """(load_balance [] fp32, z [] fp32). See `router_losses`."""
    return losses.load_balance_loss(scores, topk_idx, score), losses.z_loss(logits)


@router_losses_fwd.register_fake
def _(scores, logits, topk_idx, score):
    return scores.new_empty(()), scores.new_empty(())


@torch.library.custom_op("mok::router_losses_bwd", mutates_args=())
def router_losses_bwd(d_balance: Tensor, d_z: Tensor, scores: Tensor, logits: Tensor, topk_idx: Tensor,
                      score: str) -> tuple[Tensor, Tensor]:
    """(d_scores [T, E] fp32, d_logits [T, E] fp32)."""
    return (losses.load_balance_loss_backward(d_balance, scores, topk_idx, score),
            losses.z_loss_backward(d_z, logits))


@router_losses_bwd.register_fake
def _(d_balance, d_z, scores, logits, topk_idx, score):
    return torch.empty_like(scores), torch.empty_like(logits)


def _losses_setup(ctx, inputs, output):
    scores, logits, topk_idx, score = inputs
    ctx.save_for_backward(scores, logits, topk_idx)
    ctx.score = score


def _losses_backward(ctx, d_balance, d_z):
    scores, logits, topk_idx = ctx.saved_tensors
    zero = scores.new_zeros(())
    d_s, d_l = router_losses_bwd(d_balance if d_balance is not None else zero, d_z if d_z is not None else zero,
                                 scores, logits, topk_idx, ctx.score)
    return d_s, d_l, None, None


router_losses_fwd.register_autograd(_losses_backward, setup_context=_losses_setup)


def router_losses(scores_TE: Tensor, logits_TE: Tensor, topk_idx_TK: Tensor, *, score: str = "softmax"):
    """(load-balancing loss, z-loss) of one routing, both [] fp32, deterministic (`mok.losses`).

    Args:
        scores_TE, logits_TE: [T, E] fp32 from `router`; topk_idx_TK: [T, K] int64 from `router`.
        score: the router's score function ("softmax" or "sigmoid").
    """
    return router_losses_fwd(scores_TE, logits_TE, topk_idx_TK, score)

"""The reference's forward context as a flat list of tensors, so autograd can save it
(`ctx.save_for_backward`, with version checks) and backward can rebuild it.

Layout of the list: o_TKH [T, K, H] bf16; the local experts' rows concatenated in local-expert
order: f [R] int64 flat row ids, g, u [R, I] fp32, a [R, I] bf16, and the rows per expert [L]
int64; then the shared expert's g, u [T, S] fp32 and a [T, S] bf16 ([0, 0] without one).
"""

from __future__ import annotations

import torch

from . import _comm as comm
from ._layer import LAYER_ARGS, Ctx, ExpertRows, forward_facts
from ._validate import check_layer_args, check_precision
from ._versions import record_versions

N_SAVED = 9


def _empty(dtype, device, *shape):
    return torch.empty(shape, dtype=dtype, device=device)


def save_context(ctx: Ctx) -> list[torch.Tensor]:
    """The tensors of `ctx` (from `forward`) that `load_context` needs, in the layout above."""
    ex = ctx.experts
    dev = ctx.o_TKH.device
    rows = [torch.cat([getattr(r, n) for r in ex]) for n in ("f", "g", "u", "a")]
    counts = torch.tensor([r.f.numel() for r in ex], dtype=torch.int64, device=dev)
    sh = ctx.shared_rows
    shared = ([sh.g, sh.u, sh.a] if sh is not None else
              [_empty(torch.float32, dev, 0, 0), _empty(torch.float32, dev, 0, 0), _empty(torch.bfloat16, dev, 0, 0)])
    o = ctx.o_TKH
    if o.untyped_storage().nbytes() != o.numel() * o.element_size():  # a slice of all ranks' rows (W > 1)
        o = o.clone()
    return [o, *rows, counts, *shared]


def check_context_args(saved, n_saved: int, shared, routed) -> None:
    """The containers `load_context` takes (either implementation): `saved` a list or tuple of the `n_saved`
    tensors of save_context, `shared` and `routed` 3-tuples (or lists) of the layer's weights. TypeError /
    ValueError naming the argument."""
    if not isinstance(saved, (list, tuple)):
        raise TypeError(f"saved: expected the list of tensors of save_context, got {type(saved).__name__}")
    if len(saved) != n_saved:
        raise ValueError(f"saved: expected the {n_saved} tensors of save_context, got {len(saved)}")
    for name, t, what in (("shared", shared, "(shared_gate, shared_up, shared_down)"),
                          ("routed", routed, "(routed_gate, routed_up, routed_down)")):
        if not isinstance(t, (tuple, list)) or len(t) != 3:
            raise ValueError(f"{name}: expected the 3 tensors {what}, got {comm._short(t)}")


def load_context(saved: list, x, topk_idx, topk_weight, shared: tuple, routed: tuple, group=None,
                 precision: str = "bf16") -> Ctx:
    """Rebuild the `Ctx` of `forward(x, topk_idx, topk_weight, *shared, *routed, group=group,
    precision=precision)` from `save_context`'s tensors (the layer inputs as given to forward; gathers
    them again under W > 1). The inputs' version counters are recorded now: `backward` raises if one is changed in
    place before it runs.

    With W > 1 this is the first collective call of a backward, so like `forward` and `backward` it
    begins with the pre-flight (`_comm.preflight`), before it gathers anything: a rank whose arguments
    fail their checks, or whose sizes differ, makes every rank raise; a rank running another mok call at
    the same time (a forward: ranks out of step, or `recompute` differing between ranks in mok.nn) makes
    every rank raise a RuntimeError naming each rank's call.
    """
    W, rank = comm.world(group)
    dims, err = None, None
    try:
        check_precision(precision)
        check_context_args(saved, N_SAVED, shared, routed)
        dims = check_layer_args(x, topk_idx, topk_weight, *shared, *routed, world_size=W)
        o_TKH, f, g, u, a, counts, sg, su, sa = saved
        sizes = counts.tolist()
        if tuple(o_TKH.shape) != (dims.T, dims.K, dims.H) or len(sizes) != dims.L or sum(sizes) != f.numel():
            raise ValueError(f"saved: expected the save_context of a forward with (T, K, H) = "
                             f"{(dims.T, dims.K, dims.H)} and L = {dims.L}, got o_TKH of shape {tuple(o_TKH.shape)} "
                             f"and rows per expert {sizes} for {f.numel()} rows")
    except Exception as e:  # noqa: BLE001 - the pre-flight raises it on every rank of the group
        err = e
    comm.preflight("load_context", err, forward_facts(dims, x, precision=precision), group)
    experts = [ExpertRows(f=ff, g=gg, u=uu, a=aa) for ff, gg, uu, aa in zip(*(t.split(sizes) for t in (f, g, u, a)))]
    shared_rows = None
    if shared[0] is not None:
        shared_rows = ExpertRows(f=torch.arange(dims.T, device=x.device), g=sg, u=su, a=sa)
    return Ctx(dims=dims, group=group, rank=rank,
               x_NH=comm.all_gather_cat(x.contiguous(), group),
               topk_idx_NK=comm.all_gather_cat(topk_idx.contiguous(), group),
               topk_weight_NK=comm.all_gather_cat(topk_weight.contiguous(), group),
               o_TKH=o_TKH, experts=experts, shared=tuple(shared), routed=tuple(routed), shared_rows=shared_rows,
               precision=precision,
               versions=record_versions(dict(zip(LAYER_ARGS, (x, topk_idx, topk_weight, *shared, *routed)))))


def saved_fake(x, topk_idx, shared: tuple, routed: tuple, rows: int | torch.SymInt) -> list[torch.Tensor]:
    """Empty tensors shaped like `save_context`'s (for fake/meta implementations); `rows` = R,
    the local experts' row count (T * K for W = 1, data dependent otherwise)."""
    T, H = x.shape
    K = topk_idx.shape[1]
    L, I, _ = routed[0].shape
    S = shared[0].shape[0] if shared[0] is not None else 0
    Ts = T if shared[0] is not None else 0
    d, f32, b16 = x.device, torch.float32, torch.bfloat16
    return [_empty(b16, d, T, K, H), _empty(torch.int64, d, rows), _empty(f32, d, rows, I), _empty(f32, d, rows, I),
            _empty(b16, d, rows, I), _empty(torch.int64, d, L), _empty(f32, d, Ts, S), _empty(f32, d, Ts, S),
            _empty(b16, d, Ts, S)]

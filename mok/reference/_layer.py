"""The reference MoE layer, forward and backward (docs/layer.md), bit-exact (docs/numerics.md).

Expert parallelism: every rank gathers the whole group's tokens (N = W * T rows, rank order),
computes the rows routed to its own L experts in canonical order (global token, then k),
and the token owners gather those rows back. Per-row math never depends on W, and an
expert's weight gradient sums exactly the same ordered list of rows for every W, so every
output is bitwise independent of W.

Precision (docs/numerics.md): "bf16" multiplies the bf16 operands as given; "fp8" first rounds the
operands of the forward's gate/up and down products and of the backward's two data-gradient products
through e4m3 (activations in 1x128 blocks per row, weights in 128x128 blocks: `_fp8`), then runs the
same exact products. Both roundings are per row or per weight block, so the W independence holds alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import _comm as comm
from ._exact import bf16, matmul_exact, rows_outer_sum, rowwise_dot, silu_and_dsilu_exact, silu_exact
from ._fp8 import fp8_blocks_128x128, fp8_rows_1x128
from ._validate import PRECISIONS, Dims, check_expert_ids, check_grad_out, check_layer_args, check_precision
from ._versions import check_versions, record_versions


def _as_is(t: torch.Tensor) -> torch.Tensor:
    return t


# precision -> (rounding of a GEMM's activation operand [R, D], rounding of its weight operand [N, D]);
# a weight's 128x128 blocks are those of the tensor as given, also where the backward uses its transpose
OPERANDS = {"bf16": (_as_is, _as_is), "fp8": (fp8_rows_1x128, fp8_blocks_128x128)}

LAYER_ARGS = ("x", "topk_idx", "topk_weight", "shared_gate", "shared_up", "shared_down",
              "routed_gate", "routed_up", "routed_down")


@dataclass
class ExpertRows:
    """Rows of one local expert, canonical order. f: [R] int64 flat (n * K + k) row ids."""

    f: torch.Tensor
    g: torch.Tensor  # [R, I] fp32
    u: torch.Tensor  # [R, I] fp32
    a: torch.Tensor  # [R, I] bf16


@dataclass
class Ctx:
    """What backward needs from forward (all on the layer's device)."""

    dims: Dims
    group: object
    rank: int
    x_NH: torch.Tensor
    topk_idx_NK: torch.Tensor
    topk_weight_NK: torch.Tensor
    o_TKH: torch.Tensor
    experts: list
    shared: tuple  # (gate, up, down) or (None, None, None)
    routed: tuple  # (gate_LIH, up_LIH, down_LHI)
    shared_rows: ExpertRows | None  # this rank's T tokens
    precision: str = "bf16"  # a key of OPERANDS
    versions: tuple = ()  # the inputs' version counters at forward (`_versions.record_versions`)


def _swiglu_expert(x_RH, w_gate_IH, w_up_IH, w_down_HI, precision: str):
    """One expert on its rows. Returns (g, u fp32 [R, I], a bf16 [R, I], o bf16 [R, H]); a is the value
    before any fp8 rounding (the down projection's weight gradient uses it as it is)."""
    act, wt = OPERANDS[precision]
    I = w_gate_IH.shape[0]
    # gate and up in one call (each output is its own tree, so the bits are those of two calls)
    gu_R2I = matmul_exact(act(x_RH), torch.cat([wt(w_gate_IH), wt(w_up_IH)], dim=0))
    g, u = gu_R2I[:, :I].contiguous(), gu_R2I[:, I:].contiguous()  # own storage each: they are saved and returned
    a = bf16(silu_exact(g) * u)
    o = bf16(matmul_exact(act(a), wt(w_down_HI)))
    return g, u, a, o


def _ordered_sum(first: torch.Tensor | None, slots_TKH: torch.Tensor, weight_TK: torch.Tensor | None):
    """bf16(((first + w_0*s_0) + w_1*s_1) + ...) in fp32; first = +0 when None; w = 1 when None."""
    T, K, H = slots_TKH.shape
    acc = first.float() if first is not None else torch.zeros(T, H, dtype=torch.float32, device=slots_TKH.device)
    for k in range(K):
        term = slots_TKH[:, k].float()
        if weight_TK is not None:
            term = weight_TK[:, k : k + 1] * term
        acc = acc + term
    return bf16(acc)


def _local_rows(topk_idx_NK: torch.Tensor, e: int) -> torch.Tensor:
    """Flat row ids (n * K + k) routed to expert e, ascending (canonical order)."""
    return (topk_idx_NK.reshape(-1) == e).nonzero().squeeze(1)


def _scatter_back(parts_by_rank, f_by_rank, NK: int, H: int, like: torch.Tensor) -> torch.Tensor:
    """Place every rank's rows at their flat ids: [N*K, H]. Each id is written exactly once."""
    out = like.new_zeros((NK, H))
    for part, f in zip(parts_by_rank, f_by_rank):
        out[f] = part
    return out


_DEVICE_TYPES = {"cpu": 1, "cuda": 2}


BACKENDS = {"reference": 0, "fast": 1}  # the implementation code every rank's pre-flight carries


def backend_fact(backend: str) -> tuple[str, str, int]:
    """The pre-flight fact that makes ranks running different implementations raise together."""
    return ("backend", "layer implementation (0 mok.reference, 1 mok.fast)", BACKENDS[backend])


def forward_facts(d: Dims | None, x, backend: str = "reference", precision: str = "bf16") -> list[tuple[str, str, int]]:
    """What every rank's forward must agree on (zeros when this rank's arguments failed their checks),
    for `preflight`; `backend` names the implementation making the call, `precision` its recipe."""
    v = d or Dims(0, 0, 0, 0, 0, 0, 0, 0)
    dev = _DEVICE_TYPES.get(x.device.type, 3) if d is not None and isinstance(x, torch.Tensor) else 0
    prec = PRECISIONS.index(precision) if d is not None else 0
    return [("x", "tokens per rank T", v.T), ("x", "hidden size H", v.H), ("topk_idx", "experts per token K", v.K),
            ("routed_gate", "number of local experts L", v.L), ("routed_gate", "intermediate size I", v.I),
            ("shared_gate", "shared intermediate size S (0: no shared expert)", v.S),
            ("x", "device type (1 cpu, 2 cuda)", dev), backend_fact(backend),
            ("precision", "recipe (0 bf16, 1 fp8)", prec)]


@torch.no_grad()
def forward(
    x, topk_idx, topk_weight, shared_gate, shared_up, shared_down,
    routed_gate, routed_up, routed_down, *, group=None, precision="bf16",
):
    """Reference MoE forward (docs/layer.md). Builds no autograd graph (it runs under torch.no_grad(): inputs
    that require grad give the same bits, and y and ctx carry no graph); for autograd use `moe` or `mok.moe`.

    Args:
        x: [T, H] bf16, this rank's tokens.
        topk_idx: [T, K] int64, global expert ids in [0, E), distinct per row.
        topk_weight: [T, K] fp32, used as given.
        shared_gate, shared_up: [S, H] bf16 or None; shared_down: [H, S] bf16 or None.
        routed_gate, routed_up: [L, I, H] bf16; routed_down: [L, H, I] bf16 (this rank's experts).
        group: torch.distributed process group for expert parallelism, or None (W = 1). Every rank
            calls forward with the same T, H, K, L, I, S; a rank whose arguments fail their checks or
            differ makes every rank raise (see `_comm.preflight`).
        precision: "bf16" (default) or "fp8", the recipe of docs/numerics.md; the same on every rank.
            `backward` follows the forward's.
    Returns:
        (y [T, H] bf16, ctx for `backward`).
    """
    W, rank = comm.world(group)
    d, err = None, None
    try:
        check_precision(precision)
        d = check_layer_args(x, topk_idx, topk_weight, shared_gate, shared_up, shared_down,
                             routed_gate, routed_up, routed_down, world_size=W)
    except Exception as e:  # noqa: BLE001 - the pre-flight raises it on every rank of the group
        err = e
    comm.preflight("forward", err, forward_facts(d, x, precision=precision), group)
    x_NH = comm.all_gather_cat(x.contiguous(), group)
    idx_NK = comm.all_gather_cat(topk_idx.contiguous(), group)
    w_NK = comm.all_gather_cat(topk_weight.contiguous(), group)
    check_expert_ids(idx_NK, d.E)  # global ids: every rank raises alike
    N = x_NH.shape[0]

    experts, f_local, o_local = [], [], []
    for l in range(d.L):
        f = _local_rows(idx_NK, rank * d.L + l)
        g, u, a, o = _swiglu_expert(x_NH[f // d.K], routed_gate[l], routed_up[l], routed_down[l], precision)
        experts.append(ExpertRows(f=f, g=g, u=u, a=a))
        f_local.append(f)
        o_local.append(o)
    o_all = _scatter_back(comm.all_gather_varlen(torch.cat(o_local), group),
                          comm.all_gather_varlen(torch.cat(f_local), group), N * d.K, d.H, x)
    o_TKH = o_all.view(N, d.K, d.H)[rank * d.T : (rank + 1) * d.T]

    s, shared_rows = None, None
    if shared_gate is not None:
        g, u, a, s = _swiglu_expert(x.contiguous(), shared_gate, shared_up, shared_down, precision)
        shared_rows = ExpertRows(f=torch.arange(d.T, device=x.device), g=g, u=u, a=a)
    y = _ordered_sum(s, o_TKH, topk_weight)
    ctx = Ctx(dims=d, group=group, rank=rank, x_NH=x_NH, topk_idx_NK=idx_NK, topk_weight_NK=w_NK,
              o_TKH=o_TKH, experts=experts, shared=(shared_gate, shared_up, shared_down),
              routed=(routed_gate, routed_up, routed_down), shared_rows=shared_rows, precision=precision,
              versions=record_versions(dict(zip(LAYER_ARGS, (x, topk_idx, topk_weight, shared_gate, shared_up,
                                                             shared_down, routed_gate, routed_up, routed_down)))))
    return y, ctx


def _data_grads(go_RH, rows: ExpertRows, w_gate_IH, w_up_IH, w_down_HI, precision: str):
    """The data-gradient path of one expert. Returns (dx bf16 [R, H], dg bf16 [R, I], du bf16 [R, I]);
    dg and du before any fp8 rounding (the weight gradients use them as they are)."""
    act, wt = OPERANDS[precision]
    da = matmul_exact(act(go_RH), wt(w_down_HI).t())
    silu_g, dsilu_g = silu_and_dsilu_exact(rows.g)
    dg = bf16((da * rows.u) * dsilu_g)
    du = bf16(da * silu_g)
    # one fp32 accumulation over 2I: gate's I terms first, then up's (fp8: dg and du rounded separately,
    # so their 1x128 blocks line up with the blocks of gate's and up's weights)
    dx = bf16(matmul_exact(torch.cat([act(dg), act(du)], dim=1), torch.cat([wt(w_gate_IH), wt(w_up_IH)], dim=0).t()))
    return dx, dg, du


def _swiglu_expert_backward(go_RH, x_RH, rows: ExpertRows, w_gate_IH, w_up_IH, w_down_HI, precision: str):
    """Returns (dx bf16 [R, H], d_gate fp32 [I, H], d_up fp32 [I, H], d_down fp32 [H, I])."""
    dx, dg, du = _data_grads(go_RH, rows, w_gate_IH, w_up_IH, w_down_HI, precision)
    d_gate, d_up = _gate_up_weight_grads(dg, du, x_RH)
    return dx, d_gate, d_up, rows_outer_sum(go_RH, rows.a)


def _gate_up_weight_grads(dg_RI, du_RI, x_RH):
    """(d_gate, d_up) fp32 [I, H] each, from one `rows_outer_sum` (each output is its own tree); each has its own
    storage (they are returned as separate gradients)."""
    d_gu_2IH = rows_outer_sum(torch.cat([dg_RI, du_RI], dim=1), x_RH)
    I = dg_RI.shape[1]
    return d_gu_2IH[:I].clone(), d_gu_2IH[I:].clone()


@torch.no_grad()
def backward(ctx: Ctx, dy):
    """Reference MoE backward (docs/layer.md). Builds no autograd graph (torch.no_grad()). An input of the
    forward changed in place since (its version counter moved, as autograd checks saved tensors) raises
    RuntimeError naming it, on every rank of the group.

    Args:
        ctx: from `forward`; its recipe (`ctx.precision`) is the forward's.
        dy: [T, H] bf16, gradient of this rank's y.
    Returns:
        (d_x [T, H] bf16, d_topk_weight [T, K] fp32, d_routed_gate [L, I, H] fp32,
        d_routed_up [L, I, H] fp32, d_routed_down [L, H, I] fp32, d_shared_gate [S, H] fp32,
        d_shared_up [S, H] fp32, d_shared_down [H, S] fp32; shared ones None without a shared
        expert). Weight gradients are those of the whole group's loss: routed ones for this
        rank's experts; shared ones summed over all N tokens, identical on every rank.
    """
    if not isinstance(ctx, Ctx):
        raise TypeError(f"ctx: expected the Ctx returned by mok.reference.forward, got {type(ctx).__name__}")
    d, group = ctx.dims, ctx.group
    err = None
    try:
        check_grad_out(dy, d.T, d.H, ctx.x_NH.device)
        check_versions(ctx.versions, "mok.reference.forward", "mok.reference.backward")
    except Exception as e:  # noqa: BLE001 - the pre-flight raises it on every rank of the group
        err = e
    comm.preflight("backward", err, [backend_fact("reference")], group)
    dy = dy.contiguous()
    d_topk_weight = rowwise_dot(dy, ctx.o_TKH)
    dy_NH = comm.all_gather_cat(dy, group)
    N = dy_NH.shape[0]
    w_flat = ctx.topk_weight_NK.reshape(-1)
    gate, up, down = ctx.routed
    d_gate, d_up, d_down, dx_local, f_local = [], [], [], [], []
    for l, rows in enumerate(ctx.experts):
        n = rows.f // d.K
        go = bf16(w_flat[rows.f, None] * dy_NH[n])
        dx, dg_w, du_w, dd_w = _swiglu_expert_backward(go, ctx.x_NH[n], rows, gate[l], up[l], down[l],
                                                       ctx.precision)
        d_gate.append(dg_w)
        d_up.append(du_w)
        d_down.append(dd_w)
        dx_local.append(dx)
        f_local.append(rows.f)
    dx_all = _scatter_back(comm.all_gather_varlen(torch.cat(dx_local), group),
                           comm.all_gather_varlen(torch.cat(f_local), group), N * d.K, d.H, dy)
    dx_TKH = dx_all.view(N, d.K, d.H)[ctx.rank * d.T : (ctx.rank + 1) * d.T]

    dx_s, d_shared = None, (None, None, None)
    if ctx.shared_rows is not None:
        sg, su, sd = ctx.shared
        rows = ctx.shared_rows
        dx_s, dg, du = _data_grads(dy, rows, sg, su, sd, ctx.precision)
        # the group's rows, rank order = global token order, so the sums match W = 1 bitwise
        dg_N, du_N, a_N = (comm.all_gather_cat(t, group) for t in (dg, du, rows.a))
        d_shared = (*_gate_up_weight_grads(dg_N, du_N, ctx.x_NH), rows_outer_sum(dy_NH, a_N))
    d_x = _ordered_sum(dx_s, dx_TKH, None)
    return (d_x, d_topk_weight, torch.stack(d_gate), torch.stack(d_up), torch.stack(d_down), *d_shared)

"""Expert parallelism of the fast path (W > 1 ranks, docs/expert_parallel.md), as named stages.

Rank r owns experts [r*L, (r+1)*L) and its T tokens; global token index = rank * T + t. Forward:
publish x and ids -> signal/wait (phase 0) -> pull every rank's ids, schedule the local experts'
rows over all W*T tokens (canonical order: expert, global token, k) -> pull those rows of x from
their ranks -> the W = 1 stages on local experts (gate/up, SwiGLU, down; the shared expert on this
rank's tokens) -> push each row's output into its token owner's (t, k) slot -> signal/wait (phase 1)
-> combine locally (shared first, then k ascending). Backward mirrors it: go = bf16(w*dy) per
(t, k) and the shared expert's rows are published (phase 2), owners pull go rows, push d_x rows
(phase 3), every rank combines its own d_x; routed weight gradients reduce over the same rows in
the same order as at W = 1; the shared expert's weight gradients reduce over all ranks' rows pulled
in global token order, the W = 1 reduction: each rank computes S/W of its intermediate columns and
publishes them (phase 4), every rank pulls the W slices (all of S on every rank when S/W is not a
multiple of 8).

Every row is computed from the same inputs by the same kernels and every reduction runs in the same
order as the W = 1 layer on the concatenated batch: the outputs are bitwise independent of W.
No host synchronisation after the pre-flight: ranks wait for each other on the device.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..reference import Dims
from . import _ep_buffer, _lib, _tiles
from ._backward import (d_act_swiglu, d_input_rows, gate_up_weights, release, shared_down_segment,
                        shared_gate_up_segments, weight_grads, wgrad_kind, whole_buffers)
from ._forward import FastContext, Schedule, _empty, down, gate_up, swiglu

FWD_PUBLISHED, FWD_PUSHED, BWD_PUBLISHED, BWD_PUSHED, BWD_SHARED = range(_ep_buffer.PHASES)


@dataclass
class EPContext(FastContext):
    """FastContext of one rank's expert-parallel forward. sched: the local experts' rows over all
    W*T tokens (offsets [2L+1], row_pair [W*T*K]); x_RH, pq_R2I, a_RI: those rows; o_RH: this rank's
    tokens' expert outputs in (t, k) order [T*K, H] (pushed by their owners)."""
    buf: _ep_buffer.EPBuffer | None = None
    group: object = None  # the process group


def local_dims(d: Dims) -> Dims:
    """The sizes the W = 1 stages see: E = the L local experts."""
    return replace(d, E=d.L)


def _sync_phase(buf: _ep_buffer.EPBuffer, phase: int, epoch: torch.Tensor) -> None:
    _lib.ep_signal(buf.tables["flags"], phase, buf.rank, epoch)
    _lib.ep_wait(buf.local["flags"], phase, buf.rank, epoch, buf.timeout_s)


def run_forward_ep(x, topk_idx, topk_weight, shared_gate, shared_up, shared_down, routed_gate, routed_up,
                   routed_down, dims: Dims, group):
    """(y [T, H] bf16, EPContext) on validated inputs; every rank of `group` calls it together."""
    W, T, K, H, L = dims.W, dims.T, dims.K, dims.H, dims.L
    dev = x.device
    buf = _ep_buffer.get(group, dev, T, H, K, dims.S)
    loc = local_dims(dims)
    R = W * T * K  # the dropless worst case: every pair of every rank on this rank's experts
    _lib.ep_next_epoch(buf.epoch_fwd)
    buf.local["x"].copy_(x)
    buf.local["idx"].copy_(topk_idx)
    _sync_phase(buf, FWD_PUBLISHED, buf.epoch_fwd)

    idx_all = _empty(dev, torch.int64, W * T, K)
    _lib.ep_concat(buf.tables["idx"], idx_all)
    sched = Schedule(_empty(dev, torch.int32, 2 * L + 1), _empty(dev, torch.int32, R),
                     _empty(dev, torch.int32, W * T * K), _empty(dev, torch.int32, 1))
    _lib.schedule(idx_all, dims.E, buf.rank * L, L, R, sched.offsets, sched.row_pair, sched.pair_row, sched.flag)
    x_RH = _empty(dev, torch.bfloat16, R, H)
    _lib.ep_gather_rows(buf.tables["x"], T, K, sched.row_pair, sched.offsets, L, x_RH)
    pq, pq_s = gate_up(x, x_RH, sched, loc, routed_gate, routed_up, shared_gate, shared_up)  # [g | u] here
    a_RI, a_s = swiglu(pq, pq_s, sched, loc)  # ... and [p | q] from here on
    o_rows, s_TH = down(a_RI, a_s, sched, loc, routed_down, shared_down)
    _lib.ep_scatter_rows(o_rows, sched.row_pair, sched.offsets, L, T * K, buf.tables["o_slots"])
    _sync_phase(buf, FWD_PUSHED, buf.epoch_fwd)

    o_TKH = buf.local["o_slots"].clone()  # the next forward reuses the slots; backward needs these
    y = _empty(dev, torch.bfloat16, T, H)
    _lib.combine_fwd(s_TH, o_TKH, topk_weight, buf.ident, sched.flag, y)
    ctx = EPContext(dims, x, topk_weight, sched, x_RH, pq, a_RI, o_TKH,
                    (routed_gate, routed_up, routed_down, shared_gate, shared_up, shared_down), pq_s, a_s, buf=buf,
                    group=group)
    return y, ctx


def _shared_rows_all(buf, S: int, W: int, T: int, H: int, dev):
    """Every rank's published shared-expert rows, concatenated in global token order."""
    out = {}
    for name, width in (("x_b", H), ("dy", H), ("a_s", S), ("dg_s", 2 * S)):
        out[name] = _empty(dev, torch.bfloat16, W * T, width)
        _lib.ep_concat(buf.tables[name], out[name])
    return out


def shared_weight_grads(buf, d: Dims, rows_all: dict, dtype):
    """(d_sg [S, H], d_su [S, H], d_sd [H, S]) over all W*T rows in global order, on every rank: this
    rank's S/W columns computed here and the others' pulled (phase 4), or all S here when S/W is not a
    multiple of 8. Each column's reduction is the W = 1 one, so the bits are too."""
    W, T, H, S = d.W, d.T, d.H, d.S
    n = _ep_buffer.shared_slice(S, W)
    dev = rows_all["x_b"].device
    if n:  # my columns, written straight into my buffer: [d_sg | d_su | d_sd]
        mine = buf.local["wg_s"][: 3 * n * H * dtype.itemsize].view(dtype)
        sg, su, sd = mine[: n * H].view(n, H), mine[n * H: 2 * n * H].view(n, H), mine[2 * n * H:].view(H, n)
    else:
        sg, su, sd = _empty(dev, dtype, S, H), _empty(dev, dtype, S, H), _empty(dev, dtype, H, S)
    s0 = buf.rank * n
    down = shared_down_segment(W * T, H, S, rows_all["dy"], rows_all["a_s"], sd, s0=s0)
    gate_up = shared_gate_up_segments(W * T, H, S, rows_all["dg_s"], rows_all["x_b"], sg, su, s0=s0)
    _tiles.grouped_gemm(wgrad_kind(dtype), [down, *gate_up], dev, H, d.I)
    if not n:
        return sg, su, sd
    _sync_phase(buf, BWD_SHARED, buf.epoch_bwd)
    slices = _empty(dev, dtype, W, 3 * n * H)
    _lib.ep_concat(buf.tables["wg_s"], slices)  # every rank's first 3*n*H values, rank order
    d_sg = slices[:, : n * H].reshape(S, H)
    d_su = slices[:, n * H: 2 * n * H].reshape(S, H)
    d_sd = slices[:, 2 * n * H:].reshape(W, H, n).permute(1, 0, 2).reshape(H, S)
    return d_sg, d_su, d_sd


def run_backward_ep(ctx: EPContext, dy, weight_grad_dtype=torch.float32, separate_gate_up_grads: bool = False,
                    release_saved: bool = False):
    """Gradients in the reference's order (this rank's d_x, d_topk_weight, its local experts' weight
    gradients, the shared expert's full weight gradients). The d_x rows are dropped once scattered and combined.
    release_saved: as `_backward.run_backward` (o, [p | q] and the x rows freed once last read; the concatenation
    is made after the d_a step here in any case)."""
    d, buf = ctx.dims, ctx.buf
    W, T, K, H, L, S = d.W, d.T, d.K, d.H, d.L, d.S
    rg, ru, rd, sg, su, sd = ctx.weights
    dev, sched = dy.device, ctx.sched
    loc = local_dims(d)
    lctx = replace(ctx, dims=loc)
    R = ctx.x_RH.shape[0]
    _lib.ep_next_epoch(buf.epoch_bwd)

    d_w = _empty(dev, torch.float32, T, K)
    _lib.combine_bwd_pre(dy, ctx.o_RH, ctx.topk_weight_TK, buf.ident, sched.flag, d_w, buf.local["go"])
    release(release_saved, ctx.o_RH)
    dgu_s = None
    if S:
        _, dgu_s = d_act_swiglu(lctx, dy, None, rd, sd)
        release(release_saved, ctx.pq_s_T2S)
        for name, t in (("x_b", ctx.x_TH), ("dy", dy), ("a_s", ctx.a_s_TS), ("dg_s", dgu_s)):
            buf.local[name].copy_(t)
    _sync_phase(buf, BWD_PUBLISHED, buf.epoch_bwd)

    go_RH = _empty(dev, torch.bfloat16, R, H)
    _lib.ep_gather_rows(buf.tables["go"], T * K, 1, sched.row_pair, sched.offsets, L, go_RH)
    rows_all = _shared_rows_all(buf, S, W, T, H, dev) if S else None  # read before phase 3 lets ranks move on
    dgu, _ = d_act_swiglu(lctx, None, go_RH, rd, sd)
    release(release_saved, ctx.pq_R2I)
    w_gu, w_gu_s = gate_up_weights(rg, ru, sg, su)  # a concatenation lives only for the d_x GEMM
    dx_RH, dxs = d_input_rows(lctx, dgu, dgu_s, w_gu, w_gu_s)
    del w_gu, w_gu_s
    _lib.ep_scatter_rows(dx_RH, sched.row_pair, sched.offsets, L, T * K, buf.tables["dx_slots"])
    del dx_RH  # read by nothing after the scatter (one stream: its block goes only to later work)
    _sync_phase(buf, BWD_PUSHED, buf.epoch_bwd)

    d_x = _empty(dev, torch.bfloat16, T, H)
    _lib.combine_bwd_dx(dxs, buf.local["dx_slots"], buf.ident, sched.flag, K, d_x)
    del dxs
    grads_of = [dgu, None]
    del dgu  # weight_grads frees it once the gate/up gradients are done; the x rows are read last by those
    grads = weight_grads(lctx, dy, go_RH, grads_of, weight_grad_dtype, separate_gate_up_grads,
                         then=lambda: release(release_saved, ctx.x_RH))[:3]
    grads += shared_weight_grads(buf, d, rows_all, weight_grad_dtype) if S else (None, None, None)
    for g in whole_buffers(*grads):  # d_x and d_w: NaN from their kernels when the flag is set
        _lib.poison(g, sched.flag)
    return (d_x, d_w, *grads)

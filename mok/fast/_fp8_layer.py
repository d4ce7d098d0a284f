"""The fast path's layer in the FP8 recipe (one GPU, W = 1): the bf16 pipeline's stages with the four data GEMMs on
e4m3 operands (docs/numerics.md "FP8 recipe", docs/fast_path.md "FP8").

forward: schedule -> gather x rows -> quantise x rows (1x128) -> FP8 gate/up GEMM (+ shared, one launch, fp32 [g | u])
-> SwiGLU (bf16 a; [g | u] becomes [p | q]) -> quantise a -> FP8 down GEMM (+ shared, bf16 o) -> combine; the gate/up
GEMM and the SwiGLU are one launch (GEMM_FP8_TN_SWIGLU_FWD: [p | q] and a from its epilogue, the same bits) wherever
`_tiles.fuse_swiglu_fwd_fp8` says so.
backward: pre-combine (go) -> quantise go (and dy for the shared expert) -> FP8 d_a GEMM against down's transpose
(fp32 da) -> SwiGLU backward (bf16 [dg | du]) -> quantise dg and du apart (their blocks line up with gate's and up's)
-> FP8 d_x GEMM against [gate; up]'s transpose (one fp32 accumulation over both) -> d_x combine; the weight
gradients as in bf16, from the unquantised go, a, [dg | du] and x rows.
The weights' quantisation is cached per weight version (`_fp8.fp8_weights`). All on the current stream, no host
synchronisation.
"""
from __future__ import annotations

import torch

from ..reference import Dims
from . import _fp8, _lib, _tiles
from ._backward import release, weight_grads, whole_buffers
from ._fp8 import all_rows_segment, quant_rows, rows_segment
from ._forward import FastContext, _empty, build_schedule, swiglu


def _count(sched, E: int) -> torch.Tensor:
    """The schedule's rows placed (offsets[E]) as a one-entry device tensor: the rows the quantisers cover."""
    return sched.offsets[E:E + 1]


def run_forward_fp8(x, topk_idx, topk_weight, shared_gate, shared_up, shared_down, routed_gate, routed_up,
                    routed_down, dims: Dims, capacity: int | None = None):
    """`_forward.run_forward` in the FP8 recipe; returns (y [T, H] bf16, FastContext with .fp8 set)."""
    d = dims
    T, H, I, S, E = d.T, d.H, d.I, d.S, d.E
    dev = x.device
    w8 = _fp8.fp8_weights(routed_gate, routed_up, routed_down, shared_gate, shared_up, shared_down)
    R = T * d.K if capacity is None else capacity
    sched = build_schedule(topk_idx, E, R)
    count = _count(sched, E)
    x_RH = _empty(dev, torch.bfloat16, R, H)
    _lib.gather_rows(x, sched.pair_row, R, x_RH)
    xq, xs = quant_rows(x_RH, 1, count)
    xq_s, xs_s = quant_rows(x) if S else (None, None)
    if _tiles.fuse_swiglu_fwd_fp8(I, S):
        gu, a_RI, gu_s, a_s = _gate_up_swiglu(d, sched, w8, xq, xs, xq_s, xs_s, dev)
    else:
        gu, gu_s = _gate_up(d, sched, w8, xq, xs, xq_s, xs_s, dev)
        a_RI, a_s = swiglu(gu, gu_s, sched, d)  # gu, gu_s hold [p | q] from here on
    r = w8.routed
    aq, as_ = quant_rows(a_RI, 1, count)
    o_RH = _empty(dev, torch.bfloat16, R, H)
    segs = [rows_segment(sched.offsets, E, H, aq, as_, r.down_q, r.down_s, o_RH, H)]
    s_TH = None
    if S:
        aq_s, as_s = quant_rows(a_s)
        s_TH = _empty(dev, torch.bfloat16, T, H)
        segs.append(all_rows_segment(T, H, aq_s, as_s, w8.shared.down_q, w8.shared.down_s, s_TH, H))
    _fp8.gemm(_lib.GEMM_FP8_TN_BF16, segs, dev)
    y = _empty(dev, torch.bfloat16, T, H)
    _lib.combine_fwd(s_TH, o_RH, topk_weight, sched.pair_row, sched.flag, y)
    ctx = FastContext(d, x, topk_weight, sched, x_RH, gu, a_RI, o_RH,
                      (routed_gate, routed_up, routed_down, shared_gate, shared_up, shared_down), gu_s, a_s, fp8=w8)
    return y, ctx


def _gate_up(d: Dims, sched, w8, xq, xs, xq_s, xs_s, dev):
    """(gu [R, 2I] fp32, gu_s [T, 2S] fp32 or None) = [g | u] of the quantised x rows (xq, xs) and x (xq_s, xs_s; None
    when S = 0): routed and shared FP8 gate/up GEMMs in one launch."""
    T, I, S, E = d.T, d.I, d.S, d.E
    R = xq.shape[0]
    gu = _empty(dev, torch.float32, R, 2 * I)
    r = w8.routed
    segs = [rows_segment(sched.offsets, E, I, xq, xs, q, s, gu, 2 * I, half * I)
            for half, (q, s) in enumerate(((r.gate_q, r.gate_s), (r.up_q, r.up_s)))]
    gu_s = None
    if S:
        sh = w8.shared
        gu_s = _empty(dev, torch.float32, T, 2 * S)
        segs += [all_rows_segment(T, S, xq_s, xs_s, q, s, gu_s, 2 * S, half * S)
                 for half, (q, s) in enumerate(((sh.gate_q, sh.gate_s), (sh.up_q, sh.up_s)))]
    _fp8.gemm(_lib.GEMM_FP8_TN_F32, segs, dev)
    return gu, gu_s


def _gate_up_swiglu(d: Dims, sched, w8, xq, xs, xq_s, xs_s, dev):
    """(pq [R, 2I] fp32, a [R, I] bf16, pq_s [T, 2S] fp32 or None, a_s [T, S] bf16 or None): `_gate_up` and `swiglu`
    in one launch (GEMM_FP8_TN_SWIGLU_FWD on the interleaved [gate; up], `_fp8.gate_up`), the same bits ([p | q]
    where `_gate_up` gives [g | u])."""
    T, I, S, E = d.T, d.I, d.S, d.E
    R = xq.shape[0]
    pq, a = _empty(dev, torch.float32, R, 2 * I), _empty(dev, torch.bfloat16, R, I)
    segs = [_fp8.swiglu_rows_segment(sched.offsets, E, xq, xs, _fp8.gate_up(w8.routed), pq, a)]
    pq_s = a_s = None
    if S:
        pq_s, a_s = _empty(dev, torch.float32, T, 2 * S), _empty(dev, torch.bfloat16, T, S)
        segs.append(_fp8.swiglu_all_rows_segment(T, xq_s, xs_s, _fp8.gate_up(w8.shared), pq_s, a_s))
    _fp8.gemm(_lib.GEMM_FP8_TN_SWIGLU_FWD, segs, dev)
    return pq, a, pq_s, a_s


def _d_act(ctx: FastContext, dy, go_RH):
    """(dgu [R, 2I] bf16, dgu_s [T, 2S] bf16 or None): da = Q_r(go) · Q_b(down)ᵀ (fp32, one FP8 launch with the shared
    expert's Q_r(dy) · Q_b(shared_down)ᵀ), then the SwiGLU backward with the forward's [p | q]."""
    d, w8, sched = ctx.dims, ctx.fp8, ctx.sched
    T, I, S, E = d.T, d.I, d.S, d.E
    dev, R = go_RH.device, go_RH.shape[0]
    goq, gos = quant_rows(go_RH, 1, _count(sched, E))
    da = _empty(dev, torch.float32, R, I)
    segs = [rows_segment(sched.offsets, E, I, goq, gos, w8.routed.downT_q, w8.routed.downT_s, da, I)]
    da_s = None
    if S:
        dyq, dys = quant_rows(dy)
        da_s = _empty(dev, torch.float32, T, S)
        segs.append(all_rows_segment(T, S, dyq, dys, w8.shared.downT_q, w8.shared.downT_s, da_s, S))
    _fp8.gemm(_lib.GEMM_FP8_TN_F32, segs, dev)
    dgu = _empty(dev, torch.bfloat16, R, 2 * I)
    _lib.swiglu_bwd(da, ctx.pq_R2I, sched.offsets, E, 0, I, R, dgu)
    dgu_s = None
    if S:
        dgu_s = _empty(dev, torch.bfloat16, T, 2 * S)
        _lib.swiglu_bwd(da_s, ctx.pq_s_T2S, None, 0, T, S, T, dgu_s)
    return dgu, dgu_s


def _d_input(ctx: FastContext, dgu, dgu_s):
    """(dx rows [R, H] bf16, dx_s [T, H] bf16 or None) = [Q_r(dg) | Q_r(du)] · [Q_b(gate); Q_b(up)], one fp32
    accumulation over both halves (K = 2 * padded(I)), in one FP8 launch with the shared expert's."""
    d, w8, sched = ctx.dims, ctx.fp8, ctx.sched
    T, H, E = d.T, d.H, d.E
    dev, R = dgu.device, dgu.shape[0]
    gq, gs = quant_rows(dgu, 2, _count(sched, E))
    dx_RH = _empty(dev, torch.bfloat16, R, H)
    segs = [rows_segment(sched.offsets, E, H, gq, gs, w8.routed.guT_q, w8.routed.guT_s, dx_RH, H)]
    dxs = None
    if dgu_s is not None:
        gq_s, gs_s = quant_rows(dgu_s, 2)
        dxs = _empty(dev, torch.bfloat16, T, H)
        segs.append(all_rows_segment(T, H, gq_s, gs_s, w8.shared.guT_q, w8.shared.guT_s, dxs, H))
    _fp8.gemm(_lib.GEMM_FP8_TN_BF16, segs, dev)
    return dx_RH, dxs


def run_backward_fp8(ctx: FastContext, dy, weight_grad_dtype=torch.float32, separate_gate_up_grads: bool = False,
                     release_saved: bool = False):
    """`_backward.run_backward` in the FP8 recipe (ctx from `run_forward_fp8`): the same outputs in the same order.
    release_saved: as `run_backward`'s: o freed after the pre-combine, [p | q] after the SwiGLU backward, the x rows
    after the gate/up weight gradients (`ctx` is spent); the outputs' bits are the same either way."""
    d, sched, dev = ctx.dims, ctx.sched, dy.device
    R = ctx.x_RH.shape[0]
    d_w = _empty(dev, torch.float32, d.T, d.K)
    go_RH = _empty(dev, torch.bfloat16, R, d.H)
    _lib.combine_bwd_pre(dy, ctx.o_RH, ctx.topk_weight_TK, sched.pair_row, sched.flag, d_w, go_RH)
    release(release_saved, ctx.o_RH)
    dgu, dgu_s = _d_act(ctx, dy, go_RH)
    release(release_saved, ctx.pq_R2I, ctx.pq_s_T2S)
    dx_RH, dxs = _d_input(ctx, dgu, dgu_s)
    d_x = _empty(dev, torch.bfloat16, d.T, d.H)
    _lib.combine_bwd_dx(dxs, dx_RH, sched.pair_row, sched.flag, d.K, d_x)
    del dx_RH, dxs
    grads_of = [dgu, dgu_s]
    del dgu, dgu_s  # weight_grads frees them once the gate/up gradients are done
    grads = weight_grads(ctx, dy, go_RH, grads_of, weight_grad_dtype, separate_gate_up_grads,
                         then=lambda: release(release_saved, ctx.x_RH))
    for g in whole_buffers(*grads):
        _lib.poison(g, sched.flag)
    return (d_x, d_w, *grads)

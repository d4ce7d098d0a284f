"""Backward pass of the fast path (one GPU, W = 1), as named stages.

pre-combine (d_topk_weight, go = bf16(w*dy) scattered to rows) -> d_a grouped GEMM (+ shared; fp32 da)
-> SwiGLU backward (dg | du, bf16) (both in one launch, the SwiGLU backward in the GEMM's epilogue, wherever 8
splits I and S: the same bits, no fp32 da buffer; _tiles.fuse_swiglu_bwd) -> d_x rows grouped GEMM
against [gate; up] (+ shared; read as is when gate and up are halves of one tensor or two tensors the GEMM reads
apart, `dx_reads`, else concatenated on a side stream meanwhile, and that copy freed once the GEMM is queued)
-> d_x combine (fp32, shared first then k
ascending; on the side stream, overlapping) -> weight-gradient grouped GEMMs, gate/up then down with [dg | du] and
the d_x rows freed in between (fp32 accumulators reduced over the expert's rows in canonical order, one CTA per
output tile; gate/up gradients as halves of one buffer where the weights are) -> zero empty experts -> NaN poison of
every output if the routing flag is set. With release_saved (`mok.nn`'s eager backward, when autograd keeps no
graph), o, [p | q] and the x rows are freed once last read, and a concatenation of separate gate and up tensors is
made while the down-weight gradients run instead, so that it never lives beside [p | q].
"""
from __future__ import annotations

import contextlib

import torch

from ..reference import Dims
from . import _lib, _tiles
from ._checks import gate_up_halves, stacked_gate_up
from ._forward import FastContext, _empty

_SIDE: dict[int, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    """A second stream per device for memory-bound work that overlaps the GEMMs (pure copies and
    the d_x combine: no floating-point result depends on the overlap)."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SIDE:
        _SIDE[idx] = torch.cuda.Stream(device)
    return _SIDE[idx]


def _concat(gate, up, dim: int, out) -> None:
    torch.cat([gate, up], dim=dim, out=out)


DX_K_TILE = 64  # the d_x GEMM's K tile in every variant: B's halves read apart must be whole tiles of it


def dx_reads(gate, up):
    """How the d_x GEMM reads one gate/up pair ([L, I, H] or [S, H] bf16; gate None: no pair): (w, None) with w the
    [gate; up] tensor they are the halves of; (gate, up) when it reads two tensors apart (csrc/mainloop_k_halves.cuh:
    the fused gate/up GEMM's conditions, `_checks.gate_up_halves`, and I or S a multiple of its K tile); (None, None)
    without a pair; None when they must be concatenated."""
    if gate is None:
        return None, None
    halves = gate_up_halves(gate, up)
    if halves is None or (halves[1] is not None and gate.shape[-2] % DX_K_TILE):
        return None
    return halves[0], halves[1]


def gate_up_weights(rg, ru, sg, su, side: torch.cuda.Stream | None = None, reads=None):
    """((w_gu, w_up), (w_gu_s, w_up_s)): the B operands of the d_x GEMM's one accumulation over 2I, routed then
    shared (each None when absent): `dx_reads` of each pair (`reads`, when the caller has them), and for a pair it
    cannot read as it is, a concatenation into a new [E, 2I, H] ([2S, H]) buffer (allocated on the current stream)
    with w_up None, made on `side` after the current stream's work so far when given. `side` waits for the current
    stream even when nothing is concatenated, so that the caller's later wait for `side` never depends on work
    outside a CUDA graph being captured (cudaErrorStreamCaptureIsolation)."""
    if reads is None:
        reads = [dx_reads(rg, ru), dx_reads(sg, su)]
    out, todo = [], []
    for (gate, up, dim), read in zip(((rg, ru, 1), (sg, su, 0)), reads, strict=True):
        if read is None:
            shape = list(gate.shape)
            shape[dim] *= 2
            w = torch.empty(shape, dtype=gate.dtype, device=gate.device)
            todo.append((gate, up, dim, w))
            read = (w, None)
        out.append(read)
    if side is not None:
        side.wait_stream(torch.cuda.current_stream(rg.device))
    if todo:
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            for args in todo:
                _concat(*args)
    return out[0], out[1]


def d_act_swiglu(ctx: FastContext, dy, go_RH, rd, sd):
    """(dgu [R, 2I] bf16, dgu_s [T, 2S] bf16 or None) = [bf16(da * p) | bf16(da * q)], da = go · W_down[e]
    (dy · shared_down for the shared expert) in fp32, [p | q] = [u * silu'(g) | silu(g)] fp32 the forward kept
    (csrc/swiglu_math.cuh): `d_act_swiglu_fused` when `_tiles.fuse_swiglu_bwd(I, S)`, else `d_act_swiglu_unfused`
    (the same bits: tests/gpu/test_fast_fused.py).
    go_RH None: the shared part only (dgu None); dy None: the routed part only (dgu_s None)."""
    fn = d_act_swiglu_fused if _tiles.fuse_swiglu_bwd(ctx.dims.I, ctx.dims.S) else d_act_swiglu_unfused
    return fn(ctx, dy, go_RH, rd, sd)


def d_act_swiglu_fused(ctx: FastContext, dy, go_RH, rd, sd):
    """`d_act_swiglu` in one launch (GEMM_NN_SWIGLU_BWD; wherever 8 splits I and S, unless
    MOK_FAST_FUSE_SWIGLU_BWD=0): the SwiGLU backward in the d_a GEMMs' epilogue, so the fp32 da [R, I] is never
    written."""
    d, dev = ctx.dims, (go_RH if go_RH is not None else dy).device
    dgu = None if go_RH is None else _empty(dev, torch.bfloat16, go_RH.shape[0], 2 * d.I)
    dgu_s = _empty(dev, torch.bfloat16, d.T, 2 * d.S) if d.S and dy is not None else None
    _d_act_gemm(ctx, dy, go_RH, rd, sd, dgu, dgu_s, fused=True)
    return dgu, dgu_s


def d_act_swiglu_unfused(ctx: FastContext, dy, go_RH, rd, sd):
    """`d_act_swiglu` in two steps (small experts): the d_a GEMMs write fp32 da [R, I] and da_s [T, S]
    (GEMM_NN_F32), then the swiglu_bwd kernel reads them back with [p | q]."""
    d, dev = ctx.dims, (go_RH if go_RH is not None else dy).device
    I, S, T = d.I, d.S, d.T
    da = None if go_RH is None else _empty(dev, torch.float32, go_RH.shape[0], I)
    da_s = _empty(dev, torch.float32, T, S) if S and dy is not None else None
    _d_act_gemm(ctx, dy, go_RH, rd, sd, da, da_s, fused=False)
    dgu = dgu_s = None
    if da is not None:
        R = da.shape[0]
        dgu = _empty(dev, torch.bfloat16, R, 2 * I)
        _lib.swiglu_bwd(da, ctx.pq_R2I, ctx.sched.offsets, d.E, 0, I, R, dgu)
    if da_s is not None:
        dgu_s = _empty(dev, torch.bfloat16, T, 2 * S)
        _lib.swiglu_bwd(da_s, ctx.pq_s_T2S, None, 0, T, S, T, dgu_s)
    return dgu, dgu_s


def _d_act_gemm(ctx: FastContext, dy, go_RH, rd, sd, out, out_s, fused: bool) -> None:
    """One launch of the d_a GEMMs: go_RH · W_down[e] into `out` [R, width] and dy · shared_down into `out_s`
    [T, width] (either None: skipped). Not fused: fp32 da (GEMM_NN_F32); fused: bf16 [dg | du], each part
    reading its saved [p | q] (GEMM_NN_SWIGLU_BWD)."""
    d = ctx.dims
    H, I, S, T = d.H, d.I, d.S, d.T
    segs = []
    if out is not None:
        w = out.shape[1]
        segs.append(_lib.Segment.expert_rows(ctx.sched.offsets, d.E, I, H, _lib.Operand(go_RH, 0, H, H),
                                             _lib.Operand(rd, H * I, 0, I), _lib.Operand(out, 0, w, w),
                                             aux=_lib.Operand(ctx.pq_R2I, 0, 2 * I, 2 * I) if fused else None))
    if out_s is not None:
        w = out_s.shape[1]
        segs.append(_lib.Segment.all_rows(T, S, H, _lib.Operand(dy, 0, 0, H), _lib.Operand(sd, 0, 0, S),
                                          _lib.Operand(out_s, 0, 0, w),
                                          aux=_lib.Operand(ctx.pq_s_T2S, 0, 0, 2 * S) if fused else None))
    kind = _lib.GEMM_NN_SWIGLU_BWD if fused else _lib.GEMM_NN_F32
    _tiles.grouped_gemm(kind, segs, (out if out is not None else out_s).device, H, I)


def _dx_b(w, up, expert_stride: int, H: int):
    """The d_x GEMM's (b, b_up) operands from one of `gate_up_weights`' pairs."""
    if up is None:
        return _lib.Operand(w, 2 * expert_stride, 0, H), None
    return _lib.Operand(w, expert_stride, 0, H), _lib.Operand(up, expert_stride, 0, H)


def d_input_rows(ctx: FastContext, dgu, dgu_s, w_gu, w_gu_s):
    """(dx rows [R, H] bf16, dx_s [T, H] bf16 or None) = [dg | du] · [W_gate; W_up], one fp32 accumulation;
    dgu None: the shared part only (dx rows None). w_gu, w_gu_s: `gate_up_weights`' pairs."""
    d = ctx.dims
    H, I, S, T = d.H, d.I, d.S, d.T
    dev = (dgu if dgu is not None else dgu_s).device
    segs, dx_RH, dxs = [], None, None
    if dgu is not None:
        dx_RH = _empty(dev, torch.bfloat16, dgu.shape[0], H)
        b, b_up = _dx_b(*w_gu, I * H, H)
        segs.append(_lib.Segment.expert_rows(ctx.sched.offsets, d.E, H, 2 * I, _lib.Operand(dgu, 0, 2 * I, 2 * I), b,
                                             _lib.Operand(dx_RH, 0, H, H), b_up=b_up))
    if dgu_s is not None:
        dxs = _empty(dev, torch.bfloat16, T, H)
        b, b_up = _dx_b(*w_gu_s, 0, H)
        segs.append(_lib.Segment.all_rows(T, H, 2 * S, _lib.Operand(dgu_s, 0, 0, 2 * S), b, _lib.Operand(dxs, 0, 0, H),
                                          b_up=b_up))
    _tiles.grouped_gemm(_lib.GEMM_NN_BF16, segs, dev, H, I)
    return dx_RH, dxs


def shared_down_segment(rows: int, H: int, S: int, dy, a_s, d_sd, s0: int = 0):
    """The segment of the shared expert's down-weight gradient reduced over `rows` rows in order, for its
    intermediate columns [s0, s0 + n), n = d_sd.shape[1]: d_sd [H, n] = dyᵀ a_s[:, s0:]."""
    n = d_sd.shape[1]
    return _lib.Segment.all_wgrad(rows, H, n, _lib.Operand(dy, 0, 0, H), _lib.Operand(a_s, 0, 0, S, offset=s0),
                                  _lib.Operand(d_sd, 0, 0, n))


def shared_gate_up_segments(rows: int, H: int, S: int, dgu_s, x, d_sg, d_su, s0: int = 0):
    """The segments of the shared expert's gate and up weight gradients reduced over `rows` rows in order, for
    its intermediate columns [s0, s0 + n), n = d_sg.shape[0]: d_sg / d_su [n, H] = dg / du[:, s0:]ᵀ x."""
    n = d_sg.shape[0]
    return [_lib.Segment.all_wgrad(rows, n, H, _lib.Operand(dgu_s, 0, 0, 2 * S, offset=half * S + s0),
                                   _lib.Operand(x, 0, 0, H),
                                   _lib.Operand(out, 0, 0, H))
            for half, out in enumerate((d_sg, d_su))]


def wgrad_kind(dtype: torch.dtype) -> int:
    return _lib.GEMM_TT_BF16 if dtype == torch.bfloat16 else _lib.GEMM_TT_F32


def _gate_up_pair(gate, up, dtype, separate: bool, *shape):
    """(both, g, u): new `dtype` buffers for the gradients of `gate` and `up` ([*shape] each). g and u are the
    halves of one [gate; up] buffer `both` when gate and up are the halves of one tensor (gradients in their
    weights' layout) and not `separate`; else two tensors and both None."""
    dev = gate.device
    if separate or stacked_gate_up(gate, up) is None:
        return None, _empty(dev, dtype, *shape), _empty(dev, dtype, *shape)
    both = _empty(dev, dtype, *shape[:-2], 2 * shape[-2], shape[-1])
    return (both, *both.chunk(2, dim=-2))


def gate_up_weight_grads(ctx: FastContext, dgu, dgu_s, dtype=torch.float32, separate: bool = False):
    """(d_rg, d_ru [E, I, H], d_sg, d_su [S, H] or None) in `dtype` (fp32, or bf16: the fp32 accumulator rounded
    once) = dg / du rows ᵀ x rows, each reduced over its expert's rows in canonical order, in one launch; the
    halves of one [gate; up] buffer where the weights are halves of one tensor, unless `separate`. dgu_s None: no
    shared-expert gradients (None)."""
    d, sched = ctx.dims, ctx.sched
    H, I, S, T, E = d.H, d.I, d.S, d.T, d.E
    rg, ru, _, sg, su, _ = ctx.weights
    dev = dgu.device
    both, d_rg, d_ru = _gate_up_pair(rg, ru, dtype, separate, E, I, H)  # halves of `both`: write through it
    outs = ([_lib.Operand(both, 2 * I * H, 0, H, offset=half * I * H) for half in (0, 1)] if both is not None else
            [_lib.Operand(out, I * H, 0, H) for out in (d_rg, d_ru)])
    x_rows = _lib.Operand(ctx.x_RH, 0, H, H)
    segs = [_lib.Segment.expert_wgrad(sched.offsets, E, I, H, _lib.Operand(dgu, 0, 2 * I, 2 * I, offset=half * I),
                                      x_rows, out)
            for half, out in enumerate(outs)]
    d_sg = d_su = None
    if S and dgu_s is not None:
        _, d_sg, d_su = _gate_up_pair(sg, su, dtype, separate, S, H)  # halves of [2S, H] are contiguous
        segs += shared_gate_up_segments(T, H, S, dgu_s, ctx.x_TH, d_sg, d_su)
    _tiles.grouped_gemm(wgrad_kind(dtype), segs, dev, H, I)
    return d_rg, d_ru, d_sg, d_su


def down_weight_grads(ctx: FastContext, dy, go_RH, shared: bool, dtype=torch.float32):
    """(d_rd [E, H, I], d_sd [H, S] or None) in `dtype` = go rows ᵀ a rows (dyᵀ a_s for the shared expert when
    `shared`), each reduced over its expert's rows in canonical order, in one launch."""
    d, dev, sched = ctx.dims, go_RH.device, ctx.sched
    H, I, S, T, E = d.H, d.I, d.S, d.T, d.E
    d_rd = _empty(dev, dtype, E, H, I)
    segs = [_lib.Segment.expert_wgrad(sched.offsets, E, H, I, _lib.Operand(go_RH, 0, H, H),
                                      _lib.Operand(ctx.a_RI, 0, I, I),
                                      _lib.Operand(d_rd, H * I, 0, I))]
    d_sd = None
    if S and shared:
        d_sd = _empty(dev, dtype, H, S)
        segs.append(shared_down_segment(T, H, S, dy, ctx.a_s_TS, d_sd))
    _tiles.grouped_gemm(wgrad_kind(dtype), segs, dev, H, I)
    return d_rd, d_sd


def weight_grads(ctx: FastContext, dy, go_RH, grads_of: list, dtype=torch.float32, separate: bool = False,
                 down: tuple | None = None, then=None):
    """(d_rg, d_ru [E, I, H], d_rd [E, H, I], d_sg, d_su [S, H], d_sd [H, S] or None) in `dtype`; experts with no
    rows get zeros. grads_of: [dgu, dgu_s] (dgu_s None: no shared-expert gradients), emptied here so that the
    gate/up gradients' inputs are freed before the down gradient's buffer is allocated (the caller must hold no
    other reference): the layer's peak memory is then one [R, 2I] bf16 buffer lower. separate: as
    `gate_up_weight_grads`. down: (d_rd, d_sd) from `down_weight_grads` when the caller has run it already (go_RH
    is then not read). then: a callable run once the gate/up gradients are queued and [dg | du] dropped, before
    the down gradients' buffer is allocated (`run_backward` frees what only the gate/up gradients still read)."""
    dgu, dgu_s = grads_of
    grads_of.clear()
    shared = dgu_s is not None
    d_rg, d_ru, d_sg, d_su = gate_up_weight_grads(ctx, dgu, dgu_s, dtype, separate)
    del dgu, dgu_s
    if then is not None:
        then()
    d_rd, d_sd = down if down is not None else down_weight_grads(ctx, dy, go_RH, shared, dtype)
    for g in whole_buffers(d_rg, d_ru, d_rd):
        _lib.zero_empty(g, ctx.sched.offsets, ctx.dims.E, ctx.sched.flag)
    return d_rg, d_ru, d_rd, d_sg, d_su, d_sd


def whole_buffers(d_rg, d_ru, d_rd, d_sg=None, d_su=None, d_sd=None) -> list:
    """The buffers behind the weight gradients (None ones left out): a gate/up pair that is the halves of one
    buffer as that one contiguous buffer, for the kernels that fill whole tensors (zero_empty, poison)."""
    out = []
    for g, u in ((d_rg, d_ru), (d_sg, d_su)):
        both = stacked_gate_up(g, u)
        out += [both] if both is not None else [g, u]
    return [t for t in (*out, d_rd, d_sd) if t is not None]


def release(on: bool, *tensors) -> None:
    """When `on` (the backward's release_saved), free the memory of context tensors the backward has read for the
    last time: each storage is resized to 0 bytes, so every tensor on it (autograd's saved one too) holds no data
    afterwards. Stream-ordered as a `del`: the caching allocator hands the block out again only to work queued after
    the reads on this stream. None entries are skipped."""
    for t in tensors if on else ():
        if t is not None:
            t.untyped_storage().resize_(0)


def run_backward(ctx: FastContext, dy, weight_grad_dtype=torch.float32, separate_gate_up_grads: bool = False,
                 release_saved: bool = False):
    """Gradients in the reference's order: d_x, d_topk_weight, routed gate/up/down, shared gate/up/down
    (weight gradients in `weight_grad_dtype`). The d_x rows, which the combine reads on the side stream, are
    dropped once the gate/up gradients are queued, after the main stream waits for the side one, so that the down
    gradients' buffer may reuse them. release_saved: free o once the pre-combine has read it, [p | q] once the d_a
    step has and the x rows once the gate/up gradients have (`release`; `ctx` is spent), and where gate and up must
    be concatenated, make that copy on the side stream while the down-weight gradients run, before the d_x GEMM
    (the same bits in either order)."""
    d: Dims = ctx.dims
    rg, ru, rd, sg, su, sd = ctx.weights
    dev, sched = dy.device, ctx.sched
    R = ctx.x_RH.shape[0]
    # Buffers used on both streams are allocated on the main one; every side-stream use is ordered
    # before the main stream's later work (main.wait_stream(side)), so none is reused too early.
    main, side = torch.cuda.current_stream(dev), _side_stream(dev)
    reads = [dx_reads(rg, ru), dx_reads(sg, su)]
    concat_late = release_saved and None in reads
    if not concat_late:  # a concatenation overlaps pre-combine, d_a, SwiGLU bwd
        w_gu, w_gu_s = gate_up_weights(rg, ru, sg, su, side, reads)

    d_w = _empty(dev, torch.float32, d.T, d.K)
    go_RH = _empty(dev, torch.bfloat16, R, d.H)
    _lib.combine_bwd_pre(dy, ctx.o_RH, ctx.topk_weight_TK, sched.pair_row, sched.flag, d_w, go_RH)
    release(release_saved, ctx.o_RH)
    dgu, dgu_s = d_act_swiglu(ctx, dy, go_RH, rd, sd)
    release(release_saved, ctx.pq_R2I, ctx.pq_s_T2S)
    down = None
    if concat_late:  # the concatenation overlaps the down-weight gradients, after [p | q] is freed
        w_gu, w_gu_s = gate_up_weights(rg, ru, sg, su, side, reads)
        down = down_weight_grads(ctx, dy, go_RH, dgu_s is not None, weight_grad_dtype)
        release(release_saved, ctx.a_RI, ctx.a_s_TS)
        go_RH = None  # read by nothing after the down gradients
    main.wait_stream(side)
    dx_RH, dxs = d_input_rows(ctx, dgu, dgu_s, w_gu, w_gu_s)
    del w_gu, w_gu_s  # a concatenation ([E, 2I, H] bf16) is free for the weight gradients' buffers
    d_x = _empty(dev, torch.bfloat16, d.T, d.H)
    side.wait_stream(main)
    with torch.cuda.stream(side):  # the d_x combine overlaps the weight-gradient GEMMs
        _lib.combine_bwd_dx(dxs, dx_RH, sched.pair_row, sched.flag, d.K, d_x)
    dx_rows = [dx_RH, dxs]
    del dx_RH, dxs

    def after_gate_up():  # the combine, queued before the far longer gate/up gradients: this wait costs nothing
        main.wait_stream(side)  # measurable in whole steps; it orders the poison too
        dx_rows.clear()  # stream-ordered now: the caching allocator may hand the d_x rows to the down gradients
        release(release_saved, ctx.x_RH)

    grads_of = [dgu, dgu_s]
    del dgu, dgu_s  # weight_grads frees them once the gate/up gradients are done
    grads = weight_grads(ctx, dy, go_RH, grads_of, weight_grad_dtype, separate_gate_up_grads, down, after_gate_up)
    for g in whole_buffers(*grads):
        _lib.poison(g, sched.flag)
    return (d_x, d_w, *grads)

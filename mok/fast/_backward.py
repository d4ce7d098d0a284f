"""Backward pass of the fast path (one GPU, W = 1).

pre-combine (d_topk_weight, go = bf16(w*dy) scattered to rows) -> grouped GEMM d_a (+ shared)
-> SwiGLU backward (dg | du, bf16) -> grouped GEMM d_x rows against [gate; up] (+ shared; the
concatenation is copied on a side stream meanwhile) -> d_x combine (fp32, shared first then k
ascending; on the side stream, overlapping) -> weight-gradient grouped GEMMs (fp32,
K = the expert's rows in canonical order, one CTA per output tile) -> zero empty experts -> NaN
poison of every output if the routing flag is set.
"""
from __future__ import annotations

import torch

from . import _lib

_SIDE: dict[int, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    """A second stream per device for memory-bound work that overlaps the GEMMs (pure copies and
    the d_x combine: no floating-point result depends on the overlap)."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SIDE:
        _SIDE[idx] = torch.cuda.Stream(device)
    return _SIDE[idx]
from ._forward import FastContext
from ._lib import Operand, Segment


def run_backward(ctx: FastContext, dy):
    """Gradients in the reference's order (SPEC §2)."""
    T, H, I, S, E, K = ctx.T, ctx.H, ctx.I, ctx.S, ctx.E, ctx.K
    rg, ru, rd, sg, su, sd = ctx.weights
    dev = dy.device
    R = ctx.x_RH.shape[0]
    offsets, flag = ctx.offsets, ctx.flag
    n_rows_ptr = offsets.data_ptr() + E * 4

    main, side = torch.cuda.current_stream(dev), _side_stream(dev)
    # [W_gate; W_up] for the d_x GEMM (one fp32 accumulation over 2I): copied on the side stream
    # while the pre-combine, the d_a GEMM and the SwiGLU backward run.
    w_gu = torch.empty(E, 2 * I, H, dtype=torch.bfloat16, device=dev)
    w_gu_s = torch.empty(2 * S, H, dtype=torch.bfloat16, device=dev) if S else None
    side.wait_stream(main)
    with torch.cuda.stream(side):
        torch.cat([rg, ru], dim=1, out=w_gu)
        if S:
            torch.cat([sg, su], dim=0, out=w_gu_s)

    d_w = torch.empty(T, K, dtype=torch.float32, device=dev)
    go_RH = torch.empty(R, H, dtype=torch.bfloat16, device=dev)
    _lib.combine_bwd_pre(dy, ctx.o_RH, ctx.topk_weight_TK, ctx.pair_row, flag, d_w, go_RH)

    # d_a = go . W_down[e]   ([rows, H] x [H, I])
    da = torch.empty(R, I, dtype=torch.float32, device=dev)
    segs = [Segment(E, 0, 0, I, H, Operand(go_RH, 0, H, H), Operand(rd, H * I, 0, I), Operand(da, 0, I, I),
                    offsets=offsets)]
    da_s = None
    if S:
        da_s = torch.empty(T, S, dtype=torch.float32, device=dev)
        segs.append(Segment(1, 0, 0, S, H, Operand(dy, 0, 0, H), Operand(sd, 0, 0, S), Operand(da_s, 0, 0, S),
                            fixed_rows=T))
    _lib.grouped_gemm(_lib.GEMM_NN_F32, segs, dev)

    dgu = torch.empty(R, 2 * I, dtype=torch.bfloat16, device=dev)
    _lib.swiglu_bwd(da, ctx.gu_R2I, 2 * I, n_rows_ptr, 0, I, R, dgu)
    dgu_s = None
    if S:
        dgu_s = torch.empty(T, 2 * S, dtype=torch.bfloat16, device=dev)
        _lib.swiglu_bwd(da_s, ctx.gu_s_T2S, 2 * S, None, T, S, T, dgu_s)

    # dx rows = [dg | du] . [W_gate[e]; W_up[e]]   ([rows, 2I] x [2I, H]), one fp32 accumulation
    main.wait_stream(side)
    dx_RH = torch.empty(R, H, dtype=torch.bfloat16, device=dev)
    segs = [Segment(E, 0, 0, H, 2 * I, Operand(dgu, 0, 2 * I, 2 * I), Operand(w_gu, 2 * I * H, 0, H),
                    Operand(dx_RH, 0, H, H), offsets=offsets)]
    dxs = None
    if S:
        dxs = torch.empty(T, H, dtype=torch.bfloat16, device=dev)
        segs.append(Segment(1, 0, 0, H, 2 * S, Operand(dgu_s, 0, 0, 2 * S), Operand(w_gu_s, 0, 0, H),
                            Operand(dxs, 0, 0, H), fixed_rows=T))
    _lib.grouped_gemm(_lib.GEMM_NN_BF16, segs, dev)
    d_x = torch.empty(T, H, dtype=torch.bfloat16, device=dev)
    side.wait_stream(main)
    with torch.cuda.stream(side):  # overlaps the weight-gradient GEMMs
        _lib.combine_bwd_dx(dxs, dx_RH, ctx.pair_row, flag, K, d_x)

    # weight gradients, fp32, K = rows of the expert in canonical order
    d_rd = torch.empty(E, H, I, dtype=torch.float32, device=dev)
    d_rg = torch.empty(E, I, H, dtype=torch.float32, device=dev)
    d_ru = torch.empty(E, I, H, dtype=torch.float32, device=dev)
    segs = [Segment(E, 2, H, I, 0, Operand(go_RH, 0, H, H), Operand(ctx.a_RI, 0, I, I),
                    Operand(d_rd, H * I, 0, I), offsets=offsets)]
    d_sg = d_su = d_sd = None
    if S:
        d_sd = torch.empty(H, S, dtype=torch.float32, device=dev)
        segs.append(Segment(1, 2, H, S, 0, Operand(dy, 0, 0, H), Operand(ctx.a_s_TS, 0, 0, S),
                            Operand(d_sd, 0, 0, S), fixed_rows=T))
    _lib.grouped_gemm(_lib.GEMM_TT_F32, segs, dev)
    segs = [Segment(E, 2, I, H, 0, Operand(dgu, 0, 2 * I, 2 * I), Operand(ctx.x_RH, 0, H, H),
                    Operand(d_rg, I * H, 0, H), offsets=offsets),
            Segment(E, 2, I, H, 0, Operand(dgu, 0, 2 * I, 2 * I, elem_offset=I), Operand(ctx.x_RH, 0, H, H),
                    Operand(d_ru, I * H, 0, H), offsets=offsets)]
    if S:
        d_sg = torch.empty(S, H, dtype=torch.float32, device=dev)
        d_su = torch.empty(S, H, dtype=torch.float32, device=dev)
        segs += [Segment(1, 2, S, H, 0, Operand(dgu_s, 0, 0, 2 * S), Operand(ctx.x_TH, 0, 0, H),
                         Operand(d_sg, 0, 0, H), fixed_rows=T),
                 Segment(1, 2, S, H, 0, Operand(dgu_s, 0, 0, 2 * S, elem_offset=S), Operand(ctx.x_TH, 0, 0, H),
                         Operand(d_su, 0, 0, H), fixed_rows=T)]
    _lib.grouped_gemm(_lib.GEMM_TT_F32, segs, dev)
    main.wait_stream(side)
    for d in (d_rg, d_ru, d_rd):
        _lib.zero_empty(d, offsets, E, d[0].numel(), flag)
    for d in (d_rg, d_ru, d_rd, d_sg, d_su, d_sd):
        if d is not None:
            _lib.poison(d, flag)
    return d_x, d_w, d_rg, d_ru, d_rd, d_sg, d_su, d_sd

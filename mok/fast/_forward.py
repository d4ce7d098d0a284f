"""Forward pass of the fast path (one GPU, W = 1).

Pipeline (all on the current stream, no host sync):
schedule -> gather x rows (expert order) -> grouped GEMM gate/up (+ shared, one launch, fp32 out)
-> SwiGLU (bf16 a) -> grouped GEMM down (+ shared, one launch, bf16 out) -> combine (fp32, shared
first, then k ascending, one bf16 rounding; NaN when the routing flag is set).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import _lib
from ._lib import Operand, Segment


@dataclass
class FastContext:
    """What backward needs. R = T*K row capacity (dropless worst case); rows in canonical order."""
    T: int
    H: int
    I: int
    S: int
    E: int
    K: int
    x_TH: torch.Tensor            # bf16 [T, H]
    topk_weight_TK: torch.Tensor  # fp32 [T, K]
    offsets: torch.Tensor         # int32 [2E+1]: row offsets per expert, then counts
    pair_row: torch.Tensor        # int32 [T*K]: row of pair t*K+k
    flag: torch.Tensor            # int32 [1]: nonzero = bad routing, outputs are NaN
    x_RH: torch.Tensor            # bf16 [R, H] gathered rows
    gu_R2I: torch.Tensor          # fp32 [R, 2I] gate | up pre-activations
    a_RI: torch.Tensor            # bf16 [R, I] SwiGLU output
    o_RH: torch.Tensor            # bf16 [R, H] expert outputs (unweighted)
    weights: tuple                # (routed_gate, routed_up, routed_down, shared_gate, shared_up, shared_down)
    gu_s_T2S: torch.Tensor | None = None  # fp32 [T, 2S]
    a_s_TS: torch.Tensor | None = None    # bf16 [T, S]


def run_forward(x, topk_idx, topk_weight, shared_gate, shared_up, shared_down, routed_gate, routed_up,
                routed_down, dims, capacity: int | None = None):
    """Forward with validated inputs; dims = (T, H, I, S, E, K). `capacity`: row buffer size
    (default T*K, the dropless worst case); a smaller one makes the device flag rows that do not fit."""
    T, H, I, S, E, K = dims
    dev = x.device
    R = T * K if capacity is None else capacity
    i32 = dict(dtype=torch.int32, device=dev)
    offsets = torch.empty(2 * E + 1, **i32)
    row_pair = torch.empty(max(R, 1), **i32)
    pair_row = torch.empty(T * K, **i32)
    flag = torch.empty(1, **i32)
    _lib.schedule(topk_idx, E, 0, E, R, offsets, row_pair, pair_row, flag)
    n_rows_ptr = offsets.data_ptr() + E * 4  # device pointer to offsets[E] = rows placed

    x_RH = torch.empty(R, H, dtype=torch.bfloat16, device=dev)
    _lib.gather_rows(x, row_pair, offsets, E, K, R, x_RH)

    gu = torch.empty(R, 2 * I, dtype=torch.float32, device=dev)
    segs = [Segment(E, 0, 0, I, H, Operand(x_RH, 0, H, H), Operand(routed_gate, I * H, 0, H),
                    Operand(gu, 0, 2 * I, 2 * I), offsets=offsets),
            Segment(E, 0, 0, I, H, Operand(x_RH, 0, H, H), Operand(routed_up, I * H, 0, H),
                    Operand(gu, 0, 2 * I, 2 * I, elem_offset=I), offsets=offsets)]
    gu_s = a_s = s_TH = None
    if S:
        gu_s = torch.empty(T, 2 * S, dtype=torch.float32, device=dev)
        segs += [Segment(1, 0, 0, S, H, Operand(x, 0, 0, H), Operand(shared_gate, 0, 0, H),
                         Operand(gu_s, 0, 0, 2 * S), fixed_rows=T),
                 Segment(1, 0, 0, S, H, Operand(x, 0, 0, H), Operand(shared_up, 0, 0, H),
                         Operand(gu_s, 0, 0, 2 * S, elem_offset=S), fixed_rows=T)]
    _lib.grouped_gemm(_lib.GEMM_TN_F32, segs, dev)

    a_RI = torch.empty(R, I, dtype=torch.bfloat16, device=dev)
    _lib.swiglu_fwd(gu, 2 * I, n_rows_ptr, 0, I, R, a_RI)
    if S:
        a_s = torch.empty(T, S, dtype=torch.bfloat16, device=dev)
        _lib.swiglu_fwd(gu_s, 2 * S, None, T, S, T, a_s)

    o_RH = torch.empty(R, H, dtype=torch.bfloat16, device=dev)
    segs = [Segment(E, 0, 0, H, I, Operand(a_RI, 0, I, I), Operand(routed_down, H * I, 0, I),
                    Operand(o_RH, 0, H, H), offsets=offsets)]
    if S:
        s_TH = torch.empty(T, H, dtype=torch.bfloat16, device=dev)
        segs.append(Segment(1, 0, 0, H, S, Operand(a_s, 0, 0, S), Operand(shared_down, 0, 0, S),
                            Operand(s_TH, 0, 0, H), fixed_rows=T))
    _lib.grouped_gemm(_lib.GEMM_TN_BF16, segs, dev)

    y = torch.empty(T, H, dtype=torch.bfloat16, device=dev)
    _lib.combine_fwd(s_TH, o_RH, topk_weight, pair_row, flag, y)
    ctx = FastContext(T, H, I, S, E, K, x, topk_weight, offsets, pair_row, flag, x_RH, gu, a_RI, o_RH,
                      (routed_gate, routed_up, routed_down, shared_gate, shared_up, shared_down), gu_s, a_s)
    return y, ctx

"""Forward pass of the fast path (one GPU, W = 1), as named stages.

schedule -> gather x rows (expert order) -> gate/up grouped GEMM (+ shared, one launch, fp32 [g | u] out)
-> SwiGLU (bf16 a; [g | u] becomes the backward's [p | q] in place) -> down grouped GEMM (+ shared, one launch,
bf16 out) -> combine (fp32, shared first, then k ascending, one bf16 rounding; NaN when the routing flag is set).
The gate/up GEMM writes a too (GEMM_TN_SWIGLU_FWD, `gate_up_swiglu`; _tiles.py says when), reading gate and up
as the halves of one tensor or as two tensors (`_checks.gate_up_halves`).
All on the current stream, no host synchronisation; buffers sized for the dropless worst case.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..reference import Dims, record_versions
from . import _lib, _tiles
from ._checks import gate_up_halves, stacked_gate_up


@dataclass
class Schedule:
    """Where each (token, k) pair's row is. R = capacity rows; rows in canonical order."""
    offsets: torch.Tensor   # int32 [2E+1]: first row of each expert (offsets[E] = rows placed), then counts
    row_pair: torch.Tensor | None  # int32 [R]: pair index t*K+k of each row (forward only)
    pair_row: torch.Tensor  # int32 [T*K]: row of pair t*K+k
    flag: torch.Tensor      # int32 [1]: nonzero = bad routing, every output is NaN


@dataclass
class FastContext:
    """What backward needs (`save_context` / `load_context` turn it into tensors and back)."""
    dims: Dims
    x_TH: torch.Tensor            # bf16 [T, H]
    topk_weight_TK: torch.Tensor  # fp32 [T, K]
    sched: Schedule
    x_RH: torch.Tensor            # bf16 [R, H] gathered rows
    pq_R2I: torch.Tensor          # fp32 [R, 2I] [p | q] = [u * silu'(g) | silu(g)] of the gate | up pre-activations
    a_RI: torch.Tensor            # bf16 [R, I] SwiGLU output
    o_RH: torch.Tensor            # bf16 [R, H] expert outputs (unweighted)
    weights: tuple                # (routed_gate, routed_up, routed_down, shared_gate, shared_up, shared_down)
    pq_s_T2S: torch.Tensor | None = None  # fp32 [T, 2S] the shared expert's [p | q]
    a_s_TS: torch.Tensor | None = None    # bf16 [T, S]
    versions: tuple = ()  # version counters of the inputs backward reads (`record_versions`)
    fp8: object = None  # the FP8 recipe's quantised weights (`_fp8.Fp8Weights`), None in the bf16 recipe

    @property
    def precision(self) -> str:
        """The forward's recipe (docs/numerics.md): "fp8" when it quantised its operands, else "bf16"."""
        return "bf16" if self.fp8 is None else "fp8"

    def record_versions(self) -> FastContext:
        """Record the version counters of the inputs backward reads (x, topk_weight, the six weights), which
        `mok.fast.backward` compares; returns self."""
        rg, ru, rd, sg, su, sd = self.weights
        self.versions = record_versions({"x": self.x_TH, "topk_weight": self.topk_weight_TK, "routed_gate": rg,
                                         "routed_up": ru, "routed_down": rd, "shared_gate": sg, "shared_up": su,
                                         "shared_down": sd})
        return self


def _empty(dev, dtype, *shape):
    return torch.empty(shape, dtype=dtype, device=dev)


def build_schedule(topk_idx: torch.Tensor, E: int, capacity: int) -> Schedule:
    """Validate ids, count rows per expert, place pairs in canonical order (csrc/schedule.cu)."""
    dev = topk_idx.device
    T, K = topk_idx.shape
    s = Schedule(_empty(dev, torch.int32, 2 * E + 1), _empty(dev, torch.int32, max(capacity, 1)),
                 _empty(dev, torch.int32, T * K), _empty(dev, torch.int32, 1))
    _lib.schedule(topk_idx, E, 0, E, capacity, s.offsets, s.row_pair, s.pair_row, s.flag)
    return s


def gate_up(x_TH, x_RH, sched: Schedule, d: Dims, routed_gate, routed_up, shared_gate, shared_up):
    """(gu [R, 2I] fp32, gu_s [T, 2S] fp32 or None): routed and shared gate/up GEMMs in one launch."""
    dev, (T, H, I, S, E) = x_TH.device, (d.T, d.H, d.I, d.S, d.E)
    gu = _empty(dev, torch.float32, x_RH.shape[0], 2 * I)
    x_rows = _lib.Operand(x_RH, 0, H, H)
    w_gu = stacked_gate_up(routed_gate, routed_up)  # halves of one [E, 2I, H] tensor: read them from it
    w_ops = ([_lib.Operand(w_gu, 2 * I * H, 0, H, offset=half * I * H) for half in (0, 1)] if w_gu is not None else
             [_lib.Operand(w, I * H, 0, H) for w in (routed_gate, routed_up)])
    segs = [_lib.Segment.expert_rows(sched.offsets, E, I, H, x_rows, w_op,
                                     _lib.Operand(gu, 0, 2 * I, 2 * I, offset=half * I))
            for half, w_op in enumerate(w_ops)]
    gu_s = None
    if S:
        gu_s = _empty(dev, torch.float32, T, 2 * S)
        segs += [_lib.Segment.all_rows(T, S, H, _lib.Operand(x_TH, 0, 0, H), _lib.Operand(w, 0, 0, H),
                                       _lib.Operand(gu_s, 0, 0, 2 * S, offset=half * S))
                 for half, w in enumerate((shared_gate, shared_up))]
    _tiles.grouped_gemm(_lib.GEMM_TN_F32, segs, dev, H, I)
    return gu, gu_s


def _b_halves(halves, ld: int) -> tuple:
    """(b, b_up) operands of the fused gate/up GEMM from `_checks.gate_up_halves`'s (b, b_up, expert_stride)."""
    b, up, es = halves
    return _lib.Operand(b, es, 0, ld), (_lib.Operand(up, es, 0, ld) if up is not None else None)


def gate_up_swiglu(x_TH, x_RH, sched: Schedule, d: Dims, halves, halves_s, variant: int):
    """(pq [R, 2I] fp32, pq_s [T, 2S] fp32 or None, a [R, I] bf16, a_s [T, S] bf16 or None): `gate_up` and
    `swiglu` in one launch (GEMM_TN_SWIGLU_FWD, tile `variant`), the same bits ([p | q] where `gate_up` gives
    [g | u]). halves, halves_s: `_checks.gate_up_halves` of the routed gate and up (bf16 [E, I, H] each) and of the
    shared ones ([S, H]; None when S = 0), as `fused_gate_up` returns them."""
    dev, (T, H, I, S, E) = x_TH.device, (d.T, d.H, d.I, d.S, d.E)
    R = x_RH.shape[0]
    pq, a = _empty(dev, torch.float32, R, 2 * I), _empty(dev, torch.bfloat16, R, I)
    b, b_up = _b_halves(halves, H)
    segs = [_lib.Segment.expert_rows(sched.offsets, E, 2 * I, H, _lib.Operand(x_RH, 0, H, H), b,
                                     _lib.Operand(pq, 0, 2 * I, 2 * I), aux=_lib.Operand(a, 0, I, I), b_up=b_up)]
    pq_s = a_s = None
    if S:
        pq_s, a_s = _empty(dev, torch.float32, T, 2 * S), _empty(dev, torch.bfloat16, T, S)
        b, b_up = _b_halves(halves_s, H)
        segs.append(_lib.Segment.all_rows(T, 2 * S, H, _lib.Operand(x_TH, 0, 0, H), b, _lib.Operand(pq_s, 0, 0, 2 * S),
                                          aux=_lib.Operand(a_s, 0, 0, S), b_up=b_up))
    _lib.grouped_gemm(_lib.GEMM_TN_SWIGLU_FWD, segs, dev, variant)
    return pq, pq_s, a, a_s


def fused_gate_up(d: Dims, routed_gate, routed_up, shared_gate, shared_up):
    """(variant, halves, halves_s) for `gate_up_swiglu`, or None when this layer runs `gate_up` and `swiglu` apart:
    gate and up (routed, and shared when S > 0) are neither halves of one tensor nor two tensors the fused GEMM can
    read (`_checks.gate_up_halves`), or _tiles.py says no."""
    halves = gate_up_halves(routed_gate, routed_up)
    halves_s = gate_up_halves(shared_gate, shared_up) if d.S else None
    if halves is None or (d.S and halves_s is None):
        return None
    v = _tiles.fused_gate_up_variant(d.H, d.I, d.S, routed_gate.device)
    return None if v is None else (v, halves, halves_s)


def swiglu(gu, gu_s, sched: Schedule, d: Dims):
    """(a [R, I] bf16, a_s [T, S] bf16 or None) = bf16(silu(g) * u) of gu [R, 2I] and gu_s [T, 2S] fp32 = [g | u],
    which become [p | q] = [u * silu'(g) | silu(g)] in place (what the backward reads: csrc/swiglu_math.cuh)."""
    dev, R = gu.device, gu.shape[0]
    a = _empty(dev, torch.bfloat16, R, d.I)
    _lib.swiglu_fwd(gu, sched.offsets, d.E, 0, d.I, R, a)
    a_s = None
    if gu_s is not None:
        a_s = _empty(dev, torch.bfloat16, d.T, d.S)
        _lib.swiglu_fwd(gu_s, None, 0, d.T, d.S, d.T, a_s)
    return a, a_s


def down(a_RI, a_s, sched: Schedule, d: Dims, routed_down, shared_down):
    """(o [R, H] bf16, s [T, H] bf16 or None): routed and shared down GEMMs in one launch."""
    dev, (T, H, I, S, E) = a_RI.device, (d.T, d.H, d.I, d.S, d.E)
    o = _empty(dev, torch.bfloat16, a_RI.shape[0], H)
    segs = [_lib.Segment.expert_rows(sched.offsets, E, H, I, _lib.Operand(a_RI, 0, I, I),
                                     _lib.Operand(routed_down, H * I, 0, I),
                                     _lib.Operand(o, 0, H, H))]
    s = None
    if a_s is not None:
        s = _empty(dev, torch.bfloat16, T, H)
        segs.append(_lib.Segment.all_rows(T, H, S, _lib.Operand(a_s, 0, 0, S), _lib.Operand(shared_down, 0, 0, S),
                                          _lib.Operand(s, 0, 0, H)))
    _tiles.grouped_gemm(_lib.GEMM_TN_BF16, segs, dev, H, I)
    return o, s


def run_forward(x, topk_idx, topk_weight, shared_gate, shared_up, shared_down, routed_gate, routed_up,
                routed_down, dims: Dims, capacity: int | None = None):
    """Forward with validated inputs. `capacity`: row buffer size (default T*K, the dropless worst
    case); a smaller one makes the device flag rows that do not fit (every output NaN)."""
    R = dims.T * dims.K if capacity is None else capacity
    sched = build_schedule(topk_idx, dims.E, R)
    x_RH = _empty(x.device, torch.bfloat16, R, dims.H)
    _lib.gather_rows(x, sched.pair_row, R, x_RH)
    fused = fused_gate_up(dims, routed_gate, routed_up, shared_gate, shared_up)
    if fused is not None:
        v, halves, halves_s = fused
        pq, pq_s, a_RI, a_s = gate_up_swiglu(x, x_RH, sched, dims, halves, halves_s, v)
    else:
        pq, pq_s = gate_up(x, x_RH, sched, dims, routed_gate, routed_up, shared_gate, shared_up)  # [g | u] here
        a_RI, a_s = swiglu(pq, pq_s, sched, dims)  # ... and [p | q] from here on
    o_RH, s_TH = down(a_RI, a_s, sched, dims, routed_down, shared_down)
    y = _empty(x.device, torch.bfloat16, dims.T, dims.H)
    _lib.combine_fwd(s_TH, o_RH, topk_weight, sched.pair_row, sched.flag, y)
    ctx = FastContext(dims, x, topk_weight, sched, x_RH, pq, a_RI, o_RH,
                      (routed_gate, routed_up, routed_down, shared_gate, shared_up, shared_down), pq_s, a_s)
    return y, ctx

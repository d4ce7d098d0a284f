"""The FP8 recipe on the fast path (docs/numerics.md "FP8 recipe", docs/fast_path.md "FP8"): the quantisers'
calls, the quantised weights (made once per weight version and cached) and the FP8 grouped GEMMs' segments.

Every quantised operand is padded with zeros along its reduction dimension to a multiple of 128 (the FP8 GEMM's K
tile and scale block), so a partial last block adds exact zeros. Values and scales are bit for bit
`mok.reference.quantize_rows_1x128` / `quantize_blocks_128x128` in the columns they cover.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from . import _lib

BLOCK = 128
GROUP = 64  # rows of gate, then of up, in each group of the interleaved [gate; up] (`GateUp`; MOK_FP8_SWIGLU_GROUP)
_CACHE_SIZE = 64  # quantised weight sets kept (one per layer of a model)


def blocks(n: int) -> int:
    """ceil(n / 128): the scale blocks along a dimension of n elements."""
    return -(-n // BLOCK)


def padded(n: int) -> int:
    """n rounded up to a multiple of 128: the stored length of a quantised reduction dimension."""
    return blocks(n) * BLOCK


def quant_rows(x_RD: torch.Tensor, parts: int = 1, count: torch.Tensor | None = None):
    """The FP8 recipe's activations: each row of x_RD (bf16 [R, parts * P]) as `parts` parts of P columns, each in 1x128
    blocks from its first column. count: int32 on the device, its first entry the rows to quantise (the schedule's
    rows placed), or None (all). Returns (q_RDp float8_e4m3fn [R, parts * padded(P)], part j's values in columns
    [j * padded(P), j * padded(P) + P), zeros after them; s_RDb float32 [R, parts * blocks(P)])."""
    R, D = x_RD.shape
    P = D // parts
    q = torch.empty(R, parts * padded(P), dtype=torch.float8_e4m3fn, device=x_RD.device)
    s = torch.empty(R, parts * blocks(P), dtype=torch.float32, device=x_RD.device)
    _lib.fp8_quant_rows(x_RD, parts, count, q, s)
    return q, s


def gate_up_rows(I: int) -> int:
    """2 * ceil(I / 64) * 64: the rows of the interleaved [gate; up] of intermediate size I (`GateUp`)."""
    return 2 * -(-I // GROUP) * GROUP


@dataclass
class GateUp:
    """The B operand of the fused gate/up + SwiGLU GEMM (GEMM_FP8_TN_SWIGLU_FWD), from an `Fp8Expert`'s gate_q, up_q,
    gate_s, up_s (L experts, or none without the L dimension):
      q [L, 2 * Ig, Hp] e4m3: rows in groups of 64, gate's rows [64j, 64j + 64) then up's rows [64j, 64j + 64),
        j = 0 .. Ig / 64 - 1 (Ig = I rounded up to a multiple of 64; rows past I zero), so each 128-column output tile
        of the GEMM holds 64 gate columns and then the up columns of the same 64 intermediate columns;
      s [L, 2 * Ig / 64, Hb] fp32: the scale of each 64 rows and 128 columns, the scale of the 128x128 block of gate
        (or up) they lie in (each block's scale twice, once for each of its 64-row halves, the second dropped where
        I ends in the block's first half).
    The same e4m3 values and scales as gate_q, up_q and their scales, in another order: the GEMM's accumulators are
    the unfused gate/up GEMM's bit for bit."""
    q: torch.Tensor
    s: torch.Tensor


def interleave_gate_up(gate_q, gate_s, up_q, up_s) -> GateUp:
    """`GateUp` of gate_q, up_q ([..., I, Hp] e4m3) and gate_s, up_s ([..., ceil(I/128), Hb] fp32), with torch ops on
    their device (on the current stream; nothing waits for the device)."""
    *lead, I, Hp = gate_q.shape
    J = -(-I // GROUP)

    def rows(q):  # [..., I, Hp] -> [..., J, 64, Hp], zero rows past I (e4m3's +0 is all-zero bits)
        out = torch.zeros((*lead, J * GROUP, Hp), dtype=torch.uint8, device=q.device)
        out[..., :I, :] = q.view(torch.uint8)
        return out.unflatten(-2, (J, GROUP))

    def scales(s):  # [..., Ib, Hb] -> [..., J, Hb]: each 64 rows' 128-row block
        Ib, Hb = s.shape[-2:]
        return s.unsqueeze(-2).expand(*lead, Ib, 2, Hb).flatten(-3, -2)[..., :J, :]

    q = torch.stack((rows(gate_q), rows(up_q)), dim=-3).flatten(-4, -2)  # [..., J, 2, 64, Hp] -> [..., 2*J*64, Hp]
    s = torch.stack((scales(gate_s), scales(up_s)), dim=-2).flatten(-3, -2)  # [..., J, 2, Hb] -> [..., 2J, Hb]
    return GateUp(q.view(torch.float8_e4m3fn), s.contiguous())


@dataclass
class Fp8Expert:
    """One stack of experts' weights quantised (L experts, or the shared expert without the L dimension), every
    reduction dimension padded to a multiple of 128 with zeros:
      gate_q, up_q [L, I, Hp] e4m3 and gate_s, up_s [L, Ib, Hb] fp32: the gate/up GEMM's B (K = H);
      down_q [L, H, Ip], down_s [L, Hb, Ib]: the down GEMM's B (K = I);
      downT_q [L, I, Hp], downT_s [L, Ib, Hb]: down's transpose, the d_a GEMM's B (K = H; the same values and
        scales as down_q, down_s, transposed);
      guT_q [L, H, 2Ip], guT_s [L, Hb, 2Ib]: [gate; up]'s transpose, the d_x GEMM's B (K = 2Ip: gate's I rows at
        columns [0, I), up's at [Ip, Ip + I), zeros between and after);
      gate_up: gate and up interleaved (`GateUp`), the fused gate/up + SwiGLU GEMM's B, made from gate_q, up_q and
        their scales the first time that GEMM runs (`gate_up`), None until then.
    (Hp, Ip = H, I padded to 128; Hb, Ib = their blocks.)"""
    gate_q: torch.Tensor
    gate_s: torch.Tensor
    up_q: torch.Tensor
    up_s: torch.Tensor
    down_q: torch.Tensor
    down_s: torch.Tensor
    downT_q: torch.Tensor
    downT_s: torch.Tensor
    guT_q: torch.Tensor
    guT_s: torch.Tensor
    gate_up: GateUp | None = None


def quant_expert(gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> Fp8Expert:
    """`Fp8Expert` of gate, up ([L, I, H] or [I, H] bf16) and down ([L, H, I] or [H, I] bf16)."""
    lead = tuple(gate.shape[:-2])
    I, H = gate.shape[-2:]
    Ip, Hp, Ib, Hb = padded(I), padded(H), blocks(I), blocks(H)
    dev = gate.device

    def e(dtype, *shape):
        return torch.empty((*lead, *shape), dtype=dtype, device=dev)

    f8, f32 = torch.float8_e4m3fn, torch.float32
    w = Fp8Expert(e(f8, I, Hp), e(f32, Ib, Hb), e(f8, I, Hp), e(f32, Ib, Hb), e(f8, H, Ip), e(f32, Hb, Ib),
                  e(f8, I, Hp), e(f32, Ib, Hb), e(f8, H, 2 * Ip), e(f32, Hb, 2 * Ib))
    for half, (src, q, s) in enumerate(((gate, w.gate_q, w.gate_s), (up, w.up_q, w.up_s))):
        _lib.fp8_quant_blocks(src.contiguous(), q, s, w.guT_q, half * Ip, w.guT_s, half * Ib)
    _lib.fp8_quant_blocks(down.contiguous(), w.down_q, w.down_s, w.downT_q, 0, w.downT_s, 0)
    return w


def gate_up(w: Fp8Expert) -> GateUp:
    """w's interleaved [gate; up] (`GateUp`), made on the current stream at the first call and kept with w (which the
    cache keeps per weight version: one interleaving per version, like the quantisation)."""
    if w.gate_up is None:
        w.gate_up = interleave_gate_up(w.gate_q, w.gate_s, w.up_q, w.up_s)
    return w.gate_up


@dataclass
class Fp8Weights:
    """The layer's quantised weights: routed (`Fp8Expert` of [L, ...] stacks) and shared (None without one)."""
    routed: Fp8Expert
    shared: Fp8Expert | None


_cache: dict[int, tuple] = {}  # id of routed_gate's root -> (weakrefs to the roots, key, Fp8Weights)


def _root(w: torch.Tensor) -> torch.Tensor:
    """The tensor `w` views (itself when it is no view): mok.nn hands over new views of its [gate; up] parameters
    at every call, which share their root's storage and version counter."""
    return w if w._base is None else w._base


def _key(weights):
    return tuple(None if w is None else (w._version, w.data_ptr(), tuple(w.shape), tuple(w.stride()))
                 for w in weights)


def fp8_weights(rg, ru, rd, sg, su, sd) -> Fp8Weights:
    """The quantised weights of a layer (routed gate, up [L, I, H], down [L, H, I]; shared gate, up [S, H], down
    [H, S] bf16 or None), made on the current stream when these tensors (or the tensors they view), their places or
    their version counters changed since the last call with them (an optimizer step updates the weights in place:
    one quantisation per step), else the cached ones (no work, nothing launched)."""
    weights = (rg, ru, rd, sg, su, sd)
    roots = tuple(None if w is None else _root(w) for w in weights)
    key = _key(weights)
    hit = _cache.get(id(roots[0]))
    if hit is not None:
        refs, old_key, value = hit
        if old_key == key and all((r is None and w is None) or (r is not None and r() is w)
                                  for r, w in zip(refs, roots)):
            return value
    value = Fp8Weights(quant_expert(rg, ru, rd), quant_expert(sg, su, sd) if sg is not None else None)
    slot = id(roots[0])
    if len(_cache) >= _CACHE_SIZE and slot not in _cache:
        _cache.pop(next(iter(_cache)))
    refs = tuple(None if w is None else weakref.ref(w, lambda r, slot=slot: _drop(slot, r)) for w in roots)
    _cache[slot] = (refs, key, value)
    return value


def _drop(slot: int, dead: weakref.ref) -> None:
    """Forget the quantisation made from a weight that no longer exists (its memory with it)."""
    entry = _cache.get(slot)
    if entry is not None and any(r is dead for r in entry[0]):
        del _cache[slot]


def clear_cache() -> None:
    """Drop every cached quantisation of weights (their memory is freed once no context holds them)."""
    _cache.clear()


def rows_segment(offsets, E: int, n: int, a_q, a_s, b_q, b_s, d, d_ld: int, d_offset: int = 0):
    """The FP8 GEMM segment of routed rows: D_e [rows(e), n] = A [rows, Kp] (a_q e4m3, a_s [rows, Kb]) ·
    B_e [n, Kp]ᵀ (b_q [E, n, Kp], b_s [E, nb, Kb]), D written at column d_offset of d (leading dimension d_ld)."""
    Kp, Kb = a_q.shape[1], a_s.shape[1]
    nb = b_s.shape[-2]
    return _lib.Segment.expert_rows(offsets, E, n, Kp, _lib.Operand(a_q, 0, Kp, Kp), _lib.Operand(b_q, n * Kp, 0, Kp),
                                    _lib.Operand(d, 0, d_ld, d_ld, offset=d_offset),
                                    sfa=_lib.Operand(a_s, 0, Kb, Kb), sfb=_lib.Operand(b_s, nb * Kb, 0, Kb))


def all_rows_segment(rows: int, n: int, a_q, a_s, b_q, b_s, d, d_ld: int, d_offset: int = 0):
    """`rows_segment` for one matrix B (b_q [n, Kp], b_s [nb, Kb]) over all `rows` rows (the shared expert)."""
    Kp, Kb = a_q.shape[1], a_s.shape[1]
    return _lib.Segment.all_rows(rows, n, Kp, _lib.Operand(a_q, 0, 0, Kp), _lib.Operand(b_q, 0, 0, Kp),
                                 _lib.Operand(d, 0, 0, d_ld, offset=d_offset),
                                 sfa=_lib.Operand(a_s, 0, 0, Kb), sfb=_lib.Operand(b_s, 0, 0, Kb))


def swiglu_rows_segment(offsets, E: int, a_q, a_s, gu: GateUp, pq, a):
    """The fused gate/up + SwiGLU GEMM's (GEMM_FP8_TN_SWIGLU_FWD) segment of routed rows: for each expert e,
    [p | q] (pq [rows, 2I] fp32) and a (a [rows, I] bf16) of [g | u] = A [rows, Kp] (a_q e4m3, a_s [rows, Kb]) ·
    [gate_e; up_e]ᵀ, from `gu` ([E, ...] `GateUp`)."""
    Kp, Kb = a_q.shape[1], a_s.shape[1]
    n, nb, I = gu.q.shape[-2], gu.s.shape[-2], a.shape[1]
    return _lib.Segment.expert_rows(offsets, E, 2 * I, Kp, _lib.Operand(a_q, 0, Kp, Kp),
                                    _lib.Operand(gu.q, n * Kp, 0, Kp), _lib.Operand(pq, 0, 2 * I, 2 * I),
                                    aux=_lib.Operand(a, 0, I, I), sfa=_lib.Operand(a_s, 0, Kb, Kb),
                                    sfb=_lib.Operand(gu.s, nb * Kb, 0, Kb))


def swiglu_all_rows_segment(rows: int, a_q, a_s, gu: GateUp, pq, a):
    """`swiglu_rows_segment` for one expert (`gu` without the E dimension: the shared expert) over all `rows` rows."""
    Kp, Kb = a_q.shape[1], a_s.shape[1]
    I = a.shape[1]
    return _lib.Segment.all_rows(rows, 2 * I, Kp, _lib.Operand(a_q, 0, 0, Kp), _lib.Operand(gu.q, 0, 0, Kp),
                                 _lib.Operand(pq, 0, 0, 2 * I), aux=_lib.Operand(a, 0, 0, I),
                                 sfa=_lib.Operand(a_s, 0, 0, Kb), sfb=_lib.Operand(gu.s, 0, 0, Kb))


def gemm(kind: int, segs: list, device) -> None:
    """One FP8 grouped GEMM launch (GEMM_FP8_TN_F32, GEMM_FP8_TN_BF16 or GEMM_FP8_TN_SWIGLU_FWD; one tile whatever
    the variant)."""
    _lib.grouped_gemm(kind, segs, device, 0)

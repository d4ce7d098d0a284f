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


@dataclass
class Fp8Expert:
    """One stack of experts' weights quantised (L experts, or the shared expert without the L dimension), every
    reduction dimension padded to a multiple of 128 with zeros:
      gate_q, up_q [L, I, Hp] e4m3 and gate_s, up_s [L, Ib, Hb] fp32: the gate/up GEMM's B (K = H);
      down_q [L, H, Ip], down_s [L, Hb, Ib]: the down GEMM's B (K = I);
      downT_q [L, I, Hp], downT_s [L, Ib, Hb]: down's transpose, the d_a GEMM's B (K = H; the same values and
        scales as down_q, down_s, transposed);
      guT_q [L, H, 2Ip], guT_s [L, Hb, 2Ib]: [gate; up]'s transpose, the d_x GEMM's B (K = 2Ip: gate's I rows at
        columns [0, I), up's at [Ip, Ip + I), zeros between and after).
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


def gemm(kind: int, segs: list, device) -> None:
    """One FP8 grouped GEMM launch (GEMM_FP8_TN_F32 or GEMM_FP8_TN_BF16; one tile whatever the variant)."""
    _lib.grouped_gemm(kind, segs, device, 0)

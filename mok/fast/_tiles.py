"""Which tile variant (csrc/grouped_gemm.cuh, MOK_GEMM_NUM_VARIANTS) each grouped GEMM of a layer runs.

Chosen from the GEMM's kind and the layer's model constants only (H, I: never the token count), so a
layer runs the same kernels whatever its batch; every variant walks K in the same order with one CTA per
output tile, so all give the same bits anyway (tests/gpu/test_fast_tiles.py checks it).

The rule, from one profile of every GEMM under each variant (benchmarks/RESULTS.md, run 6; `python
benchmarks/profile_fast.py` with MOK_FAST_GEMM_VARIANT set): the weight-gradient GEMMs run ping-pong
128x192 in 2x1 clusters on every shape measured (6-22% faster); the forward and d_a / d_x GEMMs run
ping-pong 128x192 when the routed intermediate size is small (I <= 1024: 3-9% faster per GEMM on Qwen3-30B-A3B),
else the cooperative 128x256 tile (as fast or faster for I = 1536 to 14336).

`MOK_FAST_GEMM_VARIANT` overrides the choice, for benchmarks: one variant for every kind ("2"), or one per
kind in MokGemmKind order ("2,2,0,0,2,2").
"""
from __future__ import annotations

import functools
import os

from . import _lib

COOPERATIVE, COOPERATIVE_2X1, PINGPONG_2X1, PINGPONG = range(_lib.NUM_GEMM_VARIANTS)
ENV = "MOK_FAST_GEMM_VARIANT"
SMALL_I = 1024  # at or below: many small experts (Qwen3, OLMoE, DeepSeek-V2-Lite), ping-pong pays


def _override(kind: int) -> int | None:
    """The variant MOK_FAST_GEMM_VARIANT gives `kind`, or None when it is unset; ValueError naming the
    variable for anything but one or NUM_KINDS integers in [0, NUM_GEMM_VARIANTS)."""
    forced = _parse(os.environ.get(ENV, "").strip())
    return None if forced is None else forced[0] if len(forced) == 1 else forced[kind]


@functools.lru_cache(maxsize=8)
def _parse(text: str) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        vals = [int(v) for v in text.split(",")]
    except ValueError:
        vals = []
    n_kinds = len(_lib.GEMM_KINDS)
    if len(vals) not in (1, n_kinds) or not all(0 <= v < _lib.NUM_GEMM_VARIANTS for v in vals):
        raise ValueError(f"{ENV}: expected one or {n_kinds} comma-separated integers in "
                         f"[0, {_lib.NUM_GEMM_VARIANTS}), got {text!r}")
    return tuple(vals)


def variant(kind: int, H: int, I: int) -> int:
    """The tile variant of a `kind` GEMM (mok.fast._lib.GEMM_*) of a layer with hidden size H and routed
    intermediate size I."""
    forced = _override(kind)
    if forced is not None:
        return forced
    if kind in (_lib.GEMM_TT_F32, _lib.GEMM_TT_BF16):  # weight gradients: K = an expert's rows
        return PINGPONG_2X1
    return PINGPONG if I <= SMALL_I else COOPERATIVE


def grouped_gemm(kind: int, segments: list, device, H: int, I: int) -> None:
    """`_lib.grouped_gemm` of a layer with hidden size H and routed intermediate size I, in its variant."""
    _lib.grouped_gemm(kind, segments, device, variant(kind, H, I))

"""Which tile variant (csrc/grouped_gemm.cuh, MOK_GEMM_NUM_VARIANTS) each grouped GEMM of a layer runs, and
whether the d_a GEMM takes the SwiGLU backward into its epilogue.

Chosen from the GEMM's kind and the layer's model constants only (H, I: never the token count), so a
layer runs the same kernels whatever its batch; every variant walks K in the same order with one CTA per
output tile, so all give the same bits anyway (tests/gpu/test_fast_tiles.py checks it).

The rule, from one profile of every GEMM under each variant (benchmarks/RESULTS.md, run 6; `python
benchmarks/profile_fast.py` with MOK_FAST_GEMM_VARIANT set): the weight-gradient GEMMs run ping-pong
128x192 in 2x1 clusters on every shape measured (6-22% faster); the forward and d_x GEMMs run
ping-pong 128x192 when the routed intermediate size is small (I <= 1024: 3-9% faster per GEMM on Qwen3-30B-A3B),
else the cooperative 128x256 tile (as fast or faster for I = 1536 to 14336). The d_a GEMM with the SwiGLU
backward in its epilogue (off by default, see below) runs the cooperative tile everywhere (its epilogue reads
[g | u] and writes [dg | du]: the two consumer warpgroups share it; faster than ping-pong on the five shapes of
`benchmarks/bench_fused.py` in two runs but once on Mixtral-8x7B, by 0.9%; benchmarks/RESULTS.md run 7).

`MOK_FAST_GEMM_VARIANT` overrides the choice, for benchmarks: one variant for every kind ("2"), or one per
kind in MokGemmKind order ("2,2,0,0,2,2,0,3,0").

The forward's gate/up GEMM takes the SwiGLU into its epilogue (GEMM_TN_SWIGLU_FWD: the tile's B rows are gate and
up halves of the same intermediate columns, so no fp32 [g | u] is read back by a separate kernel) when the layer's
gate and up weights are the halves of one tensor, the experts are small (I <= 1024) and a tile splits I and S into
whole halves (I and S multiples of 96 for the ping-pong tile, of 128 for the cooperative one; that kind runs
without clusters). Measured end to end (benchmarks/RESULTS.md run 9, `python benchmarks/bench_fused.py
--forward`): fwd+bwd 1.023x faster on Qwen3-30B-A3B (ping-pong), 1.010x on mid-64e (ping-pong; forward alone
1.07x), 1.044x on OLMoE-1B-7B (cooperative, as 96 does not split I = 1024), and 0.988x-1.004x (noise or slower)
with the cooperative tile on the large-expert shapes, whose epilogue does not overlap the tensor cores: so the
cooperative tile fuses for small experts only (I <= 1024) and the DeepSeek-V3 slice and Mixtral shapes (96 does
not split 2048 or 14336) run apart. `MOK_FAST_FUSE_SWIGLU_FWD=0` runs the gate/up GEMM and the swiglu_fwd kernel
apart everywhere, `=1` fuses wherever a tile splits I and S (the same bits either way).

`MOK_FAST_FUSE_SWIGLU_BWD=1` runs the d_a GEMM with the SwiGLU backward in its epilogue (GEMM_NN_SWIGLU_BWD)
instead of the d_a GEMM and the swiglu_bwd kernel: the same bits, no fp32 d_a buffer (R x I x 4 bytes: 0.4 GB on
Qwen3-30B-A3B, 0.9 GB on Mixtral-8x7B at 8192 tokens), but 1-5% slower end to end on four of five benchmark
shapes (its epilogue does not overlap the tensor cores; benchmarks/RESULTS.md run 7), so off by default.
"""
from __future__ import annotations

import functools
import os

from . import _lib

COOPERATIVE, COOPERATIVE_2X1, PINGPONG_2X1, PINGPONG = range(_lib.NUM_GEMM_VARIANTS)
ENV = "MOK_FAST_GEMM_VARIANT"
FUSE_ENV = "MOK_FAST_FUSE_SWIGLU_BWD"
FUSE_FWD_ENV = "MOK_FAST_FUSE_SWIGLU_FWD"
# Half the tile's N in each variant of GEMM_TN_SWIGLU_FWD: the columns of gate (and of up) one tile covers. That
# kind runs without clusters: its variants 1 and 2 are variants 0 and 3.
HALF_TILE_N = {COOPERATIVE: 128, COOPERATIVE_2X1: 128, PINGPONG_2X1: 96, PINGPONG: 96}
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


def fuse_swiglu_bwd() -> bool:
    """Whether MOK_FAST_FUSE_SWIGLU_BWD asks for the fused d_a + SwiGLU-backward GEMM ("1"; unset, "" or "0":
    no); ValueError naming the variable for anything else."""
    return _switch(FUSE_ENV, False)


def _switch(name: str, default: bool | None) -> bool | None:
    text = os.environ.get(name, "").strip()
    if text not in ("", "0", "1"):
        raise ValueError(f"{name}: expected 0 or 1, got {text!r}")
    return default if text == "" else text == "1"


def fused_gate_up_variant(H: int, I: int, S: int) -> int | None:
    """The tile variant of the fused gate/up + SwiGLU GEMM (GEMM_TN_SWIGLU_FWD) of a layer with hidden size H,
    routed intermediate size I and shared intermediate size S (0: none), or None when the layer runs the gate/up
    GEMM and the swiglu_fwd kernel apart. The ping-pong tile when its halves (96) split I and S; else the
    cooperative tile (halves of 128) for small experts (I <= 1024), or for any when MOK_FAST_FUSE_SWIGLU_FWD=1;
    else None, and always None when it is 0. MOK_FAST_GEMM_VARIANT, when it forces the kind's variant, is the only
    candidate. ValueError naming the variable for a switch value other than 0 or 1."""
    forced_on = _switch(FUSE_FWD_ENV, None)
    if forced_on is False:
        return None
    forced = _override(_lib.GEMM_TN_SWIGLU_FWD)
    # ping-pong first (its epilogue overlaps the other warpgroup's mainloop); the cooperative tile only for small
    # experts unless the switch says 1
    candidates = (forced,) if forced is not None else (
        (PINGPONG, COOPERATIVE) if forced_on or I <= SMALL_I else (PINGPONG,))
    for v in candidates:
        if I % HALF_TILE_N[v] == 0 and S % HALF_TILE_N[v] == 0:
            return v
    return None


def variant(kind: int, H: int, I: int) -> int:
    """The tile variant of a `kind` GEMM (mok.fast._lib.GEMM_*) of a layer with hidden size H and routed
    intermediate size I."""
    forced = _override(kind)
    if forced is not None:
        return forced
    if kind in (_lib.GEMM_TT_F32, _lib.GEMM_TT_BF16):  # weight gradients: K = an expert's rows
        return PINGPONG_2X1
    if kind == _lib.GEMM_TT_F32_SMALL:  # one tile whatever the variant
        return COOPERATIVE
    if kind == _lib.GEMM_NN_SWIGLU_BWD:  # its epilogue is heavy: two warpgroups share it
        return COOPERATIVE
    return PINGPONG if I <= SMALL_I else COOPERATIVE


def grouped_gemm(kind: int, segments: list, device, H: int, I: int) -> None:
    """`_lib.grouped_gemm` of a layer with hidden size H and routed intermediate size I, in its variant."""
    _lib.grouped_gemm(kind, segments, device, variant(kind, H, I))

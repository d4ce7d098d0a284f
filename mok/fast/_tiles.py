"""Which tile variant (csrc/grouped_gemm.cuh, MOK_GEMM_NUM_VARIANTS) each grouped GEMM of a layer runs, and
whether the gate/up and d_a GEMMs take the SwiGLU forward and backward into their epilogues.

Chosen from the GEMM's kind and the layer's model constants only (H, I: never the token count; the fused gate/up
kind also from the card's name), so a layer runs the same kernels whatever its batch; every variant walks K in the
same order with one CTA per output tile, so all give the same bits anyway (tests/gpu/test_fast_tiles.py checks it).
The rule, each choice with the measurement behind it (docs/fast_path.md, "GEMM tile variants"):

- Weight gradients (GEMM_TT_F32 / GEMM_TT_BF16): ping-pong 128x192 in 2x1 clusters (6-22% faster than the
  cooperative tile on every shape profiled), or the same tile with its sides swapped, 192x128 in 1x2 clusters,
  where that covers fewer output elements (`wgrad_variant`; Mixtral-8x7B's gate/up gradient 6.25 -> 6.13 ms).
- The other row-tiled GEMMs: ping-pong 128x192 when I <= PINGPONG_MAX_I (short reductions: 3-9% faster GEMMs on
  Qwen3-30B-A3B, 0.4-0.9% faster steps at I = 1408 and 1536), else cooperative 128x256 (Mixtral-8x7B's long down
  and d_x reductions about 10% faster in it). The down and d_x GEMMs (GEMM_TN_BF16, GEMM_NN_BF16) of layers with
  TALL_MIN_I <= I <= PINGPONG_MAX_I and H <= TALL_MAX_H run the cooperative 256x128 tile in 1x2 clusters instead
  (the two CTAs of a cluster share A): whole steps on an H100 0.6-9.5% faster in a burst and 0.4-4.8% at steady
  state on six such shapes; slower where I = 512 and at H = 5120, level or slower above PINGPONG_MAX_I.
- d_a (GEMM_NN_SWIGLU_BWD, wherever 8 splits I and S): the SwiGLU backward in the epilogue of the ping-pong tile
  without clusters, [dg | du] in bf16 from the accumulators and the forward's [p | q] = [u * silu'(g) | silu(g)]
  (copied ahead by the kernel's epilogue load warp, csrc/epilogue_swiglu_bwd_loaded.cuh), so the fp32 d_a [R, I]
  is never written nor read back by the swiglu_bwd kernel; the same bits. Alone it takes 0.79 ms on Qwen3-30B-A3B
  against the pair's 0.99, and whole steps are faster on every shape measured. Its 2x1-cluster variant tied the
  rule in whole steps; 1x2 clusters sharing the go rows were 6-27% slower alone on five of six shapes.
- Gate/up (GEMM_TN_SWIGLU_FWD, when the layer's gate and up weights are the halves of one tensor or two tensors
  it can read, `_checks.gate_up_halves`, and 8 splits I and S): the SwiGLU in the epilogue, so no fp32 [g | u] is
  read back by a separate kernel (1.002-1.044x faster steps); the cooperative 128x256 tile where I > PINGPONG_MAX_I
  and H >= FUSED_GATE_UP_COOP_MIN_H (1.3-7.9% faster steps on an H100 for such layers, 1.6-3.2% slower on
  Qwen3-30B-A3B), else ping-pong 128x192; ping-pong for every layer on a card named in FUSED_GATE_UP_PINGPONG_CARDS
  (on an H200 ping-pong was 0.9-2.2% faster on the large-expert layers). The tile's halves (96 or 128 columns)
  need not split I: in the last tile they run past it and the epilogue stores nothing there.

`MOK_FAST_FUSE_SWIGLU_BWD=1` / `=0` fuses the d_a step wherever 8 splits I and S / nowhere;
`MOK_FAST_FUSE_SWIGLU_FWD=0` runs the gate/up GEMM and the swiglu_fwd kernel apart everywhere (the same bits).
`MOK_FAST_FUSE_SWIGLU_FWD_FP8=0` does the same in the FP8 recipe, whose forward otherwise runs the FP8 gate/up GEMM with
the SwiGLU in its epilogue (GEMM_FP8_TN_SWIGLU_FWD, one tile) wherever 8 splits I and S (`fuse_swiglu_fwd_fp8`).

`MOK_FAST_GEMM_VARIANT` overrides the choice, for benchmarks: one variant for every kind ("2"), or one per
kind in MokGemmKind order ("2,2,0,0,2,2,0,3,0"; the FP8 kinds, last, have one tile and may be left out), where an
empty entry leaves that kind to the rule (",3,,,,,,,":
GEMM_TN_BF16, the down GEMM, in variant 3; every other kind as the rule says, the weight gradients' per-launch
choice of `wgrad_variant` included).
"""
from __future__ import annotations

import functools
import os

import torch

from . import _lib

COOPERATIVE, COOPERATIVE_2X1, PINGPONG_2X1, PINGPONG, PINGPONG_TALL_1X2, COOPERATIVE_TALL_1X2 = range(
    _lib.NUM_GEMM_VARIANTS)
ENV = "MOK_FAST_GEMM_VARIANT"
FUSE_ENV = "MOK_FAST_FUSE_SWIGLU_BWD"
FUSE_FWD_ENV = "MOK_FAST_FUSE_SWIGLU_FWD"
FUSE_FWD_FP8_ENV = "MOK_FAST_FUSE_SWIGLU_FWD_FP8"
# Half the tile's N in each variant of GEMM_TN_SWIGLU_FWD: the columns of gate (and of up) one tile covers. Its
# variants 1 and 2 are variants 0 and 3 in 2x1 clusters (B shared by multicast), variant 4 (a weight-gradient
# tile) is 3 and variant 5 (a tile of the plain bf16-out kinds) is 0.
HALF_TILE_N = {COOPERATIVE: 128, COOPERATIVE_2X1: 128, PINGPONG_2X1: 96, PINGPONG: 96, PINGPONG_TALL_1X2: 96,
               COOPERATIVE_TALL_1X2: 128}
# The rows and columns of output one cluster covers in the weight-gradient kinds' two candidate variants (CUTLASS's
# group scheduler rounds each group's tiles up to whole clusters): 128x192 tiles in 2x1 clusters, 192x128 in 1x2.
WGRAD_CLUSTER_MN = {PINGPONG_2X1: (256, 192), PINGPONG_TALL_1X2: (192, 256)}
PINGPONG_MAX_I = 1536  # at or below: the row-tiled GEMMs' reductions (K = I or 2I) are short, ping-pong pays
# The down and d_x GEMMs run COOPERATIVE_TALL_1X2 where TALL_MIN_I <= I <= PINGPONG_MAX_I and H <= TALL_MAX_H
# (below TALL_MIN_I their reductions are a few K tiles, where the ping-pong tile's epilogue overlap pays, and
# DeepSeek-V2's H = 5120 ran 4.9% slower in it)
TALL_MIN_I = 768
TALL_MAX_H = 4096
# The fused gate/up + SwiGLU GEMM (reduction K = H) runs the cooperative tile where I > PINGPONG_MAX_I and H is at
# least this, except on the cards below
FUSED_GATE_UP_COOP_MIN_H = 4096
# Cards (a substring of the CUDA device's name) on which that kind keeps the ping-pong tile for every layer: on an
# H200 (4.8 TB/s of HBM3e) it is 0.9-2.2% faster for Mixtral-8x7B, Mixtral-8x22B, DBRX, Llama-4-Scout and
# Phi-3.5-MoE and ties on the DeepSeek-V3 slice, where on an H100 (3.35 TB/s of HBM3) the cooperative tile is
# 1.3-7.9% faster
FUSED_GATE_UP_PINGPONG_CARDS = ("H200",)


def _override(kind: int) -> int | None:
    """The variant MOK_FAST_GEMM_VARIANT gives `kind`, or None when it is unset or leaves the kind's entry empty
    (the rule then chooses); ValueError naming the variable for anything but one or NUM_KINDS entries, each an
    integer in [0, NUM_GEMM_VARIANTS) or, in a per-kind list, empty."""
    forced = _parse(os.environ.get(ENV, "").strip())
    return None if forced is None else forced[0] if len(forced) == 1 else forced[kind]


@functools.lru_cache(maxsize=8)
def _parse(text: str) -> tuple[int | None, ...] | None:
    if not text:
        return None
    n_kinds = len(_lib.GEMM_KINDS)
    n_tiled = n_kinds - len(_lib.GEMM_FP8_KINDS)  # the FP8 kinds (last) have one tile: their entries may be left out
    fields = [v.strip() for v in text.split(",")]
    try:
        vals = [int(v) if v else None for v in fields]
    except ValueError:
        vals = []
    if len(vals) not in (1, n_tiled, n_kinds) or not all(v is None or 0 <= v < _lib.NUM_GEMM_VARIANTS for v in vals):
        raise ValueError(f"{ENV}: expected one integer in [0, {_lib.NUM_GEMM_VARIANTS}) or {n_tiled} (or {n_kinds}) "
                         f"comma-separated entries, each such an integer or empty (the rule's choice), got {text!r}")
    return tuple(vals) + (None,) * (n_kinds - len(vals) if len(vals) > 1 else 0)


def fuse_swiglu_bwd(I: int, S: int) -> bool:
    """Whether a layer of routed and shared intermediate sizes I and S (0: none) runs the fused d_a + SwiGLU-backward
    GEMM: always, unless MOK_FAST_FUSE_SWIGLU_BWD says "0" (never); never when 8 does
    not split I and S (the kind copies [p | q] in 16-byte chunks). ValueError naming the variable for a value other
    than 0 or 1."""
    forced = _switch(FUSE_ENV, None)
    if I % 8 or S % 8:
        return False
    return True if forced is None else forced


def _switch(name: str, default: bool | None) -> bool | None:
    text = os.environ.get(name, "").strip()
    if text not in ("", "0", "1"):
        raise ValueError(f"{name}: expected 0 or 1, got {text!r}")
    return default if text == "" else text == "1"


def fused_gate_up_fits(I: int, S: int) -> bool:
    """Whether the fused gate/up + SwiGLU kind can run a layer of routed and shared intermediate sizes I and S (0:
    none): 8 splits both (its tiles store whole 8-column blocks; a tile's halves need not split I: the last tile's
    columns past I are not stored)."""
    return I > 0 and I % 8 == 0 and S % 8 == 0


def fused_gate_up_variant(H: int, I: int, S: int, device=None) -> int | None:
    """The tile variant of the fused gate/up + SwiGLU GEMM (GEMM_TN_SWIGLU_FWD) of a layer with hidden size H,
    routed intermediate size I and shared intermediate size S (0: none) on `device` (a torch.device; None: no card
    named), or None when the layer runs the gate/up GEMM and the swiglu_fwd kernel apart: wherever the kind fits
    (`fused_gate_up_fits`) `variant`'s choice for it (the cooperative 128x256 tile when I > PINGPONG_MAX_I and
    H >= FUSED_GATE_UP_COOP_MIN_H, long reductions and large experts, unless the card is one of
    FUSED_GATE_UP_PINGPONG_CARDS; else the ping-pong 128x192 one); None elsewhere and always when
    MOK_FAST_FUSE_SWIGLU_FWD is 0. MOK_FAST_GEMM_VARIANT, when it forces the kind's variant, is taken instead.
    ValueError naming the variable for a switch value other than 0 or 1."""
    if _switch(FUSE_FWD_ENV, True) is False or not fused_gate_up_fits(I, S):
        return None
    return variant(_lib.GEMM_TN_SWIGLU_FWD, H, I, device)


def fuse_swiglu_fwd_fp8(I: int, S: int) -> bool:
    """Whether the FP8 forward of a layer of routed and shared intermediate sizes I and S (0: none) runs the FP8
    gate/up GEMM with the SwiGLU in its epilogue (GEMM_FP8_TN_SWIGLU_FWD, on the interleaved [gate; up] of
    `_fp8.GateUp`): wherever `fused_gate_up_fits` (its tiles store whole 8-column blocks), unless
    MOK_FAST_FUSE_SWIGLU_FWD_FP8 is 0 (the FP8 gate/up GEMM and the swiglu_fwd kernel apart, the same bits).
    ValueError naming the variable for a value other than 0 or 1."""
    return _switch(FUSE_FWD_FP8_ENV, True) is not False and fused_gate_up_fits(I, S)


@functools.lru_cache(maxsize=None)
def _card_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def gate_up_pingpong_card(device) -> bool:
    """Whether `device` (a torch.device, or None) is a CUDA device whose name contains one of
    FUSED_GATE_UP_PINGPONG_CARDS: the fused gate/up kind runs the ping-pong tile there for every layer. False for
    None and for other devices (the rule measured on an H100)."""
    if device is None or device.type != "cuda":
        return False
    name = _card_name(device.index if device.index is not None else torch.cuda.current_device())
    return any(card in name for card in FUSED_GATE_UP_PINGPONG_CARDS)


def variant(kind: int, H: int, I: int, device=None) -> int:
    """The tile variant of a `kind` GEMM (mok.fast._lib.GEMM_*) of a layer with hidden size H and routed
    intermediate size I, on `device` (a torch.device; None: no card named; only the fused gate/up kind's choice
    depends on the card, `gate_up_pingpong_card`)."""
    forced = _override(kind)
    if forced is not None:
        return forced
    if kind in (_lib.GEMM_TT_F32, _lib.GEMM_TT_BF16):  # weight gradients: K = an expert's rows (`grouped_gemm`
        return PINGPONG_2X1                            # takes `wgrad_variant` over its outputs' shapes instead)
    if kind == _lib.GEMM_TT_F32_SMALL:  # one tile whatever the variant
        return COOPERATIVE
    if kind == _lib.GEMM_NN_SWIGLU_BWD:  # the ping-pong epilogue overlaps the other warpgroup's mainloop
        return PINGPONG
    if kind == _lib.GEMM_TN_SWIGLU_FWD:  # reduction K = H: cooperative where it is long and the experts large
        large = I > PINGPONG_MAX_I and H >= FUSED_GATE_UP_COOP_MIN_H
        return COOPERATIVE if large and not gate_up_pingpong_card(device) else PINGPONG
    if kind in (_lib.GEMM_TN_BF16, _lib.GEMM_NN_BF16) and TALL_MIN_I <= I <= PINGPONG_MAX_I and H <= TALL_MAX_H:
        return COOPERATIVE_TALL_1X2  # the down and d_x GEMMs of mid-sized experts
    return PINGPONG if I <= PINGPONG_MAX_I else COOPERATIVE


def wgrad_variant(kind: int, outputs) -> int:
    """The tile variant of a weight-gradient GEMM (GEMM_TT_F32 / GEMM_TT_BF16) launch whose outputs are `outputs`,
    (M, N, groups) each: `groups` outputs [M, N] (model constants: [I, H] for gate or up, [H, I] for down). Of the
    128x192 tile in 2x1 clusters and the 192x128 tile in 1x2 clusters (the same loads, registers and bits), the one
    whose clusters cover fewer output elements beyond the outputs; the first on a tie. MOK_FAST_GEMM_VARIANT, when it
    forces the kind, is taken instead."""
    forced = _override(kind)
    if forced is not None:
        return forced

    def covered(v: int) -> int:
        cm, cn = WGRAD_CLUSTER_MN[v]
        return sum(g * -(-m // cm) * cm * (-(-n // cn) * cn) for m, n, g in outputs)

    return PINGPONG_TALL_1X2 if covered(PINGPONG_TALL_1X2) < covered(PINGPONG_2X1) else PINGPONG_2X1


def grouped_gemm(kind: int, segments: list, device, H: int, I: int) -> None:
    """`_lib.grouped_gemm` of a layer with hidden size H and routed intermediate size I, in its variant: `variant`,
    or for the weight-gradient kinds `wgrad_variant` over the segments' outputs."""
    if kind in (_lib.GEMM_TT_F32, _lib.GEMM_TT_BF16):
        v = wgrad_variant(kind, [(s.m, s.n, s.num_groups) for s in segments])
    else:
        v = variant(kind, H, I, device)
    _lib.grouped_gemm(kind, segments, device, v)

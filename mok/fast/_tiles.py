"""Which tile variant (csrc/grouped_gemm.cuh, MOK_GEMM_NUM_VARIANTS) each grouped GEMM of a layer runs, and
whether the gate/up and d_a GEMMs take the SwiGLU forward and backward into their epilogues.

Chosen from the GEMM's kind and the layer's model constants only (H, I: never the token count; the fused gate/up
kind also from the card's name), so a layer runs the same kernels whatever its batch; every variant walks K in the
same order with one CTA per output tile, so all give the same bits anyway (tests/gpu/test_fast_tiles.py checks it).

The rule, from one profile of every GEMM under each variant (benchmarks/RESULTS.md, run 6; `python
benchmarks/profile_fast.py` with MOK_FAST_GEMM_VARIANT set): the weight-gradient GEMMs run ping-pong
128x192 in 2x1 clusters on every shape measured (6-22% faster), or since run 19 the same tile with its sides
swapped, 192x128 in 1x2 clusters, where that covers fewer output elements (`wgrad_variant`: the gate/up gradients
[I, H] of Qwen3-30B-A3B, mid-64e and Mixtral-8x7B, whose H = 2048 or 4096 is no multiple of 192; the down gradients
[H, I] of the DeepSeek-V3 slice and OLMoE-1B-7B); the forward and d_x GEMMs run
ping-pong 128x192 when the routed intermediate size is at most PINGPONG_MAX_I (I <= 1024: 3-9% faster per GEMM on
Qwen3-30B-A3B, run 6; I = 1408 and 1536, GLM-4.5-Air and mid-64e: 0.4-0.9% faster steps at steady state, run 22),
else the cooperative 128x256 tile (I = 2048 a tie in run 16; Mixtral-8x7B's I = 14336, whose down and d_x
reductions are long: each about 10% faster in it, run 6). Since run 41 the down and d_x GEMMs (GEMM_TN_BF16,
GEMM_NN_BF16) of layers with TALL_MIN_I <= I <= PINGPONG_MAX_I and H <= TALL_MAX_H run the cooperative 256x128 tile
in 1x2 clusters instead (the two CTAs of a cluster share A, SonicMoE's tile for them): whole steps on an H100
(`python benchmarks/energy_probe.py`, two interleaved rounds, burst / steady ms, benchmarks/RESULTS.md run 41)
0.6-9.5% / 0.4-4.8% faster on Qwen3-235B-A22B, OLMoE-1B-7B, DeepSeek-V2-Lite, GLM-4.5-Air, Qwen1.5-MoE-A2.7B and
mid-64e, a tie on Qwen3-30B-A3B (-0.8% / +1.1%); slower where I = 512 (Granite-3.0-3B-A800M steady +2.2%) and on
DeepSeek-V2 (H = 5120: +4.9% / +1.5%), which keep the rule above; the d_x launch alone 1.48 -> 1.30 ms on
Qwen3-30B-A3B. Nor does either kind alone gain outside that range (run 43: the down or the d_x kind in variant 5
on the DeepSeek-V3 slice, DeepSeek-V2, Mixtral-8x7B and Qwen2-57B-A14B, level or up to 2.6% slower).

Every layer (8 splitting I and S) runs the d_a GEMM with the SwiGLU backward in its epilogue (GEMM_NN_SWIGLU_BWD:
[dg | du] in bf16 straight from the accumulators, so the fp32 d_a [R, I] is never written nor read back by the
swiglu_bwd kernel; the same bits) in the ping-pong tile without clusters, whose epilogue reads the forward's [p | q]
from shared memory, where the kernel's epilogue load warp has copied it ahead (csrc/epilogue_swiglu_bwd_loaded.cuh;
since run 30, 0.6-9% faster alone than the consumer's own copies before), and overlaps the other warpgroup's
mainloop. Since run 27 the forward keeps [p | q] = [u * silu'(g) | silu(g)] instead of [g | u], so that epilogue is
two products a pair: the d_a step alone went from 0.99 (the pair) to 0.79 ms on Qwen3-30B-A3B, 1.46 to 1.15 on
OLMoE-1B-7B, 1.45 to 1.18 on mid-64e, and whole steps of Qwen3-30B-A3B and OLMoE-1B-7B, which kept the pair until
then (I <= 1024), 5-7% faster in a burst and 1.2-1.6% at steady state (benchmarks/RESULTS.md run 27). Before run 27
(the epilogue took the SiLU of the saved [g | u]), alone it was faster than the pair too (benchmarks/RESULTS.md run
15, `python benchmarks/bench_d_act.py`: 1.01 -> 1.00 ms on Qwen3-30B-A3B, 1.50 -> 1.20 on mid-64e, 3.85 -> 3.65 on
the DeepSeek-V3 slice, 3.75 -> 3.14 on Mixtral-8x7B).
A training step runs at the GPU's power limit, so what sets its speed is the energy a step takes: with steps back
to back for seconds (`python benchmarks/energy_probe.py`, run 16) the fused launch takes 1.1-3.4% less energy per
step and 0.7-2.0% less time on mid-64e, the DeepSeek-V3 slice and Mixtral-8x7B, and more of both on Qwen3-30B-A3B
and OLMoE-1B-7B (I <= 1024), which kept the pair. It also saves that transient R x I x 4 bytes.
`MOK_FAST_FUSE_SWIGLU_BWD=1` / `=0` fuses wherever 8 splits I and S / nowhere. The fused kind's 2x1-cluster
variant, faster alone on OLMoE-1B-7B and the DeepSeek-V3 slice (run 27), tied the rule on their whole steps (run 28,
an H100: 10.60 against 10.57 and 31.25 against 31.20 ms steady), so the rule keeps the ping-pong tile. Nor do the
kind in 1x2-cluster tiles that share A, the go rows (run 42, an H100, benchmarks/d_a_shared_a_run42.diff, not merged;
benchmarks/RESULTS.md): variant 4 (this
ping-pong tile in 1x2 clusters) was 6-27% slower alone on five of six shapes and its steps 1-4% slower on four of
five (OLMoE-1B-7B the exception: 1.7% faster steady); variant 5 (cooperative 256x128) 20-71% slower alone.

The forward's gate/up GEMM takes the SwiGLU into its epilogue (GEMM_TN_SWIGLU_FWD: the tile's B rows are gate and
up halves of the same intermediate columns, so no fp32 [g | u] is read back by a separate kernel) when the layer's
gate and up weights are the halves of one tensor or two tensors it can read (`_checks.gate_up_halves`; since run 31)
and 8 splits I and S (that kind runs without clusters): since run 34 in the cooperative 128x256 tile where
I > PINGPONG_MAX_I and H >= FUSED_GATE_UP_COOP_MIN_H, elsewhere in the ping-pong 128x192 tile; since run 35 in the
ping-pong tile for every layer on a card named in FUSED_GATE_UP_PINGPONG_CARDS (an H200: Mixtral-8x7B 1.7-1.9% faster
steps there in ping-pong, the DeepSeek-V3 slice a tie; benchmarks/RESULTS.md run 35). Whole steps on an H100,
interleaved (`python benchmarks/energy_probe.py`, benchmarks/RESULTS.md run 34), cooperative against ping-pong: 1.3-7.9%
faster on DBRX, Llama-4-Scout, Phi-3.5-MoE, Mixtral-8x7B and the DeepSeek-V3 slice (H >= 4096, I >= 2048), a tie on
mid-64e (I = 1536) and gpt-oss (H = 2880), 1.6-3.2% slower on Qwen3-30B-A3B. The tile's halves (96 or 128
columns) need not split I: in the last tile they run past it and the epilogue stores nothing there. Until run 18
the halves had to split I and S, so the DeepSeek-V3 slice (I = 2048), Mixtral-8x7B (14336) and OLMoE-1B-7B (1024)
ran the cooperative 128x256 tile, whose epilogue (fp32 [g | u] and bf16 a stored from registers) does not overlap
the tensor cores. Run 18, the fused launch alone, cooperative -> ping-pong
(`python benchmarks/bench_gate_up.py`): Mixtral-8x7B 6.35 -> 5.92 ms, OLMoE 1.82 -> 1.70, DeepSeek-V3 slice 6.87 ->
6.81 (its last tile a third full); whole steps (`python benchmarks/energy_probe.py`, two calls) 1.7-1.9% less time
steady on Mixtral-8x7B, 2.5-3.0% on OLMoE, 0.3-0.6% on the DeepSeek-V3 slice (benchmarks/RESULTS.md run 18).
Earlier: fusing at all was 1.023x fwd+bwd on Qwen3-30B-A3B, 1.010x on mid-64e, 1.044x on OLMoE (run 9) and, once the
SiLU had no division call (csrc/swiglu_math.cuh), 1.021x on the DeepSeek-V3 slice and 1.004x on Mixtral-8x7B in the
cooperative tile (run 15).
`MOK_FAST_FUSE_SWIGLU_FWD=0` runs the gate/up GEMM and the swiglu_fwd kernel apart everywhere (the same bits).

`MOK_FAST_GEMM_VARIANT` overrides the choice, for benchmarks: one variant for every kind ("2"), or one per
kind in MokGemmKind order ("2,2,0,0,2,2,0,3,0"), where an empty entry leaves that kind to the rule (",3,,,,,,,":
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
# Half the tile's N in each variant of GEMM_TN_SWIGLU_FWD: the columns of gate (and of up) one tile covers. Its
# variants 1 and 2 are variants 0 and 3 in 2x1 clusters (B shared by multicast since run 41), variant 4 (a
# weight-gradient tile) is 3 and variant 5 (a tile of the plain bf16-out kinds) is 0.
HALF_TILE_N = {COOPERATIVE: 128, COOPERATIVE_2X1: 128, PINGPONG_2X1: 96, PINGPONG: 96, PINGPONG_TALL_1X2: 96,
               COOPERATIVE_TALL_1X2: 128}
# The rows and columns of output one cluster covers in the weight-gradient kinds' two candidate variants (CUTLASS's
# group scheduler rounds each group's tiles up to whole clusters): 128x192 tiles in 2x1 clusters, 192x128 in 1x2.
WGRAD_CLUSTER_MN = {PINGPONG_2X1: (256, 192), PINGPONG_TALL_1X2: (192, 256)}
PINGPONG_MAX_I = 1536  # at or below: the row-tiled GEMMs' reductions (K = I or 2I) are short, ping-pong pays
# The down and d_x GEMMs run COOPERATIVE_TALL_1X2 where TALL_MIN_I <= I <= PINGPONG_MAX_I and H <= TALL_MAX_H
# (benchmarks/RESULTS.md run 41; below TALL_MIN_I their reductions are a few K tiles, where the ping-pong tile's
# epilogue overlap pays, and DeepSeek-V2's H = 5120 ran slower in it)
TALL_MIN_I = 768
TALL_MAX_H = 4096
# The fused gate/up + SwiGLU GEMM (reduction K = H) runs the cooperative tile where I > PINGPONG_MAX_I and H is at
# least this (benchmarks/RESULTS.md run 34), except on the cards below
FUSED_GATE_UP_COOP_MIN_H = 4096
# Cards (a substring of the CUDA device's name) on which that kind keeps the ping-pong tile for every layer: on an
# H200 (4.8 TB/s of HBM3e) it stayed faster for Mixtral-8x7B and tied on the DeepSeek-V3 slice (benchmarks/RESULTS.md
# runs 18 and 35), where on an H100 (3.35 TB/s of HBM3) the cooperative tile is 1.3-7.9% faster (run 34)
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
    fields = [v.strip() for v in text.split(",")]
    try:
        vals = [int(v) if v else None for v in fields]
    except ValueError:
        vals = []
    if len(vals) not in (1, n_kinds) or not all(v is None or 0 <= v < _lib.NUM_GEMM_VARIANTS for v in vals):
        raise ValueError(f"{ENV}: expected one integer in [0, {_lib.NUM_GEMM_VARIANTS}) or {n_kinds} comma-separated "
                         f"entries, each such an integer or empty (the rule's choice), got {text!r}")
    return tuple(vals)


def fuse_swiglu_bwd(I: int, S: int) -> bool:
    """Whether a layer of routed and shared intermediate sizes I and S (0: none) runs the fused d_a + SwiGLU-backward
    GEMM: always (benchmarks/RESULTS.md run 27), unless MOK_FAST_FUSE_SWIGLU_BWD says "0" (never); never when 8 does
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
        return COOPERATIVE_TALL_1X2  # the down and d_x GEMMs of mid-sized experts (run 41)
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

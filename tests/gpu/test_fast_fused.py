"""The d_a GEMM with the SwiGLU backward in its epilogue (GEMM_NN_SWIGLU_BWD: the forward's [p | q] loaded into
registers in the cooperative tiles, csrc/epilogue_swiglu_bwd.cuh, and copied into shared memory by the epilogue load
warp in the ping-pong ones, which the rule runs, csrc/epilogue_swiglu_bwd_loaded.cuh; the default wherever 8 splits I
and S, MOK_FAST_FUSE_SWIGLU_BWD=0 turns it off) gives the bits of the unfused pair: the GEMM_NN_F32 d_a GEMM (fp32
d_a written out) followed by the swiglu_bwd kernel, for the routed rows and the shared expert, under every tile
variant, on shapes with uneven and empty experts, token counts that are not multiples of 128 and I, S that are not
multiples of a sub-tile's 32 columns, and with saved factors whose products overflow (and infinities and NaN); and
the whole layer gives the same nine outputs with the switch on as off."""
import pytest
import torch

import mok.fast as fast
from mok.fast import _backward, _lib, _tiles
from mok.testing.bits import assert_bitwise_equal, assert_outputs_bitwise_equal
from mok.testing.cases import LAYER_ARGS, MoEConfig, make_inputs
from mok.testing.runner import run_layer

pytestmark = [pytest.mark.gpu, pytest.mark.sm90]

SHAPES = [
    MoEConfig(T=1000, H=1024, I=512, E=16, K=4, S=256),  # mid-size experts, shared expert, T % 128 != 0
    MoEConfig(T=777, H=2048, I=2816, E=4, K=2, S=0),     # few large experts (Mixtral-like), no shared expert
    MoEConfig(T=300, H=512, I=136, E=64, K=8, S=72),     # many small experts, some empty; I, S not multiples of 64
]


def _context(cfg, seed, wide: bool):
    inputs = make_inputs(cfg, seed, device="cuda")
    _, ctx = fast.forward(*(inputs[a] for a in LAYER_ARGS))
    if wide:  # large values, +-inf and NaN in p and q (the backward's saved factors)
        gen = torch.Generator(device="cuda").manual_seed(seed)
        for pq in (ctx.pq_R2I, ctx.pq_s_T2S):
            if pq is not None:
                pq.copy_(torch.randn(pq.shape, generator=gen, device="cuda") * 1e30)
                pq.view(-1)[::97] = float("inf")
                pq.view(-1)[::89] = -float("inf")
                pq.view(-1)[::83] = float("nan")
    d = ctx.dims
    go_RH = torch.empty(ctx.x_RH.shape, dtype=torch.bfloat16, device="cuda")
    d_w = torch.empty(d.T, d.K, dtype=torch.float32, device="cuda")
    _lib.combine_bwd_pre(inputs["dy"], ctx.o_RH, ctx.topk_weight_TK, ctx.sched.pair_row, ctx.sched.flag, d_w, go_RH)
    return ctx, inputs["dy"], go_RH


@pytest.mark.parametrize("cfg", SHAPES, ids=["mid", "few_large", "many_small"])
@pytest.mark.parametrize("wide", [
    False,  # the layer's own pre-activations
    True,   # [p | q] overwritten: products overflowing to +-inf, +-inf and NaN
], ids=["layer_values", "wide_preacts"])
def test_fused_epilogue_gives_the_unfused_bits_in_every_variant(monkeypatch, cfg, wide):
    ctx, dy, go_RH = _context(cfg, 3, wide)
    rd, sd = ctx.weights[2], ctx.weights[5]
    monkeypatch.setenv(_tiles.ENV, "0")
    want_dgu, want_dgu_s = _backward.d_act_swiglu_unfused(ctx, dy, go_RH, rd, sd)
    placed = int(ctx.sched.offsets[cfg.E])  # rows past the placed ones are never written by either
    assert placed > 0
    for v in range(_lib.NUM_GEMM_VARIANTS):
        monkeypatch.setenv(_tiles.ENV, str(v))
        dgu, dgu_s = _backward.d_act_swiglu_fused(ctx, dy, go_RH, rd, sd)
        assert_bitwise_equal(dgu[:placed], want_dgu[:placed], f"variant {v}: dg | du")
        if cfg.S:
            assert_bitwise_equal(dgu_s, want_dgu_s, f"variant {v}: shared dg | du")
        else:
            assert dgu_s is None


def test_fused_parts_run_alone():
    """The expert-parallel backward launches the shared part (go_RH None) and the routed part (dy None) apart."""
    cfg = SHAPES[0]
    ctx, dy, go_RH = _context(cfg, 4, False)
    rd, sd = ctx.weights[2], ctx.weights[5]
    want_dgu, want_dgu_s = _backward.d_act_swiglu_unfused(ctx, dy, go_RH, rd, sd)
    placed = int(ctx.sched.offsets[cfg.E])
    dgu, none = _backward.d_act_swiglu_fused(ctx, None, go_RH, rd, sd)
    assert none is None
    assert_bitwise_equal(dgu[:placed], want_dgu[:placed], "routed part alone")
    none, dgu_s = _backward.d_act_swiglu_fused(ctx, dy, None, rd, sd)
    assert none is None
    assert_bitwise_equal(dgu_s, want_dgu_s, "shared part alone")


def _launch_directly(seg, variant: int) -> None:
    """One GEMM_NN_SWIGLU_BWD launch of `seg` through the C entry point, bypassing the binding's own checks."""
    _lib._grouped_gemm_unchecked(_lib.GEMM_NN_SWIGLU_BWD, [seg], torch.device("cuda"), variant)


def test_the_library_refuses_a_fused_launch_without_its_input():
    """The C side checks operand aux too (the binding's check is bypassed here on purpose)."""
    x = torch.zeros(128, 128, dtype=torch.bfloat16, device="cuda")
    seg = _lib.Segment.all_rows(128, 64, 128, _lib.Operand(x, 0, 0, 128), _lib.Operand(x, 0, 0, 64),
                                _lib.Operand(x, 0, 0, 128))
    with pytest.raises(RuntimeError, match="operand aux"):
        _launch_directly(seg, 0)


@pytest.mark.parametrize("cfg", SHAPES[::2], ids=["mid", "many_small"])  # SHAPES 0 and 2: both have a shared expert
def test_the_switch_keeps_every_output_of_the_layer(monkeypatch, cfg):
    inputs = make_inputs(cfg, 5, device="cuda")

    monkeypatch.setenv(_tiles.FUSE_ENV, "0")
    want = run_layer(inputs, impl=fast)
    monkeypatch.setenv(_tiles.FUSE_ENV, "1")
    got = run_layer(inputs, impl=fast)
    assert_outputs_bitwise_equal(got, want, f"{_tiles.FUSE_ENV}=1 against =0")


@pytest.mark.parametrize("what", [
    "ld",      # a [p | q] row stride that is not whole 16-byte chunks
    "offset",  # [p | q] starting one float into its buffer
    "n",       # N not a multiple of 8
])
def test_the_library_refuses_p_q_rows_not_16_byte_aligned(what):
    """The ping-pong epilogue copies [p | q] in 16-byte chunks: the C side refuses rows it cannot copy that way (the
    binding's segments never build one; this calls the library directly)."""
    a = torch.zeros(128, 128, dtype=torch.bfloat16, device="cuda")
    b = torch.zeros(128, 128, dtype=torch.bfloat16, device="cuda")
    n = 60 if what == "n" else 64
    d = torch.zeros(128, 2 * n, dtype=torch.bfloat16, device="cuda")
    pq = torch.zeros(128, 2 * n + 4, dtype=torch.float32, device="cuda")
    aux = _lib.Operand(pq, 0, 0, 2 * n + (2 if what == "ld" else 4), offset=1 if what == "offset" else 0)
    seg = _lib.Segment.all_rows(128, n, 128, _lib.Operand(a, 0, 0, 128), _lib.Operand(b, 0, 0, n),
                                _lib.Operand(d, 0, 0, 2 * n), aux=aux)
    with pytest.raises(RuntimeError, match="16-byte"):
        _launch_directly(seg, _tiles.PINGPONG)

"""The d_x GEMM against gate and up as two tensors (GEMM_NN_BF16 with operand b_up: csrc/mainloop_k_halves.cuh reads
B's K rows [0, I) from the gate weights and [I, 2I) from the up weights, one tensormap over both) gives the bits of
the same GEMM against their concatenation [gate; up], for the routed rows and the shared expert, under every tile
variant (clusters with TMA multicast included), with up before or after gate in memory and the halves apart by no
whole number of rows; the C side refuses halves that are not whole K tiles. (The whole layer with two tensors, no
concatenation made: tests/gpu/test_fast_fused_fwd.py.)"""
import pytest
import torch

import mok.fast as fast
from mok.fast import _backward, _lib
from mok.testing.bits import assert_bitwise_equal
from mok.testing.cases import LAYER_ARGS, MoEConfig, make_inputs, two_gate_up_tensors

pytestmark = [pytest.mark.gpu, pytest.mark.sm90]

SHAPES = [
    MoEConfig(T=1000, H=1024, I=384, E=16, K=4, S=256),  # shared expert, T % 128 != 0
    MoEConfig(T=777, H=2048, I=1536, E=4, K=2, S=0),     # few large experts, no shared expert
    MoEConfig(T=300, H=512, I=128, E=64, K=8, S=64),     # many small experts, some empty; one K tile of S a half
]
IDS = ["mid_shared", "few_large", "many_small"]


@pytest.mark.parametrize("cfg", SHAPES, ids=IDS)
@pytest.mark.parametrize("up_first", [
    False,  # gate's rows first in memory: the tensormap's base is gate
    True,   # up's rows first: the base is up, and K rows [0, I) its second half
], ids=["gate_first", "up_first"])
def test_two_tensors_give_the_concatenations_bits_in_every_variant(monkeypatch, cfg, up_first):
    inputs = make_inputs(cfg, 8, device="cuda")
    _, ctx = fast.forward(*(inputs[a] for a in LAYER_ARGS))
    gen = torch.Generator(device="cuda").manual_seed(2)
    R = cfg.T * cfg.K
    dgu = torch.randn(R, 2 * cfg.I, generator=gen, device="cuda").to(torch.bfloat16)
    dgu_s = torch.randn(cfg.T, 2 * cfg.S, generator=gen, device="cuda").to(torch.bfloat16) if cfg.S else None
    rg, ru = two_gate_up_tensors(inputs["routed_gate"], inputs["routed_up"], up_first)
    sg, su = two_gate_up_tensors(inputs["shared_gate"], inputs["shared_up"], up_first) if cfg.S else (None, None)
    for g, u in ((rg, ru), (sg, su))[:1 + bool(cfg.S)]:
        read = _backward.dx_reads(g, u)
        assert read is not None and read[0] is g and read[1] is u, "read apart"
        assert (u.data_ptr() < g.data_ptr()) == up_first
        assert (abs(u.data_ptr() - g.data_ptr()) // 2) % cfg.H != 0, "the halves must not be whole rows apart"
    apart = _backward.gate_up_weights(rg, ru, sg, su)
    assert apart[0][1] is ru and (not cfg.S or apart[1][1] is su), "read apart, not concatenated"
    cat = ((torch.cat([rg, ru], 1), None), (torch.cat([sg, su]), None) if cfg.S else (None, None))
    placed = int(ctx.sched.offsets[cfg.E])
    for v in range(_lib.NUM_GEMM_VARIANTS):
        monkeypatch.setenv("MOK_FAST_GEMM_VARIANT", str(v))
        want = _backward.d_input_rows(ctx, dgu, dgu_s, *cat)
        got = _backward.d_input_rows(ctx, dgu, dgu_s, *apart)
        assert_bitwise_equal(got[0][:placed], want[0][:placed], f"variant {v}: d_x rows")
        if cfg.S:
            assert_bitwise_equal(got[1], want[1], f"variant {v}: shared d_x")


def _launch(seg, variant=0):
    """The C entry point itself (the binding's checks are bypassed on purpose)."""
    _lib._grouped_gemm_unchecked(_lib.GEMM_NN_BF16, [seg], torch.device("cuda", 0), variant)


@pytest.mark.parametrize("k, up, match", [
    (2 * 96, "apart", "multiple of 128"),  # halves of 96 rows: a K tile would straddle gate and up
    (2 * 128, "ld", "b_up"),               # the up rows' ld differs
    (2 * 128, "odd", "16 bytes"),          # 8 bytes from a 16-byte step
])
def test_the_library_refuses_halves_it_cannot_read(k, up, match):
    a = torch.zeros(128, k, dtype=torch.bfloat16, device="cuda")
    w = torch.zeros(k, 128, dtype=torch.bfloat16, device="cuda")
    out = torch.zeros(128, 128, dtype=torch.bfloat16, device="cuda")
    b_up = {"apart": _lib.Operand(w, 0, 0, 128, offset=k // 2 * 128),
            "ld": _lib.Operand(w, 0, 0, 136, offset=k // 2 * 128),
            "odd": _lib.Operand(w, 0, 0, 128, offset=4)}[up]
    seg = _lib.Segment.all_rows(128, 128, k, _lib.Operand(a, 0, 0, k), _lib.Operand(w, 0, 0, 128),
                                _lib.Operand(out, 0, 0, 128), b_up=b_up)
    with pytest.raises(RuntimeError, match=match):
        _launch(seg)

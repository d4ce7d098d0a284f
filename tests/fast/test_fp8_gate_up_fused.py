"""The FP8 recipe's fused gate/up + SwiGLU forward (GEMM_FP8_TN_SWIGLU_FWD, docs/fast_path.md "FP8") on the CPU:
the interleaved [gate; up] it reads (`mok.fast._fp8.GateUp`) is the reference quantiser's values and scales in the
kernel's order (every row and scale checked against an independent construction), the binding takes its segments
and refuses bad ones, and the FP8 layer with the kernels emulated (tests/fast/fast_emulator.py) gives the same bits
fused and unfused (MOK_FAST_FUSE_SWIGLU_FWD_FP8=0), the fused run launching the fused kind. The kernel's own bits
are checked on a GPU: tests/gpu/test_fast_fp8.py."""
import pytest
import torch

from mok.fast import _fp8, _lib, _tiles
from mok.reference import quantize_blocks_128x128
from mok.testing.bits import assert_bitwise_equal, assert_outputs_bitwise_equal, raw_bits
from mok.testing.cases import MoEConfig, make_inputs
from mok.testing.dist import launch


def _padded_quant(w: torch.Tensor):
    """(q [..., N, Hp], s) as `_fp8.quant_expert` lays out gate_q and gate_s: the reference's values, zero columns up to
    a multiple of 128."""
    q, s = quantize_blocks_128x128(w)
    Hp = _fp8.padded(w.shape[-1])
    out = torch.zeros((*q.shape[:-1], Hp), dtype=torch.uint8)
    out[..., :q.shape[-1]] = q.view(torch.uint8)
    return out.view(torch.float8_e4m3fn), s


def _interleaved_by_rows(gate_q, gate_s, up_q, up_s):
    """The kernel's B, one row at a time: row r of the interleaved B is row 64 * (r // 128) + r % 64 of gate when
    r % 128 < 64, else that row of up (zero past I); its scale row k (64 rows each) is the scale row of gate's (k even)
    or up's (k odd) 128-row block holding row 64 * (k // 2)."""
    I, Hp = gate_q.shape[-2:]
    n = _fp8.gate_up_rows(I)
    q = torch.zeros((*gate_q.shape[:-2], n, Hp), dtype=torch.uint8)
    s = torch.zeros((*gate_s.shape[:-2], n // 64, gate_s.shape[-1]))
    for r in range(n):
        src = up_q if r % 128 >= 64 else gate_q
        row = 64 * (r // 128) + r % 64
        if row < I:
            q[..., r, :] = src[..., row, :].view(torch.uint8)
    for k in range(n // 64):
        src = up_s if k % 2 else gate_s
        s[..., k, :] = src[..., (64 * (k // 2)) // 128, :]
    return q.view(torch.float8_e4m3fn), s


@pytest.mark.parametrize("lead, I, H", [((3,), 136, 200), ((2,), 64, 128), ((1,), 8, 24), ((2,), 96, 136),
                                        ((4,), 264, 256), ((), 40, 136), ((), 200, 64), ((2,), 320, 128)])
def test_interleaved_gate_up_is_the_quantisation_reordered(lead, I, H):
    """`_fp8.interleave_gate_up` of the reference quantiser's gate and up (routed [L, I, H] or shared [I, H]; I not a
    multiple of 64 or 128 among them): the kernel's B row by row, and its scales, bit for bit."""
    gen = torch.Generator().manual_seed(I * H + len(lead))
    gate = (torch.randn(*lead, I, H, generator=gen) * torch.exp2(torch.randint(-8, 8, (*lead, I, 1), generator=gen))
            ).to(torch.bfloat16)
    up = (torch.randn(*lead, I, H, generator=gen) * 0.05).to(torch.bfloat16)
    (gq, gs), (uq, us) = _padded_quant(gate), _padded_quant(up)
    got = _fp8.interleave_gate_up(gq, gs, uq, us)
    want_q, want_s = _interleaved_by_rows(gq, gs, uq, us)
    n = _fp8.gate_up_rows(I)
    assert got.q.shape == (*lead, n, _fp8.padded(H)) and got.s.shape == (*lead, n // 64, _fp8.blocks(H))
    assert got.q.is_contiguous() and got.s.is_contiguous()
    assert_bitwise_equal(got.q, want_q, "interleaved values")
    assert_bitwise_equal(got.s, want_s, "interleaved scales")
    assert int(raw_bits(got.q).int().abs().sum()) > 0


def test_gate_up_is_made_once_per_quantisation():
    gq, gs = _padded_quant(torch.randn(2, 72, 128).to(torch.bfloat16))
    w = _fp8.Fp8Expert(gq, gs, gq, gs, *([None] * 6))
    first = _fp8.gate_up(w)
    assert _fp8.gate_up(w) is first and w.gate_up is first


def _fused_gemm(**change):
    """A GEMM_FP8_TN_SWIGLU_FWD launch over all 4 rows on the CPU: [p | q] [4, 16] fp32 and a [4, 8] bf16 of
    A [4, 256] e4m3 · the interleaved [gate; up] of I = 8 (128 rows: 64 gate, 64 up, 56 of each zero)."""
    seg = dict(rows=4, n=16, k=256, a=_lib.Operand(torch.zeros(4, 256, dtype=torch.float8_e4m3fn), 0, 0, 256),
               b=_lib.Operand(torch.zeros(128, 256, dtype=torch.float8_e4m3fn), 0, 0, 256),
               d=_lib.Operand(torch.zeros(4, 16), 0, 0, 16),
               aux=_lib.Operand(torch.zeros(4, 8, dtype=torch.bfloat16), 0, 0, 8),
               sfa=_lib.Operand(torch.zeros(4, 2), 0, 0, 2), sfb=_lib.Operand(torch.zeros(2, 2), 0, 0, 2))
    seg.update(change)
    return dict(kind=_lib.GEMM_FP8_TN_SWIGLU_FWD, segments=[_lib.Segment.all_rows(**seg)], device=torch.device("cpu"),
                variant=0)


def test_the_binding_takes_a_fused_fp8_segment(mok_binding):
    _lib.check_segments(**_fused_gemm())


@pytest.mark.parametrize("what, change, match", [
    ("B of I rows, not the interleaved 128", dict(b=_lib.Operand(torch.zeros(8, 256, dtype=torch.float8_e4m3fn),
                                                                 0, 0, 256)),
     r"segments\[0\]: operand b of 1 group\(s\) of 128 x 256 elements"),
    ("scales per 128 rows", dict(sfb=_lib.Operand(torch.zeros(1, 2), 0, 0, 2)),
     r"segments\[0\]: operand sfb of 1 group\(s\) of 2 x 2 elements"),
    ("no a", dict(aux=None), r"segments\[0\]: operand aux must be given for GEMM kind 11"),
    ("I not a multiple of 8", dict(n=12, d=_lib.Operand(torch.zeros(4, 12), 0, 0, 12)),
     r"segments\[0\]: GEMM kind 11 needs n = 2I a positive multiple of 16"),
    ("a at an odd offset", dict(aux=_lib.Operand(torch.zeros(4, 9, dtype=torch.bfloat16), 0, 0, 8, offset=1)),
     r"segments\[0\]: operand aux of GEMM kind 11 needs an even offset"),
])
def test_the_binding_refuses_a_bad_fused_fp8_segment(mok_binding, what, change, match):
    with pytest.raises(ValueError, match="^" + match):
        _lib.check_segments(**_fused_gemm(**change))


def test_the_switch(monkeypatch):
    monkeypatch.delenv(_tiles.FUSE_FWD_FP8_ENV, raising=False)
    assert _tiles.fuse_swiglu_fwd_fp8(136, 40) and _tiles.fuse_swiglu_fwd_fp8(8, 0)
    assert not _tiles.fuse_swiglu_fwd_fp8(12, 0) and not _tiles.fuse_swiglu_fwd_fp8(16, 4)
    monkeypatch.setenv(_tiles.FUSE_FWD_FP8_ENV, "0")
    assert not _tiles.fuse_swiglu_fwd_fp8(136, 40)
    monkeypatch.setenv(_tiles.FUSE_FWD_FP8_ENV, "yes")
    with pytest.raises(ValueError, match=_tiles.FUSE_FWD_FP8_ENV):
        _tiles.fuse_swiglu_fwd_fp8(136, 40)


CONFIGS = [  # I (and S) a multiple of 64, of 8 only, below 64; an empty expert; a shared expert or none
    ("I 136, shared 40", MoEConfig(T=40, H=136, I=136, E=4, K=2, S=40), "random"),
    ("I 96, empty expert, no shared", MoEConfig(T=40, H=128, I=96, E=6, K=2, S=0), "empty_expert"),
    ("I 264, shared 136, skewed", MoEConfig(T=64, H=384, I=264, E=8, K=2, S=136), "skewed"),
    ("T=1, I 32, shared 16", MoEConfig(T=1, H=64, I=32, E=4, K=2, S=16), "random"),
    ("I 128, shared 64", MoEConfig(T=24, H=256, I=128, E=4, K=2, S=64), "random"),
]


def _fused_and_unfused(rank, world_size, group, inputs):
    """The emulated FP8 layer's outputs, forward contexts and FP8 GEMM kinds launched, fused and unfused."""
    import os

    import fast_emulator

    import mok.fast
    from mok.testing.cases import LAYER_ARGS
    from mok.testing.runner import run_layer

    fast_emulator.install()
    fast_emulator.stub_streams()
    kinds = []
    gemm = _fp8.gemm
    _fp8.gemm = lambda kind, segs, dev: (kinds.append(kind), gemm(kind, segs, dev))
    out = {}
    for fused in ("1", "0"):
        os.environ[_tiles.FUSE_FWD_FP8_ENV] = fused
        kinds.clear()
        outputs = run_layer(inputs, impl=mok.fast, precision="fp8")
        y, ctx = mok.fast.forward(*(inputs[a] for a in LAYER_ARGS), precision="fp8")
        n = int(ctx.sched.offsets[inputs["routed_gate"].shape[0]])
        out[fused] = dict(outputs=outputs, kinds=list(kinds), y=y, pq=ctx.pq_R2I[:n], a=ctx.a_RI[:n],
                          pq_s=ctx.pq_s_T2S, a_s=ctx.a_s_TS)
    return out


@pytest.mark.parametrize("label, cfg, routing", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_fused_fp8_forward_gives_the_unfused_bits_emulated(label, cfg, routing):
    inputs = make_inputs(cfg, seed=11, routing=routing)
    (res,) = launch(_fused_and_unfused, (inputs,), 1, timeout_s=120)
    fused, unfused = res["1"], res["0"]
    # each run_layer: forward (one gate/up launch, one down launch) and backward (d_a, d_x); then one more forward
    assert fused["kinds"][0] == _lib.GEMM_FP8_TN_SWIGLU_FWD and fused["kinds"][4] == _lib.GEMM_FP8_TN_SWIGLU_FWD
    assert _lib.GEMM_FP8_TN_SWIGLU_FWD not in unfused["kinds"] and unfused["kinds"][0] == _lib.GEMM_FP8_TN_F32
    assert_outputs_bitwise_equal(fused["outputs"], unfused["outputs"], f"{label}: fused vs unfused")
    for name in ("y", "pq", "a", "pq_s", "a_s"):
        if unfused[name] is not None:
            assert_bitwise_equal(fused[name], unfused[name], f"{label}: {name}")

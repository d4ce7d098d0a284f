"""The gate/up GEMM with the SwiGLU in its epilogue (GEMM_TN_SWIGLU_FWD: csrc/mainloop_gate_up.cuh loads each tile's B
rows as a gate half and an up half, csrc/epilogue_swiglu_fwd.cuh writes [p | q] and a) gives the bits of the
unfused pair: the GEMM_TN_F32 gate/up GEMM followed by the swiglu_fwd kernel (which turns [g | u] into [p | q]),
for the routed rows and the shared expert, under every tile variant, on shapes with uneven and empty experts, token
counts that are not multiples of 128 and intermediate sizes that a tile's halves do not split (the last tile partly
past I), with pre-activations that saturate the sigmoid and overflow to infinity, with gate and up as the halves of
one tensor or as two tensors (up before or after gate in memory, apart by no whole number of rows); a last tile
partly past I stores nothing past column I; the whole layer gives the same nine outputs with the fusion on as off;
the C side refuses what the kernel cannot do."""
import pytest
import torch

import mok.fast as fast
from mok.fast import _backward, _checks, _forward, _lib, _tiles
from mok.testing.bits import assert_bitwise_equal, assert_outputs_bitwise_equal
from mok.testing.cases import MoEConfig, make_inputs, two_gate_up_tensors, with_stacked_gate_up
from mok.testing.runner import run_layer
from mok.reference import Dims

pytestmark = [pytest.mark.gpu, pytest.mark.sm90]

SHAPES = [
    MoEConfig(T=1000, H=1024, I=384, E=16, K=4, S=384),  # shared expert, T % 128 != 0; 384 = 4 x 96 = 3 x 128
    MoEConfig(T=777, H=2048, I=768, E=4, K=2, S=0),      # few large experts (Mixtral-like), no shared expert
    MoEConfig(T=300, H=512, I=192, E=64, K=8, S=96),     # many small experts, some empty; only the 96 half splits
    MoEConfig(T=515, H=1024, I=1000, E=4, K=2, S=0),     # neither half splits I: last tiles 40 of 96, 104 of 128
    MoEConfig(T=200, H=256, I=136, E=16, K=4, S=72),     # neither splits I nor S (136 = 17 x 8, 72 < 96)
]
IDS = ["mid_shared", "few_large", "many_small", "few_large_partial", "partial_shared"]


def _dims(cfg):
    return Dims(T=cfg.T, H=cfg.H, I=cfg.I, S=cfg.S, E=cfg.E, K=cfg.K, L=cfg.E, W=1)


def _halves(gate, up, shared_gate, shared_up):
    """`_forward.gate_up_swiglu`'s halves and halves_s of these weights (`_checks.gate_up_halves`)."""
    halves_s = _checks.gate_up_halves(shared_gate, shared_up) if shared_gate is not None else None
    return _checks.gate_up_halves(gate, up), halves_s


def _prepared(cfg, seed, wide):
    inputs = with_stacked_gate_up(make_inputs(cfg, seed, device="cuda"))
    if wide:  # pre-activations of tens (the sigmoid saturated both ways), and rows that overflow to +-inf
        inputs["x"] = (inputs["x"].float() * 30).to(torch.bfloat16)
        inputs["x"][::37] = 3e38
        inputs["x"][5::41] = -3e38
    d = _dims(cfg)
    sched = _forward.build_schedule(inputs["topk_idx"], cfg.E, cfg.T * cfg.K)
    x_RH = torch.empty(cfg.T * cfg.K, cfg.H, dtype=torch.bfloat16, device="cuda")
    _lib.gather_rows(inputs["x"], sched.pair_row, cfg.T * cfg.K, x_RH)
    return inputs, d, sched, x_RH


@pytest.mark.parametrize("cfg", SHAPES, ids=IDS)
@pytest.mark.parametrize("wide", [
    False,  # the layer's own inputs
    True,   # x scaled by 30, some rows +-3e38: sigmoid saturated both ways, [g | u] overflowing to +-inf
], ids=["layer_values", "wide_preacts"])
def test_fused_gate_up_gives_the_unfused_bits_in_every_variant(monkeypatch, cfg, wide):
    inputs, d, sched, x_RH = _prepared(cfg, 3, wide)
    w = [inputs[k] for k in ("routed_gate", "routed_up", "shared_gate", "shared_up")]
    monkeypatch.setenv(_tiles.ENV, "0")
    pq, pq_s = _forward.gate_up(inputs["x"], x_RH, sched, d, *w)
    a, a_s = _forward.swiglu(pq, pq_s, sched, d)  # [g | u] -> [p | q] in place
    placed = int(sched.offsets[cfg.E])  # rows past the placed ones are never written by either
    assert placed > 0
    assert _forward.stacked_gate_up(w[0], w[1]) is not None
    assert _tiles.fused_gate_up_fits(cfg.I, cfg.S)
    for v in range(_lib.NUM_GEMM_VARIANTS):
        got = _forward.gate_up_swiglu(inputs["x"], x_RH, sched, d, *_halves(*w), v)
        assert_bitwise_equal(got[0][:placed], pq[:placed], f"variant {v}: [p | q]")
        assert_bitwise_equal(got[2][:placed], a[:placed], f"variant {v}: a")
        if cfg.S:
            assert_bitwise_equal(got[1], pq_s, f"variant {v}: shared [p | q]")
            assert_bitwise_equal(got[3], a_s, f"variant {v}: shared a")
        else:
            assert got[1] is None and got[3] is None
    if wide:
        assert (~torch.isfinite(pq[:placed])).any() and (a[:placed].float().abs() > 1e3).any()


@pytest.mark.parametrize("cfg", SHAPES, ids=IDS)
@pytest.mark.parametrize("up_first", [
    False,  # gate's rows first in memory: the tensormap's base is gate
    True,   # up's rows first: the base is up, and gate is its second half
], ids=["gate_first", "up_first"])
def test_two_tensors_give_the_one_tensor_bits_in_every_variant(cfg, up_first):
    inputs, d, sched, x_RH = _prepared(cfg, 4, False)
    w = [inputs[k] for k in ("routed_gate", "routed_up", "shared_gate", "shared_up")]
    apart = [two_gate_up_tensors(w[0], w[1], up_first),
             two_gate_up_tensors(w[2], w[3], up_first) if cfg.S else (None, None)]
    for g, u in apart[:1 + bool(cfg.S)]:
        assert _forward.stacked_gate_up(g, u) is None and (u.data_ptr() < g.data_ptr()) == up_first
        assert (abs(u.data_ptr() - g.data_ptr()) // 2) % cfg.H != 0, "the halves must not be whole rows apart"
    placed = int(sched.offsets[cfg.E])
    for v in range(_lib.NUM_GEMM_VARIANTS):
        want = _forward.gate_up_swiglu(inputs["x"], x_RH, sched, d, *_halves(*w), v)
        got = _forward.gate_up_swiglu(inputs["x"], x_RH, sched, d, *_halves(*apart[0], *apart[1]), v)
        assert_bitwise_equal(got[0][:placed], want[0][:placed], f"variant {v}: [p | q]")
        assert_bitwise_equal(got[2][:placed], want[2][:placed], f"variant {v}: a")
        if cfg.S:
            assert_bitwise_equal(got[1], want[1], f"variant {v}: shared [p | q]")
            assert_bitwise_equal(got[3], want[3], f"variant {v}: shared a")


def test_the_layer_with_two_tensors_runs_fused_and_gives_the_one_tensor_bits(monkeypatch):
    """make_inputs' gate and up are two tensors: the layer takes the fused launch for them (no fallback to the
    unfused pair), its backward's d_x GEMM reads them apart (no concatenation: I and S are whole K tiles), and its
    nine outputs are those of the same weights as one [gate; up] tensor."""
    cfg = SHAPES[0]
    inputs = make_inputs(cfg, 6, device="cuda")
    monkeypatch.delenv(_tiles.ENV, raising=False)
    monkeypatch.delenv(_tiles.FUSE_FWD_ENV, raising=False)
    names = ("routed_gate", "routed_up", "shared_gate", "shared_up")
    assert _forward.stacked_gate_up(inputs["routed_gate"], inputs["routed_up"]) is None
    assert _forward.fused_gate_up(_dims(cfg), *(inputs[k] for k in names)) is not None
    calls = []
    real = _forward.gate_up_swiglu
    monkeypatch.setattr(_forward, "gate_up_swiglu", lambda *a: calls.append(1) or real(*a))
    assert cfg.I % 64 == 0 and cfg.S % 64 == 0
    monkeypatch.setattr(_backward, "_concat", lambda *a: (_ for _ in ()).throw(AssertionError("concatenated")))
    got = run_layer(inputs, impl=fast)
    assert calls, "the layer did not take the fused gate/up launch for two tensors"
    want = run_layer(with_stacked_gate_up(inputs), impl=fast)
    assert_outputs_bitwise_equal(got, want, "two tensors against one [gate; up] tensor")


@pytest.mark.parametrize("cfg", [
    SHAPES[0],  # shared expert, T % 128 != 0
    SHAPES[2],  # many small experts, some empty
    SHAPES[4],  # neither tile half splits I nor S
], ids=["mid_shared", "many_small", "partial_shared"])
def test_the_switch_keeps_every_output_of_the_layer(monkeypatch, cfg):
    inputs = with_stacked_gate_up(make_inputs(cfg, 5, device="cuda"))
    monkeypatch.delenv(_tiles.ENV, raising=False)
    monkeypatch.delenv(_tiles.FUSE_FWD_ENV, raising=False)
    assert _forward.fused_gate_up(_dims(cfg), *(inputs[k] for k in ("routed_gate", "routed_up", "shared_gate",
                                                                     "shared_up"))) is not None

    want = run_layer(inputs, impl=fast)
    monkeypatch.setenv(_tiles.FUSE_FWD_ENV, "0")
    got = run_layer(inputs, impl=fast)
    assert_outputs_bitwise_equal(got, want, f"{_tiles.FUSE_FWD_ENV}=0")


def _launch(kind, seg, variant=0):
    """The C entry point itself (the binding's checks are bypassed on purpose)."""
    _lib._grouped_gemm_unchecked(kind, [seg], torch.device("cuda", 0), variant)


@pytest.mark.parametrize("n, aux, up, match", [
    (2 * 132, True, None, "multiple of 16"),  # I = 132: the tiles store whole 8-column blocks of gate and of up
    (2 * 128, False, None, "operand aux"),    # the a output is missing
    (2 * 128, True, "ld", "b_up"),            # the up rows' ld differs from the gate rows'
    (2 * 128, True, "odd", "16 bytes"),       # the up rows start 8 bytes from a 16-byte step: no TMA stride
    (2 * 128, True, "same", "nonzero"),       # the up rows are the gate rows
])
def test_the_library_refuses_what_the_fused_kernel_cannot_do(n, aux, up, match):
    x = torch.zeros(128, 128, dtype=torch.bfloat16, device="cuda")
    w = torch.zeros(n, 128, dtype=torch.bfloat16, device="cuda")
    gu = torch.zeros(128, n, dtype=torch.float32, device="cuda")
    a = torch.zeros(128, n // 2, dtype=torch.bfloat16, device="cuda")
    b_up = {None: None, "ld": _lib.Operand(w, 0, 0, 136, offset=n // 2 * 128),
            "odd": _lib.Operand(w, 0, 0, 128, offset=4), "same": _lib.Operand(w, 0, 0, 128)}[up]
    seg = _lib.Segment.all_rows(128, n, 128, _lib.Operand(x, 0, 0, 128), _lib.Operand(w, 0, 0, 128),
                                _lib.Operand(gu, 0, 0, n), aux=_lib.Operand(a, 0, 0, n // 2) if aux else None,
                                b_up=b_up)
    with pytest.raises(RuntimeError, match=match):
        _launch(_lib.GEMM_TN_SWIGLU_FWD, seg, variant=0)


def test_the_library_refuses_b_up_for_another_kind():
    x = torch.zeros(128, 128, dtype=torch.bfloat16, device="cuda")
    w = torch.zeros(256, 128, dtype=torch.bfloat16, device="cuda")
    out = torch.zeros(128, 128, dtype=torch.float32, device="cuda")
    seg = _lib.Segment.all_rows(128, 128, 128, _lib.Operand(x, 0, 0, 128), _lib.Operand(w, 0, 0, 128),
                                _lib.Operand(out, 0, 0, 128), b_up=_lib.Operand(w, 0, 0, 128, offset=128 * 128))
    with pytest.raises(RuntimeError, match="b_up is set"):
        _launch(_lib.GEMM_TN_F32, seg, variant=0)


@pytest.mark.parametrize("variant", range(_lib.NUM_GEMM_VARIANTS))  # every tile variant: halves of 96 or 128
def test_a_last_tile_past_i_stores_nothing_past_it(variant):
    """I = 136: the last tile's halves (96 or 128 columns) run past I, each past its half's last row of B (TMA fills
    zeros). Nothing may land in the padding columns of [p | q] or of a (NaN before, NaN after), and
    the stored columns are those of the float64 product [g | u] within rounding."""
    M, K, I, pad = 100, 64, 136, 8
    assert I % _tiles.HALF_TILE_N[variant], "the last tile must run past I"
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(M, K, generator=gen, device="cuda").to(torch.bfloat16)
    w = torch.randn(2 * I, K, generator=gen, device="cuda").to(torch.bfloat16)
    pq = torch.full((M, 2 * I + pad), float("nan"), device="cuda")
    a = torch.full((M, I + pad), float("nan"), device="cuda").to(torch.bfloat16)
    seg = _lib.Segment.all_rows(M, 2 * I, K, _lib.Operand(x, 0, 0, K), _lib.Operand(w, 0, 0, K),
                                _lib.Operand(pq, 0, 0, 2 * I + pad), aux=_lib.Operand(a, 0, 0, I + pad))
    _launch(_lib.GEMM_TN_SWIGLU_FWD, seg, variant)
    torch.cuda.synchronize()
    assert pq[:, 2 * I:].isnan().all(), "a store landed past column 2I of [p | q]"
    assert a[:, I:].isnan().all(), "a store landed past column I of a"
    want = x.double() @ w.double().T
    g, u = want[:, :I], want[:, I:]
    s = torch.sigmoid(g)
    torch.testing.assert_close(pq[:, :I].double(), u * s * (1 + g * (1 - s)), rtol=1e-4, atol=1e-4)  # p
    torch.testing.assert_close(pq[:, I:2 * I].double(), g * s, rtol=1e-4, atol=1e-4)  # q
    torch.testing.assert_close(a[:, :I].double(), g * torch.sigmoid(g) * u, rtol=1e-2, atol=1e-2)

"""The gate/up GEMM with the SwiGLU in its epilogue (GEMM_TN_SWIGLU_FWD: csrc/mainloop_gate_up.cuh loads each
tile's B rows as a gate half and an up half, csrc/epilogue_swiglu_fwd.cuh writes [g | u] and a) gives the bits of
the unfused pair: the GEMM_TN_F32 gate/up GEMM followed by the swiglu_fwd kernel, for the routed rows and the
shared expert, under every tile variant whose half tile splits I and S, on shapes with uneven and empty experts
and token counts that are not multiples of 128, with pre-activations that saturate the sigmoid and overflow to
infinity; the whole layer gives the same nine outputs with the fusion on as off; the C side refuses what the
kernel cannot do."""
import pytest
import torch

import mok.fast as fast
from mok.fast import _forward, _lib, _tiles
from mok.fast._lib import Operand, Segment
from mok.harness.bits import assert_bitwise_equal, assert_outputs_bitwise_equal
from mok.harness.cases import MoEConfig, make_inputs, with_stacked_gate_up
from mok.harness.runner import run_layer
from mok.reference import Dims

pytestmark = [pytest.mark.gpu, pytest.mark.sm90]

SHAPES = [
    MoEConfig(T=1000, H=1024, I=384, E=16, K=4, S=384),  # shared expert, T % 128 != 0; 384 = 4 x 96 = 3 x 128
    MoEConfig(T=777, H=2048, I=768, E=4, K=2, S=0),      # few large experts (Mixtral-like), no shared expert
    MoEConfig(T=300, H=512, I=192, E=64, K=8, S=96),     # many small experts, some empty; only the 96 half fits
]


def _dims(cfg):
    return Dims(T=cfg.T, H=cfg.H, I=cfg.I, S=cfg.S, E=cfg.E, K=cfg.K, L=cfg.E, W=1)


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


@pytest.mark.parametrize("cfg", SHAPES, ids=["mid_shared", "few_large", "many_small"])
@pytest.mark.parametrize("wide", [False, True], ids=["layer_values", "wide_preacts"])
def test_fused_gate_up_gives_the_unfused_bits_in_every_variant(monkeypatch, cfg, wide):
    inputs, d, sched, x_RH = _prepared(cfg, 3, wide)
    w = [inputs[k] for k in ("routed_gate", "routed_up", "shared_gate", "shared_up")]
    monkeypatch.setenv(_tiles.ENV, "0")
    gu, gu_s = _forward.gate_up(inputs["x"], x_RH, sched, d, *w)
    a, a_s = _forward.swiglu(gu, gu_s, sched, d)
    placed = int(sched.offsets[cfg.E])  # rows past the placed ones are never written by either
    assert placed > 0
    w_gu, w_gu_s = _forward.stacked_gate_up(w[0], w[1]), _forward.stacked_gate_up(w[2], w[3])
    ran = []
    for v in range(_lib.NUM_GEMM_VARIANTS):
        half = _tiles.HALF_TILE_N[v]
        if cfg.I % half or cfg.S % half:
            continue
        ran.append(v)
        got = _forward.gate_up_swiglu(inputs["x"], x_RH, sched, d, w_gu, w_gu_s, v)
        assert_bitwise_equal(got[0][:placed], gu[:placed], f"variant {v}: [g | u]")
        assert_bitwise_equal(got[2][:placed], a[:placed], f"variant {v}: a")
        if cfg.S:
            assert_bitwise_equal(got[1], gu_s, f"variant {v}: shared [g | u]")
            assert_bitwise_equal(got[3], a_s, f"variant {v}: shared a")
        else:
            assert got[1] is None and got[3] is None
    assert ran, "no variant splits this shape: the test checked nothing"
    if wide:
        assert torch.isinf(gu[:placed]).any() and (a[:placed].float().abs() > 1e3).any()


@pytest.mark.parametrize("cfg", SHAPES[::2], ids=["mid_shared", "many_small"])
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
    arr = (_lib.MokSegment * 1)(seg.c())
    ws = torch.empty(_lib._workspace_bytes(kind, variant, 1, 0), dtype=torch.uint8, device="cuda")
    _lib._call("mok_grouped_gemm", torch.device("cuda", 0), kind, variant, arr, 1, _lib._p(ws), ws.numel(), 0)


@pytest.mark.parametrize("n, aux, match", [
    (2 * 96, True, "multiple of 256"),  # the cooperative tile's halves are 128 columns: 192 cannot be split
    (2 * 128, False, "operand aux"),    # the a output is missing
])
def test_the_library_refuses_what_the_fused_kernel_cannot_do(n, aux, match):
    x = torch.zeros(128, 128, dtype=torch.bfloat16, device="cuda")
    w = torch.zeros(n, 128, dtype=torch.bfloat16, device="cuda")
    gu = torch.zeros(128, n, dtype=torch.float32, device="cuda")
    a = torch.zeros(128, n // 2, dtype=torch.bfloat16, device="cuda")
    seg = Segment.all_rows(128, n, 128, Operand(x, 0, 0, 128), Operand(w, 0, 0, 128), Operand(gu, 0, 0, n),
                           aux=Operand(a, 0, 0, n // 2) if aux else None)
    with pytest.raises(RuntimeError, match=match):
        _launch(_lib.GEMM_TN_SWIGLU_FWD, seg, variant=0)

"""Every tile variant of the grouped GEMMs (csrc/grouped_gemm.cuh, chosen in mok/fast/_tiles.py) gives the
same bits: the fast layer's 9 outputs, with fp32 and with bf16 weight gradients (every GEMM kind the layer runs), under
each variant forced through MOK_FAST_GEMM_VARIANT, against variant 0, on shapes with uneven and empty
experts and token counts that are not multiples of 128. So does every tile order (MOK_FAST_GEMM_RASTER /
MOK_FAST_GEMM_SWIZZLE), and a bad order is an error naming the variables."""
import pytest
import torch

import mok.fast as fast
from mok.fast import _lib, _tiles
from mok.harness.bits import assert_outputs_bitwise_equal
from mok.harness.cases import LAYER_ARGS, OUTPUT_NAMES, MoEConfig, make_inputs

pytestmark = [pytest.mark.gpu, pytest.mark.sm90]

SHAPES = [
    MoEConfig(T=1000, H=1024, I=512, E=16, K=4, S=256),  # mid-size experts, shared expert, T % 128 != 0
    MoEConfig(T=777, H=2048, I=2816, E=4, K=2, S=0),     # few large experts (Mixtral-like), no shared expert
    MoEConfig(T=300, H=512, I=128, E=64, K=8, S=128),    # many small experts, several with no rows
]


def _outputs(inputs) -> dict:
    y, ctx = fast.forward(*(inputs[a] for a in LAYER_ARGS))
    out = {}
    for wdt in (torch.float32, torch.bfloat16):  # both weight-gradient kinds
        for name, t in zip(OUTPUT_NAMES, (y, *fast.backward(ctx, inputs["dy"], weight_grad_dtype=wdt))):
            out[f"{name} ({wdt})"] = t
    return out


@pytest.mark.parametrize("cfg", SHAPES, ids=["mid", "few_large", "many_small"])
def test_every_variant_gives_variant_zeros_bits(monkeypatch, cfg):
    inputs = make_inputs(cfg, 0, device="cuda")
    monkeypatch.setenv(_tiles.ENV, "0")
    want = _outputs(inputs)
    for v in range(1, _lib.NUM_GEMM_VARIANTS):
        monkeypatch.setenv(_tiles.ENV, str(v))
        got = _outputs(inputs)
        assert_outputs_bitwise_equal(got, want, f"variant {v}")


def test_the_default_choice_gives_variant_zeros_bits(monkeypatch):
    inputs = make_inputs(SHAPES[0], 1, device="cuda")
    monkeypatch.setenv(_tiles.ENV, "0")
    want = _outputs(inputs)
    monkeypatch.delenv(_tiles.ENV)
    got = _outputs(inputs)
    assert_outputs_bitwise_equal(got, want, "default choice")


@pytest.mark.parametrize("raster, swizzle", [
    ("N", "1"),  # raster along N
    ("M", "4"),  # along M, swizzle 4 (CUTLASS pads the tile grid to a multiple of 4 CTAs)
    ("N", "8"),  # along N, swizzle 8
])
def test_tile_order_gives_the_same_bits(monkeypatch, raster, swizzle):
    inputs = make_inputs(SHAPES[2], 2, device="cuda")
    want = _outputs(inputs)
    monkeypatch.setenv("MOK_FAST_GEMM_RASTER", raster)
    monkeypatch.setenv("MOK_FAST_GEMM_SWIZZLE", swizzle)
    got = _outputs(inputs)
    assert_outputs_bitwise_equal(got, want, f"tile order {raster}{swizzle}")


@pytest.mark.parametrize("var, value", [
    ("MOK_FAST_GEMM_RASTER", "K"),    # neither M nor N
    ("MOK_FAST_GEMM_SWIZZLE", "3"),   # not a power of two up to 8
    ("MOK_FAST_GEMM_SWIZZLE", "16"),  # too large
])
def test_bad_tile_order_is_an_error_naming_the_variable(monkeypatch, var, value):
    inputs = make_inputs(SHAPES[0], 3, device="cuda")
    monkeypatch.setenv(var, value)
    with pytest.raises(RuntimeError, match=var):
        fast.forward(*(inputs[a] for a in LAYER_ARGS))

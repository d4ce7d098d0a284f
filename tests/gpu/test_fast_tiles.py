"""Every tile variant of the grouped GEMMs (csrc/grouped_gemm.cuh, chosen in mok/fast/_tiles.py) gives the
same bits: the fast layer's 9 outputs, with fp32 and with bf16 weight gradients (every GEMM kind the layer runs), under
each variant forced through MOK_FAST_GEMM_VARIANT, against variant 0, on shapes with uneven and empty
experts and token counts that are not multiples of 128."""
import pytest
import torch

import mok.fast as fast
from mok.fast import _lib, _tiles
from mok.harness.bits import assert_bitwise_equal
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
        for name, t in want.items():
            if t is not None:
                assert_bitwise_equal(got[name], t, f"variant {v}: {name}")


def test_the_default_choice_gives_variant_zeros_bits(monkeypatch):
    inputs = make_inputs(SHAPES[0], 1, device="cuda")
    monkeypatch.setenv(_tiles.ENV, "0")
    want = _outputs(inputs)
    monkeypatch.delenv(_tiles.ENV)
    got = _outputs(inputs)
    for name, t in want.items():
        if t is not None:
            assert_bitwise_equal(got[name], t, f"default choice: {name}")

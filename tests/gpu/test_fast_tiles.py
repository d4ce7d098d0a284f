"""Every tile variant of the grouped GEMMs (csrc/grouped_gemm.cuh, chosen in mok/fast/_tiles.py) gives the
same bits: the fast layer's 9 outputs, with fp32 and with bf16 weight gradients (every GEMM kind the layer runs), under
each variant forced through MOK_FAST_GEMM_VARIANT, against variant 0, on shapes with uneven and empty
experts and token counts that are not multiples of 128. So does every tile order (MOK_FAST_GEMM_RASTER /
MOK_FAST_GEMM_SWIZZLE), and a bad order is an error naming the variables. A group's rows come out the same whatever
its row count (its last M tile full, half full or nearly empty)."""
import pytest
import torch

import mok.fast as fast
from mok.fast import _lib, _tiles
from mok.testing.bits import assert_bitwise_equal, assert_outputs_bitwise_equal
from mok.testing.cases import LAYER_ARGS, OUTPUT_NAMES, MoEConfig, make_inputs

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
        for name, t in zip(OUTPUT_NAMES, (y, *fast.backward(ctx, inputs["dy"], weight_grad_dtype=wdt)), strict=True):
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
    ("M", "4"),  # along M, swizzle 4 asked (the group scheduler takes 1 for its one-row tile grid)
    ("N", "8"),  # along N, swizzle 8 asked (likewise 1)
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


# Row counts around a tile's two 64-row wgmma blocks: 1, 63, 64 leave the upper block empty; 65, 127, 128 fill
# both; 129 and 200 start a second tile with one or two blocks holding rows.
ROW_COUNTS = [1, 63, 64, 65, 127, 128, 129, 200]


@pytest.mark.parametrize("variant", range(_lib.NUM_GEMM_VARIANTS))  # every tile variant, cooperative and ping-pong
@pytest.mark.parametrize("kind", ["GEMM_TN_BF16", "GEMM_NN_F32"])  # forward-style and d_a/d_x-style operands
def test_a_groups_rows_do_not_depend_on_its_row_count(kind, variant):
    """Every row of groups of 1 to 200 rows is computed (against the float64 product), and each group's rows come out
    the same bits when the group has 1 or 64 (one whole block) more rows (NaN-aware bit compare): a row's result
    does not depend on how full its tile is."""
    dev = torch.device("cuda", torch.cuda.current_device())
    H, N, E = 192, 320, len(ROW_COUNTS)
    g = torch.Generator(device=dev).manual_seed(3)
    rows_max = max(ROW_COUNTS) + 64
    x = torch.randn(E, rows_max, H, generator=g, device=dev).to(torch.bfloat16)
    w_NH = (torch.randn(E, N, H, generator=g, device=dev) / H**0.5).to(torch.bfloat16)  # TN: B [N, K]
    w_HN = w_NH.transpose(1, 2).contiguous()                                               # NN: B [K, N]
    k = getattr(_lib, kind)
    out_dtype = torch.bfloat16 if kind.endswith("BF16") else torch.float32

    def run(extra: int) -> torch.Tensor:
        counts = torch.tensor([r + extra for r in ROW_COUNTS], dtype=torch.int32)
        offsets = _lib.offsets_from_counts(counts, dev)
        rows = torch.cat([x[e, :int(c)] for e, c in enumerate(counts)])
        out = torch.full((rows.shape[0], N), float("nan"), device=dev, dtype=out_dtype)
        b = _lib.Operand(w_NH, N * H, 0, H) if kind == "GEMM_TN_BF16" else _lib.Operand(w_HN, H * N, 0, N)
        seg = _lib.Segment.expert_rows(offsets, E, N, H, _lib.Operand(rows, 0, H, H), b,
                                       _lib.Operand(out, 0, N, N))
        _lib.grouped_gemm(k, [seg], dev, variant)
        torch.cuda.synchronize()
        starts = [0] + counts.cumsum(0).tolist()
        return torch.cat([out[starts[e]:starts[e] + r] for e, r in enumerate(ROW_COUNTS)])

    want = run(0)
    # every row of every group computed: within fp32-accumulation error of the float64 product (then D's rounding)
    exact = torch.cat([x[e, :r].double() @ w_NH[e].double().t() for e, r in enumerate(ROW_COUNTS)])
    tol = (2.0**-7 if out_dtype == torch.bfloat16 else 2.0**-16) * exact.abs() + 1e-5
    bad = ~((want.double() - exact).abs() <= tol)  # NaN fails
    assert not bool(bad.any()), (f"{kind} v{variant}: {int(bad.sum())} of {bad.numel()} elements off the product, "
                                 f"first at {bad.nonzero()[0].tolist()}")
    for extra in (1, 64):
        assert_bitwise_equal(run(extra), want, f"{kind} v{variant}, the first rows of groups with {extra} more")

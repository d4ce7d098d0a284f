"""The FP8 recipe of the reference (docs/numerics.md, "FP8 recipe"): the quantiser's bits (hand-computed cases,
every scale, every rounding), its blocks and edges, exact dequantisation, batch invariance, and the layer's
precision="fp8" mode (error against bf16, batch and world-size invariance, NaN, autograd, bad arguments)."""

import bisect
import math

import pytest
import torch

from mok import reference
from mok.reference import (dequantize_blocks_128x128, dequantize_rows_1x128, fp8_blocks_128x128, fp8_rows_1x128,
                           quantize_blocks_128x128, quantize_rows_1x128)
from mok.testing.bits import assert_bitwise_equal, rel_error
from mok.testing.cases import DEFAULT, LAYER_ARGS, OUTPUT_NAMES, MoEConfig, make_inputs
from mok.testing.dist import launch, run_reference_world
from mok.testing.runner import run_layer, shard_inputs, unshard_outputs

NAN, INF = float("nan"), float("inf")
BF16_MAX = torch.finfo(torch.bfloat16).max
FP8 = torch.float8_e4m3fn
# partial blocks along H and I, a shared expert with S < 128, two blocks along H
EDGES = MoEConfig(T=24, H=136, I=72, E=4, K=2, S=40)


def _bf16(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64).to(torch.bfloat16)


def _codes(q: torch.Tensor) -> list:
    return q.view(torch.uint8).tolist()


def _all_bf16(max_abs: float) -> torch.Tensor:
    """Every finite bf16 value x with |x| <= max_abs, both signs (+0 and -0 included)."""
    pos = torch.arange(0, 0x7F80, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    pos = pos[pos.float() <= max_abs]
    return torch.cat([pos, -pos])


# ---------------------------------------------------------------- e4m3, decoded by hand

def _e4m3_value(code: int) -> float:
    """The value of an e4m3fn code (s eeee mmm, bias 7; eeee = 0: subnormal m * 2^-9; 0x7F: NaN)."""
    s, e, m = code >> 7, (code >> 3) & 0xF, code & 7
    v = m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
    return -v if s else v


POSITIVE = [_e4m3_value(c) for c in range(0x7F)]  # codes 0 .. 0x7E: 0 .. 448, increasing


def _e4m3_rne(v: float) -> int:
    """The code of v (|v| <= 448) rounded to nearest e4m3, ties to the even code."""
    a = abs(v)
    i = bisect.bisect_left(POSITIVE, a)
    if POSITIVE[i] != a:
        lo, hi = i - 1, i
        d_lo, d_hi = a - POSITIVE[lo], POSITIVE[hi] - a
        i = lo if d_lo < d_hi or (d_lo == d_hi and lo % 2 == 0) else hi
    return i | (0x80 if math.copysign(1.0, v) < 0 else 0)


def test_hand_decoder_matches_torch():
    """The decoder the other tests use reads e4m3 like PyTorch does (so it is the same format)."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    got = codes.view(FP8).float().tolist()
    for c in range(256):
        want = NAN if c & 0x7F == 0x7F else _e4m3_value(c)
        assert (math.isnan(got[c]) and math.isnan(want)) or got[c] == want, (hex(c), got[c], want)


# ---------------------------------------------------------------- hand-computed quantisation

@pytest.mark.parametrize("row, scale, codes", [
    # amax 3 = 1.5·2^1: 2^-7 is the smallest scale with 3 / scale <= 448 (384); 128, -256, 384, 64
    ([1.0, -2.0, 3.0, 0.5], 2.0**-7, [0x70, 0xF8, 0x7C, 0x68]),
    # amax 448: scale 1; 17 and 19 are ties (16|18, 18|20): even codes 16 and 20; 2^-10 ties 0|2^-9: 0;
    # 1.5·2^-10 rounds up to the smallest subnormal 2^-9; -0 keeps its sign
    ([448.0, 17.0, 19.0, 2.0**-10, 1.5 * 2.0**-10, -0.0], 1.0, [0x7E, 0x58, 0x5A, 0x00, 0x01, 0x80]),
    # amax 450 (bf16 1.7578125·2^8, mantissa 97 > 96): 450 / 1 > 448, so scale 2; 225 -> 224, 1.5
    ([450.0, 3.0], 2.0, [0x76, 0x3C]),
    # amax 1.75·2^-12: scale 2^-20 gives exactly 448; 2^-29 -> 2^-9; -1.5·2^-11 below half of 2^-9: -0
    ([1.75 * 2.0**-12, 2.0**-29, -1.5 * 2.0**-31], 2.0**-20, [0x7E, 0x01, 0x80]),
    # amax 2^-130 (a bf16 subnormal): the scale stops at 2^-126; 2^-4 and -2^-7 (subnormal e4m3 4·2^-9)
    ([2.0**-130, -(2.0**-133)], 2.0**-126, [0x18, 0x84]),
    # amax 0: scale 2^-126 (the smallest), zeros keep their signs
    ([0.0, -0.0], 2.0**-126, [0x00, 0x80]),
    # NaN and ±inf: not in amax (2, scale 2^-7), and NaN in q
    ([1.0, NAN, INF, -INF, 2.0], 2.0**-7, [0x70, 0x7F, 0x7F, 0x7F, 0x78]),
    # a block of NaNs only: amax 0
    ([NAN, NAN], 2.0**-126, [0x7F, 0x7F]),
    # bf16's largest finite value (255·2^120): scale 2^120 and 255 rounds to 256; 1 is far below half of 2^-9
    ([BF16_MAX, 1.0], 2.0**120, [0x78, 0x00]),
    # 2^-133 against amax 2^100: 2^-225 is below fp32's range: 0
    ([2.0**100, 2.0**-133], 2.0**92, [0x78, 0x00]),
])
def test_quantize_rows_hand_computed(row, scale, codes):
    q, s = quantize_rows_1x128(_bf16([row]))
    assert (q.dtype, s.dtype, tuple(s.shape)) == (FP8, torch.float32, (1, 1))
    assert s.item() == scale
    assert _codes(q) == [codes]


@pytest.mark.parametrize("row, want", [
    ([2.0**-130, -(2.0**-133)], [2.0**-130, -(2.0**-133)]),  # bf16 subnormals come back exactly
    ([BF16_MAX, 1.0], [INF, 0.0]),  # 255·2^120 rounds to 256·2^120 = 2^128, past bf16's range: inf
    # at scale 2^120, 248·2^120 ties 240|256 and goes to the even code, 256: inf; 246·2^120 -> 240·2^120
    ([248 * 2.0**120, 246 * 2.0**120, BF16_MAX], [INF, 240 * 2.0**120, INF]),
    ([1.0, NAN, INF, -INF, 2.0], [1.0, NAN, NAN, NAN, 2.0]),  # non-finite values come back as NaN
])
def test_dequantize_rows_hand_computed(row, want):
    assert_bitwise_equal(fp8_rows_1x128(_bf16([row])), _bf16([want]), "dequantised")


def test_quantize_blocks_hand_computed():
    """[130, 3]: two 128x128 blocks along N, the second holding rows 128 and 129 only."""
    w = torch.ones(130, 3, dtype=torch.bfloat16)
    w[0, 0] = 3.0  # block (0, 0): amax 3, scale 2^-7
    w[129, 2] = 450.0  # block (1, 0): amax 450, scale 2
    q, s = quantize_blocks_128x128(w)
    assert s.tolist() == [[2.0**-7], [2.0]]
    assert _codes(q[[0, 5, 128, 129]]) == [[0x7C, 0x70, 0x70], [0x70, 0x70, 0x70], [0x30, 0x30, 0x30],
                                           [0x30, 0x30, 0x76]]


# ---------------------------------------------------------------- every scale, every rounding

def test_scale_is_the_smallest_power_of_two_that_fits_for_every_bf16_amax():
    """For each positive finite bf16 amax: scale = 2^n, amax / 2^n <= 448, and n is the smallest such n
    unless n = -126 (the floor)."""
    pos = torch.arange(1, 0x7F80, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    _, s = quantize_rows_1x128(pos[:, None])
    a, s = pos.double(), s[:, 0].double()
    mant, _ = torch.frexp(s)
    assert bool((mant == 0.5).all()), "a scale that is not a power of two"
    assert bool((a / s <= 448).all())
    assert bool(((s == 2.0**-126) | (a / (s / 2) > 448)).all()), "a scale larger than needed"
    assert s.min().item() == 2.0**-126 and s.max().item() == 2.0**120  # the range for bf16 inputs


def test_rounding_is_nearest_even_for_every_value_the_quantiser_rounds():
    """With scale 1 (amax 448) the values rounded are the bf16 values themselves; every bf16 value in
    [-448, 448] gets the code of the hand-written nearest-even rounding. (At any scale, x · 2^-n is one of
    these values, or below 2^-133 and rounded to 0.)"""
    x = _all_bf16(448.0)
    q, s = quantize_rows_1x128(torch.stack([x, torch.full_like(x, 448.0)], 1))
    assert bool((s == 1.0).all())
    got = _codes(q[:, 0])
    for v, c in zip(x.tolist(), got):
        assert c == _e4m3_rne(v), (v, hex(c), hex(_e4m3_rne(v)))


def test_every_e4m3_value_times_a_scale_from_2_pow_minus_124_is_a_bf16_value():
    """q · 2^n is exact in bf16 for every finite e4m3 q and n in [-124, 120], up to bf16's range (above it: inf)."""
    q = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(FP8).float()
    q = q[~torch.isnan(q)]
    n = torch.arange(-124, 121, dtype=torch.float64)
    exact = q.double()[:, None] * torch.exp2(n)[None, :]
    got = exact.float().to(torch.bfloat16).double()  # fp32 holds these exactly: the bf16 rounding is the test
    finite = exact.abs() < 2.0**128 * (1 - 2.0**-9)
    assert bool((got[finite] == exact[finite]).all())
    assert bool(torch.isinf(got[~finite]).all())


@pytest.mark.parametrize("amax, n", [
    (2.0**-133, -126),          # bf16's smallest value: n = -126 by the floor
    (1.75 * 2.0**-118, -126),   # 448 · 2^-126
    (1.75 * 2.0**-117, -125),   # 448 · 2^-125
    (1.75 * 2.0**-116, -124),   # 448 · 2^-124, the first n of the test above
    (1.75 * 2.0**127, 119),     # 448 · 2^119
    (BF16_MAX, 120),            # the largest n for bf16 inputs
])
def test_dequantisation_is_exact_for_every_bf16_input(amax, n):
    """Below n = -124 some q · 2^n are not bf16 values (2^-9 · 2^-126 = 2^-135 < 2^-133), yet none of them comes
    out of the quantiser for a bf16 input: for every bf16 x of a block with this amax (every x with |x| <= amax),
    the bf16 dequantised value is q · 2^n exactly (inf where that reaches 2^128: only for n = 120). With the test
    above (every q, n >= -124) this covers every scale the quantiser chooses."""
    every = _all_bf16(BF16_MAX)
    x = every[every.float().abs() <= amax]
    q, s = quantize_rows_1x128(torch.stack([x, _bf16([amax]).expand(len(x))], 1))
    assert bool((s == 2.0**n).all())
    exact = q.float().double() * 2.0**n
    got = dequantize_rows_1x128(q, s).double()
    big = exact.abs() >= 2.0**128
    assert bool((got[~big] == exact[~big]).all()), f"n = {n}: a dequantised value is not q · 2^n"
    assert bool(torch.isinf(got[big]).all())
    assert bool(big.any()) == (n == 120)


# ---------------------------------------------------------------- blocks, edges, round trip

def _spread_magnitudes(shape, seed):
    """Random bf16 values whose 128-wide column blocks and 128-tall row blocks have very different scales."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g)
    rows = torch.arange(shape[-2])[:, None] // 128 if len(shape) > 1 else 0
    cols = torch.arange(shape[-1])[None, :] // 128
    return (x * torch.exp2(7.0 * cols - 9.0 * rows)).to(torch.bfloat16)


@pytest.mark.parametrize("K", [1, 127, 128, 129, 300])  # one partial block .. two whole and a partial one
def test_rows_each_block_is_quantised_on_its_own(K):
    x = _spread_magnitudes((5, K), seed=K)
    q, s = quantize_rows_1x128(x)
    assert tuple(s.shape) == (5, -(-K // 128))
    for b in range(s.shape[1]):
        qb, sb = quantize_rows_1x128(x[:, 128 * b : 128 * (b + 1)].contiguous())
        assert_bitwise_equal(q[:, 128 * b : 128 * (b + 1)], qb, f"block {b} of K = {K}")
        assert_bitwise_equal(s[:, b : b + 1], sb, f"scale of block {b} of K = {K}")


@pytest.mark.parametrize("N, K", [(1, 1), (128, 128), (200, 300), (129, 72)])  # partial blocks along N and K
def test_weight_blocks_are_quantised_on_their_own(N, K):
    w = _spread_magnitudes((N, K), seed=N + K)
    q, s = quantize_blocks_128x128(w)
    assert tuple(s.shape) == (-(-N // 128), -(-K // 128))
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            blk = w[128 * i : 128 * (i + 1), 128 * j : 128 * (j + 1)].contiguous()
            qb, sb = quantize_blocks_128x128(blk)
            assert_bitwise_equal(q[128 * i : 128 * (i + 1), 128 * j : 128 * (j + 1)], qb, f"block {(i, j)}")
            assert_bitwise_equal(s[i : i + 1, j : j + 1], sb, f"scale of block {(i, j)}")


def test_weight_transpose_reuses_the_blocks_and_a_stack_is_quantised_per_matrix():
    w = _spread_magnitudes((3, 200, 130), seed=1)
    q, s = quantize_blocks_128x128(w)
    qt, st = quantize_blocks_128x128(w.transpose(1, 2))  # a strided view: same values
    assert_bitwise_equal(qt, q.transpose(1, 2).contiguous(), "q of the transpose")
    assert_bitwise_equal(st, s.transpose(1, 2).contiguous(), "scales of the transpose")
    for e in range(3):
        qe, se = quantize_blocks_128x128(w[e])
        assert_bitwise_equal(q[e], qe, f"matrix {e} of the stack")
        assert_bitwise_equal(s[e], se, f"scales of matrix {e} of the stack")


def test_empty_dimensions():
    q, s = quantize_rows_1x128(torch.zeros(4, 0, dtype=torch.bfloat16))
    assert (tuple(q.shape), tuple(s.shape)) == ((4, 0), (4, 0))
    q, s = quantize_rows_1x128(torch.zeros(0, 5, dtype=torch.bfloat16))
    assert (tuple(q.shape), tuple(s.shape)) == ((0, 5), (0, 1))
    q, s = quantize_blocks_128x128(torch.zeros(0, 5, dtype=torch.bfloat16))
    assert (tuple(q.shape), tuple(s.shape)) == ((0, 5), (0, 1))


@pytest.mark.parametrize("fp8", [fp8_rows_1x128, fp8_blocks_128x128], ids=["rows", "blocks"])
def test_round_trip_error_and_idempotence(fp8):
    """|dequantised - x| is at most half an e4m3 step at x's size (2^-4 |x|), or half the smallest step
    (2^-10 · scale) for values in e4m3's subnormal range; rounding the result again changes nothing."""
    x = _spread_magnitudes((200, 300), seed=3)
    x[7, 11], x[150, 200] = 0.0, -(2.0**-133)
    d = fp8(x)
    quantize = quantize_rows_1x128 if fp8 is fp8_rows_1x128 else quantize_blocks_128x128
    _, s = quantize(x)
    scale = s.repeat_interleave(128, -1)[..., :300]
    if fp8 is fp8_blocks_128x128:
        scale = scale.repeat_interleave(128, 0)[:200]
    err = (d.double() - x.double()).abs()
    bound = torch.maximum(x.double().abs() * 2.0**-4, scale.double() * 2.0**-10)
    assert bool((err <= bound).all()), float((err / bound).max())
    assert float((err / x.double().abs().clamp_min(1e-300)).median()) < 2.0**-5  # not all at the bound
    assert_bitwise_equal(fp8(d), d, "rounded twice")


@pytest.mark.parametrize("rows", [
    "prefix",        # the first 7 rows
    "strided",       # every third row
    "one_row",       # a single row
    "larger_batch",  # the rows inside a batch three times as large, with much larger values
])
def test_row_quantisation_is_batch_invariant(rows):
    x = _spread_magnitudes((20, 300), seed=4)
    q, s = quantize_rows_1x128(x)
    sel = {"prefix": torch.arange(7), "strided": torch.arange(1, 20, 3), "one_row": torch.tensor([13]),
           "larger_batch": torch.arange(20)}[rows]
    if rows == "larger_batch":
        big = _spread_magnitudes((60, 300), seed=5) * 1024
        big[20:40] = x
        qs, ss = (t[20:40] for t in quantize_rows_1x128(big))
    else:
        qs, ss = quantize_rows_1x128(x[sel])
    assert_bitwise_equal(qs, q[sel], f"q ({rows})")
    assert_bitwise_equal(ss, s[sel], f"scales ({rows})")


# ---------------------------------------------------------------- quantiser arguments

@pytest.mark.parametrize("call, exc, match", [
    (lambda: quantize_rows_1x128(torch.ones(2, 3)), TypeError, "x_MK: expected dtype torch.bfloat16, got torch.float32"),
    (lambda: quantize_rows_1x128(torch.tensor(1.0).bfloat16()), ValueError, r"x_MK: expected at least 1 dimension, got shape \(\)"),
    (lambda: quantize_rows_1x128([1.0]), TypeError, "x_MK: expected a torch.Tensor, got list"),
    (lambda: quantize_blocks_128x128(torch.ones(3).bfloat16()), ValueError, r"w_NK: expected at least 2 dimensions, got shape \(3,\)"),
    (lambda: quantize_blocks_128x128(torch.ones(2, 3, dtype=torch.float16)), TypeError, "w_NK: expected dtype torch.bfloat16"),
    (lambda: dequantize_rows_1x128(torch.ones(2, 3).bfloat16(), torch.ones(2, 1)), TypeError,
     "q_MK: expected dtype torch.float8_e4m3fn, got torch.bfloat16"),
    (lambda: dequantize_rows_1x128(torch.ones(2, 130).to(FP8), torch.ones(2, 1)), ValueError,
     r"scale_MKb: expected shape \(2, 2\) for q_MK of shape \(2, 130\), got \(2, 1\)"),
    (lambda: dequantize_rows_1x128(torch.ones(2, 3).to(FP8), torch.ones(2, 1, dtype=torch.float64)), TypeError,
     "scale_MKb: expected dtype torch.float32, got torch.float64"),
    (lambda: dequantize_blocks_128x128(torch.ones(200, 3).to(FP8), torch.ones(1, 1)), ValueError,
     r"scale_NbKb: expected shape \(2, 1\) for q_NK of shape \(200, 3\), got \(1, 1\)"),
])
def test_quantiser_bad_arguments(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


# ---------------------------------------------------------------- the layer, precision="fp8"

def test_fp8_outputs_within_the_recipes_error_of_bf16():
    """Every output of the fp8 recipe differs from the bf16 recipe's (it really rounds) by a relative error of a
    few e4m3 steps' worth (e4m3 keeps 3 mantissa bits: half a step is up to 2^-4 relative)."""
    inputs = make_inputs(EDGES, seed=0)
    bf, f8 = run_layer(inputs), run_layer(inputs, precision="fp8")
    for name in OUTPUT_NAMES:
        if bf[name] is None:
            assert f8[name] is None, name
            continue
        assert f8[name].dtype == bf[name].dtype and f8[name].shape == bf[name].shape, name
        err = rel_error(f8[name], bf[name])
        assert 2.0**-9 < err < 0.1, f"{name}: relative error {err:.3g} against bf16"


@pytest.mark.parametrize("rows", ["prefix", "one_token", "larger_batch"])  # as test_bitwise's batch invariance
def test_fp8_layer_is_batch_invariant(rows):
    inputs = make_inputs(EDGES, seed=1)
    full = run_layer(inputs, precision="fp8")
    T = EDGES.T
    per_token = ("x", "topk_idx", "topk_weight", "dy")
    if rows == "larger_batch":
        extra = make_inputs(MoEConfig(**{**EDGES.as_dict(), "T": 3 * T}), seed=9)
        big = {**inputs, **{k: torch.cat([extra[k][:T], inputs[k], extra[k][T:2 * T]]) for k in per_token}}
        big["x"][:T] *= 64  # other tokens' values far larger: per-token scales must not see them
        got = {k: v[T:2 * T] for k, v in run_layer(big, precision="fp8").items() if k in ("y", "d_x", "d_topk_weight")}
        sel = torch.arange(T)
    else:
        sel = {"prefix": torch.arange(10), "one_token": torch.tensor([17])}[rows]
        got = run_layer({**inputs, **{k: inputs[k][sel] for k in per_token}}, precision="fp8")
    for k in ("y", "d_x", "d_topk_weight"):
        assert_bitwise_equal(got[k], full[k][sel], f"fp8 batch invariance ({rows}): {k}")


@pytest.mark.parametrize("name, index, value", [
    ("x", (5, 7), NAN),                 # NaN in one activation: that token's row
    ("x", (9, 130), INF),               # inf (no e4m3 infinity: NaN) in x's partial second block
    ("routed_gate", (0, 3, 3), NAN),    # NaN in a routed expert's weight: every token routed to it
])
def test_fp8_nan_and_inf_propagate_and_stay_in_their_rows(name, index, value):
    inputs = make_inputs(EDGES, seed=0)
    clean = run_layer(inputs, precision="fp8")
    t = inputs[name].clone()
    t[index] = value
    if name == "routed_gate":
        hit = (inputs["topk_idx"] == index[0]).any(dim=1)
        assert bool(hit.any()) and not bool(hit.all())
    else:
        hit = torch.zeros(EDGES.T, dtype=torch.bool)
        hit[index[0]] = True
    y = run_layer({**inputs, name: t}, precision="fp8")["y"]
    assert bool(torch.isnan(y[hit]).all()), f"{name} = {value} did not make every element of the rows hit NaN"
    assert_bitwise_equal(y[~hit], clean["y"][~hit], f"rows not touched by the {value} in {name}")


def test_fp8_autograd_matches_functional():
    inputs = make_inputs(DEFAULT, seed=2)
    want = run_layer(inputs, precision="fp8")
    grads_of = {"x": "d_x", "topk_weight": "d_topk_weight", "shared_gate": "d_shared_gate", "shared_up": "d_shared_up",
                "shared_down": "d_shared_down", "routed_gate": "d_routed_gate", "routed_up": "d_routed_up",
                "routed_down": "d_routed_down"}
    leaves = {a: (inputs[a].clone().requires_grad_(True) if a in grads_of else inputs[a]) for a in LAYER_ARGS}
    y = reference.moe(*(leaves[a] for a in LAYER_ARGS), precision="fp8")
    assert_bitwise_equal(y.detach(), want["y"], "y")
    y.backward(inputs["dy"])
    for arg, out in grads_of.items():
        assert_bitwise_equal(leaves[arg].grad, want[out].to(inputs[arg].dtype), f"{arg}.grad")


@pytest.mark.parametrize("bad", ["fp16", "FP8", None, 8])  # another format, wrong case, not a string
def test_bad_precision_names_the_argument(bad):
    inputs = make_inputs(DEFAULT, seed=0)
    args = [inputs[a] for a in LAYER_ARGS]
    match = rf"precision: expected one of \('bf16', 'fp8'\), got {bad!r}"
    with pytest.raises(ValueError, match=match):
        reference.forward(*args, precision=bad)
    with pytest.raises(ValueError, match=match):
        reference.moe(*args, precision=bad)
    _, ctx = reference.forward(*args)
    saved = reference.save_context(ctx)
    with pytest.raises(ValueError, match=match):
        reference.load_context(saved, args[0], args[1], args[2], args[3:6], args[6:], precision=bad)
    with pytest.raises(ValueError, match=match):
        run_reference_world(inputs, 2, precision=bad)  # before any process starts


# ---------------------------------------------------------------- expert parallelism

@pytest.mark.slow
def test_fp8_world_size_invariance():
    """W = 2 gloo processes give the W = 1 bits (skewed routing, a shared expert, partial blocks)."""
    inputs = make_inputs(EDGES, seed=3, routing="skewed")
    want = run_layer(inputs, precision="fp8")
    got = unshard_outputs(run_reference_world(inputs, 2, precision="fp8"))
    for name in OUTPUT_NAMES:
        if want[name] is not None:
            assert_bitwise_equal(got[name], want[name], f"fp8, W = 2 vs W = 1: {name}")


def _mixed_precision_rank(rank, world_size, group):
    inp = shard_inputs(make_inputs(MoEConfig(T=8, H=8, I=4, E=4, K=2, S=4), 0), rank, world_size)
    try:
        reference.forward(*(inp[a] for a in LAYER_ARGS), group=group, precision="fp8" if rank else "bf16")
    except ValueError as e:
        return str(e)
    return "no error"


@pytest.mark.slow
def test_ranks_with_different_precisions_all_raise():
    msgs = launch(_mixed_precision_rank, (), 2, timeout_s=60)
    for m in msgs:
        assert "precision: expected the same recipe (0 bf16, 1 fp8) on every rank" in m, msgs
        assert "0 on rank 0, 1 on rank 1" in m, msgs


# ---------------------------------------------------------------- CUDA

@pytest.mark.gpu
def test_fp8_cpu_vs_cuda():
    """The quantisers (every bf16 value, edge blocks) and the fp8 layer give the CPU's bits on the GPU."""
    x = _all_bf16(BF16_MAX)
    x = torch.cat([x, x.new_zeros(-len(x) % 300)]).view(-1, 300)
    w = _spread_magnitudes((3, 200, 130), seed=1)
    for name, fn, t in (("rows", quantize_rows_1x128, x), ("blocks", quantize_blocks_128x128, w)):
        (qc, sc), (qg, sg) = fn(t), fn(t.cuda())
        assert_bitwise_equal(qg.cpu(), qc, f"{name}: q on CUDA vs CPU")
        assert_bitwise_equal(sg.cpu(), sc, f"{name}: scales on CUDA vs CPU")
        assert_bitwise_equal(dequantize_rows_1x128(qg, sg).cpu() if fn is quantize_rows_1x128 else
                             dequantize_blocks_128x128(qg, sg).cpu(),
                             fp8_rows_1x128(t) if fn is quantize_rows_1x128 else fp8_blocks_128x128(t),
                             f"{name}: dequantised on CUDA vs CPU")
    inputs = make_inputs(EDGES, seed=0)
    cpu = run_layer(inputs, precision="fp8")
    gpu = run_layer({k: (v.cuda() if v is not None else None) for k, v in inputs.items()}, precision="fp8")
    for name in OUTPUT_NAMES:
        if cpu[name] is not None:
            assert_bitwise_equal(gpu[name].cpu(), cpu[name], f"fp8 layer, CUDA vs CPU: {name}")

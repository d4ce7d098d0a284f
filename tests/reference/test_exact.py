"""The reference's bit-defining primitives (mok/reference/_exact.py): order and accuracy."""

import math

import numpy as np
import pytest
import torch

from mok.testing.bits import assert_bitwise_equal
from mok.reference import _exact as exact  # private: the chunk size is patched below
from mok.reference import (
    dsilu_exact, exp_exact, log_exact_ge1, matmul_exact, rows_outer_sum, rowwise_dot, sigmoid_exact, silu_exact,
    tree_sum,
)

U = 2.0**-24  # fp32 unit roundoff
F32_MAX = torch.finfo(torch.float32).max


def f32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def ordered(t: torch.Tensor) -> torch.Tensor:
    """fp32 bits as integers in the order of the floats (difference = ULP distance)."""
    b = t.contiguous().view(torch.int32).long()
    return torch.where(b < 0, -(b & 0x7FFFFFFF), b)


def neighbours(x: float, n: int) -> torch.Tensor:
    """The 2n+1 consecutive fp32 values around fp32(x) (same sign, so magnitude bits step by one)."""
    return (f32([x]).view(torch.int32) + torch.arange(-n, n + 1, dtype=torch.int32)).view(torch.float32)


# ---------------------------------------------------------------- tree_sum order

# 1e8 is exact in fp32 and its ULP is 8, so 1e8 + 1 rounds back to 1e8: each row's expected sum
# was worked out by hand from the documented order (v_i += v_{h+i}, odd n carries v_{2h}), and
# sequential, reversed or adjacent-pair orders give a different value (noted per row).
@pytest.mark.parametrize("values, expected", [
    ([], 0.0),                                     # n = 0: +0.0
    ([-0.0], -0.0),                                # n = 1: the value itself, sign of zero kept
    ([1e8, 1.0], 1e8),                             # n = 2: one rounded add
    ([1.0, 1e8, -1e8], 0.0),                       # n = 3 (odd): (v0+v1)+v2; right-to-left gives 1
    ([1e8, 1.0, -1e8, 1.0], 2.0),                  # n = 4 (even): (v0+v2)+(v1+v3); sequential 1, adjacent pairs 0
    ([1e8, 1.0, -1e8, 1.0, 1.0], 3.0),             # n = 5 (odd, carry at level 1): sequential gives 2
    ([1e8, 1e8, 1.0, -1e8, 1.0, 1.0, -1e8], 2.0),  # n = 7 (carries at two levels): exact sum 3, sequential 0
])
def test_tree_sum_hand_checked_order(values, expected):
    got = tree_sum(f32(values), dim=0)
    assert got.shape == () and got.dtype == torch.float32
    assert_bitwise_equal(got, f32(expected), f"tree_sum({values})")


def _tree_model(v: list) -> np.float32:
    """The docs/numerics.md order written out on numpy float32 scalars, one rounding per add."""
    v = [np.float32(x) for x in v]
    if not v:
        return np.float32(0.0)
    while len(v) > 1:
        h = len(v) // 2
        v = [np.float32(v[i] + v[h + i]) for i in range(h)] + ([v[2 * h]] if len(v) % 2 else [])
    return v[0]


@pytest.mark.parametrize("n", [0, 1, 2, 3, 6, 8, 13, 16, 33])  # empty, single, even/odd, powers of two, carries
@pytest.mark.parametrize("dim", [0, 1, -1])  # reduced axis first, middle, last (negative index)
def test_tree_sum_matches_order_model(n, dim):
    g = torch.Generator().manual_seed(n)
    shape = [3, 2, 4]
    shape[dim] = n
    # wide dynamic range so almost every order gives different bits
    p = torch.randn(shape, generator=g) * torch.exp2(torch.randint(-20, 20, shape, generator=g).float())
    got = tree_sum(p, dim)
    moved = p.movedim(dim, -1).numpy()
    want = np.array([_tree_model(list(row)) for row in moved.reshape(math.prod(moved.shape[:-1]), n)], dtype=np.float32)
    assert_bitwise_equal(got, torch.from_numpy(want.reshape(moved.shape[:-1])), f"tree_sum n={n} dim={dim}")


def test_tree_sum_empty_gives_positive_zero_of_right_shape():
    got = tree_sum(torch.empty(3, 0, 5), dim=1)
    assert got.shape == (3, 5)
    assert_bitwise_equal(got, torch.zeros(3, 5), "tree_sum over an empty axis")


# ---------------------------------------------------------------- exp_exact

def _assert_exp_within_2ulp(x: torch.Tensor):
    y = exp_exact(x)
    ref = torch.exp(x.double()).float()  # correctly rounded up to float64's error
    assert torch.equal(torch.isinf(y), torch.isinf(ref)), "overflow to inf at a different x than float64 exp"
    fin = torch.isfinite(ref)
    ulp = (ordered(y[fin]) - ordered(ref[fin])).abs()
    i = int(ulp.argmax()) if ulp.numel() else 0
    assert ulp.numel() == 0 or int(ulp.max()) <= 2, \
        f"exp_exact({x[fin][i].item()!r}) = {y[fin][i].item()!r}, float64 exp gives {ref[fin][i].item()!r}: {int(ulp.max())} ULP"


def test_exp_exact_dense_sweep_of_finite_range():
    # [-104, 89] covers everything between exp = +0 and exp = inf, including the subnormal outputs
    _assert_exp_within_2ulp(torch.linspace(-104.0, 89.0, 2_000_001, dtype=torch.float64).float())


def test_exp_exact_all_magnitudes():
    # |x| from the smallest subnormal up to 64, random mantissas, both signs
    g = torch.Generator().manual_seed(0)
    e = torch.arange(-149, 7).repeat_interleave(2000).float()
    m = 1.0 + torch.rand(e.shape, generator=g)
    x = (m * torch.exp2(e)).float()
    _assert_exp_within_2ulp(torch.cat([x, -x]))


@pytest.mark.parametrize("boundary", [
    88.72283935546875,   # exp overflows to inf (largest x with a finite fp32 exp is the float below)
    -87.33654022216797,  # exp(x) = smallest normal fp32: normal -> subnormal outputs
    -103.97208404541016, # exp(x) rounds to the smallest subnormal vs to +0
    89.0, -104.0,        # the implementation's clamp points
    0.0,                 # exp = 1, around tiny |x|
])
def test_exp_exact_every_float_near_boundaries(boundary):
    _assert_exp_within_2ulp(neighbours(boundary, 3000) if boundary else
                            torch.cat([neighbours(1e-30, 100), neighbours(-1e-30, 100), f32([1e-45, -1e-45])]))


@pytest.mark.parametrize("x, expected", [
    (float("nan"), float("nan")),  # NaN propagates
    (float("inf"), float("inf")),  # +inf -> inf
    (float("-inf"), 0.0),          # -inf -> +0
    (-0.0, 1.0),                   # negative zero
    (0.0, 1.0),                    # positive zero
    (F32_MAX, float("inf")),       # far beyond overflow
    (-F32_MAX, 0.0),               # far beyond underflow: +0, not -0
    (88.72283172607422, 3.4027985e38),  # largest x with finite exp: just below FLT_MAX
    (88.72283935546875, float("inf")),  # next float up: overflow
    (-103.97207641601562, 1.401298464324817e-45),  # smallest subnormal
    (-103.97209930419922, 0.0),    # rounds to +0
])
def test_exp_exact_special_values(x, expected):
    got = exp_exact(f32([x]))
    assert_bitwise_equal(got, f32([expected]), f"exp_exact({x!r})")


# ---------------------------------------------------------------- sigmoid / silu / dsilu

# Error bounds (u = 2^-24): exp_exact is within 1.2 ULP (<= 2.4u relative), then 1 + e, the
# division and, for silu, the product add u each: sigmoid <= 4.4u, silu <= 5.4u; we allow 6u
# (measured max 2.5u and 3.2u). dsilu = s(1 + g(1 - s)): s's rounding error enters 1 - s
# absolutely and is multiplied by g, so the natural scale is u * s * (1 + |g|); allowed 8u,
# measured 3.5u. For g < -88.72, exp(-g) overflows and sigmoid flushes to 0 (true value
# < 2^-127), so all three get an absolute floor of 2^-120.
FLOOR = 2.0**-120


def _activation_grid():
    return torch.cat([torch.linspace(-120.0, 120.0, 1_000_001), torch.randn(100_000) * 3,
                      torch.randn(10_000) * 1e-3]).float()


def test_sigmoid_and_silu_vs_float64():
    g = _activation_grid()
    s64 = torch.sigmoid(g.double())
    for name, got, ref in [("sigmoid", sigmoid_exact(g), s64), ("silu", silu_exact(g), g.double() * s64)]:
        err = (got.double() - ref).abs()
        bound = 6 * U * ref.abs() + FLOOR
        i = int((err / bound).argmax())
        assert bool((err <= bound).all()), f"{name}({g[i].item()!r}) = {got[i].item()!r}, float64 {ref[i].item()!r}"


def test_dsilu_vs_float64():
    g = _activation_grid()
    s64 = torch.sigmoid(g.double())
    ref = s64 * (1 + g.double() * (1 - s64))
    got = dsilu_exact(g)
    err = (got.double() - ref).abs()
    bound = 8 * U * s64 * (1 + g.double().abs()) + FLOOR
    i = int((err / bound).argmax())
    assert bool((err <= bound).all()), f"dsilu({g[i].item()!r}) = {got[i].item()!r}, float64 {ref[i].item()!r}"


def test_silu_and_dsilu_from_one_sigmoid_have_their_bits():
    """The backward's shared-sigmoid pair gives silu_exact's bits and dsilu's written-out order."""
    g = _activation_grid()
    silu, dsilu = exact.silu_and_dsilu_exact(g)
    s = sigmoid_exact(g)
    assert_bitwise_equal(silu, silu_exact(g), "silu from silu_and_dsilu_exact")
    assert_bitwise_equal(dsilu, s * (1.0 + g * (1.0 - s)), "dsilu from silu_and_dsilu_exact")
    assert_bitwise_equal(dsilu_exact(g), dsilu, "dsilu_exact")


@pytest.mark.parametrize("fn, x, expected", [
    (silu_exact, float("nan"), float("nan")),     # NaN propagates
    (dsilu_exact, float("nan"), float("nan")),    # NaN propagates
    (sigmoid_exact, float("nan"), float("nan")),  # NaN propagates
    (silu_exact, -0.0, -0.0),                     # sign of zero kept (as torch's silu)
    (silu_exact, 0.0, 0.0),                       # +0
    (silu_exact, float("inf"), float("inf")),     # +inf
    (silu_exact, -200.0, -0.0),                   # exp(200) overflows: -200 * 0
    (sigmoid_exact, 0.0, 0.5),                    # exact midpoint
    (dsilu_exact, 0.0, 0.5),                      # silu'(0) = 1/2 exactly
    (sigmoid_exact, float("-inf"), 0.0),          # 1 / (1 + inf)
    (sigmoid_exact, float("inf"), 1.0),           # 1 / (1 + 0)
])
def test_activation_special_values(fn, x, expected):
    assert_bitwise_equal(fn(f32([x])), f32([expected]), f"{fn.__name__}({x!r})")


# ---------------------------------------------------------------- log_exact_ge1 outside its domain

@pytest.mark.parametrize("x, expected", [
    (1.0, 0.0),                            # the domain's lower end: exactly +0
    (float("inf"), float("inf")),          # +inf (was 128 ln 2 = 88.7, read from inf's exponent bits)
    (float("nan"), float("nan")),          # NaN propagates
    (0.5, float("nan")),                   # below the domain [1, inf]: NaN (was its log, outside the documented domain)
    (1.0 - 2**-24, float("nan")),          # the largest fp32 below 1
    (0.0, float("nan")),                   # +0 (was -88: log(0) is -inf, outside the domain)
    (-0.0, float("nan")),                  # -0
    (-1.0, float("nan")),                  # negative
    (float("-inf"), float("nan")),         # -inf
    (1e-45, float("nan")),                 # a subnormal
])
def test_log_exact_ge1_outside_its_domain(x, expected):
    """Values below 1 give NaN and +inf gives +inf, decided elementwise (no value is read on the host)."""
    got = log_exact_ge1(f32([x]))
    if math.isnan(expected):
        assert bool(torch.isnan(got).all()), f"log_exact_ge1({x!r}) = {got.item()!r}, expected NaN"
    else:
        assert_bitwise_equal(got, f32([expected]), f"log_exact_ge1({x!r})")


# ---------------------------------------------------------------- matmul_exact / rows_outer_sum / rowwise_dot

def _gamma(n: int) -> float:
    """Error factor of a pairwise fp32 tree of depth ceil(log2 n) over exact products."""
    k = math.ceil(math.log2(n)) if n > 1 else 0
    return k * U / (1 - k * U)


def _bf16(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    # mixed magnitudes and signs so cancellation happens
    return (torch.randn(*shape, generator=g) * torch.exp2(torch.randint(-6, 6, shape, generator=g).float())).bfloat16()


def _assert_within_tree_bound(got, ref64, abs64, n, name):
    err = (got.double() - ref64).abs()
    bound = _gamma(n) * abs64
    assert bool((err <= bound).all()), f"{name}: max err/bound {(err / bound.clamp(min=1e-300)).max().item()}"


@pytest.mark.parametrize("M, N, D", [
    (5, 7, 1),      # D = 1: single exact product, no rounding at all
    (4, 3, 2),      # one add
    (3, 5, 3),      # odd D: carry
    (9, 6, 64),     # power of two
    (7, 5, 257),    # odd, 9 levels
    (2, 3, 4096),   # long reduction
    (0, 3, 5),      # M = 0: empty output
])
def test_matmul_exact_vs_float64(M, N, D):
    a, b = _bf16(M, D, seed=1), _bf16(N, D, seed=2)
    got = matmul_exact(a, b)
    assert got.shape == (M, N) and got.dtype == torch.float32
    _assert_within_tree_bound(got, a.double() @ b.double().T, a.double().abs() @ b.double().abs().T, D, "matmul_exact")
    if D == 1:
        assert_bitwise_equal(got, (a.double() @ b.double().T).float(), "matmul_exact D=1 (exact)")


@pytest.mark.parametrize("R, M, N", [
    (1, 4, 3),      # one row: exact
    (2, 3, 5),      # one add
    (37, 5, 4),     # odd R: carries
    (300, 3, 6),    # long
    (0, 4, 3),      # no rows (expert without tokens): +0
])
def test_rows_outer_sum_vs_float64(R, M, N):
    a, b = _bf16(R, M, seed=3), _bf16(R, N, seed=4)
    got = rows_outer_sum(a, b)
    assert got.shape == (M, N) and got.dtype == torch.float32
    _assert_within_tree_bound(got, a.double().T @ b.double(), a.double().abs().T @ b.double().abs(), R, "rows_outer_sum")
    if R == 0:
        assert_bitwise_equal(got, torch.zeros(M, N), "rows_outer_sum with no rows")


def test_rowwise_dot_vs_float64():
    a, b = _bf16(6, 45, seed=5), _bf16(6, 3, 45, seed=6)
    got = rowwise_dot(a, b)
    ref = torch.einsum("th,tkh->tk", a.double(), b.double())
    _assert_within_tree_bound(got, ref, torch.einsum("th,tkh->tk", a.double().abs(), b.double().abs()), 45, "rowwise_dot")


def test_products_are_reduced_by_tree_sum():
    """The contract's order: each output element is tree_sum of its exact products, in index order."""
    a, b = _bf16(3, 11, seed=7), _bf16(4, 11, seed=8)
    got = matmul_exact(a, b)
    for m in range(3):
        for n in range(4):
            assert_bitwise_equal(got[m, n], tree_sum(a[m].float() * b[n].float(), 0), f"matmul_exact[{m},{n}]")
    r, c = _bf16(13, 3, seed=9), _bf16(13, 2, seed=10)
    got = rows_outer_sum(r, c)
    for m in range(3):
        for n in range(2):
            assert_bitwise_equal(got[m, n], tree_sum(r[:, m].float() * c[:, n].float(), 0), f"rows_outer_sum[{m},{n}]")


def test_chunking_does_not_change_bits(monkeypatch):
    a, b = _bf16(33, 17, seed=11), _bf16(9, 17, seed=12)
    whole_mm, whole_ro = matmul_exact(a, b), rows_outer_sum(a, a[:, :5])
    monkeypatch.setattr(exact, "_CHUNK_ELEMS", {"cpu": 50, "cuda": 50})  # forces many row/column chunks
    assert_bitwise_equal(matmul_exact(a, b), whole_mm, "matmul_exact chunked")
    assert_bitwise_equal(rows_outer_sum(a, a[:, :5]), whole_ro, "rows_outer_sum chunked")

"""The blocked tree sums of mok/reference/_exact.py against a definitional implementation of the contract's tree.

The primitives write their products reduction-axis-major into chunk buffers and reduce them in place, level by
level; the definition below is the contract's loop written out on numpy float32 arrays (one rounded IEEE add per
pair, products formed elementwise), independent of torch. Every comparison is on raw bits (any NaN equals any NaN)
and names the first mismatch.
"""

import numpy as np
import pytest
import torch

from mok.reference import _exact as exact  # private: the chunk size is patched below
from mok.reference import matmul_exact, rows_outer_sum, rowwise_dot, tree_sum
from mok.testing.bits import assert_bitwise_equal


def tree_def(v: np.ndarray) -> np.ndarray:
    """docs/numerics.md's tree over the last axis of float32 `v`: v_i + v_{h+i} for i < h = n // 2, then the
    odd term v_{2h}; repeat until one term is left; n = 0 gives +0.0."""
    v = np.asarray(v, dtype=np.float32)
    if v.shape[-1] == 0:
        return np.zeros(v.shape[:-1], dtype=np.float32)
    with np.errstate(all="ignore"):  # inf - inf and friends are part of the contract
        while v.shape[-1] > 1:
            n, h = v.shape[-1], v.shape[-1] // 2
            v = np.concatenate([v[..., :h] + v[..., h : 2 * h], v[..., 2 * h :]], axis=-1)
    return v[..., 0]


def products_def(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise float32 products (each rounded once, as the contract's separate multiply)."""
    with np.errstate(all="ignore"):
        return (a.astype(np.float32) * b.astype(np.float32)).astype(np.float32)


def as_np(t: torch.Tensor) -> np.ndarray:
    return t.float().numpy()


SPECIALS = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e38, -3e38, 2.0**-130, -(2.0**-133), 1.0, -1.0]


def bf16_values(shape, seed: int, specials: bool) -> torch.Tensor:
    """bf16 of mixed magnitudes and signs; with `specials`, about a quarter of the entries from SPECIALS (signed
    zeros, infinities, NaN, overflowing and underflowing magnitudes)."""
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(*shape, generator=g) * torch.exp2(torch.randint(-20, 20, shape, generator=g).float())
    if specials:
        pick = torch.randint(0, 4 * len(SPECIALS), shape, generator=g)
        table = torch.tensor(SPECIALS + [0.0] * (3 * len(SPECIALS)))
        v = torch.where(pick < len(SPECIALS), table[pick.clamp(max=len(SPECIALS) - 1)], v)
    return v.to(torch.bfloat16)


def signed_zeros(shape, seed: int) -> torch.Tensor:
    """bf16 ±0 only, so sums of products are zeros whose sign the order of the adds decides."""
    g = torch.Generator().manual_seed(seed)
    return torch.where(torch.rand(*shape, generator=g) < 0.5, -0.0, 0.0).to(torch.bfloat16)


SIZES = [0, 1, 2, 3, 5, 7, 12, 31, 64, 100]  # n = 0..3, odd, even non-powers of two, a power of two
CHUNKS = [None, 7]  # the default chunk size, and chunks of a few products (many row and column chunks)


@pytest.fixture(params=CHUNKS, ids=["default-chunks", "tiny-chunks"])
def chunks(request, monkeypatch):
    if request.param is not None:
        monkeypatch.setattr(exact, "_CHUNK_ELEMS", {"cpu": request.param, "cuda": request.param})


def _cases(seed: int):
    yield "random", lambda shape, s: bf16_values(shape, seed + s, specials=False)
    yield "specials", lambda shape, s: bf16_values(shape, seed + s, specials=True)
    yield "signed-zeros", lambda shape, s: signed_zeros(shape, seed + s)


@pytest.mark.parametrize("D", SIZES)
def test_matmul_exact_matches_definition(D, chunks):
    M, N = 3, 5
    for kind, make in _cases(10 * D):
        a, b = make((M, D), 0), make((N, D), 1)
        want = tree_def(products_def(as_np(a)[:, None, :], as_np(b)[None, :, :]))
        assert_bitwise_equal(matmul_exact(a, b), torch.from_numpy(want), f"matmul_exact D={D} {kind}")


@pytest.mark.parametrize("R", SIZES)
def test_rows_outer_sum_matches_definition(R, chunks):
    M, N = 4, 3
    for kind, make in _cases(10 * R + 1):
        a, b = make((R, M), 0), make((R, N), 1)
        want = tree_def(products_def(as_np(a).T[:, None, :], as_np(b).T[None, :, :]))
        assert_bitwise_equal(rows_outer_sum(a, b), torch.from_numpy(want), f"rows_outer_sum R={R} {kind}")


@pytest.mark.parametrize("H", SIZES)
def test_rowwise_dot_matches_definition(H, chunks):
    T, K = 5, 3
    for kind, make in _cases(10 * H + 2):
        a, b = make((T, H), 0), make((T, K, H), 1)
        want = tree_def(products_def(as_np(a)[:, None, :], as_np(b)))
        assert_bitwise_equal(rowwise_dot(a, b), torch.from_numpy(want), f"rowwise_dot H={H} {kind}")


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_tree_sum_matches_definition_with_specials(n, dim):
    shape = [3, 4, 2]
    shape[dim] = n
    p = bf16_values(shape, seed=n, specials=True).float()
    want = tree_def(p.movedim(dim, -1).numpy())
    assert_bitwise_equal(tree_sum(p, dim), torch.from_numpy(want), f"tree_sum n={n} dim={dim}")


def test_blocked_sums_on_a_larger_odd_shape_match_definition():
    """Odd sizes everywhere, several chunks at the default chunk size (D * N above one chunk's budget)."""
    a, b = bf16_values((9, 1031), seed=3, specials=True), bf16_values((1029, 1031), seed=4, specials=False)
    want = tree_def(products_def(as_np(a)[:, None, :], as_np(b)[None, :, :]))
    assert_bitwise_equal(matmul_exact(a, b), torch.from_numpy(want), "matmul_exact 9x1029x1031")


def test_tree_sum_leaves_its_input_alone_and_returns_a_new_tensor():
    for n in (1, 2, 5):
        p = bf16_values((n, 4), seed=n, specials=True).float()
        before = p.clone()
        s = tree_sum(p, 0)
        assert_bitwise_equal(p, before, f"tree_sum's input after the sum (n={n})")
        s.fill_(7.0)  # a view of p would write into it
        assert_bitwise_equal(p, before, f"tree_sum's input after writing to the result (n={n})")


def test_tree_sum_under_autograd_gives_the_same_bits_and_gradient_one():
    p = bf16_values((7, 3), seed=5, specials=False).float().requires_grad_(True)
    s = tree_sum(p, 0)
    assert_bitwise_equal(s.detach(), tree_sum(p.detach(), 0), "tree_sum with requires_grad")
    s.sum().backward()
    assert_bitwise_equal(p.grad, torch.ones(7, 3), "d tree_sum / d p")


# ---- the first level by a two-term-dot GEMM (CPU): where it is taken, and its bits against the elementwise level


def edge_values(shape, seed: int) -> torch.Tensor:
    """bf16 whose products stay exact (|product| in [2^-134, 2^128)) but whose sums hit the edges: signed zeros,
    exact cancellation, sums that overflow to ±inf, and subnormal differences of tiny products."""
    g = torch.Generator().manual_seed(seed)
    mag = torch.exp2(torch.randint(-66, 63, shape, generator=g).float()) * (1 + torch.rand(*shape, generator=g))
    sign = torch.where(torch.rand(*shape, generator=g) < 0.5, -1.0, 1.0)
    zero = torch.rand(*shape, generator=g) < 0.2
    v = torch.where(zero, sign * 0.0, sign * mag)
    return v.to(torch.bfloat16)


def _elementwise_first_level(monkeypatch):
    monkeypatch.setattr(exact, "_first_level_by_gemm", lambda a, b, D: (False, False))


@pytest.mark.parametrize("D", [2, 3, 7, 64, 129])
def test_gemm_first_level_gives_the_elementwise_bits(D, chunks, monkeypatch):
    """The same sums with the GEMM's first level and with the elementwise one: bit for bit, both against the
    definition, on values built to reach signed zeros, cancellation, overflow and subnormal sums."""
    M, N = 6, 9
    cases = [("random", bf16_values((M, D), D, False), bf16_values((N, D), D + 1, False)),
             ("edges", edge_values((M, D), D), edge_values((N, D), D + 1)),
             ("signed-zeros", signed_zeros((M, D), D), signed_zeros((N, D), D + 1)),
             ("zero-rows", edge_values((M, D), D + 2) * (torch.arange(M) % 2)[:, None].to(torch.bfloat16),
              -edge_values((N, D), D + 3).abs())]
    for kind, a, b in cases:
        assert exact._first_level_by_gemm(a, b, D)[0], f"{kind}: the GEMM level is not taken"
        want = torch.from_numpy(tree_def(products_def(as_np(a)[:, None, :], as_np(b)[None, :, :])))
        assert_bitwise_equal(matmul_exact(a, b), want, f"matmul_exact D={D} {kind} (GEMM first level)")
        assert_bitwise_equal(rows_outer_sum(a.t().contiguous(), b.t().contiguous()), want,
                             f"rows_outer_sum R={D} {kind} (GEMM first level)")
    with monkeypatch.context() as m:
        _elementwise_first_level(m)
        for kind, a, b in cases:
            want = torch.from_numpy(tree_def(products_def(as_np(a)[:, None, :], as_np(b)[None, :, :])))
            assert_bitwise_equal(matmul_exact(a, b), want, f"matmul_exact D={D} {kind} (elementwise first level)")


def _decides(a: torch.Tensor, b: torch.Tensor) -> bool:
    return exact._first_level_by_gemm(a, b, a.shape[-1])[0]


def test_gemm_first_level_only_where_every_product_is_exact_and_finite():
    ones = torch.ones(4, 3, dtype=torch.bfloat16)
    assert _decides(ones, ones)
    assert _decides(ones * 2.0**63, ones * 2.0**63)  # 2^126: finite and exact
    assert not _decides(ones * 2.0**64, ones * 2.0**64)  # 2^128 overflows fp32
    assert _decides(ones * 2.0**-67, ones * 2.0**-67)  # 2^-134: 16 significant bits still fit
    assert not _decides(ones * 2.0**-68, ones * 2.0**-67)  # 2^-135: a product could round
    for special in (float("inf"), float("-inf"), float("nan")):
        with_special = ones.clone()
        with_special[1, 2] = special
        assert not _decides(with_special, ones), special
        assert not _decides(ones, with_special), special
    assert not exact._first_level_by_gemm(ones[:, :1], ones[:, :1], 1)[0]  # D = 1: no pair
    subnormal = ones * 2.0**-130  # a bf16 subnormal
    assert _decides(subnormal, ones)  # 2^-130: exact
    assert not _decides(subnormal, ones * 2.0**-5)  # 2^-135


@pytest.mark.parametrize("precision", ["high", "medium"])
def test_reduced_float32_matmul_precision_keeps_the_elementwise_first_level(precision):
    """A GEMM allowed to round fp32 through TF32 or bf16 is not used; the bits stay the definition's."""
    a, b = bf16_values((5, 40), 1, False), bf16_values((6, 40), 2, False)
    want = matmul_exact(a, b)
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision(precision)
        assert not _decides(a, b)
        assert_bitwise_equal(matmul_exact(a, b), want, f"matmul_exact at float32 matmul precision {precision!r}")
    finally:
        torch.set_float32_matmul_precision(before)


@pytest.mark.skipif(not hasattr(getattr(torch.backends.mkldnn, "matmul", None), "fp32_precision"),
                    reason="oneDNN's fp32_precision setting needs torch >= 2.9")
@pytest.mark.parametrize("precision", ["bf16", "tf32"])
def test_onednn_reduced_fp32_precision_keeps_the_elementwise_first_level(precision):
    """The per-backend setter (after which torch's legacy getter raises) turns the GEMM off as well."""
    a, b = bf16_values((5, 40), 3, False), bf16_values((6, 40), 4, False)
    want = matmul_exact(a, b)
    onednn = torch.backends.mkldnn.matmul
    before = onednn.fp32_precision
    try:
        onednn.fp32_precision = precision
        assert not _decides(a, b)
        assert_bitwise_equal(matmul_exact(a, b), want, f"matmul_exact at oneDNN fp32 precision {precision!r}")
    finally:
        onednn.fp32_precision = before


def test_tiny_products_keep_the_definitions_bits():
    """Products below 2^-134 round in fp32, and a GEMM that fuses the multiply into its add (FMA) rounds them
    differently: these sums must still be the definition's, so they take the elementwise first level."""
    g = torch.Generator().manual_seed(0)
    sign = lambda *shape: torch.where(torch.rand(*shape, generator=g) < 0.5, -1.0, 1.0)  # noqa: E731
    a = (sign(16, 256) * (1 + torch.rand(16, 256, generator=g)) * 2.0**-69).to(torch.bfloat16)  # products in
    b = (sign(24, 256) * (1 + torch.rand(24, 256, generator=g)) * 2.0**-69).to(torch.bfloat16)  # [2^-138, 2^-136)
    want = torch.from_numpy(tree_def(products_def(as_np(a)[:, None, :], as_np(b)[None, :, :])))
    assert_bitwise_equal(matmul_exact(a, b), want, "matmul_exact of tiny products")


def test_magnitude_bounds_from_bits_match_the_values():
    """The exactness check's integer bounds against the same bounds taken on the float values."""
    for seed in range(6):
        t = edge_values((37, 29), seed)
        if seed % 2:
            t[3, 4] = 2.0**-133  # a bf16 subnormal
        mag = t.float().abs()
        nonzero = mag[mag != 0]
        want = (float(mag.max()), float(nonzero.min()) if nonzero.numel() else float("inf"), bool((mag == 0).any()))
        assert exact._magnitude_bounds(t) == want, seed
    assert exact._magnitude_bounds(torch.zeros(3, dtype=torch.bfloat16)) == (0.0, float("inf"), True)
    assert exact._magnitude_bounds(-torch.zeros(3, dtype=torch.bfloat16)) == (0.0, float("inf"), True)
    for special in (float("inf"), float("-inf"), float("nan")):
        t = torch.tensor([1.0, special, -2.0**-5], dtype=torch.bfloat16)
        assert exact._magnitude_bounds(t) == (float("inf"), 2.0**-5, False), special

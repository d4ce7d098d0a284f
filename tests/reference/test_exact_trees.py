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

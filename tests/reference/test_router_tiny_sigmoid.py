"""Sigmoid routing with normalize when the picked scores sum below the smallest normal fp32, 2^-126
(zero or subnormal: all logits below about -87.3; below about -103.97 every score is +0): the weights
are defined as 1/k each (and their gradient 0), never NaN or inf; every other row keeps the bits of
p / tree_sum(p)."""

import pytest
import torch

from mok import reference
from mok.testing.bits import assert_bitwise_equal
from mok.reference import route, route_backward, router_scores, tree_sum


def _logits():
    g = torch.Generator().manual_seed(3)
    l = torch.randn(6, 5, generator=g) * 3
    l[1] = -120.0                                                  # every score is +0
    l[3] = torch.tensor([-200.0, -105.0, -110.0, -150.0, -104.0])  # every score is +0
    l[4] = torch.tensor([-200.0, -95.0, -110.0, -150.0, -100.0])   # subnormal scores: their sum < 2^-126
    l[5] = torch.tensor([-200.0, -80.0, -110.0, -150.0, -85.0])    # tiny but normal: the formula
    return l


TINY_ROWS, FORMULA_ROWS = (1, 3, 4), (0, 2, 5)


@pytest.mark.parametrize("k", [
    1,  # one pick: the weight 1
    2,  # 1/2, exact
    3,  # 1/3, rounded: still the same bits in each of the k places
    5,  # K = E: every expert picked, +0 scores included
])
def test_all_tiny_rows_get_uniform_weights(k):
    idx, w = route(_logits(), k, score="sigmoid", normalize=True)
    assert not bool(torch.isnan(w).any())
    one_over_k = (torch.ones(1) / k).expand(k)
    for row in TINY_ROWS:
        assert_bitwise_equal(w[row], one_over_k, f"row {row}")
    for row in (1, 3):
        assert idx[row].tolist() == list(range(k))  # equal (+0) scores: lower expert ids first


def test_other_rows_keep_the_formula_bits():
    l = _logits()
    idx, w = route(l, 3, score="sigmoid", normalize=True)
    p = torch.gather(router_scores(l, "sigmoid"), 1, idx)
    want = p / tree_sum(p, dim=1)[:, None]
    for row in FORMULA_ROWS:
        assert_bitwise_equal(w[row], want[row], f"row {row}")
    assert w[5, 2].item() == 0.0 < w[5, 1].item() < w[5, 0].item()  # two tiny normal scores and a +0


def test_gradient_of_all_tiny_rows_is_zero_and_finite():
    l = _logits()
    p = router_scores(l, "sigmoid")
    idx, _ = route(l, 2, score="sigmoid", normalize=True)
    g = torch.Generator().manual_seed(4)
    dw, dp = torch.randn(6, 2, generator=g), torch.randn(6, 5, generator=g)
    assert bool(torch.isfinite(route_backward(p, idx, dw, dp, "sigmoid", True)).all())
    dl_w = route_backward(p, idx, dw, torch.zeros_like(dp), "sigmoid", True)  # through the weights only
    assert bool(torch.isfinite(dl_w).all())
    for row in TINY_ROWS:
        assert dl_w[row].abs().max().item() == 0.0, f"row {row}: {dl_w[row]}"
    assert dl_w[5].abs().max().item() > 0.0  # the formula's rows do get a gradient


def test_router_forward_and_module_have_no_nan():
    """The same rule through the whole router (gate, scores, top-k) and its backward."""
    x = torch.full((4, 8), 8.0, dtype=torch.bfloat16)
    w = torch.full((4, 8), -8.0, dtype=torch.bfloat16)  # logits -512: every sigmoid score is +0
    tw, idx, scores, logits = reference.router_forward(x, w, 2, "sigmoid", True)
    assert bool((scores == 0).all()) and tw.tolist() == [[0.5, 0.5]] * 4
    d_x, d_w = reference.router_backward(x, w, scores, idx, torch.ones(4, 2), None, None, "sigmoid", True)
    assert bool(torch.isfinite(d_x.float()).all()) and bool(torch.isfinite(d_w).all())

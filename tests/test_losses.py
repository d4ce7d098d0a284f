"""mok.nn.losses: the router losses (load balancing, z-loss) and their hand-written backward passes
against float64 autograd, the balance loss's fixed point, and the exact log they use."""

import pytest
import torch

from mok import reference
from mok.nn import losses


@pytest.mark.parametrize("score", ["softmax", "sigmoid"])  # the balance loss normalises sigmoid scores first
def test_router_losses_and_gradients_match_float64(score):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(17, 5, generator=g) * 3
    idx, _ = reference.route(logits, 2, score=score)
    scores = reference.router_scores(logits, score)
    s64 = scores.double().requires_grad_()
    l64 = logits.double().requires_grad_()
    f = torch.bincount(idx.reshape(-1), minlength=5).double() / idx.numel()
    q = s64 if score == "softmax" else s64 / s64.sum(1, keepdim=True)
    lb64 = 5 * (f * q.mean(0)).sum()
    z64 = torch.logsumexp(l64, 1).square().mean()
    torch.testing.assert_close(losses.load_balance_loss(scores, idx, score).double(), lb64, rtol=1e-6, atol=0)
    torch.testing.assert_close(losses.z_loss(logits).double(), z64, rtol=1e-6, atol=0)
    (d_s,) = torch.autograd.grad(lb64, s64)
    (d_l,) = torch.autograd.grad(z64, l64)
    one = torch.tensor(1.0)
    torch.testing.assert_close(losses.load_balance_loss_backward(one, scores, idx, score).double(), d_s,
                               rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(losses.z_loss_backward(one, logits).double(), d_l, rtol=1e-5, atol=1e-8)


def test_uniform_routing_has_balance_loss_one():
    # 4 tokens, 4 experts, K = 1, each expert picked once, equal probabilities
    scores = torch.full((4, 4), 0.25)
    idx = torch.arange(4)[:, None]
    assert losses.load_balance_loss(scores, idx, "softmax").item() == 1.0


def test_log_exact_accuracy_and_nan():
    x = torch.cat([torch.tensor([1.0, 1.5, 2.0, 3.0, 1e30]), 1 + torch.rand(10000, generator=torch.Generator().manual_seed(0)) * 100])
    got = losses.log_exact_ge1(x).double()
    torch.testing.assert_close(got, x.double().log(), rtol=2e-7, atol=0)
    assert torch.isnan(losses.log_exact_ge1(torch.tensor([float("nan")]))).all()

"""The fast path's router losses (mok.fast.router_losses / router_losses_backward, csrc/router_losses.cu) against
float64 autograd and the bit-exact reference losses (mok.nn.losses), and their reruns bitwise."""
import pytest
import torch

import mok.fast
from mok import reference
from mok.testing.bits import assert_bitwise_equal
from mok.nn import losses

pytestmark = [pytest.mark.gpu, pytest.mark.sm90]

CASES = [
    (1, 8, 2, "softmax"),        # one token: one chunk of one row
    (64, 64, 6, "softmax"),      # exactly one chunk of 64 rows
    (1000, 64, 6, "softmax"),    # DeepSeek-V2-Lite's router at a small batch: 16 chunks, the last one partial
    (4097, 128, 8, "softmax"),   # Qwen3-like, T not a multiple of the chunk
    (300, 256, 8, "sigmoid"),    # DeepSeek-V3-like sigmoid scores (rows divided by their sum), E = 8 warps' worth
    (77, 5, 5, "sigmoid"),       # K = E, E smaller than a warp
]


def _routing(T, E, K, score, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    logits = torch.randn(T, E, generator=g, device="cuda") * 3
    idx, _ = reference.route(logits, K, score=score)
    return reference.router_scores(logits, score), logits, idx


def _float64(scores, logits, idx, score):
    """(balance, z, d_scores, d_logits, scale) in float64 autograd for unit loss gradients; scale: the largest
    d_scores term before the sigmoid's cancellation, max_e (E f_e / T) / min_t s_t."""
    E = scores.shape[1]
    s64 = scores.double().requires_grad_()
    l64 = logits.double().requires_grad_()
    f = torch.bincount(idx.reshape(-1), minlength=E).double() / idx.numel()
    q = s64 if score == "softmax" else s64 / s64.sum(1, keepdim=True)
    lb = E * (f * q.mean(0)).sum()
    z = torch.logsumexp(l64, 1).square().mean()
    s = s64.detach().sum(1) if score == "sigmoid" else torch.ones(1, dtype=torch.float64, device=scores.device)
    scale = (E * f / scores.shape[0]).max() / s.min()
    return lb, z, torch.autograd.grad(lb, s64)[0], torch.autograd.grad(z, l64)[0], scale.item()


@pytest.mark.parametrize("T, E, K, score", CASES)
def test_losses_and_gradients_match_float64_and_the_reference(T, E, K, score):
    scores, logits, idx = _routing(T, E, K, score)
    lb, z = mok.fast.router_losses(scores, logits, idx, score)
    one = torch.ones((), device="cuda")
    d_s, d_l = mok.fast.router_losses_backward(one, one, scores, logits, idx, score)
    lb64, z64, d_s64, d_l64, scale = _float64(scores, logits, idx, score)
    # fp32 sums of positive terms, at most 64 + T/64 + E/256 + 8 deep: well inside 1e-5 relative
    torch.testing.assert_close(lb.double(), lb64, rtol=1e-5, atol=0)
    torch.testing.assert_close(z.double(), z64, rtol=1e-5, atol=0)
    # absolute slack at 1e-6 of the terms' scale: with K = E every sigmoid d_scores is 0 up to their cancellation
    torch.testing.assert_close(d_s.double(), d_s64, rtol=1e-5, atol=1e-6 * scale)
    torch.testing.assert_close(d_l.double(), d_l64, rtol=1e-5, atol=1e-5 * d_l64.abs().max().item())
    ref = losses.router_losses(scores, logits, idx, score)
    torch.testing.assert_close(lb, ref[0], rtol=2e-5, atol=0)
    torch.testing.assert_close(z, ref[1], rtol=2e-5, atol=0)


def test_loss_gradients_scale_with_the_incoming_gradients():
    """d_balance and d_z are read on the device: each scales only its own loss's gradient."""
    scores, logits, idx = _routing(500, 64, 6, "sigmoid")
    one, zero = torch.ones((), device="cuda"), torch.zeros((), device="cuda")
    d_s1, d_l1 = mok.fast.router_losses_backward(one, one, scores, logits, idx, "sigmoid")
    d_s, d_l = mok.fast.router_losses_backward(one * 0.5, zero, scores, logits, idx, "sigmoid")
    torch.testing.assert_close(d_s, d_s1 * 0.5, rtol=1e-6, atol=0)
    assert torch.count_nonzero(d_l) == 0
    d_s, d_l = mok.fast.router_losses_backward(zero, one * 4, scores, logits, idx, "sigmoid")
    assert torch.count_nonzero(d_s) == 0
    torch.testing.assert_close(d_l, d_l1 * 4, rtol=1e-6, atol=0)


@pytest.mark.parametrize("score", [
    "softmax",  # scores normalised over all experts: a row-wide sum
    "sigmoid",  # per-expert scores: each on its own
])
def test_reruns_are_bitwise_identical(score):
    scores, logits, idx = _routing(3000, 128, 8, score)
    d = torch.tensor(0.37, device="cuda"), torch.tensor(-1.5, device="cuda")
    first = (*mok.fast.router_losses(scores, logits, idx, score),
             *mok.fast.router_losses_backward(*d, scores, logits, idx, score))
    for _ in range(50):
        again = (*mok.fast.router_losses(scores, logits, idx, score),
                 *mok.fast.router_losses_backward(*d, scores, logits, idx, score))
        for name, a, b in zip(("balance", "z", "d_scores", "d_logits"), first, again, strict=True):
            assert_bitwise_equal(b, a, name)


def test_gradients_are_per_token_and_batch_invariant_for_fixed_statistics():
    """d_logits of a token depends on its own row only (the z-loss gradient's 1/T aside): the first rows of a
    batch get the same bits alone, scaled by the token count's ratio exactly (T and T/2: a power of two)."""
    scores, logits, idx = _routing(512, 64, 4, "softmax")
    one = torch.ones((), device="cuda")
    _, d_l = mok.fast.router_losses_backward(one, one, scores, logits, idx, "softmax")
    _, d_l_half = mok.fast.router_losses_backward(one * 0.5, one * 0.5, scores[:256], logits[:256], idx[:256],
                                                  "softmax")
    assert_bitwise_equal(d_l_half, d_l[:256], "d_logits of the first 256 tokens")


def test_no_tokens_gives_zeros_and_sizes_beyond_the_kernels_raise():
    empty = torch.zeros(0, 16, device="cuda")
    lb, z = mok.fast.router_losses(empty, empty, torch.zeros(0, 2, dtype=torch.int64, device="cuda"), "softmax")
    assert lb.item() == 0 and z.item() == 0
    scores, logits, idx = _routing(129, 8200, 4, "softmax")
    with pytest.raises(RuntimeError, match="router_losses: bad sizes"):
        mok.fast.router_losses(scores, logits, idx, "softmax")

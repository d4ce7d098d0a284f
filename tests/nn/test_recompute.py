"""Activation recomputation: bitwise the same gradients as saving the intermediates (W = 1 and W = 2),
and it really saves less."""

import pytest
import torch

import mok
from mok.testing.dist import launch
from mok.testing.memory import saved_activation_bytes
from mok.testing.bits import assert_bitwise_equal

H, I, E, K, S, T = 16, 8, 4, 2, 8, 10


def _grads(model, x, dy, router_losses=True):
    x = x.detach().clone().requires_grad_()
    y, rl = model(x, return_router_losses=True)
    loss = (y.float() * dy).sum()
    if router_losses:  # over the call's tokens: per rank with a group, so left out when comparing W
        loss = loss + 0.01 * rl.load_balance + 0.001 * rl.z
    loss.backward()
    return {"y": y.detach(), "d_x": x.grad, **{n: p.grad for n, p in model.named_parameters()}}


def _inputs(n_tokens):
    g = torch.Generator().manual_seed(5)
    return torch.randn(n_tokens, H, generator=g), torch.randn(n_tokens, H, generator=g)


@pytest.mark.parametrize("S_, score", [
    (S, "softmax"),   # shared expert
    (0, "sigmoid"),   # no shared expert, sigmoid router
])
def test_recompute_gives_bitwise_same_gradients(S_, score):
    x, dy = _inputs(T)
    out = {}
    for recompute in (False, True):
        torch.manual_seed(0)
        out[recompute] = _grads(mok.MoE(H, I, E, K, shared_intermediate_size=S_, score=score, recompute=recompute), x, dy)
    assert out[False].keys() == out[True].keys()
    for name in out[False]:
        assert_bitwise_equal(out[True][name], out[False][name], name)


def test_recompute_saves_less():
    x, _ = _inputs(64)
    sizes = {}
    for recompute in (False, True):
        torch.manual_seed(0)
        sizes[recompute] = saved_activation_bytes(mok.MoE(H, I, E, K, shared_intermediate_size=S, recompute=recompute), x)[0]
    # without recompute: o [T,K,H] bf16 + rows (f int64, g/u fp32, a bf16) [T*K, I] + shared g/u/a [T, S]
    intermediates = 64 * K * H * 2 + 64 * K * (8 + I * 10) + 64 * S * 10 + E * 8
    assert sizes[False] - sizes[True] == intermediates


def _worker(rank, world_size, group, recompute):
    torch.manual_seed(0)
    m = mok.MoE(H, I, E, K, shared_intermediate_size=S, group=group, recompute=recompute)
    x, dy = _inputs(2 * T)
    return _grads(m, x[rank * T:(rank + 1) * T], dy[rank * T:(rank + 1) * T], router_losses=False)


@pytest.mark.slow
def test_recompute_with_expert_parallelism_matches_single_process():
    """W = 2 (gloo) with and without recompute = W = 1: y, d_x, expert and shared gradients."""
    x, dy = _inputs(2 * T)
    torch.manual_seed(0)
    ref = _grads(mok.MoE(H, I, E, K, shared_intermediate_size=S), x, dy, router_losses=False)
    L = E // 2
    for recompute in (False, True):
        parts = launch(_worker, (recompute,), 2)  # 2 gloo processes (mok.testing.dist)
        for name in ("y", "d_x"):
            assert_bitwise_equal(torch.cat([p[name] for p in parts]), ref[name], f"{name} recompute={recompute}")
        for name in ("w_gate_up_L2IH", "w_down_LHI"):  # this rank's experts, rank order
            assert_bitwise_equal(torch.cat([p[name] for p in parts]), ref[name], f"{name} recompute={recompute}")
        for name in ("w_shared_gate_up_2SH", "w_shared_down_HS"):  # group totals on every rank
            for p in parts:
                assert_bitwise_equal(p[name], ref[name], f"{name} recompute={recompute}")
        assert parts[0]["w_gate_up_L2IH"].shape[0] == L

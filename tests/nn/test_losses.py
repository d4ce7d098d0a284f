"""mok.nn.losses: the router losses (load balancing, z-loss) and their hand-written backward passes
against float64 autograd, the balance loss's fixed point, and the exact log they use."""

import pytest
import torch

from mok import reference
from mok.testing.bits import assert_bitwise_equal
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


# ---------------------------------------------------------------- mok.router_losses: bad arguments


def _routing(T=6, E=4, K=2, score="softmax"):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(T, E, generator=g)
    idx, _ = reference.route(logits, K, score=score)
    return reference.router_scores(logits, score), logits, idx


def _with(idx, r, c, v):
    idx = idx.clone()
    idx[r, c] = v
    return idx


@pytest.mark.parametrize("change, exc, match", [
    # an unknown score: was computed as sigmoid
    (dict(score="relu"), ValueError, r"^score: expected one of \('softmax', 'sigmoid'\), got 'relu'"),
    # no score: was sigmoid too
    (dict(score=None), ValueError, r"^score: expected one of .*, got None"),
    # the module's "auto" is not an op backend
    (dict(backend="auto"), ValueError, r"^backend: expected one of \('reference', 'fast'\)"),
    # bf16 scores: the fast kernels read fp32
    (dict(scores=lambda s: s.bfloat16()), TypeError, "^scores: expected dtype torch.float32, got torch.bfloat16"),
    # fp64 scores
    (dict(scores=lambda s: s.double()), TypeError, "^scores: expected dtype torch.float32, got torch.float64"),
    # bf16 logits
    (dict(logits=lambda l: l.bfloat16()), TypeError, "^logits: expected dtype torch.float32, got torch.bfloat16"),
    # int32 ids
    (dict(topk_idx=lambda i: i.int()), TypeError, "^topk_idx: expected dtype torch.int64, got torch.int32"),
    # float ids
    (dict(topk_idx=lambda i: i.float()), TypeError, "^topk_idx: expected dtype torch.int64, got torch.float32"),
    # scores as a list
    (dict(scores=lambda s: s.tolist()), TypeError, "^scores: expected a torch.Tensor, got list"),
    # no ids
    (dict(topk_idx=None), TypeError, "^topk_idx: expected a torch.Tensor, got NoneType"),
    # 1-D scores
    (dict(scores=lambda s: s[0]), ValueError, r"^scores: expected 2 dimensions \[T, E\] with E >= 1, got shape \(4,\)"),
    # no experts: E = 0
    (dict(scores=lambda s: s[:, :0], logits=lambda l: l[:, :0]), ValueError, "^scores: .*E >= 1"),
    # logits for fewer tokens than scores: was accepted
    (dict(logits=lambda l: l[:3]), ValueError,
     r"^logits: expected shape \(6, 4\) \(the shape of scores\), got \(3, 4\)$"),
    # scores with fewer experts than logits
    (dict(scores=lambda s: s[:, :3]), ValueError, r"^logits: expected shape \(6, 3\)"),
    # ids of another batch (wrong T): was accepted
    (dict(topk_idx=lambda i: i[:2]), ValueError, r"^topk_idx: expected shape \(6, K\) .*, got \(2, 2\)"),
    # K = 0
    (dict(topk_idx=lambda i: i[:, :0]), ValueError, r"^topk_idx: .*1 <= K <= E = 4, got \(6, 0\)"),
    # 1-D ids
    (dict(topk_idx=lambda i: i[:, 0]), ValueError, r"^topk_idx: expected shape \(6, K\)"),
    # id = E, one past the end: a raw RuntimeError before
    (dict(topk_idx=lambda i: _with(i, 0, 1, 4)), ValueError, r"^topk_idx: .*\[0, 4\), got 4 at index \(0, 1\)"),
    # a negative id
    (dict(topk_idx=lambda i: _with(i, 3, 1, -1)), ValueError, r"^topk_idx: .*\[0, 4\), got -1 at index \(3, 1\)"),
    # logits on meta, scores real: the fake kernel's empty outputs before
    (dict(logits=lambda l: l.to("meta")), ValueError,
     r"^logits: expected device cpu \(the device of scores\), got meta"),
    # ids on meta
    (dict(topk_idx=lambda i: i.to("meta")), ValueError, r"^topk_idx: expected device cpu \(the device of scores\)"),
])
def test_router_losses_checks_every_argument(change, exc, match):
    from mok.nn import ops

    scores, logits, idx = _routing()
    args = {"scores": scores, "logits": logits, "topk_idx": idx}
    kw = {}
    for k, v in change.items():
        if k in args:
            args[k] = v(args[k]) if callable(v) else v
        else:
            kw[k] = v
    with pytest.raises(exc, match=match):
        ops.router_losses(args["scores"], args["logits"], args["topk_idx"], **kw)


def test_router_losses_accepts_no_tokens_and_all_meta():
    """T = 0 gives zeros; all-meta tensors (shape inference) go to the fake implementation."""
    from mok.nn import ops

    scores, logits, idx = _routing()
    lb, z = ops.router_losses(scores[:0], logits[:0], idx[:0])
    assert lb.item() == 0 and z.item() == 0
    lb, z = ops.router_losses(scores.to("meta"), logits.to("meta"), idx.to("meta"))
    assert lb.is_meta and z.is_meta


def test_fast_router_losses_are_nan_for_bad_ids_without_reading_them(monkeypatch):
    """The fast backend (its kernels skip ids outside [0, E)) checks ids on the device, as the fast layer does: every
    output, forward and backward, NaN for a bad id, without a host synchronisation; the same bits for good ids.
    Emulated on the CPU by a stand-in backend."""
    from types import SimpleNamespace

    from mok.nn import ops, router_ops

    fake = SimpleNamespace(router_losses=losses.router_losses, router_losses_backward=losses.router_losses_backward)
    monkeypatch.setattr(router_ops, "_impl", lambda backend: fake)
    scores, logits, idx = _routing()
    for ids, bad in ((idx, False), (_with(idx, 2, 0, 4), True), (_with(idx, 5, 1, -1), True)):
        s, l = scores.clone().requires_grad_(), logits.clone().requires_grad_()
        if bad:  # the stand-in would index out of range: the counts of the good ids, so the NaN is the check's
            fake.router_losses = lambda sc, lg, i, score: losses.router_losses(sc, lg, i.clamp(0, 3), score)
            fake.router_losses_backward = lambda *a: losses.router_losses_backward(*a[:4], a[4].clamp(0, 3), a[5])
        with monkeypatch.context() as host:
            for read in ("item", "__bool__", "tolist"):  # what a host-side check would call
                host.setattr(torch.Tensor, read, lambda self, *a, _r=read: pytest.fail(f"{_r}: read on the host"))
            lb, z = ops.router_losses(s, l, ids, backend="fast")
            (lb + z).backward()
        want = [*losses.router_losses(scores, logits, idx, "softmax")]
        for name, t, w in (("load_balance", lb, want[0]), ("z", z, want[1]), ("d_scores", s.grad, None),
                           ("d_logits", l.grad, None)):
            assert torch.isnan(t).all() if bad else not torch.isnan(t).any(), name
            if w is not None and not bad:
                assert torch.equal(t, w), name


@pytest.mark.parametrize("backend", [
    "reference",  # the check would read the ids on the host (a synchronisation on CUDA)
    "fast",  # the check would add device kernels each way (emulated by a stand-in backend)
])
def test_the_module_skips_the_id_check_of_its_own_routing_and_gives_the_same_bits(monkeypatch, backend):
    """mok.MoE's forward takes its router's ids, in range by construction, to `router_losses_of_router`: the checks
    are not run (they cost host time every step) and the losses and their gradients are those of the checked
    public `router_losses`."""
    from types import SimpleNamespace

    import mok
    from mok.nn import router_ops

    torch.manual_seed(0)
    m = mok.MoE(16, 8, 4, 2)
    r = m.route(torch.randn(6, 16))  # the reference router; the fast backend is a stand-in for the losses only
    scores, logits, idx = r.scores.detach(), r.logits.detach(), r.topk_idx
    fake = SimpleNamespace(router_losses=losses.router_losses, router_losses_backward=losses.router_losses_backward)
    monkeypatch.setattr(router_ops, "_impl", lambda b: fake)
    got, want = [], []
    for fn, out in ((router_ops.router_losses_of_router, got), (router_ops.router_losses, want)):
        s, l = scores.clone().requires_grad_(), logits.clone().requires_grad_()
        with monkeypatch.context() as p:
            if fn is router_ops.router_losses_of_router:
                for check in ("check_expert_ids", "_nan_if_bad_ids"):
                    p.setattr(router_ops, check, lambda *a, _c=check, **k: pytest.fail(f"{_c} ran on the router's ids"))
            lb, z = fn(s, l, idx, score=m.score, backend=backend)
            (lb + 2 * z).backward()
        out += [lb, z, s.grad, l.grad]
    for name, a, b in zip(("load_balance", "z", "d_scores", "d_logits"), got, want, strict=True):
        assert_bitwise_equal(a, b, name)


def test_module_forward_takes_the_unchecked_path_and_public_router_losses_the_checked_one(monkeypatch):
    """m(x, return_router_losses=True) runs no id check; m.router_losses(routing) (a Routing a user may have built)
    does; both give the same losses."""
    import mok
    from mok.nn import router_ops

    torch.manual_seed(0)
    m = mok.MoE(16, 8, 4, 2)
    x = torch.randn(6, 16)
    calls = []
    real = router_ops.check_expert_ids
    monkeypatch.setattr(router_ops, "check_expert_ids", lambda *a, **k: (calls.append(1), real(*a, **k)))
    _, (lb, z) = m(x, return_router_losses=True)
    assert calls == [], "the module's forward checked its own router's ids"
    lb2, z2 = m.router_losses(m.route(x))
    assert calls == [1], "the public router_losses did not check the ids"
    assert_bitwise_equal(lb, lb2, "load_balance")
    assert_bitwise_equal(z, z2, "z")

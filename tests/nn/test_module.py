"""mok.MoE: shapes, parameters, state_dict, backend choice, argument errors, agreement with the
functional reference, and the router's hand-written gradient (router losses: tests/nn/test_losses.py)."""

import logging

import pytest
import torch

import mok
from mok import reference
from mok.testing.bits import assert_bitwise_equal
from mok.nn import backend as nn_backend


def _moe(**kw):
    args = dict(hidden_size=16, intermediate_size=8, num_experts=4, top_k=2, shared_intermediate_size=8)
    args.update(kw)
    torch.manual_seed(0)
    return mok.MoE(**args)


@pytest.mark.parametrize("shape", [
    (5, 16),      # [T, H]
    (2, 3, 16),   # [B, S, H]
    (0, 16),      # no tokens
])
@pytest.mark.parametrize("dtype", [
    torch.float32,   # fp32 activations: y comes back in fp32
    torch.bfloat16,  # bf16 activations: y in bf16
])
def test_output_shape_and_dtype(shape, dtype):
    m = _moe()
    x = torch.randn(shape).to(dtype)
    y, rl = m(x, return_router_losses=True)
    assert y.shape == x.shape and y.dtype == dtype
    assert rl.load_balance.shape == () and rl.z.shape == ()


@pytest.mark.parametrize("S, expected", [
    (0, 4 * 16 + 3 * 4 * 8 * 16),             # router + routed experts only
    (8, 4 * 16 + 3 * 4 * 8 * 16 + 3 * 8 * 16),  # plus the shared expert
])
def test_parameter_count_and_names(S, expected):
    m = _moe(shared_intermediate_size=S)
    assert sum(p.numel() for p in m.parameters()) == expected
    names = {n for n, _ in m.named_parameters()}
    assert names == {"w_router_EH", "w_gate_up_L2IH", "w_down_LHI"} | (
        {"w_shared_gate_up_2SH", "w_shared_down_HS"} if S else set())
    # the gate and up names are views of the stacked parameters' halves
    for half, stacked, dim in (("w_gate_LIH", "w_gate_up_L2IH", 1), ("w_up_LIH", "w_gate_up_L2IH", 1),
                               ("w_shared_gate_SH", "w_shared_gate_up_2SH", 0),
                               ("w_shared_up_SH", "w_shared_gate_up_2SH", 0)):
        p = getattr(m, stacked)
        if p is None:
            assert getattr(m, half) is None
            continue
        i = half.endswith("up_LIH") or half.endswith("up_SH")
        assert getattr(m, half).data_ptr() == p.chunk(2, dim)[i].data_ptr() and getattr(m, half).shape == \
            p.chunk(2, dim)[i].shape, half


_PAIRS = (("w_gate_up_L2IH", ("w_gate_LIH", "w_up_LIH"), 1),  # (stacked parameter, mok 0.2's keys, stacking dim)
          ("w_shared_gate_up_2SH", ("w_shared_gate_SH", "w_shared_up_SH"), 0))


def test_a_dcp_checkpoint_with_separate_gate_and_up_loads_through_views(tmp_path):
    """docs/distributed.md's recipe for a DCP checkpoint of mok 0.2 (separate gate and up keys): load it into
    tensors shaped like the stacked parameters' halves, then copy them in; the same bits as the saved layer."""
    import torch.distributed.checkpoint as dcp

    a = _moe(shared_intermediate_size=8)
    old = dict(a.state_dict())
    for stacked, (gate, up), dim in _PAIRS:
        old[gate], old[up] = (t.clone() for t in old.pop(stacked).chunk(2, dim))
    dcp.save(old, checkpoint_id=str(tmp_path), no_dist=True)
    torch.manual_seed(5)
    b = mok.MoE(16, 8, 4, 2, shared_intermediate_size=8)
    sd = b.state_dict()
    for stacked, (gate, up), dim in _PAIRS:
        sd[gate], sd[up] = (torch.empty_like(h) for h in sd.pop(stacked).chunk(2, dim))
    dcp.load(sd, checkpoint_id=str(tmp_path), no_dist=True)
    with torch.no_grad():
        for stacked, (gate, up), dim in _PAIRS:
            getattr(b, stacked).copy_(torch.cat([sd[gate], sd[up]], dim))
    for (n, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert_bitwise_equal(q, p, n)


@pytest.mark.parametrize("S", [0, 8])  # without / with the shared expert
def test_a_state_dict_with_separate_gate_and_up_loads_stacked(S):
    """A checkpoint of mok 0.2 (separate w_gate_LIH / w_up_LIH and shared tensors) loads into the stacked
    parameters: the same module bits as loading its stacked form."""
    a = _moe(shared_intermediate_size=S)
    old = dict(a.state_dict())
    for stacked, (gate, up), dim in _PAIRS:
        if stacked in old:
            old[gate], old[up] = (t.clone() for t in old.pop(stacked).chunk(2, dim))
    torch.manual_seed(5)
    b = mok.MoE(16, 8, 4, 2, shared_intermediate_size=S)
    b.load_state_dict(old)
    for (n, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert_bitwise_equal(q, p, n)
    half = {k: v for k, v in old.items() if k != "w_up_LIH"}  # one of a pair alone: named, not guessed
    with pytest.raises(RuntimeError, match="w_gate_up_L2IH"):
        mok.MoE(16, 8, 4, 2, shared_intermediate_size=S).load_state_dict(half)


def test_state_dict_round_trip_gives_same_bits():
    a = _moe()
    torch.manual_seed(1)
    b = mok.MoE(16, 8, 4, 2, shared_intermediate_size=8)
    x = torch.randn(7, 16)
    assert not torch.equal(a(x), b(x))
    b.load_state_dict(a.state_dict())
    assert_bitwise_equal(b(x), a(x), "y after load_state_dict")


def test_seeded_init_is_reproducible_and_scaled():
    a, b = _moe(), _moe()
    for (n, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert_bitwise_equal(p, q, n)
    # fan-in scaling: std close to H^-0.5 for the gate, I^-0.5 for the down projection
    assert abs(a.w_gate_LIH.std().item() - 16**-0.5) < 0.05
    assert abs(a.w_down_LHI.std().item() - 8**-0.5) < 0.05


@pytest.mark.parametrize("S", [0, 8])  # without / with the shared expert
@pytest.mark.parametrize("score, normalize", [
    ("softmax", True),   # Qwen3-style: softmax scores, top-k weights renormalised
    ("sigmoid", False),  # sigmoid scores, raw top-k weights
])
def test_module_equals_functional_reference(S, score, normalize):
    """The module is the router + the reference layer: same y and weight gradients, bit for bit."""
    m = _moe(shared_intermediate_size=S, score=score, normalize=normalize, dtype=torch.bfloat16)
    x = torch.randn(9, 16).to(torch.bfloat16)
    dy = torch.randn(9, 16).to(torch.bfloat16)
    y = m(x)
    y.backward(dy)
    logits = reference.matmul_exact(x, m.w_router_EH.detach())
    idx, w = reference.route(logits, 2, score=score, normalize=normalize)
    sh = [getattr(m, n).detach() if S else None for n in ("w_shared_gate_SH", "w_shared_up_SH", "w_shared_down_HS")]
    y_ref, ctx = reference.forward(x, idx, w, *sh, m.w_gate_LIH.detach(), m.w_up_LIH.detach(),
                                   m.w_down_LHI.detach())
    assert_bitwise_equal(y, y_ref, "y")
    g = reference.backward(ctx, dy)
    d_gate, d_up = m.w_gate_up_L2IH.grad.chunk(2, dim=1)
    assert_bitwise_equal(d_gate, g[2].to(torch.bfloat16), "d_routed_gate")
    assert_bitwise_equal(d_up, g[3].to(torch.bfloat16), "d_routed_up")
    assert_bitwise_equal(m.w_down_LHI.grad, g[4].to(torch.bfloat16), "d_routed_down")
    if S:
        assert_bitwise_equal(m.w_shared_gate_up_2SH.grad, torch.cat([g[5], g[6]]).to(torch.bfloat16), "d_shared_gu")


def test_fp32_master_weights_get_unrounded_fp32_gradients():
    m = _moe()
    x = torch.randn(9, 16)
    m(x).float().square().sum().backward()
    grad = m.w_gate_up_L2IH.grad
    assert grad.dtype == torch.float32
    # an fp32 tree sum of exact products: not all values are bf16-representable
    assert not torch.equal(grad, grad.to(torch.bfloat16).float())


def test_rerun_gives_identical_bits():
    outs = []
    for _ in range(2):
        m = _moe()
        x = torch.randn(11, 16, generator=torch.Generator().manual_seed(3), requires_grad=True)
        y, rl = m(x, return_router_losses=True)
        (y.square().sum() + rl.load_balance + rl.z).backward()
        outs.append([y, x.grad] + [p.grad for p in m.parameters()])
    for i, (a, b) in enumerate(zip(*outs, strict=True)):
        assert_bitwise_equal(a, b, f"output {i}")


# ---------------------------------------------------------------- backend selection


def test_auto_backend_on_cpu_picks_reference_and_says_so(caplog):
    nn_backend._announced.clear()
    with caplog.at_level(logging.INFO, logger="mok"):
        m = _moe(backend="auto")
        _moe(backend="auto")
    assert m.backend_in_use == "reference"
    assert "CUDA" in m.backend_reason
    msgs = [r.getMessage() for r in caplog.records if "mok.MoE backend" in r.getMessage()]
    assert len(msgs) == 1, msgs  # logged once


@pytest.mark.parametrize("requested, expected", [
    ("reference", "reference"),  # asked for by name
    ("auto", "reference"),  # CPU
])
def test_backend_resolution(requested, expected):
    assert _moe(backend=requested).backend_in_use == expected


@pytest.mark.sm90
def test_auto_backend_follows_device():
    # on an sm_90 GPU with the fast path usable (conftest fails this test otherwise), "auto" must take it
    m = _moe(backend="auto").cuda()
    assert m.backend_in_use == "fast", m.backend_reason
    assert m.cpu().backend_in_use == "reference"


# ---------------------------------------------------------------- bad arguments


@pytest.mark.parametrize("kw, name, exc", [
    (dict(hidden_size=0), "hidden_size", ValueError),          # a zero size
    (dict(intermediate_size=2.5), "intermediate_size", TypeError),  # a float size: a wrong type
    (dict(intermediate_size=2.0), "intermediate_size", TypeError),  # an integral float is still a float
    (dict(hidden_size="8"), "hidden_size", TypeError),         # a size as a string
    (dict(num_experts=True), "num_experts", TypeError),        # a bool is not an int here
    (dict(top_k=5), "top_k", ValueError),                      # K > E
    (dict(top_k=0), "top_k", ValueError),                      # no experts per token
    (dict(top_k=None), "top_k", TypeError),                    # no K
    (dict(shared_intermediate_size=-1), "shared_intermediate_size", ValueError),  # negative (0: no shared expert)
    (dict(shared_intermediate_size=0.5), "shared_intermediate_size", TypeError),  # a float S
    (dict(score="relu"), "score", ValueError),                 # unknown score
    (dict(normalize=1), "normalize", TypeError),               # an int, not a bool
    (dict(backend="triton"), "backend", ValueError),           # unknown backend
    (dict(recompute="yes"), "recompute", TypeError),           # a truthy string, not a bool
    (dict(dtype=torch.float16), "dtype", TypeError),           # fp16: only fp32 and bf16 weights
])
def test_bad_constructor_arguments_name_the_argument(kw, name, exc):
    """TypeError for a wrong type, ValueError for a wrong value (docs/bad_input.md), as PyTorch does."""
    with pytest.raises(exc, match=f"^{name}: expected"):
        _moe(**kw)


@pytest.mark.parametrize("value", [
    "no",   # a truthy string: losses were returned
    1,      # an int
    None,   # None: was taken as False
])
def test_return_router_losses_must_be_a_bool(value):
    with pytest.raises(TypeError, match=f"^return_router_losses: expected a bool, got {value!r}$"):
        _moe()(torch.randn(3, 16), return_router_losses=value)


@pytest.mark.parametrize("call", [
    "forward",  # y from uninitialised memory before
    "route",    # garbage expert ids before
])
def test_meta_parameters_with_real_x_say_to_materialise_first(call):
    m = mok.MoE(16, 8, 4, 2, shared_intermediate_size=8, device="meta")
    with pytest.raises(ValueError, match=r"^x: expected device meta .* got cpu: .*to_empty\(device=...\) then "
                                         r"reset_parameters\(\)"):
        getattr(m, call)(torch.randn(4, 16))


@pytest.mark.parametrize("call", [
    "forward",          # the whole layer
    "route",            # the router alone
    "compute_experts",  # the experts alone
])
def test_x_on_another_device_than_the_parameters(call):
    m = _moe()
    x = torch.randn(4, 16, device="meta")
    args = (x, torch.zeros(4, 2, dtype=torch.int64), torch.ones(4, 2)) if call == "compute_experts" else (x,)
    with pytest.raises(ValueError, match=r"^x: expected device cpu \(the device of the module's parameters\), "
                                         r"got meta$"):
        getattr(m, call)(*args)


def test_all_meta_module_gives_shapes():
    """A meta-built module on meta x (shape inference) still works: meta outputs of the right shapes."""
    m = mok.MoE(16, 8, 4, 2, shared_intermediate_size=8, device="meta")
    y, rl = m(torch.empty(2, 3, 16, device="meta"), return_router_losses=True)
    assert y.is_meta and y.shape == (2, 3, 16) and rl.z.is_meta
    r = m.route(torch.empty(5, 16, device="meta"))
    assert r.topk_idx.is_meta and r.topk_idx.shape == (5, 2)


@pytest.mark.parametrize("x, exc, match", [
    (torch.randn(4, 15), ValueError, r"^x: expected shape \(\.\.\., 16\), got \(4, 15\)$"),  # wrong H: blamed weight
    (torch.randn(2, 4, 16), ValueError, r"^x: expected 2 dimensions \[T, 16\], got shape \(2, 4, 16\)$"),  # [B, T, H]
    (torch.randn(4, 16).double(), TypeError, "^x: expected dtype torch.float32 or torch.bfloat16"),  # fp64 tokens
    ([[0.0] * 16], TypeError, "^x: expected a torch.Tensor, got list"),  # not a tensor
])
def test_route_checks_x(x, exc, match):
    with pytest.raises(exc, match=match):
        _moe().route(x)


@pytest.mark.parametrize("generator, actual", [
    ("x", "str 'x'"),  # a string: AttributeError before
    (0, "int 0"),      # a seed instead of a generator
])
def test_reset_parameters_generator_must_be_a_generator(generator, actual):
    with pytest.raises(TypeError, match=f"^generator: expected a torch.Generator or None, got {actual}$"):
        _moe().reset_parameters(generator=generator)
    with pytest.raises(TypeError, match="^generator: "):  # also on meta, where nothing is drawn
        mok.MoE(16, 8, 4, 2, device="meta").reset_parameters(generator=generator)


@pytest.mark.parametrize("gate_key, up_key, gate_shape, up_shape", [
    # mok 0.2 routed pair with I 7 and 9: 7 + 9 = 2 * 8 stacked into a wrong gate/up split before
    ("w_gate_LIH", "w_up_LIH", (4, 7, 16), (4, 9, 16)),
    # routed pair with different H: a raw torch.cat error before
    ("w_gate_LIH", "w_up_LIH", (4, 8, 16), (4, 8, 15)),
    # the shared pair with S 6 and 10
    ("w_shared_gate_SH", "w_shared_up_SH", (6, 16), (10, 16)),
])
def test_an_old_checkpoint_with_gate_and_up_of_different_shapes_is_refused(gate_key, up_key, gate_shape, up_shape):
    old = dict(_moe().state_dict())
    for stacked, (gate, up), dim in _PAIRS:
        old[gate], old[up] = (t.clone() for t in old.pop(stacked).chunk(2, dim))
    old[gate_key], old[up_key] = torch.zeros(gate_shape), torch.zeros(up_shape)
    m = _moe()
    before = [p.clone() for p in m.parameters()]
    with pytest.raises(ValueError, match=rf"^{gate_key}, {up_key}: expected a gate and an up weight of one shape, "
                                         rf"got \({', '.join(map(str, gate_shape))},?\) and"):
        m.load_state_dict(old)
    for p, q in zip(m.parameters(), before, strict=True):
        assert torch.equal(p, q)  # nothing loaded


@pytest.mark.parametrize("x, msg", [
    (torch.randn(3, 15), r"x: expected shape \(\.\.\., 16\), got \(3, 15\)"),  # last dim not H
    (torch.randn(3, 16).half(), "x: expected dtype torch.float32 or torch.bfloat16, got torch.float16"),  # fp16
    ("tokens", "x: expected a torch.Tensor, got str"),  # not a tensor
])
def test_bad_input_names_x(x, msg):
    with pytest.raises((ValueError, TypeError), match=msg):
        _moe()(x)


def test_explicit_fast_on_cpu_is_pending_with_reason():
    # explicit "fast" on the CPU is accepted (the module may move to a GPU later) but says why it cannot run yet
    m = _moe(backend="fast")
    assert m.backend_in_use == "fast" and "not runnable yet" in m.backend_reason


def test_fast_status_refuses_unaligned_sizes():
    # the size rule is checked before the device is looked at, so it runs (and must say why) without a GPU
    ok, reason = nn_backend.fast_status(torch.device("cuda"), sizes=(16, 12, 0))
    assert not ok
    assert "multiples of 8" in reason and "I=12" in reason, reason


def test_auto_does_not_pick_unproven_fast_expert_parallelism(monkeypatch):
    """With W > 1, "auto" stays on the reference (saying why) until FAST_EP_PROVEN; "fast" is taken as asked."""
    monkeypatch.setattr(nn_backend, "fast_status", lambda device, **layer: (True, "usable"))
    monkeypatch.setattr(nn_backend, "FAST_EP_PROVEN", False)
    cuda = torch.device("cuda")
    picked, why = nn_backend.resolve("auto", cuda, world_size=2)
    assert picked == "reference" and "not yet proven" in why and "backend='fast'" in why
    assert nn_backend.resolve("fast", cuda, world_size=2) == ("fast", "requested")
    assert nn_backend.resolve("auto", cuda, world_size=1) == ("fast", "usable")
    monkeypatch.setattr(nn_backend, "FAST_EP_PROVEN", True)
    assert nn_backend.resolve("auto", cuda, world_size=2) == ("fast", "usable")


# ---------------------------------------------------------------- hand-written gradients


def _route64(logits, idx, score, normalize):
    l = logits.double()
    p = torch.softmax(l, dim=1) if score == "softmax" else torch.sigmoid(l)
    pk = torch.gather(p, 1, idx)
    return (pk / pk.sum(1, keepdim=True) if normalize else pk), p


@pytest.mark.parametrize("score, normalize", [
    ("softmax", True),   # each score with and without renormalisation: the quotient rule through the softmax
    ("softmax", False),  # the softmax's own Jacobian alone
    ("sigmoid", True),   # per-expert sigmoid, then the quotient rule
    ("sigmoid", False),  # the sigmoid's derivative alone
])
def test_route_backward_matches_float64_autograd(score, normalize):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(13, 6, generator=g)
    idx, _ = reference.route(logits, 3, score=score, normalize=normalize)
    dw, ds = torch.randn(13, 3, generator=g), torch.randn(13, 6, generator=g)
    got = reference.route_backward(reference.router_scores(logits, score), idx, dw, ds, score, normalize)
    l64 = logits.double().requires_grad_()
    w64, p64 = _route64(l64, idx, score, normalize)
    (want,) = torch.autograd.grad((w64, p64), l64, (dw.double(), ds.double()))
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)

"""The custom ops: torch.library.opcheck for each, and torch.compile(fullgraph=True) = eager, bitwise."""

import pytest
import torch

import mok
from mok.nn import _op_common, ops, router_ops
from mok.testing.bits import assert_bitwise_equal
from mok.testing.cases import MoEConfig, make_inputs


def _req(t):
    return None if t is None else t.detach().clone().requires_grad_()


def _layer_args(S, weight_dtype=torch.bfloat16, x_dtype=torch.bfloat16):
    inp = make_inputs(MoEConfig(T=12, H=16, I=8, E=4, K=2, S=S), seed=0)
    ws = [None if inp[n] is None else inp[n].to(weight_dtype) for n in
          ("shared_gate", "shared_up", "shared_down", "routed_gate", "routed_up", "routed_down")]
    return [_req(inp["x"].to(x_dtype)), inp["topk_idx"], _req(inp["topk_weight"]), *map(_req, ws)], inp["dy"]


@pytest.mark.parametrize("S, weight_dtype, x_dtype, recompute", [
    (8, torch.bfloat16, torch.bfloat16, False),  # shared expert, bf16 everything, saved intermediates
    (8, torch.float32, torch.float32, False),    # fp32 master weights and fp32 activations
    (0, torch.bfloat16, torch.bfloat16, False),  # no shared expert
    (8, torch.float32, torch.bfloat16, True),    # recompute: only inputs saved
])
def test_opcheck_moe(S, weight_dtype, x_dtype, recompute):
    args, dy = _layer_args(S, weight_dtype, x_dtype)
    torch.library.opcheck(ops.moe_fwd, (*args, None, "reference", recompute, "bf16"))
    plain = [_detach(a) for a in args]
    out = [t.detach() for t in ops.moe_fwd(*plain, None, "reference", recompute, "bf16")]
    x, _, _, sg, su, sd, rg, ru, rd = plain
    bf16 = torch.bfloat16
    want = [x.to(bf16)] if x.dtype == torch.float32 else []  # the bf16 copies forward makes, once
    if weight_dtype == torch.float32:  # a gate/up pair as one [gate; up] tensor, gate rows first
        want += ([torch.cat([sg, su]).to(bf16), sd.to(bf16)] if S else []) + [torch.cat([rg, ru], 1).to(bf16),
                                                                              rd.to(bf16)]
    casts, saved = out[1:1 + len(want)], out[1 + len(want):]
    assert len(saved) == (0 if recompute else 9)  # recompute saves no intermediates
    for c, w in zip(casts, want, strict=True):
        assert c.dtype == bf16 and torch.equal(c, w)
    bf16_args = list(plain)
    if x.dtype == torch.float32:
        bf16_args[0] = casts.pop(0)
    if weight_dtype == torch.float32:  # backward gets the halves as views of the saved pair
        pairs = iter(casts)
        if S:
            bf16_args[3:5], bf16_args[5] = next(pairs).chunk(2), next(pairs)
        bf16_args[6:8], bf16_args[8] = next(pairs).chunk(2, 1), next(pairs)
    for bf16_grads in (False, True):  # fp32 weight gradients / bf16 ones (for bf16 parameters)
        torch.library.opcheck(ops.moe_bwd, (dy, *bf16_args, saved, None, "reference", recompute, bf16_grads,
                                            False, False))


def _stacked(gate, up, dim):
    return None if gate is None else torch.cat([gate, up], dim).detach().requires_grad_()


@pytest.mark.parametrize("S, weight_dtype, recompute", [
    (8, torch.bfloat16, False),  # shared expert, bf16 weights (used as given: the halves are views)
    (8, torch.float32, False),   # fp32 master weights: each stacked tensor rounded to bf16 as one
    (0, torch.bfloat16, False),  # no shared expert
    (8, torch.float32, True),    # recompute: only inputs saved
])
def test_moe_gate_up_is_moe_on_the_halves_with_one_gradient_per_stacked_tensor(S, weight_dtype, recompute):
    """ops.moe_gate_up (gate and up as one [gate; up] tensor): y, d_x, d_topk_weight and d_down bitwise those of
    ops.moe on the separate tensors, and each stacked tensor's gradient is [d_gate; d_up] bitwise; opcheck of
    both ops in that form."""
    args, dy = _layer_args(S, weight_dtype)
    x, idx, w, sg, su, sd, rg, ru, rd = args
    sgu, rgu = _stacked(sg, su, 0), _stacked(rg, ru, 1)
    leaves = [_req(t) for t in (x, w, sd, rd)]
    y = ops.moe(x, idx, w, sg, su, sd, rg, ru, rd, recompute=recompute)
    y.backward(dy)
    y2 = ops.moe_gate_up(leaves[0], idx, leaves[1], sgu, leaves[2], rgu, leaves[3], recompute=recompute)
    y2.backward(dy)
    assert_bitwise_equal(y2, y, "y")
    for name, got, want in (("d_x", leaves[0], x), ("d_topk_weight", leaves[1], w), ("d_routed_down", leaves[3], rd),
                            ("d_shared_down", leaves[2], sd)):
        if want is not None:
            assert_bitwise_equal(got.grad, want.grad, name)
    assert rgu.grad.dtype == weight_dtype
    assert_bitwise_equal(rgu.grad, torch.cat([rg.grad, ru.grad], 1), "d_routed_gate_up")
    if S:
        assert_bitwise_equal(sgu.grad, torch.cat([sg.grad, su.grad], 0), "d_shared_gate_up")
    fwd_args = (x, idx, w, sgu, None, sd, rgu, None, rd, None, "reference", recompute, "bf16")
    torch.library.opcheck(ops.moe_fwd, fwd_args)
    out = [t.detach() for t in ops.moe_fwd(*[_detach(a) if isinstance(a, torch.Tensor) else a for a in fwd_args])]
    n_casts = (2 if S else 1) * 2 if weight_dtype == torch.float32 else 0  # each stacked tensor and each down
    casts, saved = out[1:1 + n_casts], out[1 + n_casts:]
    bf16 = [_detach(t) for t in (sgu, sd, rgu, rd)]
    if weight_dtype == torch.float32:
        bf16 = ([casts[0], casts[1]] if S else [None, None]) + casts[-2:]
    sg16, su16 = bf16[0].chunk(2) if S else (None, None)
    rg16, ru16 = bf16[2].chunk(2, 1)
    bwd_args = (dy, x.detach().to(torch.bfloat16), idx, w.detach(), sg16, su16, bf16[1], rg16, ru16, bf16[3], saved,
                None, "reference", recompute, weight_dtype == torch.bfloat16, bool(S), True)
    torch.library.opcheck(ops.moe_bwd, bwd_args)
    grads = ops.moe_bwd(*bwd_args)
    assert tuple(grads[2].shape) == tuple(rgu.shape) and grads[3].numel() == 0  # [d_gate; d_up], then nothing


@pytest.mark.parametrize("bad, match", [
    # an odd 2I = 7: no gate and up halves
    (dict(routed_gate_up_L2IH=torch.zeros(4, 7, 16)), "routed_gate_up_L2IH: expected 3 dimensions with an even"),
    # 2-D: no expert dimension
    (dict(routed_gate_up_L2IH=torch.zeros(8, 16)), "routed_gate_up_L2IH: expected 3 dimensions"),
    # the shared [gate; up] with an odd 2S = 15
    (dict(shared_gate_up_2SH=torch.zeros(15, 16)), "shared_gate_up_2SH: expected 2 dimensions with an even"),
    # the shared [gate; up] without its down weight
    (dict(shared_down_HS=None), "shared_gate_up_2SH, shared_down_HS: expected both tensors or both None"),
])
def test_moe_gate_up_rejects_a_stacked_tensor_it_cannot_split(bad, match):
    args, _ = _layer_args(8)
    x, idx, w, sg, su, sd, rg, ru, rd = args
    kw = dict(shared_gate_up_2SH=torch.cat([sg, su]).detach(), shared_down_HS=sd,
              routed_gate_up_L2IH=torch.cat([rg, ru], 1).detach(), routed_down_LHI=rd)
    kw.update(bad)
    with pytest.raises(ValueError, match=match):
        ops.moe_gate_up(x, idx, w, **kw)


def test_moe_rejects_a_missing_up_weight():
    """None for an up weight in ops.moe is a mistake (the stacked form is ops.moe_gate_up), not a stacked gate."""
    args, _ = _layer_args(8)
    for i, name in ((7, "routed_up_LIH"), (4, "shared_up_SH")):
        bad = list(args)
        bad[i] = None
        with pytest.raises(ValueError, match=name):
            ops.moe(*bad)


def _detach(t):
    return None if t is None else t.detach()


@pytest.mark.parametrize("score, normalize, x_dtype", [
    ("softmax", True, torch.bfloat16),   # Qwen-style router
    ("sigmoid", False, torch.float32),   # sigmoid scores, raw weights, fp32 input
])
def test_opcheck_router_and_losses(score, normalize, x_dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(10, 16, generator=g).to(x_dtype)
    w = torch.randn(6, 16, generator=g) * 0.25
    torch.library.opcheck(ops.router_fwd, (_req(x), _req(w), 3, score, normalize, "reference"))
    tw, idx, sc, lg, *_ = ops.router_fwd(x, w, 3, score, normalize, "reference")
    x16, w16 = x.to(torch.bfloat16), w.to(torch.bfloat16)
    torch.library.opcheck(ops.router_bwd, (x16, w16, sc, idx, torch.randn_like(tw), torch.randn_like(sc),
                                           torch.randn_like(lg), score, normalize, "reference"))
    torch.library.opcheck(ops.router_bwd, (x16, w16, sc, idx, None, None, None, score, normalize, "reference"))
    one = torch.tensor(1.0)
    for check_ids in (True, False):  # the public router_losses; the module's own routing (router_losses_of_router)
        torch.library.opcheck(ops.router_losses_fwd, (_req(sc), _req(lg), idx, score, "reference", check_ids))
        torch.library.opcheck(ops.router_losses_bwd, (one, one, sc, lg, idx, score, "reference", check_ids))


def _run(model, x, dy, params_of):
    x = x.detach().clone().requires_grad_()
    params_of.zero_grad(set_to_none=True)
    y, rl = model(x, return_router_losses=True)
    loss = (y.float() * dy.float()).sum() + 0.01 * rl.load_balance + 0.001 * rl.z
    loss.backward()
    return {"y": y, "load_balance": rl.load_balance, "z": rl.z, "d_x": x.grad,
            **{f"d_{n}": p.grad for n, p in params_of.named_parameters()}}


@pytest.mark.parametrize("kw, x_dtype", [
    (dict(shared_intermediate_size=8), torch.float32),                             # fp32 master weights + activations
    (dict(score="sigmoid", normalize=False, dtype=torch.bfloat16), torch.bfloat16),  # bf16 params, no shared expert
    (dict(shared_intermediate_size=8, recompute=True), torch.bfloat16),            # recompute path
])
def test_compile_fullgraph_equals_eager_bitwise(kw, x_dtype):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = mok.MoE(16, 8, 4, 2, **kw)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, 16, generator=g).to(x_dtype)
    dy = torch.randn(3, 5, 16, generator=g)
    eager = _run(model, x, dy, model)
    compiled = _run(torch.compile(model, fullgraph=True), x, dy, model)
    assert eager.keys() == compiled.keys()
    for name, t in eager.items():
        assert t is not None, name
        assert_bitwise_equal(compiled[name], t, name)


def test_functional_moe_rejects_unknown_backend():
    args, _ = _layer_args(0)
    with pytest.raises(ValueError, match="backend: expected one of"):
        ops.moe(*args, backend="cuda")


def test_weight_dtype_is_checked():
    args, _ = _layer_args(0, weight_dtype=torch.float16)
    with pytest.raises(TypeError, match="routed_gate: expected dtype torch.float32 or torch.bfloat16, got torch.float16"):
        ops.moe(*args)


def _step_via(model, x, dy, eager: bool, monkeypatch):
    """`_run` with plain eager calls taking the eager Functions (eager) or the registered custom ops, and the names of
    the ops that ran."""
    ran = []
    for module, names in ((router_ops, ("router_fwd", "router_bwd", "router_losses_fwd", "router_losses_bwd")),
                          (ops, ("moe_fwd", "moe_bwd"))):
        for name in names:
            op = getattr(module, name)
            monkeypatch.setattr(module, name, lambda *a, _op=op, _name=name: (ran.append(_name), _op(*a))[1])
    monkeypatch.setattr(_op_common, "_EAGER", eager)
    out = _run(model, x, dy, model)
    monkeypatch.undo()
    return out, ran


def test_eager_calls_skip_the_custom_ops_with_their_bits(monkeypatch):
    """Eager calls run the ops' bodies through a torch.autograd.Function (no torch.library autograd wrapper: its host
    time mattered at small batches); the registered ops, which torch.compile sees, give the same bits."""
    torch.manual_seed(0)
    model = mok.MoE(16, 8, 4, 2, shared_intermediate_size=8)
    g = torch.Generator().manual_seed(1)
    x, dy = torch.randn(7, 16, generator=g), torch.randn(7, 16, generator=g)
    eager, ran = _step_via(model, x, dy, True, monkeypatch)
    assert ran == []
    via_ops, ran = _step_via(model, x, dy, False, monkeypatch)
    assert sorted(ran) == sorted(["router_fwd", "moe_fwd", "router_losses_fwd", "moe_bwd", "router_losses_bwd",
                                  "router_bwd"])
    for name, t in eager.items():
        assert_bitwise_equal(via_ops[name], t, name)


def test_tensor_subclasses_take_the_registered_ops():
    """Fake tensors (as tracing uses) go to the custom ops and their fake implementations, never to the bodies."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    args, _ = _layer_args(8)
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        y = ops.moe(*fake)
    assert type(y).__name__ == "FakeTensor" and y.shape == args[0].shape


# ---------------------------------------------------------------- bad arguments of the functional ops


def _router_inputs(T=6, H=16, E=4):
    g = torch.Generator().manual_seed(2)
    return torch.randn(T, H, generator=g), torch.randn(E, H, generator=g)


def _meta(args, i):
    """args with the tensor at position i moved to the meta device."""
    out = list(args)
    out[i] = out[i].to("meta")
    return out


@pytest.mark.parametrize("i, name", [
    (1, "topk_idx"),     # ids on meta: the fake kernel would hand back uninitialised memory as y
    (2, "topk_weight"),  # routing weights elsewhere
    (3, "shared_gate"),  # a shared weight elsewhere
    (6, "routed_gate"),  # an expert weight on meta
    (8, "routed_down"),  # the last argument checked too
])
def test_moe_refuses_tensors_on_another_device_than_x(i, name):
    args, _ = _layer_args(8)
    with pytest.raises(ValueError, match=rf"^{name}: expected device cpu \(the device of x\), got meta$"):
        ops.moe(*_meta(args, i))


def test_moe_with_x_alone_on_meta_names_the_first_other_tensor():
    args, _ = _layer_args(8)
    with pytest.raises(ValueError, match=r"^topk_idx: expected device meta \(the device of x\), got cpu$"):
        ops.moe(*_meta(args, 0))


@pytest.mark.parametrize("name", [
    "routed_gate_up_L2IH",  # the stacked expert weight on meta
    "shared_down",          # the shared down weight on meta
])
def test_moe_gate_up_refuses_tensors_on_another_device_than_x(name):
    args, _ = _layer_args(8)
    x, idx, w, sg, su, sd, rg, ru, rd = args
    kw = dict(shared_gate_up_2SH=torch.cat([sg, su]).detach(), shared_down=sd.detach(),
              routed_gate_up_L2IH=torch.cat([rg, ru], 1).detach(), routed_down=rd)
    kw[name] = kw[name].to("meta")
    with pytest.raises(ValueError, match=rf"^{name}: expected device cpu \(the device of x\), got meta$"):
        ops.moe_gate_up(x, idx, w, kw["shared_gate_up_2SH"], kw["shared_down"], kw["routed_gate_up_L2IH"],
                        kw["routed_down"])


@pytest.mark.parametrize("moved, name, expected", [
    ("weight", "weight", "cpu"),  # the gate weight on meta: garbage ids before
    ("x", "weight", "meta"),      # x alone on meta: the weight differs from x
])
def test_router_refuses_tensors_on_different_devices(moved, name, expected):
    x, w = _router_inputs()
    args = {"x": x, "weight": w}
    args[moved] = args[moved].to("meta")
    with pytest.raises(ValueError, match=rf"^{name}: expected device {expected} \(the device of x\)"):
        ops.router(args["x"], args["weight"], 2)


def test_all_meta_calls_still_give_shapes():
    """Meta-device shape inference (every tensor on meta) goes to the fake implementations, as before."""
    x, w = (t.to("meta") for t in _router_inputs())
    idx, tw, sc, lg = ops.router(x, w, 2)
    assert idx.is_meta and idx.shape == (6, 2) and sc.shape == (6, 4)
    lb, z = ops.router_losses(sc, lg, idx)
    assert lb.is_meta and lb.shape == () and z.shape == ()
    args, _ = _layer_args(8)
    meta = [a.detach().to("meta") for a in args]
    assert ops.moe(*meta).is_meta
    x, idx, tw, sg, su, sd, rg, ru, rd = meta
    y = ops.moe_gate_up(x, idx, tw, torch.cat([sg, su]), sd, torch.cat([rg, ru], 1), rd)
    assert y.is_meta and y.shape == x.shape


@pytest.mark.parametrize("backend", [
    "reference",  # checked before the reference's own checks
    "fast",       # the fast path checks none of these (score "relu" would be sigmoid, k=True K = 1): refused first
])
@pytest.mark.parametrize("kw, exc, match", [
    (dict(score="relu"), ValueError, r"^score: expected one of \('softmax', 'sigmoid'\), got 'relu'"),  # bad score
    (dict(score=None), ValueError, "^score: expected one of"),               # no score
    (dict(k=True), TypeError, r"^k: expected an int in \[1, E = 4\], got bool True"),  # a bool for k
    (dict(k=2.0), TypeError, "^k: expected an int .* got float 2.0"),        # a float k
    (dict(k=0), ValueError, r"^k: expected an int in \[1, E = 4\], got 0"),  # k below 1
    (dict(k=5), ValueError, r"^k: expected an int in \[1, E = 4\], got 5"),  # k above E
    (dict(normalize=1), TypeError, "^normalize: expected a bool, got 1"),    # an int for normalize
    (dict(x=None), TypeError, "^x: expected a torch.Tensor, got NoneType"),  # no x
    (dict(weight=[[0.0] * 16] * 4), TypeError, "^weight: expected a torch.Tensor, got list"),  # weight as a list
    (dict(x="half"), TypeError, "^x: expected a torch.Tensor, got str"),     # a string
    (dict(H=0), ValueError, r"^x: expected H >= 1, got shape \(6, 0\)"),     # no features: arbitrary routing before
    (dict(x_dtype=torch.float16), TypeError, "^x: expected dtype torch.float32 or torch.bfloat16"),  # fp16 x
    (dict(E=0), ValueError, r"^weight: expected shape \(E, 16\) with E >= 1, got \(0, 16\)"),  # no experts
])
def test_router_checks_every_argument_before_dispatch(backend, kw, exc, match):
    kw = dict(kw)
    x, w = _router_inputs(H=kw.pop("H", 16), E=kw.pop("E", 4))
    x = x.to(kw.pop("x_dtype", x.dtype))
    args = {"x": x, "weight": w, "k": 2, **kw}
    with pytest.raises(exc, match=match):
        ops.router(args.pop("x"), args.pop("weight"), args.pop("k"), backend=backend, **args)


@pytest.mark.parametrize("kw, exc, match", [
    (dict(x=[[0.0]]), TypeError, "^x: expected a torch.Tensor, got list"),  # x as a list: AttributeError before
    (dict(group="g"), TypeError, "^group: expected a torch.distributed ProcessGroup or None, got str 'g'"),  # a name
    (dict(group=0), TypeError, "^group: expected a torch.distributed ProcessGroup or None, got int 0"),  # a world size
    (dict(routed_down=None), TypeError, "^routed_down: expected a torch.Tensor, got NoneType"),  # a missing weight
])
def test_moe_bad_types_name_the_argument(kw, exc, match):
    args, _ = _layer_args(8)
    names = ("x", "topk_idx", "topk_weight", "shared_gate", "shared_up", "shared_down", "routed_gate", "routed_up",
             "routed_down")
    pos = dict(zip(names, args))
    opts = {k: kw[k] for k in kw if k not in pos}
    pos.update({k: v for k, v in kw.items() if k in pos})
    with pytest.raises(exc, match=match):
        ops.moe(*pos.values(), **opts)
    if "group" in opts:  # the stacked form takes the same check
        x, idx, w, sg, su, sd, rg, ru, rd = args
        with pytest.raises(exc, match=match):
            ops.moe_gate_up(x, idx, w, None, None, torch.cat([rg, ru], 1), rd, **opts)

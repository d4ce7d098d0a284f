"""`mok.MoE` on the fast backend, as a user trains with it: the forward runs once (backward uses the
saved context unless recompute=True), weights are cast at most once per step (never when bf16),
reruns and torch.compile(fullgraph=True) give eager's bits, and the kernels build on the first
forward, not in the constructor."""
import os
import subprocess
import sys

import pytest
import torch

import mok
import mok.fast
from mok.testing.bits import assert_bitwise_equal
from mok.nn import ops

pytestmark = [pytest.mark.gpu, pytest.mark.sm90]

H, I, E, K, S, T = 256, 128, 16, 4, 64, 300


def _model(dtype, **kw):
    torch.manual_seed(0)
    return mok.MoE(H, I, E, K, shared_intermediate_size=S, backend="fast", dtype=dtype, **kw).cuda()


def _step(model, x, dy):
    """One forward+backward with both router losses; every output and gradient."""
    x = x.detach().clone().requires_grad_()
    model.zero_grad(set_to_none=True)
    y, rl = model(x, return_router_losses=True)
    ((y.float() * dy).sum() + 0.01 * rl.load_balance + 0.001 * rl.z).backward()
    out = {"y": y, "lb": rl.load_balance, "z": rl.z, "d_x": x.grad,
           **{"d_" + n.removeprefix("_orig_mod."): p.grad for n, p in model.named_parameters()}}
    return {k: v.detach().clone() for k, v in out.items()}  # later steps may accumulate into .grad


def _data(x_dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(1)
    return (torch.randn(T, H, generator=g, device="cuda").to(x_dtype),
            torch.randn(T, H, generator=g, device="cuda"))


@pytest.mark.parametrize("dtype, recompute, forwards_in_backward", [
    (torch.bfloat16, False, 0),  # bf16 parameters: the saved context is used
    (torch.float32, False, 0),   # fp32 master weights: same
    (torch.bfloat16, True, 1),   # recompute: the forward runs again, by request
])
def test_backward_runs_the_forward_only_when_recomputing(monkeypatch, dtype, recompute, forwards_in_backward):
    model = _model(dtype, recompute=recompute)
    x, dy = _data()
    calls = []
    real = mok.fast.forward
    monkeypatch.setattr(mok.fast, "forward", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    y, rl = model(x, return_router_losses=True)
    assert len(calls) == 1
    ((y.float() * dy).sum() + rl.load_balance).backward()
    assert len(calls) == 1 + forwards_in_backward


@pytest.mark.parametrize("dtype, x_dtype, n_casts", [
    (torch.bfloat16, torch.bfloat16, 0),  # bf16 everything: no cast at all
    (torch.float32, torch.bfloat16, 4),   # fp32 master weights: each once, gate/up pairs into one tensor each
    (torch.float32, torch.float32, 5),    # fp32 activations too: x once more
])
def test_weights_are_cast_once_per_step(dtype, x_dtype, n_casts):
    model = _model(dtype)
    x, _ = _data(x_dtype)
    routing = model.route(x)
    out = ops.moe_fwd(x, routing.topk_idx, routing.topk_weight, model.w_shared_gate_up_2SH, None,
                      model.w_shared_down_HS, model.w_gate_up_L2IH, None, model.w_down_LHI, None, "fast", False, "bf16")
    assert len(out) == 1 + n_casts + mok.fast._context.N_SAVED
    for c in out[1:1 + n_casts]:
        assert c.dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # fp32 master weights / bf16 parameters
def test_the_module_never_concatenates_gate_and_up(monkeypatch, dtype):
    """mok.MoE holds each gate/up pair as one [gate; up] parameter: the forward reads it (one cast for fp32), the
    backward's d_x GEMM reads it as is and writes its gradient as one tensor."""
    from mok.fast import _backward

    model = _model(dtype)
    x, dy = _data()
    calls = []
    real = _backward._concat
    monkeypatch.setattr(_backward, "_concat", lambda *a: (calls.append(1), real(*a)))
    out = _step(model, x, dy)
    assert not calls
    assert out["d_w_gate_up_L2IH"].shape == model.w_gate_up_L2IH.shape


def _separate_inputs(model, dtype):
    """The model's weights as separate contiguous gate and up tensors of `dtype` (leaves), for ops.moe."""
    ws = [model.w_shared_gate_SH, model.w_shared_up_SH, model.w_shared_down_HS, model.w_gate_LIH, model.w_up_LIH,
          model.w_down_LHI]
    return [w.detach().to(dtype).clone(memory_format=torch.contiguous_format).requires_grad_() for w in ws]


def _ops_step(model, ws, x, dy):
    """ops.moe (separate gate and up) on the model's routing: y and every gradient."""
    x = x.detach().clone().requires_grad_()
    for w in ws:
        w.grad = None
    r = model.route(x.detach())
    y = ops.moe(x, r.topk_idx, r.topk_weight.detach(), *ws, backend="fast")
    (y.float() * dy).sum().backward()
    return {"y": y.detach().clone(), "d_x": x.grad.clone(), **{f"d_w{i}": w.grad.clone() for i, w in enumerate(ws)}}


@pytest.mark.parametrize("shapes, concats", [
    ((H, I, E, K, S), 0),            # I = 128, S = 64: whole K tiles of the d_x GEMM, read apart
    ((H, I + 8, E, K, S + 8), 2),    # I = 136, S = 72: they are not, so each pair is concatenated once
])
def test_separate_bf16_gate_and_up_are_read_apart_or_concatenated_once_each_in_backward(monkeypatch, shapes, concats):
    """ops.moe on separate bf16 gate and up tensors: the d_x GEMM reads them as two tensors where its K tile (64)
    splits I and S (no copy), else backward concatenates the routed and the shared pair once each; the step's outputs
    and gradients are bitwise those of the same weights as one [gate; up] tensor each (ops.moe_gate_up)."""
    from mok.fast import _backward

    h, i, e, k, s_ = shapes
    torch.manual_seed(0)
    model = mok.MoE(h, i, e, k, shared_intermediate_size=s_, backend="fast", dtype=torch.bfloat16).cuda()
    x, dy = _data()
    calls = []
    real = _backward._concat
    monkeypatch.setattr(_backward, "_concat", lambda *a: (calls.append(1), real(*a)))
    ws = _separate_inputs(model, torch.bfloat16)
    got = _ops_step(model, ws, x, dy)
    assert len(calls) == concats
    # the same weights as one [gate; up] tensor each (ops.moe_gate_up), the same routing
    sgu, rgu = (torch.cat([ws[0], ws[1]]).detach().requires_grad_(),
                torch.cat([ws[3], ws[4]], 1).detach().requires_grad_())
    sd, rd = (w.detach().clone().requires_grad_() for w in (ws[2], ws[5]))
    x2 = x.detach().clone().requires_grad_()
    r = model.route(x2.detach())
    y = ops.moe_gate_up(x2, r.topk_idx, r.topk_weight.detach(), sgu, sd, rgu, rd, backend="fast")
    (y.float() * dy).sum().backward()
    want = {"y": y, "d_x": x2.grad, "d_w0": sgu.grad[:s_], "d_w1": sgu.grad[s_:], "d_w2": sd.grad,
            "d_w3": rgu.grad[:, :i], "d_w4": rgu.grad[:, i:], "d_w5": rd.grad}
    for name, t in want.items():
        assert_bitwise_equal(got[name], t.detach(), name)


def test_fp32_gate_up_pairs_are_rounded_by_the_pair_kernel_with_torchs_bits(monkeypatch):
    """Separate fp32 gate and up tensors (ops.moe): each pair (routed, shared) goes through
    mok.fast.cast_pair_bf16 into one bf16 [gate; up], and the step's outputs and gradients are bitwise those of
    PyTorch's own copy into the halves."""
    model = _model(torch.float32)
    x, dy = _data()
    ws = _separate_inputs(model, torch.float32)
    calls = []
    real = mok.fast.cast_pair_bf16
    monkeypatch.setattr(mok.fast, "cast_pair_bf16", lambda *a: (calls.append(a[0].shape), real(*a)))
    with_kernel = _ops_step(model, ws, x, dy)
    assert sorted(len(s) for s in calls) == [2, 3]  # the shared [S, H] pair and the routed [L, I, H] pair
    monkeypatch.delattr(mok.fast, "cast_pair_bf16")  # ops falls back to copy_ into the two halves
    with_copy = _ops_step(model, ws, x, dy)
    for name, t in with_kernel.items():
        assert_bitwise_equal(t, with_copy[name], name)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])  # bf16 params / fp32 master weights
def test_module_reruns_are_bitwise_identical(dtype):
    model = _model(dtype)
    x, dy = _data()
    first = _step(model, x, dy)
    for i in range(20):
        again = _step(model, x, dy)
        for name, t in first.items():
            assert_bitwise_equal(again[name], t, f"rerun {i}: {name}")
    assert first["d_w_gate_up_L2IH"].dtype == dtype and first["d_w_router_EH"].dtype == dtype


def test_module_batch_invariance_of_y():
    model = _model(torch.bfloat16)
    x, _ = _data()
    with torch.no_grad():
        y = model(x)
        for n in (1, 129, 299):
            assert_bitwise_equal(model(x[:n]), y[:n], f"first {n} tokens")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])  # bf16 params / fp32 master weights
def test_compile_fullgraph_equals_eager_bitwise(dtype):
    torch._dynamo.reset()
    model = _model(dtype)
    x, dy = _data()
    eager = _step(model, x, dy)
    compiled = _step(torch.compile(model, fullgraph=True), x, dy)
    for name, t in eager.items():
        assert_bitwise_equal(compiled[name], t, name)


def test_construction_and_cuda_do_not_build():
    code = ("import time, torch, mok, mok.fast._build as b\n"
            "t0 = time.time(); m = mok.MoE(256, 128, 16, 4, backend='auto').cuda(); dt = time.time() - t0\n"
            "assert b._KERNELS is None and b._BINDING is None, 'built in the constructor'\n"
            "assert m.backend_in_use == 'fast', m.backend_reason\n"
            "print(f'{dt:.2f}s', m.backend_reason)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "MOK_FAST_CACHE": "/tmp/mok-empty-cache"})
    assert r.returncode == 0, r.stderr[-3000:]


def test_bf16_weight_gradients_are_the_fp32_ones_rounded_once():
    from mok.testing.cases import LAYER_ARGS, MoEConfig, make_inputs
    inp = make_inputs(MoEConfig(T=300, H=256, I=128, E=16, K=4, S=64), seed=2, routing="empty_expert", device="cuda")
    _, ctx = mok.fast.forward(*(inp[a] for a in LAYER_ARGS))
    g32 = mok.fast.backward(ctx, inp["dy"])
    g16 = mok.fast.backward(ctx, inp["dy"], weight_grad_dtype=torch.bfloat16)
    assert_bitwise_equal(g16[0], g32[0], "d_x")
    assert_bitwise_equal(g16[1], g32[1], "d_topk_weight")
    for i in range(2, 8):  # routed and shared weight gradients, an expert without rows included
        assert g16[i].dtype == torch.bfloat16
        assert_bitwise_equal(g16[i], g32[i].to(torch.bfloat16), f"weight gradient {i}")


def test_whole_training_step_replays_in_a_cuda_graph_with_eager_bits():
    """A mok.MoE step (router, losses, layer, backward) captured once and replayed on new data: the
    remedy when few tokens per step leave the host slower than the GPU (docs/usage.md)."""
    model = _model(torch.bfloat16)
    x, dy = _data()
    eager = _step(model, x, dy)
    static_x = x.detach().clone().requires_grad_()
    static_dy = dy.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graphs asks
        for _ in range(2):
            y, rl = model(static_x, return_router_losses=True)
            ((y.float() * static_dy).sum() + 0.01 * rl.load_balance + 0.001 * rl.z).backward()
    torch.cuda.current_stream().wait_stream(side)
    model.zero_grad(set_to_none=True)  # the captured backward then assigns its own gradient tensors
    static_x.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, rl = model(static_x, return_router_losses=True)
        ((y.float() * static_dy).sum() + 0.01 * rl.load_balance + 0.001 * rl.z).backward()
    static = {"y": y, "lb": rl.load_balance, "z": rl.z, "d_x": static_x.grad,  # the graph's own tensors
              **{"d_" + n: p.grad for n, p in model.named_parameters()}}
    new = (x.flip(0), dy.flip(0))
    wants = {"same data": eager, "new data": _step(model, *new)}  # (eager steps reset .grad: static is kept)
    for label, (xi, dyi) in (("same data", (x, dy)), ("new data", new)):
        want = wants[label]
        with torch.no_grad():
            static_x.copy_(xi)
            static_dy.copy_(dyi)
        graph.replay()
        torch.cuda.synchronize()
        for name, t in want.items():
            assert_bitwise_equal(static[name].detach(), t, f"graph replay, {label}: {name}")

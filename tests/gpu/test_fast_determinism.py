"""Bitwise properties of mok.fast (docs/determinism.md): reruns, CUDA-graph replay, other streams, batch
invariance. Comparisons are on raw bits (mok.testing.bits.assert_bitwise_equal)."""
import pytest
import torch

import mok.fast
from mok.testing.bits import assert_bitwise_equal, assert_outputs_bitwise_equal, raw_bits
from mok.fast import _tiles
from mok.fast._checks import stacked_gate_up
from mok.testing.cases import LAYER_ARGS, OUTPUT_NAMES, MoEConfig, make_inputs, with_stacked_gate_up
from mok.testing.runner import assert_replays_equal, capture_layer, run_layer

pytestmark = [pytest.mark.gpu, pytest.mark.sm90]

CFG = MoEConfig(T=512, H=256, I=128, E=16, K=4, S=128)  # I, S split into the fused gate/up launch's halves


def _same(a: dict, b: dict) -> bool:
    return all((a[k] is None and b[k] is None) or torch.equal(raw_bits(a[k]), raw_bits(b[k])) for k in a)


@pytest.fixture(scope="module", params=["separate", "stacked"])
def inputs(request):
    """Gate and up as separate tensors (the gate/up GEMM and the SwiGLU kernel apart), or as the halves of one
    tensor (the gate/up GEMM with the SwiGLU in its epilogue, GEMM_TN_SWIGLU_FWD)."""
    inp = make_inputs(CFG, seed=3, routing="skewed", device="cuda")
    if request.param == "stacked":
        assert _tiles.fused_gate_up_variant(CFG.H, CFG.I, CFG.S) is not None
        return with_stacked_gate_up(inp)
    return inp


def test_forward_1000_reruns(inputs):
    args = [inputs[a] for a in LAYER_ARGS]
    y0, _ = mok.fast.forward(*args)
    for i in range(1000):
        y, _ = mok.fast.forward(*args)
        if not torch.equal(raw_bits(y), raw_bits(y0)):
            assert_bitwise_equal(y, y0, f"forward rerun {i}")


def test_backward_1000_reruns(inputs):
    args = [inputs[a] for a in LAYER_ARGS]
    _, ctx = mok.fast.forward(*args)
    g0 = dict(zip(OUTPUT_NAMES[1:], mok.fast.backward(ctx, inputs["dy"]), strict=True))
    for i in range(1000):
        g = dict(zip(OUTPUT_NAMES[1:], mok.fast.backward(ctx, inputs["dy"]), strict=True))
        if not _same(g, g0):
            assert_outputs_bitwise_equal(g, g0, f"backward rerun {i}")


def test_gate_up_halves_of_one_tensor_give_the_separate_tensors_bits(inputs):
    """Gate and up as views into one [gate; up] tensor (what mok.nn.ops and transformers hand over): read at
    their strides in forward and as one tensor by backward's d_x GEMM, the bits do not change."""
    stacked = with_stacked_gate_up(inputs)
    assert not stacked["routed_gate"].is_contiguous()
    assert_outputs_bitwise_equal(run_layer(stacked, impl=mok.fast), run_layer(inputs, impl=mok.fast), "gate/up halves")


def test_cuda_graph_replay_matches_eager(inputs):
    eager = run_layer(inputs, impl=mok.fast)
    static = {k: (v.clone() if v is not None else None) for k, v in inputs.items()}
    if stacked_gate_up(inputs["routed_gate"], inputs["routed_up"]) is not None:
        static = with_stacked_gate_up(static)  # clone() made the halves separate tensors
    graph, out = capture_layer(static, impl=mok.fast)
    assert_replays_equal(graph, out, eager, "graph replay")
    # new data copied into the static inputs flows through the graph
    fresh = make_inputs(CFG, seed=4, routing="random", device="cuda")
    for k, v in fresh.items():
        if v is not None:
            static[k].copy_(v)
    graph.replay()
    torch.cuda.synchronize()
    assert_outputs_bitwise_equal(out, run_layer(fresh, impl=mok.fast), "graph replay, new inputs")


def test_other_stream_matches(inputs):
    base = run_layer(inputs, impl=mok.fast)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        other = run_layer(inputs, impl=mok.fast)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    assert_outputs_bitwise_equal(other, base, "side stream")


def _subset(inputs: dict, rows: torch.Tensor) -> dict:
    out = dict(inputs)
    for k in ("x", "topk_idx", "topk_weight", "dy"):
        out[k] = inputs[k][rows].contiguous()
    return out


@pytest.mark.parametrize("rows", ["first_100", "middle", "one_token", "larger_batch"])  # prefix, strided subset, T = 1, 3x batch around it
def test_batch_invariance(inputs, rows):
    T = CFG.T
    full = run_layer(inputs, impl=mok.fast)
    if rows == "larger_batch":
        extra = make_inputs(MoEConfig(T=3 * T, H=CFG.H, I=CFG.I, E=CFG.E, K=CFG.K, S=CFG.S), seed=9, device="cuda")
        big = dict(inputs)
        for k in ("x", "topk_idx", "topk_weight", "dy"):
            big[k] = torch.cat([extra[k][:T], inputs[k], extra[k][T:]]).contiguous()
        got = run_layer(big, impl=mok.fast)
        sel = torch.arange(T, 2 * T, device="cuda")
    else:
        sel = {"first_100": torch.arange(100), "middle": torch.arange(50, 450, 3),
               "one_token": torch.tensor([17])}[rows].cuda()
        got = run_layer(_subset(inputs, sel), impl=mok.fast)
        sel_out = torch.arange(sel.numel(), device="cuda")
        got = {k: (v[sel_out] if k in ("y", "d_x", "d_topk_weight") else v) for k, v in got.items()}
        for k in ("y", "d_x", "d_topk_weight"):
            assert_bitwise_equal(got[k], full[k][sel], f"batch invariance ({rows}): {k}")
        return
    for k in ("y", "d_x", "d_topk_weight"):
        assert_bitwise_equal(got[k][sel], full[k], f"batch invariance ({rows}): {k}")

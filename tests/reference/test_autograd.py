"""mok.reference.moe under autograd gives the functional backward's bits."""

import pytest
import torch

from mok import reference
from mok.nn import ops
from mok.testing.bits import assert_bitwise_equal
from mok.testing.cases import DEFAULT, LAYER_ARGS, MoEConfig, make_inputs
from mok.testing.tolerance import GRAD_OF
from mok.testing.runner import run_layer

GRAD_FOR = {arg: grad for grad, arg in GRAD_OF.items()}  # input name -> name of its gradient


def _leaves(inputs):
    return {a: (inputs[a].clone().requires_grad_(True) if a in GRAD_FOR and inputs[a] is not None else inputs[a])
            for a in LAYER_ARGS}


@pytest.mark.parametrize("cfg, routing", [
    (DEFAULT, "random"),                                          # shared expert, odd sizes
    (MoEConfig(T=37, H=24, I=12, E=4, K=4, S=0), "random"),       # no shared expert, K = E, T = 37
    (MoEConfig(T=16, H=16, I=8, E=4, K=2, S=8), "empty_expert"),  # an expert without tokens: zero grads
])
def test_backward_matches_functional(cfg, routing):
    inputs = make_inputs(cfg, seed=0, routing=routing)
    want = run_layer(inputs)
    leaves = _leaves(inputs)
    y = reference.moe(*(leaves[a] for a in LAYER_ARGS))
    assert_bitwise_equal(y.detach(), want["y"], "y")
    y.backward(inputs["dy"])
    for arg, out in GRAD_FOR.items():
        if inputs[arg] is None:
            assert want[out] is None
            continue
        grad = leaves[arg].grad
        # the engine casts each gradient to its input's dtype: fp32 weight grads -> bf16
        assert grad.dtype == inputs[arg].dtype, arg
        assert_bitwise_equal(grad, want[out].to(inputs[arg].dtype), f"{arg}.grad")


def test_loss_backward_matches_functional():
    """Through a scalar loss whose gradient w.r.t. y is exactly dy (bf16 values, fp32 product)."""
    inputs = make_inputs(MoEConfig(T=8, H=16, I=8, E=4, K=2, S=8), seed=1)
    want = run_layer(inputs)
    leaves = _leaves(inputs)
    y = reference.moe(*(leaves[a] for a in LAYER_ARGS))
    (y.float() * inputs["dy"].float()).sum().backward()
    assert_bitwise_equal(leaves["x"].grad, want["d_x"], "x.grad")
    assert_bitwise_equal(leaves["topk_weight"].grad, want["d_topk_weight"], "topk_weight.grad")
    assert_bitwise_equal(leaves["routed_down"].grad, want["d_routed_down"].bfloat16(), "routed_down.grad")


def test_only_some_inputs_require_grad():
    """Frozen weights: x and topk_weight still get the functional bits; weights get no .grad."""
    inputs = make_inputs(MoEConfig(T=8, H=16, I=8, E=4, K=2, S=8), seed=2)
    want = run_layer(inputs)
    x = inputs["x"].clone().requires_grad_(True)
    w = inputs["topk_weight"].clone().requires_grad_(True)
    y = reference.moe(x, inputs["topk_idx"], w, *(inputs[a] for a in LAYER_ARGS[3:]))
    y.backward(inputs["dy"])
    assert_bitwise_equal(x.grad, want["d_x"], "x.grad")
    assert_bitwise_equal(w.grad, want["d_topk_weight"], "topk_weight.grad")
    assert all(inputs[a] is None or inputs[a].grad is None for a in LAYER_ARGS[3:])


def test_non_contiguous_dy():
    """autograd may hand the backward a non-contiguous gradient (here: a transposed view)."""
    inputs = make_inputs(MoEConfig(T=8, H=16, I=8, E=4, K=2, S=8), seed=3)
    want = run_layer(inputs)
    leaves = _leaves(inputs)
    y = reference.moe(*(leaves[a] for a in LAYER_ARGS))
    dy_t = inputs["dy"].t().contiguous().t()
    assert not dy_t.is_contiguous()
    y.backward(dy_t)
    assert_bitwise_equal(leaves["x"].grad, want["d_x"], "x.grad")
    assert_bitwise_equal(leaves["routed_gate"].grad, want["d_routed_gate"].bfloat16(), "routed_gate.grad")


# ---------------------------------------------------------------- autograd semantics, as mok.nn.ops.moe

SMALL = MoEConfig(T=8, H=16, I=8, E=4, K=2, S=8)
IMPLS = {"reference.moe": reference.moe, "ops.moe": ops.moe}


@pytest.mark.parametrize("impl", IMPLS)  # reference.moe and ops.moe (the public op)
@pytest.mark.parametrize("arg", [
    "x",            # the activations
    "routed_gate",  # a routed expert weight
    "shared_down",  # a shared expert weight
    "topk_weight",  # the router's weights, in fp32
])
def test_inplace_change_after_forward_is_caught(impl, arg):
    """Saved inputs carry version counters: changing one in place before backward is PyTorch's usual error."""
    inputs = make_inputs(SMALL, seed=4)
    leaves = _leaves(inputs)
    y = IMPLS[impl](*(leaves[a] for a in LAYER_ARGS))
    with torch.no_grad():
        leaves[arg].add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward(inputs["dy"])


@pytest.mark.parametrize("impl", IMPLS)  # reference.moe and ops.moe (the public op)
def test_retain_graph_second_backward_gives_the_same_bits(impl):
    inputs = make_inputs(SMALL, seed=5)
    want = run_layer(inputs)
    leaves = _leaves(inputs)
    y = IMPLS[impl](*(leaves[a] for a in LAYER_ARGS))
    args = [a for a in GRAD_FOR if inputs[a] is not None]
    wrt = [leaves[a] for a in args]
    first = torch.autograd.grad(y, wrt, inputs["dy"], retain_graph=True)
    second = torch.autograd.grad(y, wrt, inputs["dy"])
    for arg, a, b in zip(args, first, second, strict=True):
        assert_bitwise_equal(b, a, f"{arg}: second backward")
        assert_bitwise_equal(a, want[GRAD_FOR[arg]].to(inputs[arg].dtype), f"{arg}: vs functional")
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        torch.autograd.grad(y, wrt, inputs["dy"])  # the graph was freed by the second call


@pytest.mark.parametrize("impl", IMPLS)  # reference.moe and ops.moe (the public op)
@pytest.mark.parametrize("dy_requires_grad", [
    False,  # dy a constant
    True,   # dy itself differentiable: the gradients' graph reaches it too
])
def test_create_graph_gives_gradients_whose_backward_raises(impl, dy_requires_grad):
    """No double backward: the gradients keep their bits but differentiating them raises (never a
    silently detached gradient)."""
    inputs = make_inputs(SMALL, seed=6)
    want = run_layer(inputs)
    leaves = _leaves(inputs)
    y = IMPLS[impl](*(leaves[a] for a in LAYER_ARGS))
    dy = inputs["dy"].clone().requires_grad_(dy_requires_grad)
    gx, gw = torch.autograd.grad(y, [leaves["x"], leaves["routed_up"]], dy, create_graph=True)
    assert_bitwise_equal(gx.detach(), want["d_x"], "d_x")
    assert_bitwise_equal(gw.detach(), want["d_routed_up"].bfloat16(), "d_routed_up")
    assert gx.requires_grad and gx.grad_fn is not None
    with pytest.raises(RuntimeError, match="differentiate twice|no autograd formula"):
        (gx.float().sum() + gw.float().sum()).backward()


@pytest.mark.parametrize("impl", IMPLS)  # reference.moe and ops.moe (the public op)
@pytest.mark.parametrize("wrt", [
    "x",            # d/dx of d_x: the second derivative a user asks for first
    "routed_gate",  # d/dw of d_x: a weight, reached only through the gradient's graph
])
def test_second_derivative_with_respect_to_an_input_raises(impl, wrt):
    """autograd.grad of a gradient with respect to an input of the layer reaches the node that refuses double
    backward: an error, never None read as a zero second derivative (allow_unused=True) nor "appears to not have
    been used in the graph"."""
    inputs = make_inputs(SMALL, seed=7)
    leaves = _leaves(inputs)
    y = IMPLS[impl](*(leaves[a] for a in LAYER_ARGS))
    loss = (y.float() * inputs["dy"].float()).sum()
    (gx,) = torch.autograd.grad(loss, leaves["x"], create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice|no autograd formula"):
        torch.autograd.grad(gx.float().sum(), leaves[wrt], allow_unused=True)

"""The functional API (`mok.reference.forward` / `backward`) as a PyTorch user calls it: an input changed in place
between forward and backward raises as autograd's version counters do, and inputs that require grad give the same
bits and no autograd graph."""

import pytest
import torch

from mok import reference
from mok.testing.bits import assert_bitwise_equal
from mok.testing.cases import LAYER_ARGS, OUTPUT_NAMES, MoEConfig, make_inputs
from mok.testing.runner import run_layer

SMALL = MoEConfig(T=8, H=16, I=8, E=4, K=2, S=8)


@pytest.mark.parametrize("arg, edit", [
    ("routed_down", lambda t: t.mul_(2)),   # a routed weight scaled in place (an optimizer step)
    ("x", lambda t: t.zero_()),             # the activations reused as a buffer
    ("topk_weight", lambda t: t.add_(1)),   # the router's weights
    ("shared_gate", lambda t: t[0].fill_(0)),  # one row of a shared weight, through a view
    ("topk_idx", lambda t: t.copy_(t.flip(1))),  # the ids, reordered in place
], ids=["routed_down", "x", "topk_weight", "shared_gate", "topk_idx"])
def test_inplace_edit_between_forward_and_backward_raises_naming_the_input(arg, edit):
    inputs = make_inputs(SMALL, seed=4)
    y, ctx = reference.forward(*(inputs[a] for a in LAYER_ARGS))
    edit(inputs[arg])
    with pytest.raises(RuntimeError, match=rf"^{arg}: modified by an inplace operation between "
                                           r"mok.reference.forward and mok.reference.backward.*version 1; "
                                           r"expected version 0"):
        reference.backward(ctx, inputs["dy"])


def test_unedited_backward_runs_twice_with_the_same_bits():
    """The check does not fire on its own: backward may run again on the same ctx."""
    inputs = make_inputs(SMALL, seed=4)
    y, ctx = reference.forward(*(inputs[a] for a in LAYER_ARGS))
    first, second = reference.backward(ctx, inputs["dy"]), reference.backward(ctx, inputs["dy"])
    for name, a, b in zip(OUTPUT_NAMES[1:], first, second, strict=True):
        if a is not None:
            assert_bitwise_equal(b, a, name)


def test_load_context_records_versions_too():
    """A ctx rebuilt by load_context (what autograd wrappers do) checks the inputs it was given."""
    inputs = make_inputs(SMALL, seed=5)
    args = [inputs[a] for a in LAYER_ARGS]
    _, ctx = reference.forward(*args)
    saved = reference.save_context(ctx)
    ctx2 = reference.load_context(saved, args[0], args[1], args[2], tuple(args[3:6]), tuple(args[6:]))
    inputs["routed_gate"].add_(1)
    with pytest.raises(RuntimeError, match="^routed_gate: modified by an inplace operation"):
        reference.backward(ctx2, inputs["dy"])


def test_inference_mode_inputs_are_accepted():
    """Inference tensors have no version counter: forward and backward still run (nothing to compare)."""
    with torch.inference_mode():
        inputs = make_inputs(SMALL, seed=6)
        y, ctx = reference.forward(*(inputs[a] for a in LAYER_ARGS))
        grads = reference.backward(ctx, inputs["dy"])
    want = run_layer(make_inputs(SMALL, seed=6))
    assert_bitwise_equal(y, want["y"], "y")
    assert_bitwise_equal(grads[0], want["d_x"], "d_x")


def _as_parameters(inputs):
    return {a: (torch.nn.Parameter(inputs[a].clone()) if inputs[a] is not None and inputs[a].is_floating_point()
                else inputs[a]) for a in LAYER_ARGS}


def test_inputs_that_require_grad_give_the_same_bits_and_no_graph():
    """nn.Parameters (or any input that requires grad): the functional API builds no autograd graph, so y and the
    gradients carry no grad_fn (y.backward() raises PyTorch's "does not require grad" error rather than
    differentiating the exact arithmetic), and the bits are those of plain tensors."""
    inputs = make_inputs(SMALL, seed=7)
    want = run_layer(inputs)
    params = _as_parameters(inputs)
    y, ctx = reference.forward(*(params[a] for a in LAYER_ARGS))
    assert not y.requires_grad and y.grad_fn is None
    assert_bitwise_equal(y, want["y"], "y")
    grads = reference.backward(ctx, inputs["dy"].clone().requires_grad_())
    for name, g in zip(OUTPUT_NAMES[1:], grads, strict=True):
        if g is None:
            assert want[name] is None, name
            continue
        assert not g.requires_grad and g.grad_fn is None, name
        assert_bitwise_equal(g, want[name], name)
    with pytest.raises(RuntimeError, match="does not require grad"):
        y.float().sum().backward()


def test_inputs_that_require_grad_keep_no_graph_alive():
    """The ctx holds no autograd history: the saved activations are plain tensors."""
    params = _as_parameters(make_inputs(SMALL, seed=8))
    _, ctx = reference.forward(*(params[a] for a in LAYER_ARGS))
    saved = reference.save_context(ctx)
    assert not any(t.requires_grad for t in saved)


def _edit_on_one_rank(rank, world_size, group, inputs):
    from mok.testing.runner import shard_inputs

    local = shard_inputs(inputs, rank, world_size)
    _, ctx = reference.forward(*(local[a] for a in LAYER_ARGS), group=group)
    if rank == 1:
        local["routed_gate"].add_(1)
    try:
        reference.backward(ctx, local["dy"])
    except RuntimeError as e:
        return str(e)
    return ""


def test_inplace_edit_on_one_rank_raises_on_every_rank():
    """Expert parallel: the edited rank's error reaches every rank through the pre-flight, before any collective (no
    rank is left waiting)."""
    from mok.testing.dist import launch

    errors = launch(_edit_on_one_rank, (make_inputs(SMALL, seed=9),), 2, timeout_s=60)
    for rank, err in enumerate(errors):
        assert err.startswith("routed_gate: modified by an inplace operation between mok.reference.forward and "
                              "mok.reference.backward") and "(on rank 1 of the group)" in err, (rank, err)

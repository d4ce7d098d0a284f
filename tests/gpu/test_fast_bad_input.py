"""Bad input to mok.fast: exceptions naming the argument for what the host can check cheaply; for
expert ids (checked on the device, no sync) every output is NaN and every input keeps its bits (out-of-bounds
accesses are compute-sanitizer memcheck's part: tests/gpu/test_fast_sanitizer.py runs a bad id); a row capacity too
small for the routed rows gives NaN, never a silent wrong result."""
import pytest
import torch

import mok.fast
from mok.testing.bits import assert_bitwise_equal
from mok.testing.cases import LAYER_ARGS, OUTPUT_NAMES, MoEConfig, make_inputs
from mok.fast._checks import check_inputs
from mok.fast._forward import run_forward
from mok.testing.runner import run_layer

pytestmark = [pytest.mark.gpu, pytest.mark.sm90]

CFG = MoEConfig(T=64, H=64, I=32, E=8, K=2, S=16)


@pytest.fixture()
def inputs():
    return make_inputs(CFG, seed=5, device="cuda")


def _args(inputs, **override):
    d = dict(inputs)
    d.update(override)
    return [d[a] for a in LAYER_ARGS]


@pytest.mark.parametrize("name,bad,match", [
    ("x", lambda i: i["x"].float(), "^x: expected dtype"),  # wrong dtype
    ("x", lambda i: i["x"][:, :-8].contiguous(), "^routed_gate: expected shape"),  # H differs from the weights
    ("topk_idx", lambda i: i["topk_idx"].int(), "^topk_idx: expected dtype"),  # int32 ids
    ("topk_weight", lambda i: i["topk_weight"].half(), "^topk_weight: expected dtype"),  # fp16 weights
    ("routed_up", lambda i: i["routed_up"][:, :-8].contiguous(), "^routed_up: expected shape"),  # I differs
    ("routed_down", lambda i: i["routed_down"].transpose(1, 2), "^routed_down: expected shape"),  # [L, I, H]
    ("shared_up", lambda i: None, "^shared_up: expected a tensor"),  # shared expert half given
    ("x", lambda i: i["x"].cpu(), "^x: expected a CUDA tensor"),  # host tensor
    ("topk_weight", lambda i: i["topk_weight"].t().contiguous().t(), "^topk_weight: expected a contiguous"),  # strided
    ("routed_gate", lambda i: i["routed_gate"].transpose(1, 2).contiguous().transpose(1, 2),
     "^routed_gate: expected a contiguous"),  # strided, and not the gate half of one [gate; up] tensor
])
def test_bad_argument_raises_naming_it(inputs, name, bad, match):
    with pytest.raises((TypeError, ValueError), match=match):
        mok.fast.forward(*_args(inputs, **{name: bad(inputs)}))


def test_bad_dy_raises(inputs):
    _, ctx = mok.fast.forward(*_args(inputs))
    with pytest.raises(TypeError, match="^dy: expected dtype"):
        mok.fast.backward(ctx, inputs["dy"].float())
    with pytest.raises(ValueError, match="^dy: expected shape"):
        mok.fast.backward(ctx, inputs["dy"][:-1].contiguous())
    with pytest.raises(ValueError, match="^ctx: expected the FastContext"):
        mok.fast.backward(object(), inputs["dy"])


@pytest.mark.parametrize("arg, edit", [
    ("routed_down", lambda t: t.mul_(2)),  # a routed weight scaled in place (an optimizer step)
    ("x", lambda t: t.zero_()),            # the activations reused as a buffer
    ("topk_weight", lambda t: t.add_(1)),  # the router's weights
], ids=["routed_down", "x", "topk_weight"])
def test_inplace_edit_between_forward_and_backward_raises_naming_it(inputs, arg, edit):
    """As autograd's version counters do for saved tensors: never gradients of the edited inputs."""
    _, ctx = mok.fast.forward(*_args(inputs))
    edit(inputs[arg])
    with pytest.raises(RuntimeError, match=rf"^{arg}: modified by an inplace operation between mok.fast.forward and "
                                           r"mok.fast.backward"):
        mok.fast.backward(ctx, inputs["dy"])


def test_inputs_that_require_grad_give_the_same_bits_and_no_graph(inputs):
    """nn.Parameters: y and the gradients carry no autograd graph, with the bits of plain tensors."""
    want_y, want_ctx = mok.fast.forward(*_args(inputs))
    want = mok.fast.backward(want_ctx, inputs["dy"])
    params = {a: (torch.nn.Parameter(v.clone()) if v is not None and v.is_floating_point() else v)
              for a, v in inputs.items()}
    y, ctx = mok.fast.forward(*_args(params))
    assert not y.requires_grad and y.grad_fn is None
    assert_bitwise_equal(y, want_y, "y")
    got = mok.fast.backward(ctx, inputs["dy"])
    for name, g, w in zip(OUTPUT_NAMES[1:], got, want, strict=True):
        if w is not None:
            assert not g.requires_grad, name
            assert_bitwise_equal(g, w, name)


def test_group_that_is_not_a_process_group_raises(inputs):
    with pytest.raises(TypeError, match="^group: expected a torch.distributed ProcessGroup or None"):
        mok.fast.forward(*_args(inputs), group=object())


def test_wrong_arch_raises(inputs, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(RuntimeError, match="9.0"):
        mok.fast.forward(*_args(inputs))


def _all_nan(out: dict) -> None:
    for k in OUTPUT_NAMES:
        if out[k] is not None:
            assert torch.isnan(out[k]).all(), f"{k}: expected all NaN, {int((~torch.isnan(out[k])).sum())} finite"


@pytest.mark.parametrize("bad_id", ["too_large", "negative", "huge", "duplicate"])  # id = E, -1, 2^40, repeated in a row
def test_bad_expert_ids_give_nan_and_no_corruption(inputs, bad_id):
    idx = inputs["topk_idx"].clone()
    if bad_id == "too_large":
        idx[5, 1] = CFG.E
    elif bad_id == "negative":
        idx[0, 0] = -1
    elif bad_id == "huge":
        idx[63, 1] = 2**40
    else:
        idx[9, 1] = idx[9, 0]
    bad = dict(inputs, topk_idx=idx)
    before = {k: v.clone() for k, v in bad.items() if isinstance(v, torch.Tensor)}
    out = run_layer(bad, impl=mok.fast)
    torch.cuda.synchronize()
    _all_nan(out)
    for k, v in before.items():  # the layer reads its inputs only, bad ids or not
        assert_bitwise_equal(bad[k], v, f"input {k} after the call")
    # a good call afterwards is unaffected
    good = run_layer(inputs, impl=mok.fast)
    for k in OUTPUT_NAMES:
        if good[k] is not None:
            assert torch.isfinite(good[k]).all(), k


def test_rows_beyond_capacity_give_nan(inputs):
    args = _args(inputs)
    dims = check_inputs(*args)
    T, K = CFG.T, CFG.K
    y, ctx = run_forward(*args, dims, capacity=T * K - 5)
    grads = mok.fast.backward(ctx, inputs["dy"])
    _all_nan(dict(zip(OUTPUT_NAMES, (y, *grads), strict=True)))

"""mok.fast.forward / backward as a PyTorch user calls them, on the CPU with the kernels emulated
(tests/fast/fast_emulator.py), one process and expert-parallel: an input changed in place between forward and backward
raises naming it (on every rank), and inputs that require grad give no autograd graph. The same on the GPU:
tests/gpu/test_fast_bad_input.py."""
import pytest
import torch

from mok.testing.cases import LAYER_ARGS, MoEConfig, make_inputs
from mok.testing.dist import launch
from mok.testing.runner import shard_inputs

CFG = MoEConfig(T=16, H=16, I=8, E=4, K=2, S=8)


def _misuse(rank, world_size, group, inputs, edit_rank):
    """forward on nn.Parameters, then (on `edit_rank`, or no rank for None) routed_down scaled in place, then backward:
    what the user sees."""
    import fast_emulator

    import mok.fast

    fast_emulator.install()
    fast_emulator.stub_streams()
    local = shard_inputs(inputs, rank, world_size)
    args = [torch.nn.Parameter(local[a]) if local[a] is not None and local[a].is_floating_point() else local[a]
            for a in LAYER_ARGS]
    y, ctx = mok.fast.forward(*args, group=group)
    out = {"y_requires_grad": y.requires_grad, "y_grad_fn": y.grad_fn is not None}
    if edit_rank == rank:
        with torch.no_grad():
            args[LAYER_ARGS.index("routed_down")].mul_(2)
    try:
        grads = mok.fast.backward(ctx, local["dy"])
    except RuntimeError as e:
        out["error"] = str(e)
    else:
        out["grads_require_grad"] = any(g.requires_grad for g in grads if g is not None)
    if world_size > 1:
        mok.fast.release_ep_buffers()
    return out


@pytest.mark.parametrize("W, edit_rank", [
    (1, None),  # one process, nothing edited: no graph, and backward runs
    (1, 0),     # one process, a weight edited: backward raises naming it
    (2, 1),     # expert parallel, rank 1's weight edited: every rank raises, naming it and the rank
])
def test_fast_functional_api_misuse(W, edit_rank):
    inputs = make_inputs(CFG, seed=31)
    results = launch(_misuse, (inputs, edit_rank), W, timeout_s=60)
    for rank, out in enumerate(results):
        assert not out["y_requires_grad"] and not out["y_grad_fn"], (rank, out)
        if edit_rank is None:
            assert out["grads_require_grad"] is False, (rank, out)
            continue
        err = out.get("error", "")
        assert err.startswith("routed_down: modified by an inplace operation between mok.fast.forward and "
                              "mok.fast.backward"), (rank, out)
        if W > 1:
            assert f"(on rank {edit_rank} of the group)" in err, (rank, err)

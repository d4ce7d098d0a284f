"""The fast path's expert parallelism, what a CPU can check (no GPU, nothing built): the peer buffer's
layout, the wait timeout's setting, the saved-context layout, and the pre-flight that makes every rank
raise together (gloo processes). Its bits and protocol are tested on the GPU: tests/gpu/test_fast_ep.py."""
import pytest
import torch

import mok.fast
from mok import reference
from mok.fast import _ep_buffer
from mok.testing.cases import LAYER_ARGS, MoEConfig, make_inputs
from mok.testing.dist import WorkerError, launch
from mok.testing.runner import shard_inputs


@pytest.mark.parametrize("T, H, K, S, W", [
    (8, 16, 2, 8, 2),     # small, shared expert
    (37, 64, 3, 0, 8),    # odd T and K, no shared expert (empty regions)
    (1, 8, 1, 8, 4),      # one token
])
def test_buffer_regions_are_aligned_disjoint_and_sized(T, H, K, S, W):
    regions = _ep_buffer._regions(T, H, K, S, W)
    layout, total = _ep_buffer._layout(regions)
    spans = []
    for name, dtype, shape in regions:
        off, dt, sh = layout[name]
        assert (dt, sh) == (dtype, shape)
        assert off % _ep_buffer.ALIGN == 0, name
        n = torch.Size(shape).numel() * dtype.itemsize
        spans.append((off, off + n, name))
        raw = torch.zeros(total, dtype=torch.uint8)
        v = _ep_buffer._view(raw, layout[name])
        assert v.shape == shape and v.dtype == dtype and v.is_contiguous()
    spans.sort()
    for (a0, a1, an), (b0, b1, bn) in zip(spans, spans[1:]):
        assert a1 <= b0, f"{an} overlaps {bn}"
    assert spans[-1][1] <= total
    assert layout["flags"][2] == (_ep_buffer.PHASES, W)


@pytest.mark.parametrize("value, expected", [
    (None, 120.0),  # unset: the default two minutes
    ("5", 5.0),     # an integer string
    ("0.5", 0.5),   # a fraction of a second
])
def test_wait_timeout_from_the_environment(value, expected, monkeypatch):
    if value is None:
        monkeypatch.delenv(_ep_buffer.TIMEOUT_ENV, raising=False)
    else:
        monkeypatch.setenv(_ep_buffer.TIMEOUT_ENV, value)
    assert _ep_buffer.timeout_s() == expected


@pytest.mark.parametrize("value", [
    "abc",  # not a number
    "0",    # zero: no wait at all
    "-3",   # negative
    "nan",  # a float that compares false with everything
])
def test_bad_wait_timeout_names_the_variable(value, monkeypatch):
    monkeypatch.setenv(_ep_buffer.TIMEOUT_ENV, value)
    with pytest.raises(ValueError, match=f"^{_ep_buffer.TIMEOUT_ENV}: expected"):
        _ep_buffer.timeout_s()


def test_saved_fake_has_the_expert_parallel_layout():
    """W*T*K rows on the expert owner; the (t, k) slots of this rank's tokens."""
    T, H, I, L, K, S, W = 6, 16, 8, 2, 2, 8, 4
    x = torch.empty(T, H, dtype=torch.bfloat16, device="meta")
    idx = torch.empty(T, K, dtype=torch.int64, device="meta")
    shared = tuple(torch.empty(s, dtype=torch.bfloat16, device="meta") for s in ((S, H), (S, H), (H, S)))
    routed = tuple(torch.empty(s, dtype=torch.bfloat16, device="meta") for s in ((L, I, H), (L, I, H), (L, H, I)))
    R = W * T * K
    got = [tuple(t.shape) for t in mok.fast.saved_fake(x, idx, shared, routed, rows=R)]
    assert got == [(2 * L + 1,), (R,), (1,), (R, H), (R, 2 * I), (R, I), (T * K, H), (T, 2 * S), (T, S)]
    assert [tuple(t.shape) for t in mok.fast.saved_fake(x, idx, shared, routed)][1] == (T * K,)


def _mixed_backends(rank, world_size, group, inputs):
    """Rank 0 runs the reference, the others claim the fast path: every rank must raise in the pre-flight."""
    local = shard_inputs(inputs, rank, world_size)
    if rank == 0:
        reference.forward(*(local[a] for a in LAYER_ARGS), group=group)
    else:
        d = reference.check_layer_args(*(local[a] for a in LAYER_ARGS), world_size=world_size)
        reference.preflight("forward", None, reference.forward_facts(d, local["x"], "fast"), group)
    return True


def test_ranks_running_different_implementations_all_raise():
    inputs = make_inputs(MoEConfig(T=8, H=16, I=8, E=4, K=2, S=8), seed=0)
    with pytest.raises(WorkerError, match="backend: expected the same layer implementation"):
        launch(_mixed_backends, (inputs,), 2, timeout_s=30)


def _fast_on_cpu(rank, world_size, group, inputs):
    local = shard_inputs(inputs, rank, world_size)
    try:
        mok.fast.forward(*(local[a] for a in LAYER_ARGS), group=group)
    except ValueError as e:
        return str(e)
    return "no error"


def test_a_local_argument_error_is_raised_on_every_rank_with_the_rank_named():
    """CPU tensors fail the fast path's device check: each rank gets the lowest failing rank's error."""
    inputs = make_inputs(MoEConfig(T=8, H=16, I=8, E=4, K=2, S=8), seed=0)
    msgs = launch(_fast_on_cpu, (inputs,), 2, timeout_s=30)
    for m in msgs:
        assert m.startswith("x: expected a CUDA tensor") and "on rank 0 of the group" in m, m


def test_group_must_be_a_process_group():
    inputs = make_inputs(MoEConfig(T=8, H=16, I=8, E=4, K=2, S=8), seed=0)
    with pytest.raises(TypeError, match="^group: expected a torch.distributed ProcessGroup or None"):
        mok.fast.forward(*(inputs[a] for a in LAYER_ARGS), group="abc")


def _fast_load_context(rank, world_size, group, inputs, what):
    """Rank 0 rebuilds a context with good saved tensors; rank 1 with `what` wrong ("short": 5 of the 9
    tensors, "shape": x_RH one row short) or in a forward's pre-flight ("forward"). The fast path's device
    check is replaced by the shared checks, so CPU tensors stand in for CUDA ones."""
    from mok.fast import _context
    _context.check_inputs = lambda *a, world_size=1: reference.check_layer_args(*a, world_size=world_size)
    local = shard_inputs(inputs, rank, world_size)
    x, idx = local["x"], local["topk_idx"]
    shared, routed = tuple(local[a] for a in LAYER_ARGS[3:6]), tuple(local[a] for a in LAYER_ARGS[6:])
    T, K = idx.shape
    saved = mok.fast.saved_fake(x, idx, shared, routed, rows=world_size * T * K)
    try:
        if rank == 1 and what == "forward":
            d = reference.check_layer_args(*(local[a] for a in LAYER_ARGS), world_size=world_size)
            reference.preflight("forward", None, reference.forward_facts(d, x, "fast"), group)
        else:
            if rank == 1 and what == "short":
                saved = saved[:5]
            elif rank == 1 and what == "shape":
                saved[3] = saved[3][1:]
            mok.fast.load_context(saved, x, idx, local["topk_weight"], shared, routed, group)
    except Exception as e:  # noqa: BLE001 - the test inspects what each rank raised
        return f"{type(e).__name__}: {e}"
    return "no error"


@pytest.mark.parametrize("what, parts", [
    # rank 1 passes 5 of the 9 saved tensors
    ("short", ["ValueError: saved: expected the 9 tensors of save_context, got 5", "on rank 1 of the group"]),
    # rank 1's saved x_RH is one row short of W*T*K
    ("shape", ["ValueError: saved: expected tensor 3 (x_RH)", "got torch.bfloat16 [15, 16]", "on rank 1 of the group"]),
    # rank 1 is in a forward while rank 0 rebuilds a context for backward: ranks out of step
    ("forward", ["RuntimeError: group: expected every rank in the same mok call", "backward (load_context)",
                 "forward"]),
])
def test_fast_load_context_runs_the_preflight_before_the_peer_buffer(what, parts):
    """Every rank raises the same error, at once, before any rank makes or exchanges its peer buffer
    (which a CPU process could not: without the pre-flight rank 0 would fail there or wait)."""
    inputs = make_inputs(MoEConfig(T=8, H=16, I=8, E=4, K=2, S=8), seed=0)
    msgs = launch(_fast_load_context, (inputs, what), 2, timeout_s=30)
    for rank, m in enumerate(msgs):
        for p in parts:
            assert p in m, (rank, m)


@pytest.mark.parametrize("index, bad, exc, match", [
    # the schedule's offsets for 3 experts where the layer has 2
    (0, lambda t: torch.zeros(7, dtype=torch.int32), ValueError, r"tensor 0 \(offsets\) .* to be torch.int32 \[5\]"),
    # g|u in bf16 instead of fp32: a dtype, so a TypeError
    (4, lambda t: t.bfloat16(), TypeError, r"tensor 4 \(pq_R2I\) .* to be torch.float32"),
    # a plain list where a tensor belongs
    (6, lambda t: t.tolist(), TypeError, r"^saved: expected tensor 6 \(o_RH\) to be a torch.Tensor"),
    # nothing changed: the layout of a forward with these sizes is accepted (W = 1: a FastContext comes back)
    (None, None, None, None),
])
def test_fast_load_context_checks_the_saved_layout(index, bad, exc, match, monkeypatch):
    from mok.fast import _context
    monkeypatch.setattr(_context, "check_inputs",
                        lambda *a, world_size=1: reference.check_layer_args(*a, world_size=world_size))
    inputs = make_inputs(MoEConfig(T=4, H=16, I=8, E=2, K=2, S=8), seed=0)
    x, idx = inputs["x"], inputs["topk_idx"]
    shared, routed = tuple(inputs[a] for a in LAYER_ARGS[3:6]), tuple(inputs[a] for a in LAYER_ARGS[6:])
    saved = mok.fast.saved_fake(x, idx, shared, routed)
    if index is None:
        ctx = mok.fast.load_context(saved, x, idx, inputs["topk_weight"], shared, routed)
        assert isinstance(ctx, mok.fast.FastContext) and ctx.x_RH is saved[3] and ctx.dims.E == 2
        return
    saved[index] = bad(saved[index])
    with pytest.raises(exc, match=match):
        mok.fast.load_context(saved, x, idx, inputs["topk_weight"], shared, routed)

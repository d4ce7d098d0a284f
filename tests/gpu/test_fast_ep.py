"""Expert parallelism of the fast path (docs/expert_parallel.md), W processes sharing one GPU (or one GPU
each where there are enough): bitwise equal to W = 1 for every output, reruns, CUDA-graph replay, the
autograd op, the 2x rule against the reference, and bad input ending every rank in bounded time."""
import os
import time

import pytest
import torch

import mok.fast
from mok.testing.bits import assert_bitwise_equal, raw_bits
from mok.testing.cases import LAYER_ARGS, OUTPUT_NAMES, MoEConfig, make_inputs
from mok.testing.dist import WorkerError, launch, run_world
from mok.testing.tolerance import GRAD_OF, assert_within_2x, plain_outputs
from mok.testing.runner import run_layer, shard_inputs, unshard_outputs

pytestmark = [pytest.mark.gpu, pytest.mark.sm90]

CFGS = {
    "shared": MoEConfig(T=256, H=128, I=64, E=16, K=4, S=64),   # shared expert, 16 experts
    "no_shared": MoEConfig(T=136, H=64, I=32, E=8, K=2, S=0),   # no shared expert, T/W not a multiple of 8
    "shared_whole": MoEConfig(T=64, H=64, I=32, E=8, K=2, S=24),  # S/W not a multiple of 8: all of S per rank
}


def _cpu(d: dict) -> dict:
    return {k: (v.cpu() if v is not None else None) for k, v in d.items()}


def _w1(inputs: dict) -> dict:
    return _cpu(run_layer({k: (v.cuda() if v is not None else None) for k, v in inputs.items()}, impl=mok.fast))


def _assert_same(got: dict, want: dict, label: str) -> None:
    for k in OUTPUT_NAMES:
        assert (got[k] is None) == (want[k] is None), f"{label}: {k} present in one only"
        if want[k] is not None:
            assert_bitwise_equal(got[k], want[k], f"{label}: {k}")


@pytest.mark.parametrize("name", list(CFGS))  # the three CFGS above: shared, no_shared, shared_whole
@pytest.mark.parametrize("W", [
    2,  # the smallest world: half the experts on each rank
    4,  # four ranks: two experts each where E = 8
    8,  # eight ranks: one expert each where E = 8, 17 tokens each for no_shared
])
def test_every_output_is_bitwise_the_w1_output(name, W):
    cfg = CFGS[name]
    inputs = make_inputs(cfg, seed=11, routing="skewed")
    want = _w1(inputs)
    got = unshard_outputs(run_world(inputs, W, impl="fast", device="cuda"))  # also: shared grads equal on all ranks
    _assert_same(got, want, f"W={W}")


def _reruns(rank, world_size, group, inputs, n):
    local = {k: (v.cuda() if v is not None else None) for k, v in shard_inputs(inputs, rank, world_size).items()}
    first = run_layer(local, impl=mok.fast, group=group)
    for i in range(n):
        out = run_layer(local, impl=mok.fast, group=group)
        for k in OUTPUT_NAMES:
            if first[k] is not None and not torch.equal(raw_bits(out[k]), raw_bits(first[k])):
                assert_bitwise_equal(out[k], first[k], f"rank {rank} rerun {i}: {k}")
    return n


def test_100_reruns_are_bitwise_identical_at_w2():
    inputs = make_inputs(CFGS["shared"], seed=12)
    assert launch(_reruns, (inputs, 100), 2, device="cuda") == [100, 100]


@pytest.mark.parametrize("W", [
    2,  # two ranks, eight of the 16 experts each
    4,  # four ranks, four experts each: more of each token's K = 4 experts remote
])
def test_within_twice_plain_bf16_error_of_the_reference(W):
    inputs = make_inputs(CFGS["shared"], seed=13)
    got = unshard_outputs(run_world(inputs, W, impl="fast", device="cuda"))
    assert_within_2x(got, _cpu(run_layer(inputs)), _cpu(plain_outputs(inputs)), f"W={W}")


def _graph_replay(rank, world_size, group, inputs):
    local = {k: (v.cuda() if v is not None else None) for k, v in shard_inputs(inputs, rank, world_size).items()}
    args = [local[a] for a in LAYER_ARGS]
    eager = run_layer(local, impl=mok.fast, group=group)  # also creates the peer buffers before capture
    static = {}
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, ctx = mok.fast.forward(*args, group=group)
        grads = mok.fast.backward(ctx, local["dy"])
        static.update(zip(OUTPUT_NAMES, (y, *grads), strict=True))
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    for k in OUTPUT_NAMES:
        if eager[k] is not None:
            assert_bitwise_equal(static[k], eager[k], f"rank {rank} graph replay: {k}")
    return True


def test_cuda_graph_replay_matches_eager_at_w2():
    inputs = make_inputs(CFGS["shared"], seed=14)
    assert launch(_graph_replay, (inputs,), 2, device="cuda") == [True, True]


def _through_autograd_op(rank, world_size, group, inputs):
    from mok.nn import ops

    local = {k: (v.cuda() if v is not None else None) for k, v in shard_inputs(inputs, rank, world_size).items()}
    leaves = {k: (v.clone().requires_grad_(True) if v is not None and v.is_floating_point() else v)
              for k, v in local.items()}
    y = ops.moe(*(leaves[a] for a in LAYER_ARGS), group=group, backend="fast")
    y.backward(local["dy"])
    out = {"y": y.detach().cpu()}
    out.update({g: (leaves[a].grad.cpu() if leaves[a] is not None else None) for g, a in GRAD_OF.items()})
    return out


def test_autograd_op_at_w2_gives_the_functional_w1_bits():
    """mok.nn.ops.moe(backend="fast", group): forward saves the EP context, backward loads it; the bf16
    weights' gradients are the fp32 ones rounded once."""
    inputs = make_inputs(CFGS["shared"], seed=15)
    want = _w1(inputs)
    got = unshard_outputs(launch(_through_autograd_op, (inputs,), 2, device="cuda"))
    for k in OUTPUT_NAMES:
        w = want[k].to(got[k].dtype) if want[k] is not None else None
        if w is not None:
            assert_bitwise_equal(got[k], w, f"ops.moe W=2: {k}")


# ---------------------------------------------------------------- bad input and failures under EP


def _bad_rank(rank, world_size, group, inputs, how):
    local = {k: (v.cuda() if v is not None else None) for k, v in shard_inputs(inputs, rank, world_size).items()}
    args = [local[a] for a in LAYER_ARGS]
    if rank == 1 and how == "tokens":
        args[0], args[1], args[2] = args[0][:-2].contiguous(), args[1][:-2].contiguous(), args[2][:-2].contiguous()
    if rank == 1 and how == "experts":
        args[6:9] = [a[:-1].contiguous() for a in args[6:9]]
    if rank == 1 and how == "dtype":
        args[0] = args[0].float()
    if rank == 1 and how == "dies":
        os._exit(3)
    if rank == 1 and how == "no_signal":  # passes the pre-flight, then never signals: the others' waits trap
        mok.fast._ep._sync_phase = lambda *a, **k: None
    y, ctx = mok.fast.forward(*args, group=group)
    mok.fast.backward(ctx, local["dy"])
    torch.cuda.synchronize()
    return True


@pytest.mark.parametrize("how, match", [
    ("tokens", "x: expected the same tokens per rank T on every rank"),        # T differs
    ("experts", "routed_gate: expected the same number of local experts L"),  # L differs
    ("dtype", "x: expected dtype torch.bfloat16"),                           # one rank's bad argument
    ("dies", "rank 1"),                                                      # a rank exits before the call
])
def test_a_bad_or_missing_rank_fails_every_rank_in_bounded_time(how, match, monkeypatch):
    monkeypatch.setenv("MOK_DIST_TIMEOUT_S", "20")
    inputs = make_inputs(CFGS["shared"], seed=16)
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match=match):
        launch(_bad_rank, (inputs, how), 2, device="cuda")
    assert time.monotonic() - t0 < 60


def test_a_rank_that_never_signals_traps_the_waiting_rank_after_the_timeout(monkeypatch):
    monkeypatch.setenv("MOK_EP_TIMEOUT_S", "5")
    monkeypatch.setenv("MOK_DIST_TIMEOUT_S", "30")
    inputs = make_inputs(CFGS["shared"], seed=17)
    t0 = time.monotonic()
    with pytest.raises(WorkerError, match="rank 0.*(CUDA|cuda|launch failure|trap)"):
        launch(_bad_rank, (inputs, "no_signal"), 2, device="cuda")
    assert time.monotonic() - t0 < 60

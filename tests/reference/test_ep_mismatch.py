"""Expert parallelism with one rank's arguments bad or different from the others', or ranks out of step
(one in a backward while the other runs a forward): every rank raises the same error, naming the argument
or each rank's call and the ranks, at once (no rank waits in a collective for the group's timeout, none
aborts inside gloo). One launch of 2 gloo processes runs every scenario in turn; the group stays usable
after each error."""

import time

import pytest
import torch

import mok
from mok import reference
from mok.testing.cases import LAYER_ARGS, MoEConfig, make_inputs
from mok.testing.dist import launch
from mok.testing.runner import shard_inputs

CFG = MoEConfig(T=8, H=8, I=4, E=4, K=2, S=4)


def _rank_inputs(rank, cfg=CFG, seed=0):
    return shard_inputs(make_inputs(cfg, seed), rank, 2)


def _scenarios(rank):
    """name -> this rank's (inputs for forward, dy override or None, what to call)."""
    base = _rank_inputs(rank)
    one = rank == 1
    out = {}
    out["T"] = ({**_rank_inputs(rank, MoEConfig(T=6 + 2 * rank, H=8, I=4, E=4, K=2, S=4))}, None, "forward")
    out["dtype"] = ({**base, "x": base["x"].float() if one else base["x"]}, None, "forward")
    out["L"] = ({**base, **({n: base[n][:1] for n in ("routed_gate", "routed_up", "routed_down")} if one else {})},
                None, "forward")
    k1 = make_inputs(MoEConfig(T=8, H=8, I=4, E=4, K=1, S=4), 0)
    out["K"] = (shard_inputs(k1, rank, 2) if one else base, None, "forward")
    h = make_inputs(MoEConfig(T=8, H=16, I=4, E=4, K=2, S=4), 0)
    out["H"] = (shard_inputs(h, rank, 2) if one else base, None, "forward")
    out["S"] = ({**base, **({n: None for n in ("shared_gate", "shared_up", "shared_down")} if one else {})},
                None, "forward")
    out["bad id"] = ({**base, "topk_idx": base["topk_idx"].clone().fill_(7) if one else base["topk_idx"]},
                     None, "forward")
    out["dy dtype"] = (base, base["dy"].float() if one else base["dy"], "backward")
    out["dy shape"] = (base, base["dy"][:3] if one else base["dy"], "backward")
    out["op"] = (base, base["dy"], "forward then backward" if one else "forward, forward")
    out["load_context short"] = (base, None, "load_context short" if one else "load_context")
    out["load_context vs forward"] = (base, None, "forward, forward" if one else "load_context")
    out["MoE backward vs forward"] = (None, None, "MoE forward, forward" if one else "MoE forward, backward")
    out["MoE recompute"] = (None, None, "MoE recompute" if one else "MoE forward, backward")
    out["MoE recompute, other rank"] = (None, None, "MoE forward, backward" if one else "MoE recompute")
    out["MoE score"] = (None, None, "MoE sigmoid" if one else "MoE forward, backward")
    out["MoE normalize"] = (None, None, "MoE unnormalized" if one else "MoE forward, backward")
    out["MoE score changed"] = (None, None, "MoE sigmoid after a step" if one else "MoE forward, forward")
    out["ok after errors"] = (base, base["dy"], "backward")
    return out


def _module_step(group, what):
    """mok.MoE over the group, 64 tokens per rank (more bytes than a pre-flight descriptor): a forward, then a
    backward ("MoE forward, backward"), a backward with recompute=True ("MoE recompute"), or a second
    forward in place of the backward ("MoE forward, forward"); the router scored by sigmoid ("MoE sigmoid") or
    its weights not renormalised ("MoE unnormalized"), or switched to sigmoid between two forwards ("MoE sigmoid
    after a step")."""
    torch.manual_seed(0)
    m = mok.MoE(8, 4, 4, 2, shared_intermediate_size=4, group=group, backend="reference",
                recompute=what == "MoE recompute", score="sigmoid" if what == "MoE sigmoid" else "softmax",
                normalize=what != "MoE unnormalized")
    x = torch.randn(64, 8, requires_grad=True)
    y = m(x)
    if what == "MoE sigmoid after a step":
        m.score = "sigmoid"
        m(x)
    elif what == "MoE forward, forward":
        m(x)
    else:
        y.sum().backward()


def _run_scenarios(rank, world_size, group):
    torch.set_num_threads(1)
    results = {}
    for name, (inp, dy, what) in _scenarios(rank).items():
        t0 = time.perf_counter()
        try:
            if what.startswith("MoE"):
                _module_step(group, what)
                results[name] = ("no error", time.perf_counter() - t0)
                continue
            y, ctx = reference.forward(*(inp[a] for a in LAYER_ARGS), group=group)
            args = (inp["x"], inp["topk_idx"], inp["topk_weight"], tuple(inp[a] for a in LAYER_ARGS[3:6]),
                    tuple(inp[a] for a in LAYER_ARGS[6:]))
            if what == "load_context":  # the first step of an autograd backward (mok.reference.moe, mok.nn)
                reference.load_context(reference.save_context(ctx), *args, group=group)
            elif what == "load_context short":
                reference.load_context(reference.save_context(ctx)[:5], *args, group=group)
            elif what == "backward":
                reference.backward(ctx, dy)
            elif what == "forward then backward":  # rank 1 is one call ahead of rank 0
                reference.backward(ctx, dy)
            elif what == "forward, forward":
                reference.forward(*(inp[a] for a in LAYER_ARGS), group=group)
            results[name] = ("no error", time.perf_counter() - t0)
        except Exception as e:  # noqa: BLE001 - the test inspects what each rank raised
            results[name] = (f"{type(e).__name__}: {e}", time.perf_counter() - t0)
    return results


@pytest.fixture(scope="module")
def by_rank():
    return launch(_run_scenarios, (), 2, timeout_s=60)


@pytest.mark.parametrize("name, parts", [
    # rank 1 has more tokens than rank 0 (4 against 3)
    ("T", ["ValueError", "x: expected the same tokens per rank T", "3 on rank 0, 4 on rank 1"]),
    # rank 1's x in fp32: a bad argument on one rank only
    ("dtype", ["TypeError", "x: expected dtype torch.bfloat16, got torch.float32", "on rank 1 of the group"]),
    # rank 1 holds one local expert, rank 0 two
    ("L", ["ValueError", "routed_gate: expected the same number of local experts L", "2 on rank 0, 1 on rank 1"]),
    # rank 1 routes each token to one expert, rank 0 to two
    ("K", ["ValueError", "topk_idx: expected the same experts per token K", "2 on rank 0, 1 on rank 1"]),
    # rank 1's hidden size twice rank 0's
    ("H", ["ValueError", "x: expected the same hidden size H", "8 on rank 0, 16 on rank 1"]),
    # rank 1 without the shared expert
    ("S", ["ValueError", "shared_gate: expected the same shared intermediate size S", "4 on rank 0, 0 on rank 1"]),
    # rank 1's expert ids all 7, past E = 4
    ("bad id", ["ValueError", "topk_idx: expected expert ids in [0, 4), got 7"]),
    # backward: rank 1's dy in fp32
    ("dy dtype", ["TypeError", "dy: expected dtype torch.bfloat16, got torch.float32", "on rank 1 of the group"]),
    # backward: rank 1's dy one token short
    ("dy shape", ["ValueError", "dy: expected shape (4, 8), got (3, 8)", "on rank 1 of the group"]),
    # calls out of step: rank 1 runs backward while rank 0 runs a second forward
    ("op", ["RuntimeError", "expected every rank in the same mok call", "forward on rank 0, backward on rank 1"]),
    # load_context (a backward's first step) with rank 1's saved context cut short: raised on both ranks
    ("load_context short", ["ValueError", "saved: expected the 9 tensors of save_context, got 5",
                            "on rank 1 of the group"]),
    # rank 0 rebuilds its context for a backward while rank 1 runs a second forward: load_context's
    # pre-flight comes before it gathers x, so nothing of a different size is exchanged
    ("load_context vs forward", ["RuntimeError", "expected every rank in the same mok call",
                                 "backward (load_context) on rank 0, forward on rank 1", "out of step"]),
    # mok.MoE: rank 0 runs y.sum().backward() while rank 1 calls the module again (gloo aborted with SIGABRT)
    ("MoE backward vs forward", ["RuntimeError", "expected every rank in the same mok call",
                                 "backward (load_context) on rank 0, forward on rank 1", "out of step"]),
    # mok.MoE with recompute=True on rank 1 only: its backward starts with a forward, rank 0's with load_context
    ("MoE recompute", ["RuntimeError", "backward (load_context) on rank 0, forward on rank 1", "recompute"]),
    # the same with recompute=True on rank 0
    ("MoE recompute, other rank", ["RuntimeError", "forward on rank 0, backward (load_context) on rank 1",
                                   "recompute"]),
    # mok.MoE scoring by sigmoid on rank 1, softmax on rank 0: each rank would route its tokens differently
    ("MoE score", ["ValueError", "score: expected the same router score", "0 on rank 0, 1 on rank 1"]),
    # mok.MoE renormalising the K weights on rank 0 only
    ("MoE normalize", ["ValueError", "normalize: expected the same normalize", "1 on rank 0, 0 on rank 1"]),
    # rank 1 switches its module to sigmoid after a step; its next routing checks again, rank 0 is in the layer
    ("MoE score changed", ["RuntimeError", "forward on rank 0, mok.MoE's router settings check on rank 1",
                           "every rank must make that change"]),
])
def test_every_rank_raises_the_same_error(by_rank, name, parts):
    msgs = [r[name][0] for r in by_rank]
    assert msgs[0] == msgs[1], f"ranks raised different errors: {msgs}"
    for p in parts:
        assert p in msgs[0], f"{name}: {msgs[0]!r} does not mention {p!r}"
    assert max(r[name][1] for r in by_rank) < 20, "an error must not wait for a collective timeout"


def test_group_still_works_after_the_errors(by_rank):
    assert [r["ok after errors"][0] for r in by_rank] == ["no error", "no error"]

"""Run one forward+backward of a layer implementation, whole or as one rank's shard."""

from __future__ import annotations

import torch

from .bits import assert_outputs_bitwise_equal, bit_diff
from .cases import LAYER_ARGS, OUTPUT_NAMES


def shard_inputs(inputs: dict, rank: int, world_size: int) -> dict:
    """Rank `rank`'s part of global inputs: its T = N / W tokens and its L = E / W experts."""
    from ..reference import check_ep_split

    N = inputs["x"].shape[0]
    L = check_ep_split(inputs["routed_gate"].shape[0], world_size)
    if N % world_size:
        raise ValueError(f"x: expected the token count divisible by W = {world_size}, got {N}")
    T = N // world_size
    out = dict(inputs)
    for name in ("x", "topk_idx", "topk_weight", "dy"):
        out[name] = inputs[name][rank * T : (rank + 1) * T]
    for name in ("routed_gate", "routed_up", "routed_down"):
        out[name] = inputs[name][rank * L : (rank + 1) * L]
    return out


def run_layer(inputs: dict, *, impl=None, group=None, precision: str = "bf16") -> dict:
    """forward then backward(dy) of `impl` (a module with forward/backward; default the reference), with
    recipe `precision` (passed on only when not "bf16").

    Returns {name: tensor or None} for OUTPUT_NAMES, on the inputs' device.
    """
    if impl is None:
        from .. import reference as impl
    kw = {} if precision == "bf16" else {"precision": precision}
    y, ctx = impl.forward(*(inputs[a] for a in LAYER_ARGS), group=group, **kw)
    grads = impl.backward(ctx, inputs["dy"])
    return dict(zip(OUTPUT_NAMES, (y, *grads)))


def capture_layer(static: dict, **kw) -> tuple:
    """`run_layer(static, **kw)` captured in a CUDA graph, after two warm-up runs on a side stream (as
    torch.cuda.graphs asks). Returns (the torch.cuda.CUDAGraph, its outputs {name: tensor or None})."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            run_layer(static, **kw)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run_layer(static, **kw)
    return graph, out


def assert_replays_equal(graph, out: dict, expected: dict, label: str, replays: int = 3) -> None:
    """Replay `graph` `replays` times, its outputs `out` overwritten with 7 before each replay, and compare them
    bitwise with `expected` after each (`assert_outputs_bitwise_equal`)."""
    for _ in range(replays):
        for v in out.values():
            if v is not None:
                v.fill_(7)
        graph.replay()
        torch.cuda.synchronize()
        assert_outputs_bitwise_equal(out, expected, label)


def unshard_outputs(parts: list) -> dict:
    """Assemble per-rank outputs (rank order) into global ones; shared grads must agree bitwise."""
    out = {}
    for name in ("y", "d_x", "d_topk_weight", "d_routed_gate", "d_routed_up", "d_routed_down"):
        out[name] = torch.cat([p[name] for p in parts], dim=0)
    for name in ("d_shared_gate", "d_shared_up", "d_shared_down"):
        first = parts[0][name]
        for r, p in enumerate(parts[1:], 1):
            if first is not None and not bit_diff(p[name], first).equal:
                raise AssertionError(f"{name}: rank {r} differs from rank 0; shared gradients must be identical on every rank")
        out[name] = first
    return out


IMPLS = ("reference", "fast")


def layer_impl(name: str):
    """The layer implementation called `name`: mok.reference or mok.fast."""
    if name not in IMPLS:
        raise ValueError(f"impl: expected one of {IMPLS}, got {name!r}")
    if name == "fast":
        from .. import fast
        return fast
    from .. import reference
    return reference


def run_sharded(inputs: dict, rank: int, world_size: int, group, impl: str = "reference",
                precision: str = "bf16") -> dict:
    """One rank's forward+backward on its shard of global `inputs` (called inside a process group) with
    implementation `impl` ("reference" or "fast") and recipe `precision`; outputs on the CPU."""
    local = shard_inputs(inputs, rank, world_size)
    out = run_layer(local, impl=layer_impl(impl), group=group, precision=precision)
    return {k: (v.cpu() if v is not None else None) for k, v in out.items()}

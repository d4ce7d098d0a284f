"""The eager backward frees the saved context as it reads it (mok/fast/_backward.py `release`, and
`_fp8_layer.run_backward_fp8` in the FP8 recipe), on the GPU: the backward's peak memory is at least the saved
[p | q] (fp32 [R, 2I]) lower than with retain_graph=True, which keeps it, and every gradient is bitwise the same
either way, in both recipes; the backward's peak, one GPU and expert-parallel, is what
its order of allocations and frees plans. (The CPU tests, tests/fast/test_release.py and
tests/fast/test_ep_emulated.py, check the bits and what is freed with the emulated kernels; this one checks that
the caching allocator gets the memory back.)"""
import pytest
import torch

from mok.testing.bits import assert_bitwise_equal
from mok.testing.cases import MoEConfig, make_inputs
from mok.nn import ops

pytestmark = [pytest.mark.gpu, pytest.mark.sm90]


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
@pytest.mark.parametrize("cfg", [
    MoEConfig(T=2048, H=1024, I=2048, E=8, K=2, S=0),    # few large experts: the fused d_a launch reads [p | q]
    MoEConfig(T=1000, H=512, I=256, E=32, K=8, S=128),   # many small ones and a shared expert: the swiglu_bwd kernel
])
def test_eager_backward_peak_drops_by_the_released_p_q_with_the_same_gradients(cfg, precision):
    inputs = make_inputs(cfg, seed=41, device="cuda")
    stacked = {"routed": torch.cat([inputs["routed_gate"], inputs["routed_up"]], 1),
               "shared": (torch.cat([inputs["shared_gate"], inputs["shared_up"]]) if cfg.S else None)}

    def step(retain: bool):
        leaves = {k: (v.detach().clone().requires_grad_(True) if v is not None else None)
                  for k, v in (("x", inputs["x"]), ("rgu", stacked["routed"]), ("rd", inputs["routed_down"]),
                               ("sgu", stacked["shared"]), ("sd", inputs["shared_down"]))}
        y = ops.moe_gate_up(leaves["x"], inputs["topk_idx"], inputs["topk_weight"], leaves["sgu"], leaves["sd"],
                            leaves["rgu"], leaves["rd"], backend="fast", precision=precision)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        y.backward(inputs["dy"], retain_graph=retain)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        return peak, {k: v.grad.clone() for k, v in leaves.items() if v is not None}

    step(False)  # the kernels' first launches, outside the measurement
    kept, want = step(True)
    freed, got = step(False)
    pq_bytes = cfg.T * cfg.K * 2 * cfg.I * 4
    assert kept - freed >= pq_bytes, f"peak {kept} B with the graph kept, {freed} B released: less than {pq_bytes}"
    for k in want:
        assert_bitwise_equal(got[k], want[k], f"d_{k}")


def _highest(steps: list) -> tuple[int, str]:
    """(bytes, stage) where the running sum of the steps' (stage, bytes allocated or freed) is highest."""
    live, best = 0, (0, "")
    for name, delta in steps:
        live += delta
        best = max(best, (live, name))
    return best


def _second_backward_peak(leaves: dict, forward, dy) -> int:
    """Bytes the eager backward allocates above what is resident when it starts, in the second of two steps (the
    first: the kernels' first launches, and the expert-parallel buffers). forward(leaves) -> y."""
    for _ in range(2):
        for v in leaves.values():
            if v is not None:
                v.grad = None
        y = forward(leaves)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        y.backward(dy)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    return peak


def _planned_backward_peak(cfg: MoEConfig) -> tuple[int, int]:
    """(bytes, stage): the most the eager backward of one stacked [gate; up] layer with bf16 weights should allocate
    above what is resident when it starts (inputs, y, the saved context), from mok/fast/_backward.py's order with
    release_saved: d_topk_weight and go rows; o freed; [dg | du]; [p | q] freed; d_x rows and d_x; the gate/up
    gradient; [dg | du], the d_x rows and the x rows freed; the down gradient. The fused d_a launch (8 splits I, S)."""
    T, H, I, E, K, S = cfg.T, cfg.H, cfg.I, cfg.E, cfg.K, cfg.S
    R = T * K
    steps = [("pre-combine", 4 * T * K + 2 * R * H), ("o freed", -2 * R * H), ("d_a", 4 * R * I + 4 * T * S),
             ("[p | q] freed", -8 * R * I - 8 * T * S), ("d_x", 2 * R * H + 2 * T * H * (S > 0) + 2 * T * H),
             ("gate/up gradient", 4 * E * I * H + 4 * S * H),
             ("rows freed", -4 * R * I - 4 * T * S - 2 * R * H - 2 * T * H * (S > 0) - 2 * R * H),
             ("down gradient", 2 * E * I * H + 2 * S * H)]
    return _highest(steps)


@pytest.mark.parametrize("cfg", [
    MoEConfig(T=4096, H=2048, I=1024, E=64, K=2, S=0),    # 64 experts of 128 rows: the down gradient step peaks
    MoEConfig(T=4096, H=2048, I=2048, E=16, K=2, S=512),  # the gate/up gradient step peaks; a shared expert
])
def test_eager_backward_peak_is_the_planned_one(cfg):
    """The backward allocates no more than its plan (`_planned_backward_peak`, within 8 MiB of workspaces and
    rounding) and not far less (the plan is what runs). The first shape peaks at the down gradient, where the d_x
    rows and the x rows (4·R·H bytes: 128 MiB) are already freed."""
    inputs = make_inputs(cfg, seed=42, device="cuda")
    leaves = {k: (v.detach().clone().requires_grad_(True) if v is not None else None)
              for k, v in (("x", inputs["x"]), ("rd", inputs["routed_down"]), ("sd", inputs["shared_down"]),
                           ("rgu", torch.cat([inputs["routed_gate"], inputs["routed_up"]], 1)),
                           ("sgu", torch.cat([inputs["shared_gate"], inputs["shared_up"]]) if cfg.S else None))}
    want, stage = _planned_backward_peak(cfg)
    peak = _second_backward_peak(leaves, lambda v: ops.moe_gate_up(v["x"], inputs["topk_idx"], inputs["topk_weight"],
                                                                    v["sgu"], v["sd"], v["rgu"], v["rd"],
                                                                    backend="fast"), inputs["dy"])
    mib = 2**20
    assert want - 16 * mib <= peak <= want + 8 * mib, \
        f"backward peak {peak / mib:.1f} MiB above its start, planned {want / mib:.1f} MiB (at the {stage} step)"


def _planned_ep_backward_peak(cfg: MoEConfig, W: int) -> tuple[int, int]:
    """(bytes, stage): as `_planned_backward_peak`, for one rank of the expert-parallel backward (mok/fast/_ep.py
    `run_backward_ep`; no shared expert): T local tokens, L = E / W local experts, and the received rows sized for the
    dropless worst case, R = W·T·K. Its order: d_topk_weight; o [T, K, H] freed; go rows; [dg | du]; [p | q] freed;
    d_x rows, dropped once scattered; d_x; the gate/up gradient; [dg | du] and the x rows freed; the down gradient."""
    T, H, I, E, K = cfg.T // W, cfg.H, cfg.I, cfg.E, cfg.K
    L, R = E // W, W * (cfg.T // W) * K
    steps = [("d_topk_weight", 4 * T * K), ("o freed", -2 * T * K * H), ("go rows", 2 * R * H), ("d_a", 4 * R * I),
             ("[p | q] freed", -8 * R * I), ("d_x rows", 2 * R * H), ("d_x rows dropped", -2 * R * H),
             ("d_x", 2 * T * H), ("gate/up gradient", 4 * L * I * H), ("rows freed", -4 * R * I - 2 * R * H),
             ("down gradient", 2 * L * I * H)]
    return _highest(steps)


def _ep_backward_peak(rank, world_size, group, inputs):
    """This rank's eager backward peak above its start (bytes), second of two steps, through ops.moe_gate_up."""
    from mok.testing.runner import shard_inputs

    local = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in
             shard_inputs(inputs, rank, world_size).items()}
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in
              (("x", local["x"]), ("rd", local["routed_down"]),
               ("rgu", torch.cat([local["routed_gate"], local["routed_up"]], 1)))}
    peak = _second_backward_peak(leaves, lambda v: ops.moe_gate_up(v["x"], local["topk_idx"], local["topk_weight"],
                                                                    None, None, v["rgu"], v["rd"], group=group,
                                                                    backend="fast"), local["dy"])
    import mok.fast

    mok.fast.release_ep_buffers()
    return peak


def test_expert_parallel_backward_peak_is_the_planned_one():
    """Two ranks sharing the GPU: each rank's backward allocates its plan (`_planned_ep_backward_peak`, within the
    same margins), which frees the d_x rows once scattered and the x rows once the gate/up gradients are queued:
    R·H·2 bytes each (64 MiB here). Kept to the end, as before run 29, the peak would be 192 MiB, at the down
    gradient, against the plan's 100."""
    from mok.testing.dist import launch

    cfg, W = MoEConfig(T=2048, H=4096, I=128, E=64, K=4, S=0), 2
    want, stage = _planned_ep_backward_peak(cfg, W)
    mib = 2**20
    assert (want, stage) == (100 * mib + 4 * (cfg.T // W) * cfg.K, "gate/up gradient"), (want / mib, stage)
    inputs = make_inputs(cfg, seed=43)
    for rank, peak in enumerate(launch(_ep_backward_peak, (inputs,), W, device="cuda", timeout_s=120)):
        assert want - 16 * mib <= peak <= want + 8 * mib, \
            f"rank {rank}: backward peak {peak / mib:.1f} MiB above its start, planned {want / mib:.1f} MiB ({stage})"

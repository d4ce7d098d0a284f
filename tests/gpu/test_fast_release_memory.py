"""The eager backward frees the saved context as it reads it (mok/fast/_backward.py `release`), on the GPU: the
backward's peak memory is at least the saved [p | q] (fp32 [R, 2I]) lower than with retain_graph=True, which keeps
it, and every gradient is bitwise the same either way. (The CPU tests, tests/test_fast_release.py, check the bits
and what is freed with the emulated kernels; this one checks that the caching allocator gets the memory back.)"""
import pytest
import torch

from mok.harness.bits import assert_bitwise_equal
from mok.harness.cases import MoEConfig, make_inputs
from mok.nn import ops

pytestmark = [pytest.mark.gpu, pytest.mark.sm90]


@pytest.mark.parametrize("cfg", [
    MoEConfig(T=2048, H=1024, I=2048, E=8, K=2, S=0),    # few large experts: the fused d_a launch reads [p | q]
    MoEConfig(T=1000, H=512, I=256, E=32, K=8, S=128),   # many small ones and a shared expert: the swiglu_bwd kernel
])
def test_eager_backward_peak_drops_by_the_released_p_q_with_the_same_gradients(cfg):
    inputs = make_inputs(cfg, seed=41, device="cuda")
    stacked = {"routed": torch.cat([inputs["routed_gate"], inputs["routed_up"]], 1),
               "shared": (torch.cat([inputs["shared_gate"], inputs["shared_up"]]) if cfg.S else None)}

    def step(retain: bool):
        leaves = {k: (v.detach().clone().requires_grad_(True) if v is not None else None)
                  for k, v in (("x", inputs["x"]), ("rgu", stacked["routed"]), ("rd", inputs["routed_down"]),
                               ("sgu", stacked["shared"]), ("sd", inputs["shared_down"]))}
        y = ops.moe_gate_up(leaves["x"], inputs["topk_idx"], inputs["topk_weight"], leaves["sgu"], leaves["sd"],
                            leaves["rgu"], leaves["rd"], backend="fast")
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

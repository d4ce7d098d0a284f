"""Where the GPU waits during forward+backward steps queued back to back (as a training loop and bench_moe.py's
stream timing run them): under torch.profiler, the wall time of N queued steps against the time a kernel runs, and
the largest idle gaps with the kernels on either side. The layer (mok.fast, gate and up as halves of one tensor),
or with --module a `mok.MoE` (bf16 parameters, fast backend) with its router and router losses.

Usage: python benchmarks/step_gaps.py [config,...] [--steps 10] [--weight-grads fp32|bf16] [--module]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import mok.fast  # noqa: E402
from bench_moe import ARGS, CONFIGS, SUITE, load_configs, make_bench_inputs  # noqa: E402
from mok.harness.cases import with_stacked_gate_up  # noqa: E402
from profile_fast import busy_ms, short  # noqa: E402


def layer_step(inp: dict, wgrad: torch.dtype):
    def step():
        y, ctx = mok.fast.forward(*(inp[k] for k in ARGS))
        return mok.fast.backward(ctx, inp["dy"], weight_grad_dtype=wgrad)
    return step


def module_step(c: dict, inp: dict):
    """One mok.MoE training step (bf16 parameters): forward with router losses, backward."""
    import mok

    m = mok.MoE(c["H"], c["I"], c["E"], c["K"], shared_intermediate_size=c["S"], backend="fast",
                dtype=torch.bfloat16, device="cuda")
    x = inp["x"].detach().clone().requires_grad_()

    def step():
        m.zero_grad(set_to_none=True)
        x.grad = None
        y, rl = m(x, return_router_losses=True)
        ((y * inp["dy"]).sum() + 0.01 * rl.load_balance + 0.001 * rl.z).backward()
    return step


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="?", default="qwen3-30b-a3b,mid-64e")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--weight-grads", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--module", action="store_true", help="mok.MoE with router losses instead of the layer")
    a = ap.parse_args()
    wgrad = torch.float32 if a.weight_grads == "fp32" else torch.bfloat16
    by_name = {c["name"]: c for c in load_configs(CONFIGS) + load_configs(SUITE)}
    for name in a.configs.split(","):
        inp = with_stacked_gate_up(make_bench_inputs(by_name[name], "random"))
        step = module_step(by_name[name], inp) if a.module else layer_step(inp, wgrad)

        for _ in range(3):
            step()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            start.record()
            for _ in range(a.steps):
                step()
            end.record()
            end.synchronize()
        evs = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                      and e.time_range.end > e.time_range.start), key=lambda e: e.time_range.start)
        gaps, reach, prev = [], None, None  # idle stretches: no kernel running (side-stream kernels overlap)
        for e in evs:
            s, t = e.time_range.start, e.time_range.end
            if reach is not None and s > reach:
                gaps.append(((s - reach) / 1e3, short(prev.name), short(e.name)))
            if reach is None or t > reach:
                reach, prev = t, e
        span = (reach - evs[0].time_range.start) / 1e3
        print(f"{name}: {a.steps} steps queued: {start.elapsed_time(end) / a.steps:.2f} ms a step by CUDA events; "
              f"first kernel to last {span / a.steps:.2f} ms a step, a kernel running {busy_ms(evs) / a.steps:.2f}; "
              f"idle {sum(g for g, *_ in gaps) / a.steps:.3f} ms a step in {len(gaps)} gaps")
        for g, before, after in sorted(gaps, reverse=True)[:8]:
            print(f"  {g:7.3f} ms idle after {before} before {after}")
        del inp, step
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())

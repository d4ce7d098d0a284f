"""Per-kernel GPU time of `mok.MoE`'s router on the fast backend: one forward+backward of the router and its
losses (what a training step adds to the layer), kernels in launch order (torch.profiler), at a config of
configs.json or suite.json.

Usage: python benchmarks/profile_router.py [config] [--no-losses]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import mok  # noqa: E402
from bench_moe import CONFIGS, SUITE, load_configs, timed  # noqa: E402
from profile_fast import short  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", nargs="?", default="qwen3-30b-a3b")
    ap.add_argument("--no-losses", action="store_true")
    a = ap.parse_args()
    c = {c["name"]: c for c in load_configs(CONFIGS) + load_configs(SUITE)}[a.config]
    T, H, I, E, K, S = (c[k] for k in "THIEKS")
    torch.manual_seed(0)
    m = mok.MoE(H, I, E, K, shared_intermediate_size=S, backend="fast", dtype=torch.bfloat16, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(T, H, generator=g, device="cuda").to(torch.bfloat16).requires_grad_()

    def step():
        m.zero_grad(set_to_none=True)
        x.grad = None
        r = m.route(x)
        loss = (r.scores * 1e-3).sum() + (r.topk_weight * 1e-3).sum()
        if not a.no_losses:
            rl = m.router_losses(r)
            loss = loss + 0.01 * rl.load_balance + 0.001 * rl.z
        loss.backward()

    ms = timed(step, 3, 10, "stream")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    evs = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                 key=lambda e: e.time_range.start)
    total = sum(e.device_time_total for e in evs) / 1e3
    print(f"{a.config} T={T} H={H} E={E} K={K}: router fwd+bwd{'' if a.no_losses else ' + losses'} {ms:.3f} ms "
          f"queued back to back; {total:.3f} ms of kernels in one step, in launch order:")
    for e in evs:
        print(f"  {e.device_time_total / 1e3:8.3f} ms  {short(e.name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

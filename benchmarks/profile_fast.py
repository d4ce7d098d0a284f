"""Per-kernel time of one mok.fast forward+backward (torch.profiler, CUDA activity), per config of
configs.json: what the GEMMs and the separate memory-bound kernels cost.
Usage: python benchmarks/profile_fast.py [config,...]"""
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import mok.fast  # noqa: E402
from bench_moe import ARGS, CONFIGS, load_configs, make_bench_inputs  # noqa: E402


def short(name: str) -> str:
    if "GemmUniversal" in name or "cutlass" in name:
        return "cutlass grouped GEMM " + ("pingpong" if "Pingpong" in name else "cooperative") + \
            (" f32-out" if "LinearCombinationIffvf" in name else " bf16-out")
    return name.split("(")[0].replace("void ", "").replace("(anonymous namespace)::", "")[:60]


def step(inp):
    y, ctx = mok.fast.forward(*(inp[a] for a in ARGS))
    return mok.fast.backward(ctx, inp["dy"])


def main():
    names = sys.argv[1].split(",") if len(sys.argv) > 1 else None
    for c in load_configs(CONFIGS):
        if names and c["name"] not in names:
            continue
        inp = make_bench_inputs(c, "random")
        for _ in range(3):
            step(inp)
        torch.cuda.synchronize()
        iters = 3
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                step(inp)
            torch.cuda.synchronize()
        evs = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
        per = len(evs) // iters
        last = evs[-per:]
        s = sum(e.device_time_total for e in last) / 1e3
        print(f"\n{c['name']}: kernel time of one fwd+bwd {s:.2f} ms, in launch order:")
        for e in last:
            print(f"  {e.device_time_total / 1e3:8.3f} ms  {short(e.name)}")
        del inp
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

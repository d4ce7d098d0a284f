"""Per-kernel time of one forward+backward of each method, side by side on the same inputs (torch.profiler, CUDA
activity): where a peer (SonicMoE: sonic_peer.py) spends its step against mok. Configs run without their shared
expert; mok (gate and up as one tensor, bf16 weight gradients) as bench_moe.py's mok_gu. Each method's kernels are
listed in launch order with their ms (the last of 3 profiled steps queued back to back, after 3 warm-ups), then
the sum. Kernel names are cut to 100 characters.

Usage: python benchmarks/profile_peers.py qwen3-30b-a3b,mixtral-8x7b [--methods mok_gu,sonic]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_moe import Method, make_bench_inputs, named_configs  # noqa: E402
from profile_fast import busy_ms, profiled_steps  # noqa: E402


def kernel_name(name: str) -> str:
    """A kernel's name without `void `, anonymous namespaces and its argument list, at most 100 characters."""
    name = name.replace("(anonymous namespace)::", "").removeprefix("void ")
    return name.split("(")[0][:100]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs")
    ap.add_argument("--methods", default="mok_gu,sonic")
    a = ap.parse_args()
    try:
        configs = named_configs(a.configs)
    except ValueError as e:
        ap.error(str(e))
    for c in configs:
        name = c["name"]
        inp = make_bench_inputs(dict(c, S=0), "random")
        for m in a.methods.split(","):
            meth = Method(m, inp, torch.bfloat16)
            _, last = profiled_steps(meth.fwd_bwd)
            total = sum(e.device_time_total for e in last) / 1e3
            print(f"\n{name} {m}: {len(last)} kernels, {total:.2f} ms of kernel time a step, the GPU busy "
                  f"{busy_ms(last):.2f} ms; in launch order:", flush=True)
            for e in last:
                print(f"  {e.device_time_total / 1e3:8.3f} ms  {kernel_name(e.name)}")
            del meth
            torch.cuda.empty_cache()
        del inp
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

"""A few mok.fast forward+backward steps of one config and nothing else, for a hardware-counter profiler to attach to
(ncu: no torch.profiler here, whose CUPTI session would collide with it). Gate and up as halves of one tensor, as
profile_fast.py runs them.
Usage: ncu --clock-control none --kernel-name-base demangled -k regex:GemmUniversal --launch-skip 6 --launch-count 6 \
         python benchmarks/ncu_steps.py qwen3-30b-a3b [steps, default 2]"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_moe import CONFIGS, SUITE, load_configs, make_bench_inputs  # noqa: E402
from mok.harness.cases import with_stacked_gate_up  # noqa: E402
from profile_fast import step  # noqa: E402


def main():
    name, steps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2
    found = [c for c in load_configs(CONFIGS) + load_configs(SUITE) if c["name"] == name]
    if not found:
        raise SystemExit(f"ncu_steps.py: no config named {name!r} in configs.json or suite.json")
    inp = with_stacked_gate_up(make_bench_inputs(found[0], "random"))
    for _ in range(steps):
        step(inp)
    torch.cuda.synchronize()
    print(f"{name}: {steps} steps done")


if __name__ == "__main__":
    main()

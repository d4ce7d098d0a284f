"""The tile-variant choice (mok/fast/_tiles.py) against forcing one variant for every GEMM, in one process:
for each shape, fwd+bwd of the fast layer (gate/up as halves of one tensor, bf16 weight gradients) under
each choice, the choices interleaved round by round so that clock drift hits them alike; median ms per
choice. The bits are the same under every choice (tests/gpu/test_fast_tiles.py). CUDA only.

Usage: python benchmarks/bench_tiles.py [--configs a,b] [--choices default,0,2,3/3/3/3/2/2] [--rounds 5] [--reps 5]
(a choice: "default" (the rule), one variant for every GEMM, or seven joined by "/" in MokGemmKind order;
optionally "@" and a tile order, raster M or N then swizzle 1/2/4/8, e.g. "default@N2": MOK_FAST_GEMM_RASTER
and MOK_FAST_GEMM_SWIZZLE, which change only which CTA computes which tile; the swizzle never takes effect in
CUTLASS's group scheduler, benchmarks/RESULTS.md run 44)
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_moe import CONFIGS, SUITE, Method, load_configs, make_bench_inputs, timed  # noqa: E402
from mok.fast import _tiles  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="qwen3-30b-a3b,mid-64e,dsv3-ep8-slice,mixtral-8x7b,olmoe-1b-7b")
    ap.add_argument("--choices", default="default,0,2,3")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    names = a.configs.split(",")
    configs = {c["name"]: c for c in load_configs(CONFIGS) + load_configs(SUITE)}
    choices = a.choices.split(",")
    print(f"device {torch.cuda.get_device_name()}; fwd+bwd ms, median over {a.rounds} rounds of medians of {a.reps}")
    print("| config | " + " | ".join(f"{c} ms" for c in choices) + " | default vs 0 |")
    print("|---" * (len(choices) + 2) + "|")
    for name in names:
        c = configs[name]
        meth = Method("mok_gu", make_bench_inputs(c, "random"), torch.bfloat16)
        times = {ch: [] for ch in choices}
        for _ in range(a.rounds):
            for ch in choices:
                variants, _, order = ch.partition("@")
                if variants == "default":
                    os.environ.pop(_tiles.ENV, None)
                else:
                    os.environ[_tiles.ENV] = variants.replace("/", ",")
                os.environ["MOK_FAST_GEMM_RASTER"], os.environ["MOK_FAST_GEMM_SWIZZLE"] = \
                    (order[0], order[1:]) if order else ("M", "1")
                times[ch].append(timed(meth.fwd_bwd, 2, a.reps))
        med = {ch: statistics.median(v) for ch, v in times.items()}
        ratio = f"{med['0'] / med['default']:.3f}x" if "0" in med and "default" in med else "-"
        print(f"| {name} | " + " | ".join(f"{med[ch]:.2f}" for ch in choices) + f" | {ratio} |", flush=True)
        del meth
        torch.cuda.empty_cache()
    for var in (_tiles.ENV, "MOK_FAST_GEMM_RASTER", "MOK_FAST_GEMM_SWIZZLE"):
        os.environ.pop(var, None)


if __name__ == "__main__":
    main()

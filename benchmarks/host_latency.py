"""Where the host spends one fwd+bwd of mok.fast called one at a time (the host waits for the GPU before each
call, as bench_moe.py's timing does): the host time at which each C call starts and how long it takes, relative to
the call's start, and the GPU time from the start to the first and the last kernel. What the GPU waits for before
its first large GEMM is host latency that a training loop queueing steps back to back does not see.

Usage: python benchmarks/host_latency.py [config] [--reps 5]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import mok.fast  # noqa: E402
from bench_moe import ARGS, CONFIGS, SUITE, Method, load_configs, make_bench_inputs  # noqa: E402
from mok.fast import _lib  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", nargs="?", default="qwen3-30b-a3b")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    c = {c["name"]: c for c in load_configs(CONFIGS) + load_configs(SUITE)}[a.config]
    inp = Method("mok_gu", make_bench_inputs(c, "random")).inp
    log, orig = [], _lib._call

    def timed_call(name, device, *args):
        t = time.perf_counter()
        orig(name, device, *args)
        log.append((name, t, time.perf_counter()))

    _lib._call = timed_call
    rows = {}
    for rep in range(a.reps + 2):
        torch.cuda.synchronize()
        log.clear()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        y, ctx = mok.fast.forward(*(inp[k] for k in ARGS))
        t_fwd = time.perf_counter()
        mok.fast.backward(ctx, inp["dy"], weight_grad_dtype=torch.bfloat16)
        end.record()
        t1 = time.perf_counter()
        end.synchronize()
        if rep < 2:
            continue
        rows.setdefault("GPU ms from the start event to the end event", []).append(start.elapsed_time(end))
        rows.setdefault("host ms in forward()", []).append((t_fwd - t0) * 1e3)
        rows.setdefault("host ms in backward()", []).append((t1 - t_fwd) * 1e3)
        for i, (name, ts, te) in enumerate(log):
            rows.setdefault(f"call {i:2d} {name}: starts at ms", []).append((ts - t0) * 1e3)
            rows.setdefault(f"call {i:2d} {name}: takes ms", []).append((te - ts) * 1e3)
    print(f"{a.config}, median of {a.reps} calls one at a time (host perf_counter from just before the start event)")
    for k, v in rows.items():
        print(f"  {statistics.median(v):8.3f}  {k}")


if __name__ == "__main__":
    main()

"""GPU clock and power while the fast layer trains, for the fused SwiGLU backward (MOK_FAST_FUSE_SWIGLU_BWD=1)
against the unfused pair (=0): each choice runs fwd+bwd steps back to back for --seconds, alternating for --rounds,
while `nvidia-smi -lms 50` samples the SM clock, the board power and the active clock-event reasons; prints per phase
the ms per step and the mean clock and power of the samples after its first 0.5 s. Tells whether a step is held back
by the power limit (the H200 lowers its clock to stay within it). CUDA only.

Usage: python benchmarks/clock_probe.py [config] [--rounds 3] [--seconds 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_moe import CONFIGS, SUITE, Method, load_configs, make_bench_inputs  # noqa: E402
from mok.fast import _tiles  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", nargs="?", default="mid-64e")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    a = ap.parse_args()
    c = {x["name"]: x for x in load_configs(CONFIGS) + load_configs(SUITE)}[a.config]
    meth = Method("mok_gu", make_bench_inputs(c, "random"), torch.bfloat16)
    for fuse in ("0", "1"):  # warm both paths up
        os.environ[_tiles.FUSE_ENV] = fuse
        meth.fwd_bwd()
    torch.cuda.synchronize()
    log = tempfile.NamedTemporaryFile("w+", suffix=".csv", delete=False)
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,clocks_event_reasons.active",
                            "--format=csv,noheader,nounits", "-lms", "50"], stdout=log)
    time.sleep(1.0)
    phases = []
    for _ in range(a.rounds):
        for fuse in ("0", "1"):
            os.environ[_tiles.FUSE_ENV] = fuse
            t0, n = time.time(), 0
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            while time.time() - t0 < a.seconds:
                for _ in range(5):
                    meth.fwd_bwd()
                n += 5
                torch.cuda.synchronize()
            end.record()
            end.synchronize()
            phases.append((fuse, t0, time.time(), start.elapsed_time(end) / n))
    smi.terminate()
    smi.wait()
    os.environ.pop(_tiles.FUSE_ENV, None)
    samples = []
    for line in Path(log.name).read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4:
            continue
        try:
            ts = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            samples.append((ts, float(parts[1]), float(parts[2]), parts[3]))
        except ValueError:
            continue
    print(f"{a.config} on {torch.cuda.get_device_name()}: {len(samples)} samples")
    print("| MOK_FAST_FUSE_SWIGLU_BWD | ms per step | mean SM MHz | mean W | clock-event reasons seen |")
    print("|---|---|---|---|---|")
    for fuse, t0, t1, ms in phases:
        s = [x for x in samples if t0 + 0.5 <= x[0] <= t1]
        mhz = statistics.mean(x[1] for x in s) if s else float("nan")
        watts = statistics.mean(x[2] for x in s) if s else float("nan")
        print(f"| {fuse} | {ms:.2f} | {mhz:.0f} | {watts:.0f} | {sorted({x[3] for x in s})} |")


if __name__ == "__main__":
    main()

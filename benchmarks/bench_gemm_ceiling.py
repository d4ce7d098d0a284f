"""How close mok's grouped GEMMs come to a dense cuBLAS GEMM of the same size, and what the tile order costs.

For the gate/up GEMM of each config (A = the R = T*K routed rows [R, H] bf16, B = the experts' [gate; up]
[E, 2I, H] bf16, rows split evenly-at-random over the E experts): TFLOP/s of
  - mok's grouped GEMM, bf16 out (GEMM_TN_BF16) and fp32 out (GEMM_TN_F32, the layer's), E groups of N = 2I,
    in the given tile variants;
  - the same with 2E groups of N = I (gate and up apart: what the layer launched before this script);
  - mok's grouped GEMM with one group [R, H] x [H, 2I] (no group changes: what grouping costs);
  - torch.mm of the same one group (cuBLAS, bf16 out) and torch._grouped_mm of the E groups;
  - each mok launch under the tile orders given (MOK_FAST_GEMM_RASTER / MOK_FAST_GEMM_SWIZZLE; the swizzle never
    takes effect in CUTLASS's group scheduler, benchmarks/RESULTS.md run 44).
Median ms over interleaved rounds; bits of every mok launch of one (kind, grouping) checked equal. CUDA only.

Usage: python benchmarks/bench_gemm_ceiling.py [--configs a,b] [--variants 0,3] [--orders M1,N1,M2,M4,N4]
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
from bench_moe import bf16_peak_tflops, named_configs, timed  # noqa: E402
from mok.fast import _lib  # noqa: E402
from mok.fast._lib import Operand, Segment  # noqa: E402


def set_order(order: str) -> None:
    os.environ["MOK_FAST_GEMM_RASTER"], os.environ["MOK_FAST_GEMM_SWIZZLE"] = order[0], order[1:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="qwen3-30b-a3b,mid-64e,dsv3-ep8-slice,mixtral-8x7b")
    ap.add_argument("--variants", default="0,3")
    ap.add_argument("--orders", default="M1,N1,M2,M4,N2,N4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    try:
        configs = named_configs(a.configs)
    except ValueError as e:
        ap.error(f"--{e}")
    variants = [int(v) for v in a.variants.split(",")]
    orders = a.orders.split(",")
    dev = torch.device("cuda", torch.cuda.current_device())
    print(f"bf16 peak (8192^3 matmul, median of 10): {bf16_peak_tflops():.0f} TFLOP/s")
    print(f"device {torch.cuda.get_device_name()}; ms median over {a.rounds} rounds of medians of {a.reps}")
    print("| config | launch | " + " | ".join(orders) + " | best TFLOP/s |")
    print("|---" * (len(orders) + 3) + "|")
    for c in configs:
        bench_config(c["name"], c, a, variants, orders, dev)
        torch.cuda.empty_cache()
    for var in ("MOK_FAST_GEMM_RASTER", "MOK_FAST_GEMM_SWIZZLE"):
        os.environ.pop(var, None)


def bench_config(name, c, a, variants, orders, dev) -> None:
    """Print the rows of one config."""
    T, H, I, E, K = c["T"], c["H"], c["I"], c["E"], c["K"]
    R = T * K
    g = torch.Generator().manual_seed(1)
    counts = torch.bincount(torch.randint(0, E, (R,), generator=g), minlength=E)
    offsets = _lib.offsets_from_counts(counts, dev)
    x = torch.randn(R, H, device=dev, dtype=torch.bfloat16)
    w = torch.randn(E, 2 * I, H, device=dev, dtype=torch.bfloat16) / H ** 0.5
    flops = 2.0 * R * H * 2 * I
    outs = {torch.bfloat16: torch.empty(R, 2 * I, device=dev, dtype=torch.bfloat16),
            torch.float32: torch.empty(R, 2 * I, device=dev, dtype=torch.float32)}
    kinds = {torch.bfloat16: _lib.GEMM_TN_BF16, torch.float32: _lib.GEMM_TN_F32}

    def mok(dtype, grouping, v):
        out = outs[dtype]
        xa = Operand(x, 0, H, H)
        if grouping == "E x 2I":
            segs = [Segment.expert_rows(offsets, E, 2 * I, H, xa, Operand(w, 2 * I * H, 0, H),
                                        Operand(out, 0, 2 * I, 2 * I))]
        elif grouping == "2E x I":
            segs = [Segment.expert_rows(offsets, E, I, H, xa, Operand(w, 2 * I * H, 0, H, offset=h * I * H),
                                        Operand(out, 0, 2 * I, 2 * I, offset=h * I)) for h in (0, 1)]
        else:
            segs = [Segment.all_rows(R, 2 * I, H, Operand(x, 0, 0, H), Operand(w, 0, 0, H), Operand(out, 0, 0, 2 * I))]
        return lambda: _lib.grouped_gemm(kinds[dtype], segs, dev, v)

    launches = {}
    for dtype, tag in ((torch.bfloat16, "bf16"), (torch.float32, "f32")):
        for grouping in ("E x 2I", "2E x I", "1 x 2I"):
            if dtype == torch.float32 and grouping == "1 x 2I":
                continue
            for v in variants:
                launches[f"mok {tag} {grouping} v{v}"] = mok(dtype, grouping, v)
    w_t = w.transpose(-2, -1)
    ends = offsets[1:E + 1].clone()
    dense = {"torch.mm bf16 1 x 2I": lambda: torch.mm(x, w_t[0]),
             "torch._grouped_mm bf16 E x 2I": lambda: torch._grouped_mm(x, w_t, offs=ends)}
    for key, fn in launches.items():  # bits do not depend on the order
        want = None
        for o in orders:
            set_order(o)
            fn()
            torch.cuda.synchronize()
            got = outs[torch.bfloat16 if " bf16 " in key else torch.float32].clone()
            if want is None:
                want = got
            elif not torch.equal(got.view(torch.int16), want.view(torch.int16)):
                raise SystemExit(f"CHECK FAILED: {name} {key}: bits differ under tile order {o}")
    times = {k: {o: [] for o in orders} for k in launches}
    dtimes = {k: [] for k in dense}
    for _ in range(a.rounds):
        for key, fn in launches.items():
            for o in orders:
                set_order(o)
                times[key][o].append(timed(fn, 2, a.reps, mode="stream"))
        for key, fn in dense.items():
            dtimes[key].append(timed(fn, 2, a.reps, mode="stream"))
    for key in launches:
        med = {o: statistics.median(times[key][o]) for o in orders}
        best = min(med.values())
        print(f"| {name} | {key} | " + " | ".join(f"{med[o]:.3f}" for o in orders) +
              f" | {flops / best / 1e9:.0f} |", flush=True)
    for key in dense:
        m = statistics.median(dtimes[key])
        print(f"| {name} | {key} | " + " | ".join(f"{m:.3f}" if i == 0 else "" for i in range(len(orders))) +
              f" | {flops / m / 1e9:.0f} |", flush=True)


if __name__ == "__main__":
    main()

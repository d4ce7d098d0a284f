"""Time of the fast path's per-token kernels (one block per token): the row gather, the forward combine, the
backward pre-combine (d_topk_weight and go) and the d_x combine, at the shapes of configs.json and suite.json,
with each token's K rows at random rows of [0, T*K) (as the schedule spreads a token over K experts). Prints ms
(median of rounds of CUDA-event timings of back-to-back launches) and the bytes each kernel must move per ms.

Usage: python benchmarks/bench_token_kernels.py [config,...] [--rounds 5] [--reps 20]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_moe import CONFIGS, SUITE, load_configs  # noqa: E402
from mok.fast import _lib  # noqa: E402


def timed_ms(fn, rounds: int, reps: int) -> float:
    """Median over `rounds` of the mean time of `reps` launches queued back to back."""
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / reps)
    return statistics.median(out)


def kernels(c: dict):
    """(name, launch, bytes moved) of each per-token kernel at config c."""
    T, H, K = c["T"], c["H"], c["K"]
    R, dev, g = T * K, torch.device("cuda"), torch.Generator(device="cuda").manual_seed(0)
    bf = dict(device=dev, dtype=torch.bfloat16)
    x, dy, s = (torch.randn(T, H, generator=g, **bf) for _ in range(3))
    rows_RH, other_RH, out_RH = (torch.randn(R, H, generator=g, **bf) for _ in range(3))
    w = torch.rand(T, K, generator=g, device=dev)
    pair_row = torch.randperm(R, generator=g, device=dev).to(torch.int32)
    flag = torch.zeros(1, dtype=torch.int32, device=dev)
    y, d_w = torch.empty(T, H, **bf), torch.empty(T, K, device=dev)
    row_bytes, tok_bytes = R * H * 2, T * H * 2
    return [
        ("gather", lambda: _lib.gather_rows(x, pair_row, R, out_RH), tok_bytes + row_bytes),
        ("combine", lambda: _lib.combine_fwd(s, rows_RH, w, pair_row, flag, y), 2 * tok_bytes + row_bytes),
        ("pre-combine", lambda: _lib.combine_bwd_pre(dy, rows_RH, w, pair_row, flag, d_w, other_RH),
         tok_bytes + 2 * row_bytes),
        ("d_x combine", lambda: _lib.combine_bwd_dx(s, rows_RH, pair_row, flag, K, y), 2 * tok_bytes + row_bytes),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="?", default=None, help="comma-separated names (default: all)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    names = a.configs.split(",") if a.configs else None
    seen, configs = set(), []
    for c in load_configs(CONFIGS) + load_configs(SUITE):
        if c["name"] not in seen and (names is None or c["name"] in names):
            seen.add(c["name"])
            configs.append(c)
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}")
    print(f"{'config':24s} {'kernel':12s} {'ms':>8s} {'GB/s':>8s}")
    for c in configs:
        for name, fn, nbytes in kernels(c):
            ms = timed_ms(fn, a.rounds, a.reps)
            print(f"{c['name']:24s} {name:12s} {ms:8.3f} {nbytes / ms / 1e6:8.0f}", flush=True)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())

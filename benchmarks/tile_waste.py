"""How much of the row-tiled GEMMs' work (gate/up, down, d_a, d_x: M = an expert's rows) the experts' part-filled
last 128-row tiles waste, under `bench_moe`'s routing, and how much of it two remedies would take back. CPU only.

For each shape: the routed rows R = T·K, the 128-row tiles they make (each expert's rows rounded up), and the work
beyond R as a share of R, counted in rows of a 128-row tile:
  - in one launch of 128-row tiles (how every row-tiled GEMM ran until run 41; the gate/up and d_a still do);
  - split: the short last tiles (rows mod 128 in 1..64) in a 64-row tile, which takes --short-cost of a 128-row
    tile's time (run 19 measured 64-row tiles 10-20% slower per row than 128-row ones: 0.55-0.6);
  - paired: two short tiles in one 128-row tile (a kernel that loads two experts' B tiles; not built);
  - and, for comparison, one launch of 256-row tiles (tile variant 5, the down and d_x tile of mid-sized experts).
Usage: python benchmarks/tile_waste.py [--configs a,b] [--routing random] [--short-cost 0.6]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_moe import CONFIGS, SUITE, bench_routing, load_configs  # noqa: E402
from mok.harness.cases import MoEConfig  # noqa: E402

TILE, SHORT = 128, 64


def one_launch_waste(counts: list[int], tile: int) -> float:
    """Rows per expert -> the rows computed beyond them when each expert's rows are rounded up to whole `tile`-row
    tiles, as a share of the rows (0 for no rows)."""
    rows = sum(counts)
    return (sum(-(-c // tile) for c in counts) * tile - rows) / rows if rows else 0.0


def waste(counts: list[int], short_cost: float) -> dict:
    """Rows per expert -> {"tiles": 128-row tiles, "short": short last tiles, and the waste beyond the rows, as a
    share of them, "one" (one launch), "split" and "paired"}."""
    rows = sum(counts)
    whole = sum(c // TILE for c in counts)
    long_last = sum(1 for c in counts if c % TILE > SHORT)
    short = sum(1 for c in counts if 0 < c % TILE <= SHORT)
    tiles = whole + long_last + short

    def share(tile_equivalents: float) -> float:
        return (tile_equivalents * TILE - rows) / rows if rows else 0.0

    return {"tiles": tiles, "short": short, "one": one_launch_waste(counts, TILE),
            "split": share(whole + long_last + short_cost * short), "paired": share(whole + long_last + short / 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="qwen3-30b-a3b,mid-64e,olmoe-1b-7b,dsv3-ep8-slice,mixtral-8x7b")
    ap.add_argument("--routing", default="random")
    ap.add_argument("--short-cost", type=float, default=0.6)
    a = ap.parse_args()
    configs = {c["name"]: c for c in load_configs(CONFIGS) + load_configs(SUITE)}
    print(f"routing {a.routing}; a 64-row tile taken as {a.short_cost} of a 128-row tile's time")
    print("| shape | routed rows | 128-row tiles | short last tiles | waste, one launch | split | paired "
          "| 256-row tiles, one launch |")
    print("|---|---|---|---|---|---|---|---|")
    for name in a.configs.split(","):
        c = configs[name]
        cfg = MoEConfig(c["T"], c["H"], c["I"], c["E"], c["K"], c["S"])
        idx, _ = bench_routing(cfg, a.routing)
        counts = torch.bincount(idx.flatten(), minlength=cfg.E).tolist()
        w = waste(counts, a.short_cost)
        print(f"| {name} | {sum(counts)} | {w['tiles']} | {w['short']} | {w['one']:.1%} | {w['split']:.1%} | "
              f"{w['paired']:.1%} | {one_launch_waste(counts, 2 * TILE):.1%} |")


if __name__ == "__main__":
    main()

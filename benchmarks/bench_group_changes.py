"""What a change of group costs mok's grouped GEMM: one down-projection launch (GEMM_TN_BF16, o_RH = a_RI ·
w_down_EHIᵀ per expert) over the same R = T*K rows split four ways, in each tile variant given:
  - "E routed": the E experts' rows as bench_moe.py routes them (uneven; each expert's last tile partly empty);
  - "E even": R / E rows an expert (no partly empty tiles when that is a multiple of the tile's rows);
  - "E/8 even": the same rows in E / 8 groups of 8R / E (a CTA changes group about 8 times less often);
  - "1": one group of R rows.
The FLOPs are the same in every row. CUTLASS's ptr-array kernels rewrite A's, B's and D's tensor maps whenever a CTA
moves to a tile of another group, and with many small experts that is almost every tile, so "E even" against
"E/8 even" measures the rewrites (with the same tiles and the same waste). --chunks times each launch under each
MOK_FAST_GEMM_CHUNK given (a library built with benchmarks/chunked_order_run45.diff hands each CTA that many
neighbouring tiles in a row; main's library ignores the variable) and checks that every chunk gives chunk 1's bits.
Median ms over interleaved rounds of medians of --reps back-to-back launches, and TFLOP/s. CUDA only.

Usage: python benchmarks/bench_group_changes.py [--configs qwen3-30b-a3b,mid-64e] [--variants 0,5] [--chunks 1,2,4]
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
from bench_moe import named_configs, timed  # noqa: E402
from mok.fast import _lib  # noqa: E402
from mok.fast._lib import Operand, Segment  # noqa: E402

GROUPINGS = ("E routed", "E even", "E/8 even", "1")


def launches(c: dict, variants: list[int], dev: torch.device) -> tuple[dict, float, torch.Tensor]:
    """The down-projection launches of config c by grouping and variant, their FLOPs and their output o_RH."""
    T, H, I, E, K = c["T"], c["H"], c["I"], c["E"], c["K"]
    R = T * K
    g = torch.Generator().manual_seed(1)
    routed_E = torch.bincount(torch.randint(0, E, (R,), generator=g), minlength=E)
    a_RI = torch.randn(R, I, device=dev, dtype=torch.bfloat16)
    w_down_EHI = torch.randn(E, H, I, device=dev, dtype=torch.bfloat16) / I ** 0.5
    o_RH = torch.empty(R, H, device=dev, dtype=torch.bfloat16)
    a, w, o = Operand(a_RI, 0, I, I), Operand(w_down_EHI, H * I, 0, I), Operand(o_RH, 0, H, H)
    counts = {"E routed": routed_E}
    if R % E == 0:
        counts["E even"] = torch.full((E,), R // E, dtype=torch.int64)
    if E % 8 == 0 and R % (E // 8) == 0:
        counts["E/8 even"] = torch.full((E // 8,), R // (E // 8), dtype=torch.int64)
    segs = {k: [Segment.expert_rows(_lib.offsets_from_counts(v, dev), v.numel(), H, I, a, w, o)]
            for k, v in counts.items()}
    segs["1"] = [Segment.all_rows(R, H, I, Operand(a_RI, 0, 0, I), Operand(w_down_EHI, 0, 0, I),
                                  Operand(o_RH, 0, 0, H))]

    def launch(s, v):
        return lambda: _lib.grouped_gemm(_lib.GEMM_TN_BF16, s, dev, v)

    fns = {(k, v): launch(segs[k], v) for k in GROUPINGS if k in segs for v in variants}
    return fns, 2.0 * R * H * I, o_RH


def set_chunk(chunk: int) -> None:
    os.environ["MOK_FAST_GEMM_CHUNK"] = str(chunk)


def check_chunk_bits(name: str, fns: dict, chunks: list[int], o_RH: torch.Tensor) -> None:
    """Every launch gives the same bits under every chunk (raw int16 compare); exits naming the first difference."""
    for key, fn in fns.items():
        want = None
        for chunk in chunks:
            set_chunk(chunk)
            o_RH.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            got = o_RH.view(torch.int16).clone()
            if want is None:
                want = got
            elif not torch.equal(got, want):
                first = (got != want).nonzero()[0].tolist()
                raise SystemExit(f"CHECK FAILED: {name} {key}: chunk {chunk} differs from chunk {chunks[0]} "
                                 f"first at row, column {first}")


def int_list(ap: argparse.ArgumentParser, flag: str, text: str, lo: int, hi: int) -> list[int]:
    """The comma-separated integers of option `flag`, each in [lo, hi]; else exits naming the option."""
    try:
        vals = [int(v) for v in text.split(",")]
    except ValueError:
        ap.error(f"{flag}: expected comma-separated integers, got {text!r}")
    bad = [v for v in vals if not lo <= v <= hi]
    if bad:
        ap.error(f"{flag}: {bad} not in [{lo}, {hi}]")
    return vals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="qwen3-30b-a3b,mid-64e,dsv3-ep8-slice,mixtral-8x7b")
    ap.add_argument("--variants", default="0,5")
    ap.add_argument("--chunks", default="1")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    if a.rounds < 1 or a.reps < 1:
        ap.error("--rounds and --reps must be at least 1")
    try:
        configs = named_configs(a.configs)
    except ValueError as e:
        ap.error(f"--{e}")
    variants = int_list(ap, "--variants", a.variants, 0, _lib.NUM_GEMM_VARIANTS - 1)
    chunks = int_list(ap, "--chunks", a.chunks, 1, 16)
    dev = torch.device("cuda", torch.cuda.current_device())
    print(f"device {torch.cuda.get_device_name()}; the down GEMM (GEMM_TN_BF16), ms: median over {a.rounds} "
          f"rounds of medians of {a.reps} back-to-back launches (TFLOP/s)")
    print("| config | variant | chunk | " + " | ".join(GROUPINGS) + " |")
    print("|---" * (len(GROUPINGS) + 3) + "|")
    for c in configs:
        name = c["name"]
        fns, flops, o_RH = launches(c, variants, dev)
        check_chunk_bits(name, fns, chunks, o_RH)
        times = {(key, chunk): [] for key in fns for chunk in chunks}
        for _ in range(a.rounds):
            for key, fn in fns.items():
                for chunk in chunks:
                    set_chunk(chunk)
                    times[(key, chunk)].append(timed(fn, 2, a.reps, mode="stream"))
        for v in variants:
            for chunk in chunks:
                cells = []
                for k in GROUPINGS:
                    if ((k, v), chunk) not in times:
                        cells.append("-")
                        continue
                    ms = statistics.median(times[((k, v), chunk)])
                    cells.append(f"{ms:.3f} ({flops / ms / 1e9:.0f})")
                print(f"| {name} | {v} | {chunk} | " + " | ".join(cells) + " |", flush=True)
        del fns, o_RH
        torch.cuda.empty_cache()
    os.environ.pop("MOK_FAST_GEMM_CHUNK", None)


if __name__ == "__main__":
    main()

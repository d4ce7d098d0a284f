"""The fast path's error against the reference, relative to plain bf16's (the 2x rule, docs/numerics.md), on
the CPU: the fast path's orchestration with its kernels replaced by tests/fast_emulator.py (exact GEMMs,
the kernels' roundings), over random small shapes and the golden cases. Prints the worst ratios and how many
shapes break the rule. Used to try numerics changes (e.g. bf16 g|u) before spending GPU time.

Usage: python benchmarks/emulated_error_scan.py [--shapes 40] [--seed 0]
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def scan_cases(shapes: int, seed: int) -> list[tuple[str, dict]]:
    """(name, layer inputs) of `shapes` random small shapes (T = 1-64, E = 1-8) drawn from `seed`, then the
    golden cases."""
    from mok.harness.cases import MoEConfig, make_inputs
    from mok.harness.golden import CASES, load_case

    rng = random.Random(seed)
    cases = []
    for i in range(shapes):
        E = rng.choice([1, 2, 4, 8])
        cfg = MoEConfig(T=rng.choice([1, 2, 3, 8, 37, 64]), H=rng.choice([8, 16, 32, 64]), I=rng.choice([8, 16, 32]),
                        E=E, K=rng.randint(1, E), S=rng.choice([0, 8, 16]))
        cases.append((str(cfg), make_inputs(cfg, i)))
    return cases + [(f"golden {c.name}", load_case(c.name)[0]) for c in CASES]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    import fast_emulator

    import mok.fast as fast
    from mok.harness.fast_checks import error_table, plain_outputs
    from mok.harness.runner import run_layer

    fast_emulator.install()
    fast_emulator.stub_streams()

    rows = []
    for name, inp in scan_cases(a.shapes, a.seed):
        table = error_table(run_layer(inp, impl=fast), run_layer(inp), plain_outputs(inp))
        ratio, out = max(((ef / ep if ep else 0.0), n) for n, ef, ep, _ in table)
        rows.append((ratio, out, name, all(ok for *_, ok in table)))
    rows.sort(key=lambda r: -r[0])
    for ratio, out, name, _ in rows[:6]:
        print(f"{ratio:6.2f}x  {out:14s}  {name}")
    bad = sum(not ok for *_, ok in rows)
    print(f"{bad} of {len(rows)} shapes break the 2x rule (worst ratio {rows[0][0]:.2f}x)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""Determinism report: y and all 8 gradients across world sizes, reruns and seeds.

Every run is a fresh set of processes (`mok.harness.dist.run_reference_world`), W = 1 included.
"""

from __future__ import annotations

from dataclasses import dataclass

from tqdm import tqdm

from .bits import bit_diff
from .cases import OUTPUT_NAMES, MoEConfig, make_inputs
from .dist import run_reference_world
from .runner import unshard_outputs


@dataclass
class TensorVerdict:
    """Per tensor: rerun and cross-W comparisons (worst case) and whether seeds change it."""

    name: str
    rerun_diff: int = 0
    rerun_ulp: int = 0
    world_diff: int = 0
    world_ulp: int = 0
    seeds_differ: bool = True
    present: bool = True

    @property
    def ok(self) -> bool:
        return not self.present or (self.rerun_diff == 0 and self.world_diff == 0 and self.seeds_differ)


def _fold(v: TensorVerdict, which: str, a, b) -> None:
    d = bit_diff(a, b)
    n, ulp = (a.numel(), -1) if d.n_diff < 0 else (d.n_diff, d.max_ulp)
    setattr(v, f"{which}_diff", max(getattr(v, f"{which}_diff"), n))
    setattr(v, f"{which}_ulp", max(getattr(v, f"{which}_ulp"), ulp))


def diff_grads(cfg: MoEConfig, seeds, world_sizes, *, routing="random", reruns=2, device="cpu",
               threads=1, progress=True) -> list[TensorVerdict]:
    """Run every (seed, W, rerun) in fresh processes and compare outputs bit by bit."""
    if len(seeds) < 2:
        raise ValueError(f"seeds: expected at least 2 (to show equality is not vacuous), got {list(seeds)}")
    if reruns < 2:
        raise ValueError(f"reruns: expected at least 2, got {reruns}")
    jobs = [(s, W, r) for s in seeds for W in world_sizes for r in range(reruns)]
    runs = {}
    for s, W, r in tqdm(jobs, desc="diff-grads runs", disable=not progress):
        inputs = make_inputs(cfg, s, routing)
        runs[s, W, r] = unshard_outputs(run_reference_world(inputs, W, device=device, threads=threads))
    verdicts = []
    base_W = world_sizes[0]
    for name in OUTPUT_NAMES:
        v = TensorVerdict(name, present=runs[seeds[0], base_W, 0][name] is not None)
        if v.present:
            for s in seeds:
                first = runs[s, base_W, 0][name]
                for W in world_sizes:
                    for r in range(reruns):
                        _fold(v, "rerun", runs[s, W, r][name], runs[s, W, 0][name])
                    _fold(v, "world", runs[s, W, 0][name], first)
            v.seeds_differ = all(
                not bit_diff(runs[a, base_W, 0][name], runs[b, base_W, 0][name]).equal
                for i, a in enumerate(seeds) for b in seeds[i + 1:]
            )
        verdicts.append(v)
    return verdicts


def format_table(verdicts: list[TensorVerdict]) -> str:
    """Plain-text table, one row per tensor."""

    def cell(n, ulp):
        return "bit-identical" if n == 0 else f"{n} differ, max {ulp} ULP"

    rows = [("tensor", "reruns", "across world sizes", "seeds differ", "verdict")]
    for v in verdicts:
        if not v.present:
            rows.append((v.name, "-", "-", "-", "absent (S = 0)"))
        else:
            rows.append((v.name, cell(v.rerun_diff, v.rerun_ulp), cell(v.world_diff, v.world_ulp),
                         "yes" if v.seeds_differ else "NO (vacuous)", "ok" if v.ok else "FAIL"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)

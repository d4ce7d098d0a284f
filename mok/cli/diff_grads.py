"""Determinism report: y and all 8 gradients across world sizes, reruns and seeds.

Every run is a fresh set of processes (`mok.testing.dist.run_world`), W = 1 included; on cuda the W ranks
share the GPUs (several per GPU when W exceeds their number).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tqdm import tqdm

from ..testing.bits import bit_diff
from ..testing.cases import OUTPUT_NAMES, ROUTINGS, MoEConfig, make_inputs
from ..testing.dist import check_world_size, run_world
from ..testing.runner import IMPLS, unshard_outputs


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

    def record(self) -> dict:
        """JSON-ready: the tensor's name, its counts of differing elements and max ULP distances (rerun_*,
        world_*; ulp -1 when not measurable), seeds_differ, present, and ok."""
        return {**asdict(self), "ok": self.ok}


def _fold(v: TensorVerdict, which: str, a, b) -> None:
    d = bit_diff(a, b)
    n, ulp = (a.numel(), -1) if d.n_diff < 0 else (d.n_diff, d.max_ulp)
    setattr(v, f"{which}_diff", max(getattr(v, f"{which}_diff"), n))
    setattr(v, f"{which}_ulp", max(getattr(v, f"{which}_ulp"), ulp))


MAX_SEED = 2**64 - 1  # torch.Generator.manual_seed takes [-2**63, 2**64); negatives alias 2**64 + seed


def _int(name: str, v, low: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise ValueError(f"{name}: expected an int >= {low}, got {v!r}")
    return v


def default_impl(device: str) -> str:
    """The layer diff-grads runs by default: the fast path on cuda once its expert parallelism is proven
    (mok.nn.backend.FAST_EP_PROVEN), else the reference."""
    from ..nn.backend import FAST_EP_PROVEN

    return "fast" if device == "cuda" and FAST_EP_PROVEN else "reference"


def check_args(cfg: MoEConfig, seeds, world_sizes, *, routing="random", reruns=2, device="cpu", threads=1,
               impl=None) -> None:
    """Raise ValueError naming the first bad argument, before any process starts."""
    cfg.validated()
    impl = default_impl(device) if impl is None else impl
    if impl not in IMPLS:
        raise ValueError(f"impl: expected one of {IMPLS}, got {impl!r}")
    if impl == "fast":
        if device != "cuda":
            raise ValueError(f"impl: 'fast' runs on device 'cuda', got device {device!r}")
        from ..fast._checks import sizes_problem

        problem = sizes_problem(cfg.H, cfg.I, cfg.S)
        if problem:
            raise ValueError(f"shape: {problem} (or pass impl 'reference')")
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= MAX_SEED:
            raise ValueError(f"seeds: expected ints in [0, 2**64 - 1] (torch.manual_seed's range; a negative seed "
                             f"would alias 2**64 + seed), got {s!r} in {list(seeds)}")
    if len(seeds) < 2 or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds: expected at least 2 distinct seeds (to show equality is not vacuous), got {list(seeds)}")
    _int("reruns", reruns, 2)
    _int("threads", threads, 1)
    if routing not in ROUTINGS:
        raise ValueError(f"routing: expected one of {ROUTINGS}, got {routing!r}")
    if routing == "empty_expert" and cfg.K >= cfg.E:
        raise ValueError(f"routing: 'empty_expert' needs K < E, got K = {cfg.K}, E = {cfg.E}")
    if not world_sizes:
        raise ValueError("world_sizes: expected at least one world size, got none")
    for W in world_sizes:
        if isinstance(W, bool) or not isinstance(W, int) or W < 1:
            raise ValueError(f"world_sizes: expected ints >= 1, got {W!r} in {list(world_sizes)}")
        if cfg.E % W or cfg.T % W:
            raise ValueError(f"world_sizes: expected divisors of both E = {cfg.E} and T = {cfg.T} (global tokens), "
                             f"got {W} in {list(world_sizes)}")
        check_world_size(W, device)


def diff_grads(cfg: MoEConfig, seeds, world_sizes, *, routing="random", reruns=2, device="cpu",
               threads=1, progress=True, impl=None) -> list[TensorVerdict]:
    """Run every (seed, W, rerun) in fresh processes and compare outputs bit by bit.

    impl: "reference" or "fast" (on cuda, W ranks sharing the GPUs); default `default_impl(device)`.
    Arguments are checked first (`check_args`), so a bad one starts no process.
    """
    impl = default_impl(device) if impl is None else impl
    check_args(cfg, seeds, world_sizes, routing=routing, reruns=reruns, device=device, threads=threads, impl=impl)
    jobs = [(s, W, r) for s in seeds for W in world_sizes for r in range(reruns)]
    runs = {}
    for s, W, r in tqdm(jobs, desc="diff-grads runs", disable=not progress):
        inputs = make_inputs(cfg, s, routing)
        runs[s, W, r] = unshard_outputs(run_world(inputs, W, impl=impl, device=device, threads=threads))
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


def format_table(verdicts: list[TensorVerdict], only_failures: bool = False) -> str:
    """Plain-text table, one row per tensor (only_failures: failed rows only; "" when none failed)."""
    if only_failures:
        verdicts = [v for v in verdicts if not v.ok]
        if not verdicts:
            return ""

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

"""`mok verify`: the determinism suite on the embedded default config, as a verdict table.

CPU: goldens reproduced (bf16 and FP8 recipes), reruns, 1 vs 2 threads, W = 1, 2, 4 in separate processes (and
W = 2 with the FP8 recipe), seeds differ.
CUDA: goldens reproduced by the reference on the GPU, GPU vs CPU reference, and (when the
fast path is present) its reruns, batch invariance and closeness to the reference.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from tqdm import tqdm

from ..testing.bits import bit_diff
from ..testing.cases import DEFAULT, OUTPUT_NAMES, MoEConfig, make_inputs


@dataclass
class Check:
    """One row of the verdict table."""

    name: str
    ok: bool
    detail: str
    seconds: float = 0.0


def compare_outputs(got: dict, expected: dict) -> tuple[bool, str]:
    """All outputs bitwise equal? Detail names the first differing tensor and element."""
    for k in OUTPUT_NAMES:
        if (got[k] is None) != (expected[k] is None):
            return False, f"{k}: present in one run only"
        if got[k] is None:
            continue
        d = bit_diff(got[k].cpu(), expected[k].cpu())
        if not d.equal:
            return False, (f"{k}: {d.n_diff} elements differ, first at {d.first_index}: "
                           f"{d.first_values[0]!r} vs {d.first_values[1]!r}")
    n = sum(v is not None for v in expected.values())
    return True, f"{n} tensors bit-identical"


def _with_threads(n: int, fn):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        return fn()
    finally:
        torch.set_num_threads(old)


def cpu_checks(cfg: MoEConfig = DEFAULT, seed: int = 0, world_sizes=(2, 4)):
    """(name, thunk) pairs; each thunk returns (ok, detail)."""
    from ..testing.dist import run_reference_world
    from .golden import CASES, check_case
    from ..testing.runner import run_layer, unshard_outputs

    inputs = make_inputs(cfg, seed)
    base = {}

    def baseline():
        base.update(run_layer(inputs))
        return True, "computed"

    def golden(name):
        r = check_case(name, world_sizes=(1,))
        return r.ok, "bit-identical to the file" if r.ok else "; ".join(f"{k}: {p}" for k, p in r.problems[:2])

    def world(W):
        return compare_outputs(unshard_outputs(run_reference_world(inputs, W)), base)

    def world_fp8(W):
        return compare_outputs(unshard_outputs(run_reference_world(inputs, W, precision="fp8")),
                               run_layer(inputs, precision="fp8"))

    def seeds_differ():
        other = run_layer(make_inputs(cfg, seed + 1))
        same = [k for k in OUTPUT_NAMES if base[k] is not None and bit_diff(other[k], base[k]).equal]
        return not same, "every tensor changes with the seed" if not same else f"unchanged: {same}"

    checks = [(f"golden {c.name}", lambda c=c: golden(c.name)) for c in CASES]
    checks += [
        (f"default {cfg.T},{cfg.H},{cfg.I},{cfg.E},{cfg.K},{cfg.S}: W=1", baseline),
        ("rerun", lambda: compare_outputs(run_layer(inputs), base)),
        ("1 vs 2 threads", lambda: compare_outputs(_with_threads(1, lambda: run_layer(inputs)),
                                                   _with_threads(2, lambda: run_layer(inputs)))),
    ]
    checks += [(f"W={W} vs W=1 (separate processes)", lambda W=W: world(W)) for W in world_sizes]
    checks += [(f"fp8: W={W} vs W=1 (separate processes)", lambda W=W: world_fp8(W)) for W in world_sizes[:1]]
    checks.append(("seeds differ (not vacuous)", seeds_differ))
    return checks


def cuda_checks(cfg: MoEConfig = DEFAULT, seed: int = 0):
    """Reference on the GPU (goldens, vs CPU), then the fast path's checks if it is importable."""
    from .golden import CASES, check_case
    from ..testing.runner import run_layer

    if not torch.cuda.is_available():
        raise RuntimeError("device: expected a CUDA GPU for `mok verify --device cuda`, found none")
    inputs = make_inputs(cfg, seed)

    def golden(name):
        r = check_case(name, device="cuda", world_sizes=(1,))
        return r.ok, "bit-identical to the file" if r.ok else "; ".join(f"{k}: {p}" for k, p in r.problems[:2])

    checks = [(f"golden {c.name} (reference on cuda)", lambda c=c: golden(c.name)) for c in CASES]
    checks.append(("reference cuda vs cpu", lambda: compare_outputs(
        run_layer(make_inputs(cfg, seed, device="cuda")), run_layer(inputs))))
    try:
        import mok.fast  # noqa: F401  (the fast path is optional)
    except ImportError as e:
        checks.append(("fast path", lambda e=e: (False, f"not importable: {e}")))
    else:
        checks += fast_checks(cfg, seed)
    return checks


def fast_checks(cfg: MoEConfig = DEFAULT, seed: int = 0, reruns: int = 100):
    """mok.fast on the GPU: reruns, batch invariance, expert parallelism (W = 2, 4 processes sharing the
    GPU, bitwise against W = 1), and the 2x rule vs the reference (docs/numerics.md)."""
    import mok.fast as fast

    from ..testing.tolerance import error_table, plain_outputs
    from .golden import CASES, load_case
    from ..testing.runner import run_layer

    inputs = make_inputs(cfg, seed, device="cuda")
    first = {}

    def reruns_equal():
        first.update(run_layer(inputs, impl=fast))
        for i in range(reruns):
            ok, detail = compare_outputs(run_layer(inputs, impl=fast), first)
            if not ok:
                return False, f"rerun {i + 1}: {detail}"
        return True, f"{reruns} reruns of forward+backward bit-identical"

    def batch_invariance():
        half = cfg.T // 2
        sub = {k: (v[:half] if k in ("x", "topk_idx", "topk_weight", "dy") else v) for k, v in inputs.items()}
        got = run_layer(sub, impl=fast)
        for k in ("y", "d_x", "d_topk_weight"):
            d = bit_diff(got[k].cpu(), first[k][:half].cpu())
            if not d.equal:
                return False, f"{k}: {d.n_diff} differ, first at {d.first_index}"
        return True, f"first {half} of {cfg.T} tokens: y, d_x, d_topk_weight bit-identical"

    def close(case_inputs):
        rows = error_table(run_layer(case_inputs, impl=fast), run_layer(case_inputs), plain_outputs(case_inputs))
        bad = [f"{n}: {ef:.2e} > 2 x {ep:.2e}" for n, ef, ep, ok in rows if not ok]
        worst = max((ef / ep if ep else 0.0) for _, ef, ep, _ in rows)
        return not bad, "; ".join(bad) if bad else f"every tensor within 2x plain bf16 (worst ratio {worst:.2f})"

    def golden_inputs(name):
        return {k: (v.cuda() if v is not None else None) for k, v in load_case(name)[0].items()}

    def expert_parallel(W):  # W processes sharing the GPU(s), against the W = 1 run above
        from ..testing.dist import run_world
        from ..testing.runner import unshard_outputs

        if not first:
            first.update(run_layer(inputs, impl=fast))
        return compare_outputs(unshard_outputs(run_world(inputs, W, impl="fast", device="cuda")), first)

    checks = [("fast: reruns", reruns_equal), ("fast: batch invariance", batch_invariance),
              ("fast vs reference: default", lambda: close(inputs))]
    from ..nn.backend import FAST_EP_PROVEN

    if FAST_EP_PROVEN:
        checks += [(f"fast: expert parallel W = {W} vs W = 1", lambda W=W: expert_parallel(W)) for W in (2, 4)
                   if cfg.E % W == 0 and cfg.T % W == 0]
    # the fast path runs the bf16 recipe: it is compared on the bf16 cases
    checks += [(f"fast vs reference: golden {c.name}", lambda c=c: close(golden_inputs(c.name)))
               for c in CASES if c.precision == "bf16"]
    return checks


def run_checks(checks, progress: bool = True, on_result=None) -> list[Check]:
    """Run every check (an exception is a failure with its message), with a progress bar (stderr).
    on_result(check) is called as each one finishes."""
    results = []
    bar = tqdm(checks, desc="mok verify", disable=not progress)
    for name, thunk in bar:
        bar.set_postfix_str(name[:40])
        t0 = time.perf_counter()
        try:
            ok, detail = thunk()
        except Exception as e:  # reported, never hidden: the row fails with the error
            ok, detail = False, f"{type(e).__name__}: {e}"
        results.append(Check(name, ok, detail, time.perf_counter() - t0))
        if on_result:
            on_result(results[-1])
    return results


def format_verdicts(results: list[Check], only_failures: bool = False) -> str:
    """The verdict table and an "N passed, M failed" line; only_failures: failed rows only (no header
    when none failed)."""
    shown = [r for r in results if not r.ok] if only_failures else results
    if not shown:
        return f"{len(results)} passed, 0 failed"
    rows = [("check", "verdict", "detail")] + [(r.name, "PASS" if r.ok else "FAIL", r.detail) for r in shown]
    w0, w1 = (max(len(r[i]) for r in rows) for i in (0, 1))
    lines = [f"{a.ljust(w0)}  {b.ljust(w1)}  {c}" for a, b, c in rows]
    n_fail = sum(not r.ok for r in results)
    lines.append(f"\n{len(results) - n_fail} passed, {n_fail} failed")
    return "\n".join(lines)

"""The bit-exact reference's speed: `mok.reference` forward+backward against a naive per-expert loop and an unfused
torch.matmul layer (bf16 and fp32), on the CPU or a GPU, optionally beside the reference of another checkout (old
against new, its outputs checked bit for bit), every method timed once in turn within each rep, min of --reps.

    python benchmarks/bench_reference.py --device cpu [--threads 1] --reference-old /tmp/ref-old
    python benchmarks/bench_reference.py --device cuda --reps 1 --reference-old /tmp/ref-old   # Qwen3-30B-A3B

`--reference-old` takes a checkout whose `mok/reference` is imported beside this one (e.g. `git worktree add
/tmp/ref-old <rev>`).
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import mok.reference  # noqa: E402
from bench_moe import ARGS, make_bench_inputs  # noqa: E402
from mok.testing.bits import bit_diff  # noqa: E402
from mok.testing.cases import MoEConfig  # noqa: E402
from mok.testing.plain import moe_plain  # noqa: E402
from peers import naive_loop  # noqa: E402

SHAPES = {"cpu": "256,256,128,8,2;1024,512,256,16,2;2048,768,384,16,2", "cuda": "16384,2048,768,128,8"}
METHODS = ("reference", "reference_old", "naive", "matmul_bf16", "matmul_fp32")


def load_reference(checkout: str):
    """The `mok/reference` package of another checkout (e.g. `git worktree add /tmp/ref-old main`), imported under
    its own name beside this one (it imports nothing outside itself)."""
    init = Path(checkout) / "mok" / "reference" / "__init__.py"
    if not init.is_file():
        raise ValueError(f"--reference-old: no mok/reference/__init__.py under {checkout!r}")
    spec = importlib.util.spec_from_file_location("mok_reference_old", init, submodule_search_locations=[str(init.parent)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def reference_step(ref, inp: dict):
    """One forward+backward of the reference module `ref`: (y, d_x, d_topk_weight, weight gradients...)."""
    y, ctx = ref.forward(*(inp[a] for a in ARGS))
    return (y, *ref.backward(ctx, inp["dy"]))


def autograd_step(fn, inp: dict):
    """One forward+backward of a plain autograd layer `fn(*ARGS)` on fresh leaves: (y, d_x)."""
    leaves = {a: (inp[a].detach().requires_grad_(True) if isinstance(inp[a], torch.Tensor) and inp[a].is_floating_point()
                  else inp[a]) for a in ARGS}
    y = fn(*(leaves[a] for a in ARGS))
    y.backward(inp["dy"].to(y.dtype))
    return y, leaves["x"].grad


def reference_methods(names: list[str], old) -> dict:
    """name -> fn(inp) running one forward+backward."""
    fns = {"reference": functools.partial(reference_step, mok.reference),
           "reference_old": functools.partial(reference_step, old),
           "naive": functools.partial(autograd_step, naive_loop),
           "matmul_bf16": functools.partial(autograd_step, functools.partial(moe_plain, dtype=torch.bfloat16)),
           "matmul_fp32": functools.partial(autograd_step, functools.partial(moe_plain, dtype=torch.float32))}
    return {n: fns[n] for n in names}


def wall_seconds(fn, inp: dict, device: str):
    """(seconds, result) of one call, the device synchronised before and after."""
    if device == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn(inp)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t, out


def same_bits(a: tuple, b: tuple) -> str:
    """"same bits" when every output of two reference runs is bitwise equal (NaN-aware), else the first difference."""
    for i, (x, y) in enumerate(zip(a, b)):
        if (x is None) != (y is None):
            return f"output {i}: None in one run only"
        if x is not None and not bit_diff(x, y).equal:
            d = bit_diff(x, y)
            return f"output {i}: {d.n_diff} elements differ, first at {d.first_index}: {d.first_values}"
    return "same bits"


def run(a, names: list[str]) -> None:
    """Forward+backward of each method `names` at each shape, every method once per rep in turn, min of reps (a: the
    parsed options)."""
    device = a.device
    if a.threads:
        torch.set_num_threads(a.threads)
    old = load_reference(a.reference_old) if a.reference_old else None
    fns = reference_methods(names, old)
    where = torch.cuda.get_device_name() if device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"{where}, torch {torch.__version__}; forward+backward, min of {a.reps} reps, methods interleaved"
          + (f"; reference_old from {a.reference_old}" if old else ""))
    print("| T,H,I,E,K,S | " + " | ".join(f"{n} s" for n in names) + " | reference / naive | reference / matmul_fp32 |"
          + (" reference_old / reference | old vs new |" if old else ""))
    print("|---" * (len(names) + 3 + (2 if old else 0)) + "|")
    for text in (a.shapes or SHAPES[device]).split(";"):
        cfg = MoEConfig.parse(text)
        inp = make_bench_inputs(dict(cfg.as_dict()), "random", device=device)
        best, outs = {n: float("inf") for n in names}, {}
        for _ in range(a.warmup):
            for n in names:
                fns[n](inp)
        for _ in range(a.reps):
            for n in names:
                dt, outs[n] = wall_seconds(fns[n], inp, device)
                best[n] = min(best[n], dt)
        ratio = lambda x, y: f"{best[x] / best[y]:.1f}x" if x in best and y in best else "-"  # noqa: E731
        row = f"| {text} | " + " | ".join(f"{best[n]:.3f}" for n in names)
        row += f" | {ratio('reference', 'naive')} | {ratio('reference', 'matmul_fp32')} |"
        if old:
            row += f" {ratio('reference_old', 'reference')} | {same_bits(outs['reference_old'], outs['reference'])} |"
        print(row, flush=True)
        del inp, outs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where it runs (default cpu)")
    ap.add_argument("--shapes", default="", help="'T,H,I,E,K[,S]' shapes separated by ';' (default cpu: "
                    f"{SHAPES['cpu']}; cuda: Qwen3-30B-A3B, {SHAPES['cuda']})")
    ap.add_argument("--methods", default="", help=f"some of {', '.join(METHODS)} (default: all; reference_old "
                    "only with --reference-old)")
    ap.add_argument("--reference-old", default="", help="a checkout whose mok/reference is timed beside this one as "
                    "reference_old (its outputs checked bit for bit against the new one's)")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--warmup", type=int, default=0, help="untimed calls of each method first")
    ap.add_argument("--reps", type=int, default=3, help="timed calls of each method; the minimum is reported")
    a = ap.parse_args()
    names = a.methods.split(",") if a.methods else [m for m in METHODS if m != "reference_old" or a.reference_old]
    unknown = [m for m in names if m not in METHODS]
    if unknown:
        ap.error(f"--methods: unknown {unknown}; expected some of {', '.join(METHODS)}")
    if "reference_old" in names and not a.reference_old:
        ap.error("--methods: reference_old needs --reference-old PATH (a checkout of the old reference)")
    for name in ("threads", "warmup"):
        if getattr(a, name) < 0:
            ap.error(f"--{name}: expected an int >= 0, got {getattr(a, name)}")
    if a.reps < 1:
        ap.error(f"--reps: expected an int >= 1, got {a.reps}")
    run(a, names)


if __name__ == "__main__":
    main()

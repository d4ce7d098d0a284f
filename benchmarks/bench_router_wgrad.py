"""The router's weight-gradient GEMM (`mok.fast._router.weight_grad_halves`) in the layer's tile (GEMM_TT_F32,
variant 0: what the router ran until run 13) and in the small tile (GEMM_TT_F32_SMALL, what it runs now),
interleaved in one process, at the router shapes of configs.json / suite.json: [2, Ep, H] = [hi | lo]ᵀ x over T
tokens. Checks the two give the same bits first.

With --module: `mok.MoE` training steps (bf16 parameters, router losses; bench_module's step, "stream" timing) with
the router's weight gradient in either kind, interleaved round by round in one process.

Usage: python benchmarks/bench_router_wgrad.py [--configs a,b] [--reps 20] [--rounds 5] [--module]
"""
from __future__ import annotations

import argparse
import functools
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_moe import CONFIGS, SUITE, load_configs, timed  # noqa: E402
from bench_token_kernels import timed_ms  # noqa: E402
from mok.fast import _lib, _router  # noqa: E402

KINDS = {"layer tile": _lib.GEMM_TT_F32, "small tile": _lib.GEMM_TT_F32_SMALL}


def gemm_alone(c: dict, a) -> str:
    """One table row: the GEMM alone in both kinds (mean of `reps` queued launches, median of `rounds`)."""
    T, H, E = c["T"], c["H"], c["E"]
    Ep = (E + 7) // 8 * 8
    g = torch.Generator(device="cuda").manual_seed(0)
    hl = torch.randn(T, 2 * Ep, generator=g, device="cuda").to(torch.bfloat16)
    x = torch.randn(T, H, generator=g, device="cuda").to(torch.bfloat16)
    old, new = (_router.weight_grad_halves(hl, x, Ep, k).view(torch.int32) for k in KINDS.values())
    if not torch.equal(old, new):
        raise SystemExit(f"{c['name']}: the two tiles differ first at {(old != new).nonzero()[0].tolist()}")
    runs = {k: functools.partial(_router.weight_grad_halves, hl, x, Ep, k) for k in KINDS.values()}
    times = {k: [] for k in runs}
    for _ in range(a.rounds):
        for k, fn in runs.items():
            times[k].append(timed_ms(fn, 1, a.reps))
    old_ms, new_ms = (statistics.median(v) for v in times.values())
    return f"{c['name']} ({T}, {E}, {H}) | {old_ms:.4f} | {new_ms:.4f} | {old_ms / new_ms:.2f}x"


def module_steps(c: dict, a) -> str:
    """One table row: mok.MoE steps with the router's weight gradient in either kind, interleaved."""
    import mok
    from bench_module import _module_step

    T, H, I, E, K, S = (c[k] for k in "THIEKS")
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(T, H, generator=g, device="cuda").to(torch.bfloat16).requires_grad_()
    dy = torch.randn(T, H, generator=g, device="cuda").to(torch.bfloat16)
    torch.manual_seed(0)
    m = mok.MoE(H, I, E, K, shared_intermediate_size=S, backend="fast", dtype=torch.bfloat16, device="cuda")
    chosen = _router.weight_grad_halves
    times = {k: [] for k in KINDS.values()}
    for _ in range(a.rounds):
        for kind in times:
            _router.weight_grad_halves = functools.partial(chosen, kind=kind)  # what router_backward calls
            try:
                times[kind].append(timed(lambda: _module_step(m, x, dy), 3, a.reps, "stream"))
            finally:
                _router.weight_grad_halves = chosen
    old, new = (statistics.median(v) for v in times.values())
    return f"{c['name']} | {old:.3f} | {new:.3f} | {old / new:.3f}x"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="qwen3-30b-a3b,mid-64e,dsv3-ep8-slice,mixtral-8x7b,qwen3-235b-a22b,"
                                         "deepseek-v2-lite-t1000")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--module", action="store_true", help="time mok.MoE training steps instead of the GEMM alone")
    a = ap.parse_args()
    cfgs = {c["name"]: c for c in load_configs(CONFIGS) + load_configs(SUITE)}
    print("config (T, E, H) | layer tile ms | small tile ms | speedup" if not a.module else
          "config | mok.MoE step ms, layer tile | small tile | speedup")
    for name in a.configs.split(","):
        print((module_steps if a.module else gemm_alone)(cfgs[name], a))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

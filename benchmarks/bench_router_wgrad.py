"""The router's weight-gradient GEMM alone, in the layer's tile (GEMM_TT_F32, variant 0: what the router ran until
run 13) and in the small tile (GEMM_TT_F32_SMALL, what it runs now), interleaved in one process, at the router
shapes of configs.json / suite.json: d_w [2, Ep, H] = [hi | lo]ᵀ x over T tokens, two segments, as
mok/fast/_router.py calls it. Checks the two give the same bits first.

With --module: a `mok.MoE` training step (bf16 parameters, router losses; bench_module's step, "stream" timing)
with the router's weight gradient in either kind, interleaved round by round in one process (the old kind by
pointing the router's kind name at GEMM_TT_F32 for those rounds).

Usage: python benchmarks/bench_router_wgrad.py [--configs a,b] [--reps 20] [--rounds 5] [--module]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_moe import CONFIGS, SUITE, load_configs, timed  # noqa: E402
from mok.fast import _lib  # noqa: E402

SMALL = _lib.GEMM_TT_F32_SMALL


def wgrad(kind: int, hl, x, d_w2, T: int, Ep: int, H: int) -> None:
    """The two segments of mok/fast/_router.py's weight gradient, in GEMM `kind` (variant 0)."""
    _lib.grouped_gemm(kind, [
        _lib.Segment.all_wgrad(T, Ep, H, _lib.Operand(hl, 0, 0, 2 * Ep, offset=half * Ep), _lib.Operand(x, 0, 0, H),
                               _lib.Operand(d_w2, 0, 0, H, offset=half * Ep * H)) for half in (0, 1)], x.device)


def time_ms(fn, reps: int) -> float:
    """Mean of `reps` launches queued back to back (CUDA events), ms per launch."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="qwen3-30b-a3b,mid-64e,dsv3-ep8-slice,mixtral-8x7b,qwen3-235b-a22b,"
                                         "deepseek-v2-lite-t1000")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--module", action="store_true", help="time mok.MoE training steps instead of the GEMM alone")
    a = ap.parse_args()
    cfgs = {c["name"]: c for c in load_configs(CONFIGS) + load_configs(SUITE)}
    if a.module:
        return module(cfgs, a)
    print("config (T, E, H) | layer tile ms | small tile ms | speedup")
    for name in a.configs.split(","):
        c = cfgs[name]
        T, H, E = c["T"], c["H"], c["E"]
        Ep = (E + 7) // 8 * 8
        g = torch.Generator(device="cuda").manual_seed(0)
        hl = torch.randn(T, 2 * Ep, generator=g, device="cuda").to(torch.bfloat16)
        x = torch.randn(T, H, generator=g, device="cuda").to(torch.bfloat16)
        outs = {k: torch.empty(2, Ep, H, device="cuda") for k in (_lib.GEMM_TT_F32, _lib.GEMM_TT_F32_SMALL)}
        runs = {k: (lambda k=k: wgrad(k, hl, x, outs[k], T, Ep, H)) for k in outs}
        for fn in runs.values():
            fn()
        torch.cuda.synchronize()
        a32, b32 = (outs[k].view(torch.int32) for k in outs)
        if not torch.equal(a32, b32):
            i = (a32 != b32).nonzero()[0].tolist()
            raise SystemExit(f"{name}: the two tiles differ first at {i}")
        times = {k: [] for k in runs}
        for _ in range(a.rounds):
            for k, fn in runs.items():
                times[k].append(time_ms(fn, a.reps))
        old, new = (statistics.median(times[k]) for k in runs)
        print(f"{name} ({T}, {E}, {H}) | {old:.4f} | {new:.4f} | {old / new:.2f}x")
    return 0


def module(cfgs: dict, a) -> int:
    """mok.MoE steps with the router's weight gradient in the layer's tile and in the small one, interleaved."""
    import mok
    from bench_module import _module_step

    print("config | mok.MoE step ms, layer tile | small tile | speedup")
    for name in a.configs.split(","):
        c = cfgs[name]
        T, H, I, E, K, S = (c[k] for k in "THIEKS")
        g = torch.Generator(device="cuda").manual_seed(1)
        x = torch.randn(T, H, generator=g, device="cuda").to(torch.bfloat16).requires_grad_()
        dy = torch.randn(T, H, generator=g, device="cuda").to(torch.bfloat16)
        torch.manual_seed(0)
        m = mok.MoE(H, I, E, K, shared_intermediate_size=S, backend="fast", dtype=torch.bfloat16, device="cuda")
        times = {_lib.GEMM_TT_F32: [], SMALL: []}
        for _ in range(a.rounds):
            for kind in times:
                _lib.GEMM_TT_F32_SMALL = kind  # the name mok/fast/_router.py looks up at each call
                try:
                    times[kind].append(timed(lambda: _module_step(m, x, dy), 3, a.reps, "stream"))
                finally:
                    _lib.GEMM_TT_F32_SMALL = SMALL
        old, new = (statistics.median(v) for v in times.values())
        print(f"{name} | {old:.3f} | {new:.3f} | {old / new:.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

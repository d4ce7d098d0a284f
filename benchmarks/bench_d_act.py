"""The backward's d_a step alone: the d_a grouped GEMM (GEMM_NN_F32, fp32 d_a) and the swiglu_bwd kernel, apart
and as the pair `_backward.d_act_swiglu_unfused` runs them, against the fused launch (GEMM_NN_SWIGLU_BWD,
`_backward.d_act_swiglu_fused`) in each tile variant asked for, at the shapes of configs.json and suite.json
(the layer's own forward makes the saved [g | u]; go from the pre-combine). Checks the fused [dg | du] bits
against the unfused pair's first (--no-check skips it), then prints ms: the median over rounds of the mean of
back-to-back launches. CUDA only.

Usage: python benchmarks/bench_d_act.py [config,...] [--variants 0,2,3] [--rounds 5] [--reps 10] [--no-check]
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_moe import ARGS, CONFIGS, SUITE, load_configs, make_bench_inputs  # noqa: E402
from bench_token_kernels import timed_ms  # noqa: E402

import mok.fast as fast  # noqa: E402
from mok.fast import _backward, _lib, _tiles  # noqa: E402
from mok.harness.bits import assert_bitwise_equal  # noqa: E402


def step_args(doc: str, variants: str):
    """(args, {name: config}, [variant]) from the command line of a one-step benchmark (this one, bench_gate_up.py)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("configs", nargs="?", default="qwen3-30b-a3b,mid-64e,olmoe-1b-7b,dsv3-ep8-slice,mixtral-8x7b")
    ap.add_argument("--variants", default=variants)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--no-check", action="store_true", help="skip the bit check (diagnostic builds)")
    a = ap.parse_args()
    configs = {c["name"]: c for c in load_configs(CONFIGS) + load_configs(SUITE)}
    return a, configs, [int(v) for v in a.variants.split(",")]


def main() -> None:
    a, configs, variants = step_args(__doc__, "0,2,3")
    os.environ.pop(_tiles.ENV, None)
    os.environ.pop(_tiles.FUSE_ENV, None)
    print(f"device {torch.cuda.get_device_name()}; ms, median of {a.rounds} rounds of {a.reps} launches queued")
    print("| config | d_a GEMM (rule) | swiglu_bwd | pair | " + " | ".join(f"fused v{v}" for v in variants) + " |")
    print("|---" * (len(variants) + 4) + "|")
    for name in a.configs.split(","):
        gemm_ms, kern_ms, pair_ms, fused_ms = measure(name, configs[name], variants, a)
        print(f"| {name} | {gemm_ms:.3f} | {kern_ms:.3f} | {pair_ms:.3f} | " +
              " | ".join(f"{t:.3f}" for t in fused_ms) + " |", flush=True)
        torch.cuda.empty_cache()


def measure(name: str, c: dict, variants: list[int], a) -> tuple[float, float, float, list[float]]:
    """ms of the d_a GEMM, the swiglu_bwd kernel, the pair and the fused launch in each variant at config c."""
    inputs = make_bench_inputs(c, "random")
    _, ctx = fast.forward(*(inputs[k] for k in ARGS))
    d = ctx.dims
    dy = inputs["x"].clone()  # any bf16 [T, H]
    go_RH = torch.empty(ctx.x_RH.shape, dtype=torch.bfloat16, device="cuda")
    d_w = torch.empty(d.T, d.K, dtype=torch.float32, device="cuda")
    _lib.combine_bwd_pre(dy, ctx.o_RH, ctx.topk_weight_TK, ctx.sched.pair_row, ctx.sched.flag, d_w, go_RH)
    rd, sd = ctx.weights[2], ctx.weights[5]
    R, I = go_RH.shape[0], d.I
    da = torch.empty(R, I, dtype=torch.float32, device="cuda")
    da_s = torch.empty(d.T, d.S, dtype=torch.float32, device="cuda") if d.S else None
    dgu = torch.empty(R, 2 * I, dtype=torch.bfloat16, device="cuda")
    gemm_ms = timed_ms(lambda: _backward._d_act_gemm(ctx, dy, go_RH, rd, sd, da, da_s, fused=False),
                       a.rounds, a.reps)
    kern_ms = timed_ms(lambda: _lib.swiglu_bwd(da, ctx.pq_R2I, ctx.sched.offsets, d.E, 0, I, R, dgu),
                       a.rounds, a.reps)
    pair_ms = timed_ms(lambda: _backward.d_act_swiglu_unfused(ctx, dy, go_RH, rd, sd), a.rounds, a.reps)
    want, want_s = _backward.d_act_swiglu_unfused(ctx, dy, go_RH, rd, sd)
    placed = int(ctx.sched.offsets[d.E])
    fused_ms = []
    for v in variants:
        os.environ[_tiles.ENV] = str(v)
        if not a.no_check:
            got, got_s = _backward.d_act_swiglu_fused(ctx, dy, go_RH, rd, sd)
            assert_bitwise_equal(got[:placed], want[:placed], f"{name} variant {v}: dg | du")
            if want_s is not None:
                assert_bitwise_equal(got_s, want_s, f"{name} variant {v}: shared dg | du")
        fused_ms.append(timed_ms(lambda: _backward.d_act_swiglu_fused(ctx, dy, go_RH, rd, sd), a.rounds, a.reps))
        os.environ.pop(_tiles.ENV, None)
    return gemm_ms, kern_ms, pair_ms, fused_ms


if __name__ == "__main__":
    main()

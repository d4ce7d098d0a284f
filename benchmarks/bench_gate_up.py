"""The forward's gate/up step alone: the gate/up grouped GEMM with fp32 `[g | u]` out (GEMM_TN_F32, what the
backward reads) and the swiglu_fwd kernel, apart and as the pair `_forward.gate_up` + `_forward.swiglu` run them,
against the fused launch (GEMM_TN_SWIGLU_FWD, `_forward.gate_up_swiglu`) in each tile variant asked for (where 8
splits I and S); and, as the floor without the fp32 output, the same GEMM writing bf16 (GEMM_TN_BF16, what
no layer runs). Shapes of configs.json and suite.json, gate and up as the halves of one tensor; rows from the
layer's own schedule. Checks the fused `[g | u]` and `a` bits against the pair's (--no-check skips it), then prints
ms: the median over rounds of the mean of back-to-back launches. CUDA only.

Usage: python benchmarks/bench_gate_up.py [config,...] [--variants 0,3] [--rounds 5] [--reps 10] [--no-check]
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_d_act import step_args  # noqa: E402
from bench_moe import ARGS, make_bench_inputs  # noqa: E402
from bench_token_kernels import timed_ms  # noqa: E402

import mok.fast as fast  # noqa: E402
from mok.fast import _forward, _lib, _tiles  # noqa: E402
from mok.fast._checks import gate_up_halves  # noqa: E402
from mok.fast._lib import Operand, Segment  # noqa: E402
from mok.harness.bits import assert_bitwise_equal  # noqa: E402
from mok.harness.cases import with_stacked_gate_up  # noqa: E402


def main() -> None:
    a, configs, variants = step_args(__doc__, "0,3")
    os.environ.pop(_tiles.ENV, None)
    print(f"device {torch.cuda.get_device_name()}; ms, median of {a.rounds} rounds of {a.reps} launches queued; "
          "'-': 8 does not split I and S")
    print("| config | GEMM fp32 out (rule) | GEMM bf16 out | swiglu_fwd | pair | "
          + " | ".join(f"fused v{v}" for v in variants) + " |")
    print("|---" * (len(variants) + 5) + "|")
    for name in a.configs.split(","):
        t = measure(name, configs[name], variants, a)
        print(f"| {name} | " + " | ".join("-" if x is None else f"{x:.3f}" for x in t) + " |", flush=True)
        torch.cuda.empty_cache()


def measure(name: str, c: dict, variants: list[int], a) -> list[float | None]:
    """ms of the fp32 and bf16 GEMMs, the swiglu_fwd kernel, the pair and the fused launch in each variant."""
    inputs = with_stacked_gate_up(make_bench_inputs(c, "random"))
    _, ctx = fast.forward(*(inputs[k] for k in ARGS))
    d, sched, x_TH, x_RH = ctx.dims, ctx.sched, inputs["x"], ctx.x_RH
    g, u, sg, su = (inputs[k] for k in ("routed_gate", "routed_up", "shared_gate", "shared_up"))
    w_gu = _forward.stacked_gate_up(g, u)
    w_gu_s = _forward.stacked_gate_up(sg, su) if d.S else None
    halves = (gate_up_halves(g, u), gate_up_halves(sg, su) if d.S else None)
    gemm_ms = timed_ms(lambda: _forward.gate_up(x_TH, x_RH, sched, d, g, u, sg, su), a.rounds, a.reps)
    bf16_ms = timed_ms(lambda: gate_up_bf16(x_TH, x_RH, sched, d, w_gu, w_gu_s), a.rounds, a.reps)
    gu, gu_s = _forward.gate_up(x_TH, x_RH, sched, d, g, u, sg, su)
    kern_ms = timed_ms(lambda: _forward.swiglu(gu, gu_s, sched, d), a.rounds, a.reps)

    def pair():
        gu, gu_s = _forward.gate_up(x_TH, x_RH, sched, d, g, u, sg, su)
        return (gu, gu_s, *_forward.swiglu(gu, gu_s, sched, d))
    pair_ms = timed_ms(pair, a.rounds, a.reps)
    want = pair()
    placed = int(sched.offsets[d.E])
    fused_ms: list[float | None] = []
    for v in variants:
        if not _tiles.fused_gate_up_fits(d.I, d.S):
            fused_ms.append(None)
            continue
        if not a.no_check:
            got = _forward.gate_up_swiglu(x_TH, x_RH, sched, d, *halves, v)
            for what, x, y in zip(("[g | u]", "shared [g | u]", "a", "shared a"), got, want):
                if y is not None:
                    n = placed if x.shape[0] == want[0].shape[0] else x.shape[0]
                    assert_bitwise_equal(x[:n], y[:n], f"{name} variant {v}: {what}")
        fused_ms.append(timed_ms(lambda: _forward.gate_up_swiglu(x_TH, x_RH, sched, d, *halves, v),
                                 a.rounds, a.reps))
    return [gemm_ms, bf16_ms, kern_ms, pair_ms, *fused_ms]


def gate_up_bf16(x_TH, x_RH, sched, d, w_gu, w_gu_s):
    """The gate/up GEMM of `_forward.gate_up` writing bf16 `[g | u]` (GEMM_TN_BF16, rule variant): the floor."""
    dev, (T, H, I, S, E) = x_TH.device, (d.T, d.H, d.I, d.S, d.E)
    gu = torch.empty(x_RH.shape[0], 2 * I, dtype=torch.bfloat16, device=dev)
    segs = [Segment.expert_rows(sched.offsets, E, 2 * I, H, Operand(x_RH, 0, H, H), Operand(w_gu, 2 * I * H, 0, H),
                                Operand(gu, 0, 2 * I, 2 * I))]
    if S:
        gu_s = torch.empty(T, 2 * S, dtype=torch.bfloat16, device=dev)
        segs.append(Segment.all_rows(T, 2 * S, H, Operand(x_TH, 0, 0, H), Operand(w_gu_s, 0, 0, H),
                                     Operand(gu_s, 0, 0, 2 * S)))
    _tiles.grouped_gemm(_lib.GEMM_TN_BF16, segs, dev, H, I)
    return gu


if __name__ == "__main__":
    main()

"""The d_a GEMM with the SwiGLU backward in its epilogue (GEMM_NN_SWIGLU_BWD, MOK_FAST_FUSE_SWIGLU_BWD=1)
against the default unfused pair (=0: the d_a GEMM writes fp32 d_a, the swiglu_bwd kernel reads it back), in one
process: fwd+bwd of the fast layer (gate/up as halves of one tensor, bf16 weight gradients) with the unfused
pair and with the fused kind in each tile variant (the other GEMMs in their default variant), interleaved
round by round; median ms. Also checks that every choice gives the same d_x bits. CUDA only.

With --forward: the gate/up GEMM with the SwiGLU in its epilogue (GEMM_TN_SWIGLU_FWD, on by default where it
applies) against the gate/up GEMM and the swiglu_fwd kernel apart (MOK_FAST_FUSE_SWIGLU_FWD=0), forward and
forward+backward ms, the same way (y and d_x bits checked equal).

Usage: python benchmarks/bench_fused.py [--configs a,b] [--variants 0,2,3] [--rounds 5] [--reps 5] [--timing sync|stream]
[--forward]
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
from bench_moe import CONFIGS, SUITE, Method, load_configs, make_bench_inputs, timed  # noqa: E402
from mok.fast import _lib, _tiles  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="qwen3-30b-a3b,mid-64e,dsv3-ep8-slice,mixtral-8x7b,olmoe-1b-7b")
    ap.add_argument("--variants", default="0,2,3")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--timing", choices=("sync", "stream"), default="sync",
                    help="bench_moe.timed's mode: each rep waited for (sync) or reps queued back to back (stream)")
    ap.add_argument("--forward", action="store_true", help="the fused gate/up + SwiGLU launch instead (see above)")
    ap.add_argument("--fused-variant", type=int, default=None,
                    help="with --forward: the fused launch's tile variant (default: the rule's; other GEMMs: the rule)")
    a = ap.parse_args()
    if a.forward:
        return forward_main(a)
    configs = {c["name"]: c for c in load_configs(CONFIGS) + load_configs(SUITE)}
    variants = [int(v) for v in a.variants.split(",")]
    os.environ.pop(_tiles.ENV, None)
    print(f"device {torch.cuda.get_device_name()}; fwd+bwd ms, median over {a.rounds} rounds of medians of {a.reps}")
    print("| config | unfused ms | " + " | ".join(f"fused v{v} ms" for v in variants) + " | rule's variant | unfused / fused (rule) |")
    print("|---" * (len(variants) + 4) + "|")
    for name in a.configs.split(","):
        c = configs[name]
        meth = Method("mok_gu", make_bench_inputs(c, "random"), torch.bfloat16)
        os.environ.pop(_tiles.ENV, None)  # the rule itself, not the last choice of the previous config
        dev = torch.device("cuda")
        rule = {k: _tiles.variant(k, c["H"], c["I"], dev) for k in sorted(_lib.GEMM_KINDS.values())}

        def use(choice):
            if choice == "unfused":
                os.environ[_tiles.FUSE_ENV] = "0"
                os.environ.pop(_tiles.ENV, None)
            else:
                os.environ[_tiles.FUSE_ENV] = "1"
                os.environ[_tiles.ENV] = ",".join(str(choice if k == _lib.GEMM_NN_SWIGLU_BWD else v)
                                                  for k, v in rule.items())

        choices = ["unfused"] + variants
        want = None
        for ch in choices:
            use(ch)
            dx = meth.fwd_bwd()[1].clone()
            if want is None:
                want = dx
            elif not torch.equal(dx.view(torch.int16), want.view(torch.int16)):
                raise SystemExit(f"CHECK FAILED: {name}: d_x bits differ between unfused and fused v{ch}")
        times = {ch: [] for ch in choices}
        for _ in range(a.rounds):
            for ch in choices:
                use(ch)
                times[ch].append(timed(meth.fwd_bwd, 2, a.reps, a.timing))
        med = {ch: statistics.median(v) for ch, v in times.items()}
        r = rule[_lib.GEMM_NN_SWIGLU_BWD]
        ratio = f"{med['unfused'] / med[r]:.3f}x" if r in med else "-"
        print(f"| {name} | {med['unfused']:.2f} | " + " | ".join(f"{med[v]:.2f}" for v in variants) +
              f" | {r} | {ratio} |", flush=True)
        del meth
        torch.cuda.empty_cache()
    os.environ.pop(_tiles.FUSE_ENV, None)
    os.environ.pop(_tiles.ENV, None)


def forward_main(a) -> None:
    configs = {c["name"]: c for c in load_configs(CONFIGS) + load_configs(SUITE)}
    os.environ.pop(_tiles.ENV, None)
    print(f"device {torch.cuda.get_device_name()}; ms, median over {a.rounds} rounds of medians of {a.reps}")
    print("| config | fused variant | fwd apart | fwd fused | fwd+bwd apart | fwd+bwd fused | fwd+bwd apart / fused |")
    print("|---|---|---|---|---|---|---|")
    for name in a.configs.split(","):
        c = configs[name]
        os.environ.pop(_tiles.ENV, None)
        if a.fused_variant is not None:  # the rule for every other kind
            kinds = sorted(_lib.GEMM_KINDS.values())
            os.environ[_tiles.ENV] = ",".join(str(a.fused_variant if k == _lib.GEMM_TN_SWIGLU_FWD else
                                                  _tiles.variant(k, c["H"], c["I"])) for k in kinds)
        os.environ[_tiles.FUSE_FWD_ENV] = "1"  # wherever 8 splits I and S, large experts too
        v = _tiles.fused_gate_up_variant(c["H"], c["I"], c["S"], torch.device("cuda"))
        if v is None:
            print(f"| {name} | none (runs apart) | | | | | |", flush=True)
            continue
        meth = Method("mok_gu", make_bench_inputs(c, "random"), torch.bfloat16)
        choices = {"apart": "0", "fused": "1"}
        outs = {}
        for ch, text in choices.items():
            os.environ[_tiles.FUSE_FWD_ENV] = text
            outs[ch] = [t.clone() for t in meth.fwd_bwd()]
        for i, what in enumerate(("y", "d_x")):
            if not torch.equal(outs["apart"][i].view(torch.int16), outs["fused"][i].view(torch.int16)):
                raise SystemExit(f"CHECK FAILED: {name}: {what} bits differ between apart and fused")
        times = {(ch, p): [] for ch in choices for p in ("fwd", "fb")}
        for _ in range(a.rounds):
            for ch, text in choices.items():
                os.environ[_tiles.FUSE_FWD_ENV] = text
                times[ch, "fwd"].append(timed(meth.fwd, 2, a.reps, a.timing))
                times[ch, "fb"].append(timed(meth.fwd_bwd, 2, a.reps, a.timing))
        med = {k: statistics.median(t) for k, t in times.items()}
        print(f"| {name} | {v} | {med['apart', 'fwd']:.2f} | {med['fused', 'fwd']:.2f} | {med['apart', 'fb']:.2f} | "
              f"{med['fused', 'fb']:.2f} | {med['apart', 'fb'] / med['fused', 'fb']:.3f}x |", flush=True)
        del meth, outs
        torch.cuda.empty_cache()
    os.environ.pop(_tiles.FUSE_FWD_ENV, None)
    os.environ.pop(_tiles.ENV, None)


if __name__ == "__main__":
    main()

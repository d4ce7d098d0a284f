"""Do the GEMM tile variants (MOK_FAST_GEMM_VARIANT, csrc/grouped_gemm.cuh) give the same bits?
Each run saves the fast layer's 9 outputs (forward, backward with fp32 and with bf16 weight gradients)
for a few shapes; --compare reports, per file against the first, whether every tensor is bit-identical (NaN-aware)
and where the first difference is. CUDA only.

Usage: MOK_FAST_GEMM_VARIANT=V python benchmarks/variant_bits.py --save /tmp/vV.pt
       python benchmarks/variant_bits.py --compare /tmp/v0.pt /tmp/v1.pt ...
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mok.harness.bits import bit_diff  # noqa: E402
from mok.harness.cases import MoEConfig, make_inputs  # noqa: E402

SHAPES = {  # T not a multiple of 128, uneven experts, shared expert on and off
    "mid": MoEConfig(T=1000, H=1024, I=512, E=16, K=4, S=256),
    "few_large": MoEConfig(T=777, H=2048, I=2816, E=4, K=2, S=0),
    "many_small": MoEConfig(T=2048, H=512, I=128, E=64, K=8, S=128),
}


def run() -> dict:
    import mok.fast as fast
    from mok.harness.cases import LAYER_ARGS, OUTPUT_NAMES

    out = {}
    for name, cfg in SHAPES.items():
        inputs = make_inputs(cfg, 0, device="cuda")
        y, ctx = fast.forward(*(inputs[a] for a in LAYER_ARGS))
        for wdt in (torch.float32, torch.bfloat16):  # both weight-gradient GEMM kinds
            grads = fast.backward(ctx, inputs["dy"], weight_grad_dtype=wdt)
            for k, v in zip(OUTPUT_NAMES, (y, *grads)):
                out[f"{name}/{str(wdt)[6:]}/{k}"] = v.cpu() if v is not None else None
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--save")
    ap.add_argument("--compare", nargs="+")
    a = ap.parse_args()
    if a.save:
        torch.save(run(), a.save)
        return 0
    first = torch.load(a.compare[0])
    bad = 0
    for path in a.compare[1:]:
        other = torch.load(path)
        diffs = []
        for k, v in first.items():
            if v is None:
                continue
            d = bit_diff(other[k], v)
            if not d.equal:
                diffs.append(f"{k}: {d.n_diff} differ, first at {d.first_index}")
        bad += bool(diffs)
        print(f"{path} vs {a.compare[0]}: " + ("bit-identical, all tensors" if not diffs else "; ".join(diffs[:6])))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

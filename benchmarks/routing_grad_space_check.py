"""Would SonicMoE's routing-weight gradient pass mok's 2x rule? A CPU check of one numerics design, not of mok's code.

SonicMoE (arXiv 2512.14080) takes d_topk_weight in the intermediate space: d_w[t, k] = Σ_i (dy[t] · W_down[e]ᵀ)_i ·
a[i], from values its backward has anyway, so the forward need not keep the down-projection rows o [T·K, H]. mok's
reference defines d_w[t, k] = Σ_h dy[t, h] · o_k[h] with o_k rounded to bf16 (docs/layer.md). The two differ by
the rounding of o, which is about the size of plain bf16's own error, and the 2x rule (docs/numerics.md) compares
per tensor against plain bf16's error.

This evaluates the intermediate-space d_w (and the down-weight gradient that goes with it, dyᵀ · bf16(w · a)) in
float64 from the layer's inputs, over the shapes of benchmarks/emulated_error_scan.py (40 random small shapes and
the golden cases), and prints each output's error against the reference divided by plain bf16's. Exits 1 if any
ratio is above 2.

Usage: python benchmarks/routing_grad_space_check.py [--shapes 40] [--seed 0]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def _bf16(v: torch.Tensor) -> torch.Tensor:
    return v.to(torch.bfloat16).to(v.dtype)


def intermediate_space_grads(inp: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(d_w [T, K] fp32, d_routed_down [E, H, I] fp32) in float64: d_w = (dy · W_downᵀ) · a, d_down = Σ dy ⊗ bf16(w a),
    a = bf16(silu(g) · u) with g, u from fp32-rounded pre-activations (the fast path's)."""
    x, w, dy = (inp[k].double() for k in ("x", "topk_weight", "dy"))
    gate, up, down = (inp[k].double() for k in ("routed_gate", "routed_up", "routed_down"))
    idx = inp["topk_idx"]
    T, K = idx.shape
    d_w, d_down = torch.zeros(T, K, dtype=torch.float64), torch.zeros_like(down)
    for t in range(T):
        for k in range(K):
            e = idx[t, k]
            g, u = ((m[e] @ x[t]).float().double() for m in (gate, up))
            a = _bf16(F.silu(g) * u)
            d_w[t, k] = ((down[e].t() @ dy[t]) * a).sum()
            d_down[e] += torch.outer(dy[t], _bf16(w[t, k] * a))
    return d_w.float(), d_down.float()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    from emulated_error_scan import scan_cases
    from mok.harness.bits import rel_error
    from mok.harness.fast_checks import plain_outputs
    from mok.harness.runner import run_layer

    rows = []
    for name, inp in scan_cases(a.shapes, a.seed):  # the shapes of emulated_error_scan.py
        ref, plain = run_layer(inp), plain_outputs(inp)
        got = dict(zip(("d_topk_weight", "d_routed_down"), intermediate_space_grads(inp)))
        ratios = {n: rel_error(got[n], ref[n]) / max(rel_error(plain[n], ref[n]), 1e-30) for n in got}
        rows.append((max(ratios.values()), ratios, name))
    rows.sort(key=lambda r: -r[0])
    for worst, ratios, name in rows[:6]:
        print(f"{worst:6.2f}x  " + "  ".join(f"{n} {r:.2f}x" for n, r in ratios.items()) + f"  {name}")
    bad = sum(r[0] > 2.0 for r in rows)
    print(f"{bad} of {len(rows)} shapes break the 2x rule (worst ratio {rows[0][0]:.2f}x)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""The 2x rule with the SwiGLU backward's saved inputs narrowed to bf16, on the CPU (benchmarks/RESULTS.md run 26):
`emulated_error_scan.py` (the fast path's orchestration, kernels emulated by tests/fast_emulator.py) with the
backward's elementwise SwiGLU step replaced by one that rounds some of its fp32 inputs to bf16 first (the forward
then keeps [g | u] as it computed them, and each mode derives what it needs from them).

Modes: g, u, gu (the saved pre-activations); p, q, pq (p = u*silu'(g) and q = silu(g) computed in fp32 from them,
then the backward dg = bf16(da*p), du = bf16(da*q)); pq24 (p and q cut to their top 24 bits instead: the low 8
mantissa bits dropped, benchmarks/pq24_run43.diff's form, run 43); none (that form with nothing rounded: what the
fast path does since run 27, keeping [p | q] in fp32).

Usage: python benchmarks/saved_swiglu_dtype_scan.py MODE [--shapes 40] [--seed 0]
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

MODES = ("g", "u", "gu", "p", "q", "pq", "pq24", "none")


def swiglu_bwd_rows(mode: str):
    """The emulator's `_swiglu_bwd_rows(da, gu, dgu, I)` with `mode`'s inputs rounded to bf16."""
    import torch

    def bf(t, on):
        if on and mode == "pq24":  # the top 24 bits: bf16's 16 and the next 8 mantissa bits, the rest cut off
            return (t.view(torch.int32) & ~0xFF).view(torch.float32)
        return t.bfloat16().float() if on else t

    def rows(da, gu, dgu, I):
        g, u = bf(gu[:, :I], "g" in mode), bf(gu[:, I:2 * I], "u" in mode)
        sig = torch.sigmoid(g)
        if mode in ("g", "u", "gu"):  # the emulator's own formula, on the rounded g and u
            dgu[:, :I] = (da * u * (sig * (1 + g * (1 - sig)))).to(torch.bfloat16)
            dgu[:, I:2 * I] = (da * (g * sig)).to(torch.bfloat16)
            return
        p = bf(u * (sig * (1 + g * (1 - sig))), "p" in mode)
        q = bf(g * sig, "q" in mode)
        dgu[:, :I] = (da * p).to(torch.bfloat16)
        dgu[:, I:2 * I] = (da * q).to(torch.bfloat16)
    return rows


def swiglu_fwd_rows_keeping_gu(gu, a, I):
    """The emulator's `_swiglu_fwd_rows(gu, a, I)` without the in-place [g | u] -> [p | q]: a = bf16(silu(g) * u)."""
    import torch

    g, u = gu[:, :I], gu[:, I:2 * I]
    a.copy_((g * torch.sigmoid(g) * u).to(torch.bfloat16))


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in MODES:
        print(f"usage: {sys.argv[0]} MODE [--shapes N] [--seed S]; MODE one of {', '.join(MODES)}", file=sys.stderr)
        return 2
    import emulated_error_scan
    import fast_emulator

    fast_emulator._swiglu_fwd_rows = swiglu_fwd_rows_keeping_gu
    fast_emulator._swiglu_bwd_rows = swiglu_bwd_rows(sys.argv[1])
    sys.argv = [sys.argv[0], *sys.argv[2:]]
    return emulated_error_scan.main()


if __name__ == "__main__":
    sys.exit(main())

"""Helpers for the fast path's tests and benchmark: the plain bf16 comparison implementation with
autograd, and the 2x error rule (docs/numerics.md, flash-attention's rule)."""
from __future__ import annotations

import math

import torch

from .bits import rel_error
from .cases import LAYER_ARGS, OUTPUT_NAMES
from .plain import moe_plain

GRAD_OF = {"d_x": "x", "d_topk_weight": "topk_weight", "d_routed_gate": "routed_gate",
           "d_routed_up": "routed_up", "d_routed_down": "routed_down", "d_shared_gate": "shared_gate",
           "d_shared_up": "shared_up", "d_shared_down": "shared_down"}
# Absolute slack added to 2x the plain implementation's relative error, so that a plain error of
# exactly 0 (e.g. a tensor both round identically) does not demand bit equality.
REL_SLACK = 1e-6


def plain_outputs(inputs: dict, dtype: torch.dtype = torch.bfloat16, spec_rounding: bool = False) -> dict:
    """y and the 8 gradients of `moe_plain` (torch.matmul per expert, autograd) in `dtype`."""
    leaves = {}
    for name in LAYER_ARGS:
        v = inputs[name]
        if v is not None and v.is_floating_point():
            v = v.detach().clone().requires_grad_(True)
        leaves[name] = v
    y = moe_plain(*(leaves[a] for a in LAYER_ARGS), dtype=dtype, spec_rounding=spec_rounding)
    y.backward(inputs["dy"].to(y.dtype))
    out = {"y": y.detach()}
    for g, src in GRAD_OF.items():
        out[g] = leaves[src].grad if leaves[src] is not None else None
    return out


def error_table(got: dict, ref: dict, plain: dict) -> list[tuple[str, float, float, bool]]:
    """(name, fast error, plain error, passes) per output; NaN or inf never passes."""
    rows = []
    for name in OUTPUT_NAMES:
        if ref[name] is None:
            ok = got[name] is None
            rows.append((name, 0.0, 0.0, ok))
            continue
        e_fast = rel_error(got[name], ref[name])
        e_plain = rel_error(plain[name], ref[name])
        ok = math.isfinite(e_fast) and e_fast <= 2.0 * e_plain + REL_SLACK
        rows.append((name, e_fast, e_plain, ok))
    return rows


def assert_within_2x(got: dict, ref: dict, plain: dict, label: str = "") -> None:
    """Fail naming each output whose error vs the reference exceeds 2x the plain bf16 one."""
    rows = error_table(got, ref, plain)
    bad = [r for r in rows if not r[3]]
    if bad:
        lines = "\n".join(f"  {n}: fast {ef:.3e} vs plain bf16 {ep:.3e}" for n, ef, ep, _ in bad)
        raise AssertionError(f"{label}: error above 2x plain bf16:\n{lines}")

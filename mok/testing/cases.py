"""Layer configurations and deterministic input generation for tests, goldens and tools."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from ..reference import route

ROUTINGS = ("random", "skewed", "empty_expert", "one_expert")


@dataclass(frozen=True)
class MoEConfig:
    """Sizes of one layer (the shape legend of docs/layer.md; T is the number of global tokens here, W = 1)."""

    T: int
    H: int
    I: int
    E: int
    K: int
    S: int = 0

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def parse(cls, text: str) -> "MoEConfig":
        """From "T,H,I,E,K[,S]" (S optional); raises ValueError naming `shape` for anything else."""
        try:
            parts = [int(p) for p in text.split(",")]
        except ValueError:
            parts = []
        if len(parts) not in (5, 6):
            raise ValueError(f"shape: expected 'T,H,I,E,K[,S]' (integers), got {text!r}")
        return cls(*parts).validated()

    def validated(self) -> "MoEConfig":
        """self, if T, H, I, E, K >= 1, S >= 0 and K <= E; else ValueError naming `shape`."""
        low = [(n, v) for n, v in self.as_dict().items() if v < (0 if n == "S" else 1)]
        if low:
            n, v = low[0]
            raise ValueError(f"shape: expected {n} >= {0 if n == 'S' else 1}, got {n} = {v}")
        if self.K > self.E:
            raise ValueError(f"shape: expected K <= E = {self.E}, got K = {self.K}")
        return self


# The embedded default of `mok verify` and `tools/diff_grads.py`: odd sizes (tree carries),
# T divisible by 4 so W = 1, 2, 4 split it evenly, a shared expert.
DEFAULT = MoEConfig(T=48, H=80, I=40, E=8, K=3, S=24)
NAMED = {"default": DEFAULT, "tiny": MoEConfig(T=8, H=16, I=8, E=4, K=2, S=8)}


def make_routing(cfg: MoEConfig, gen: torch.Generator, routing: str = "random"):
    """(topk_idx [T, K] int64, topk_weight [T, K] fp32) from random router logits via `route`.

    routing: "random"; "skewed" (half the tokens pick expert 0 among their k);
    "empty_expert" (expert E-1 never picked; needs K < E); "one_expert" (every token picks expert 0).
    """
    if routing not in ROUTINGS:
        raise ValueError(f"routing: expected one of {ROUTINGS}, got {routing!r}")
    logits = torch.randn(cfg.T, cfg.E, generator=gen)
    if routing == "skewed":
        logits[: cfg.T // 2, 0] = 30.0
    elif routing == "one_expert":
        logits[:, 0] = 30.0
    elif routing == "empty_expert":
        if cfg.K >= cfg.E:
            raise ValueError(f"routing: 'empty_expert' needs K < E, got K = {cfg.K}, E = {cfg.E}")
        logits[:, cfg.E - 1] = -30.0
    return route(logits, cfg.K)


def make_inputs(cfg: MoEConfig, seed: int, routing: str = "random", device="cpu") -> dict:
    """All inputs of one forward+backward, drawn on the CPU from `seed`, then moved to `device`.

    Weights are scaled by 1/sqrt(fan-in) so activations stay O(1).
    Returns a dict with the layer's argument names plus "dy" ([T, H] bf16).
    """
    gen = torch.Generator().manual_seed(seed)

    def w(*shape, fan_in):
        return (torch.randn(*shape, generator=gen) * fan_in**-0.5).to(torch.bfloat16)

    topk_idx, topk_weight = make_routing(cfg, gen, routing)
    T, H, I, E, S = cfg.T, cfg.H, cfg.I, cfg.E, cfg.S
    inputs = {
        "x": torch.randn(T, H, generator=gen).to(torch.bfloat16),
        "topk_idx": topk_idx,
        "topk_weight": topk_weight,
        "shared_gate": w(S, H, fan_in=H) if S else None,
        "shared_up": w(S, H, fan_in=H) if S else None,
        "shared_down": w(H, S, fan_in=S) if S else None,
        "routed_gate": w(E, I, H, fan_in=H),
        "routed_up": w(E, I, H, fan_in=H),
        "routed_down": w(E, H, I, fan_in=I),
        "dy": torch.randn(T, H, generator=gen).to(torch.bfloat16),
    }
    return {k: (v.to(device) if v is not None else None) for k, v in inputs.items()}


def with_stacked_gate_up(inputs: dict) -> dict:
    """`inputs` with gate and up (routed and shared) as the two halves of one [gate; up] tensor each, as
    transformers' `gate_up_proj` and mok.MoE's float32 casts hand them over (the same values)."""
    out = dict(inputs)
    for gate, up, dim in (("routed_gate", "routed_up", 1), ("shared_gate", "shared_up", 0)):
        if inputs[gate] is not None:
            out[gate], out[up] = torch.cat([inputs[gate], inputs[up]], dim).chunk(2, dim)
    return out


def two_gate_up_tensors(gate, up, up_first: bool = False):
    """Copies of `gate` and `up` (one shape) as two contiguous tensors in one buffer, `up_first` in memory or not,
    8 elements (16 bytes of bf16) apart: their starts differ by no whole number of rows, and neither is a half of one
    [gate; up] tensor. The gap holds NaN. For the fast path's two-tensor reads (mok/fast/_checks.gate_up_halves)."""
    n = gate.numel()
    flat = torch.full((2 * n + 8,), float("nan"), dtype=gate.dtype, device=gate.device)
    first, second = flat[:n].view(gate.shape), flat[n + 8:].view(gate.shape)
    g, u = (second, first) if up_first else (first, second)
    g.copy_(gate)
    u.copy_(up)
    return g, u


LAYER_ARGS = ("x", "topk_idx", "topk_weight", "shared_gate", "shared_up", "shared_down",
              "routed_gate", "routed_up", "routed_down")
OUTPUT_NAMES = ("y", "d_x", "d_topk_weight", "d_routed_gate", "d_routed_up", "d_routed_down",
                "d_shared_gate", "d_shared_up", "d_shared_down")

"""`mok.MoE`: a deterministic mixture-of-experts layer as an `nn.Module` (router + experts)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from ..reference import SCORES, check_ep_split, world
from . import backend as _backend
from . import ops


class Routing(NamedTuple):
    """The router's output for T tokens: topk_idx [T, K] int64, topk_weight [T, K] fp32,
    scores [T, E] fp32, logits [T, E] fp32."""

    topk_idx: torch.Tensor
    topk_weight: torch.Tensor
    scores: torch.Tensor
    logits: torch.Tensor


class RouterLosses(NamedTuple):
    """load_balance: Switch-style E * Σ f_e P_e (1 when uniform); z: mean logsumexp(logits)²; [] fp32."""

    load_balance: torch.Tensor
    z: torch.Tensor


def _positive_int(name: str, v, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {v!r}")
    return v


class MoE(nn.Module):
    """Router (bias-free gate feeding `mok.reference.route`), optional shared expert, routed SwiGLU experts.

    Args:
        hidden_size: H. intermediate_size: I (routed experts). num_experts: E. top_k: K (1 <= K <= E).
        shared_intermediate_size: S, 0 for no shared expert.
        score: "softmax" or "sigmoid" router scores. normalize: renormalise the K weights to sum to 1.
        backend: "auto" (fast path on an sm_90 GPU when built, else reference), "reference" or "fast".
            The choice is in `self.backend_in_use` (with `self.backend_reason`), re-made when the
            module moves device, and logged once (logger "mok").
        group: torch.distributed process group for expert parallelism (W ranks; this rank holds
            experts [rank * L, (rank + 1) * L), L = E / W); None for W = 1.
        recompute: save only the layer's inputs and recompute its intermediates in backward
            (bitwise the same gradients, less activation memory).
        dtype: parameter dtype, float32 (master weights; default) or bfloat16. The math always
            uses bf16 weights; fp32 parameters receive fp32 gradients.
        device: parameter device.

    Parameters (SPEC §1 names): w_router_EH [E, H]; w_gate_LIH, w_up_LIH [L, I, H];
    w_down_LHI [L, H, I]; with S > 0 also w_shared_gate_SH, w_shared_up_SH [S, H], w_shared_down_HS [H, S].
    """

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int, *,
                 shared_intermediate_size: int = 0, score: str = "softmax", normalize: bool = True,
                 backend: str = "auto", group=None, recompute: bool = False, dtype=torch.float32, device=None):
        super().__init__()
        H = _positive_int("hidden_size", hidden_size)
        I = _positive_int("intermediate_size", intermediate_size)
        E = _positive_int("num_experts", num_experts)
        K = _positive_int("top_k", top_k)
        if K > E:
            raise ValueError(f"top_k: expected an int in [1, num_experts = {E}], got {K}")
        S = _positive_int("shared_intermediate_size", shared_intermediate_size, minimum=0)
        if score not in SCORES:
            raise ValueError(f"score: expected one of {SCORES}, got {score!r}")
        if not isinstance(normalize, bool):
            raise TypeError(f"normalize: expected a bool, got {normalize!r}")
        if not isinstance(recompute, bool):
            raise TypeError(f"recompute: expected a bool, got {recompute!r}")
        if dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"dtype: expected torch.float32 or torch.bfloat16, got {dtype}")
        if backend not in _backend.CHOICES:
            raise ValueError(f"backend: expected one of {_backend.CHOICES}, got {backend!r}")
        W, rank = world(group)
        L = check_ep_split(E, W)
        self.hidden_size, self.intermediate_size, self.num_experts, self.top_k = H, I, E, K
        self.shared_intermediate_size, self.score, self.normalize = S, score, normalize
        self.group, self.world_size, self.rank, self.local_experts = group, W, rank, L
        self.recompute, self.backend = recompute, backend

        def p(*shape):
            return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device))

        self.w_router_EH = p(E, H)
        self.w_gate_LIH, self.w_up_LIH, self.w_down_LHI = p(L, I, H), p(L, I, H), p(L, H, I)
        if S:
            self.w_shared_gate_SH, self.w_shared_up_SH, self.w_shared_down_HS = p(S, H), p(S, H), p(H, S)
        else:
            for name in ("w_shared_gate_SH", "w_shared_up_SH", "w_shared_down_HS"):
                self.register_parameter(name, None)
        self.reset_parameters()
        self._pick_backend()

    # ------------------------------------------------------------ setup

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Normal(0, 1/fan_in) weights drawn on the CPU for all E experts, then this rank's L taken,
        so one seed gives the same global layer for every W. `generator`: default torch's global one."""
        H, I, E, S, L, r = (self.hidden_size, self.intermediate_size, self.num_experts,
                            self.shared_intermediate_size, self.local_experts, self.rank)

        def draw(param, shape, fan_in, local=False):
            w = torch.randn(*shape, generator=generator) * fan_in**-0.5
            if local:
                w = w[r * L : (r + 1) * L]
            param.copy_(w.to(param.dtype))

        draw(self.w_router_EH, (E, H), H)
        draw(self.w_gate_LIH, (E, I, H), H, local=True)
        draw(self.w_up_LIH, (E, I, H), H, local=True)
        draw(self.w_down_LHI, (E, H, I), I, local=True)
        if S:
            draw(self.w_shared_gate_SH, (S, H), H)
            draw(self.w_shared_up_SH, (S, H), H)
            draw(self.w_shared_down_HS, (H, S), S)

    def _pick_backend(self) -> None:
        device = self.w_router_EH.device
        sizes = (self.hidden_size, self.intermediate_size, self.shared_intermediate_size)
        self.backend_in_use, self.backend_reason = _backend.resolve(self.backend, device, world_size=self.world_size,
                                                                    sizes=sizes)
        self._fast_ready = False
        _backend.announce(self.backend, self.backend_in_use, self.backend_reason, device)

    def _ensure_ready(self) -> None:
        """Build/load the fast path's kernels on the first forward that needs them (not in __init__
        or .cuda()); with backend="auto" a failed build falls back to the reference, with a warning."""
        if self.backend_in_use != "fast" or self._fast_ready or torch.compiler.is_compiling():
            return
        ok, why = _backend.ensure_ready(self.backend)
        if not ok:
            self.backend_in_use, self.backend_reason = "reference", why
            _backend.announce(self.backend, self.backend_in_use, why, self.w_router_EH.device)
            return
        self._fast_ready = True

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        self._pick_backend()  # the device may have changed
        return out

    def extra_repr(self) -> str:
        return (f"H={self.hidden_size}, I={self.intermediate_size}, E={self.num_experts}, K={self.top_k}, "
                f"S={self.shared_intermediate_size}, L={self.local_experts}, W={self.world_size}, "
                f"score={self.score!r}, normalize={self.normalize}, backend={self.backend_in_use!r}, "
                f"recompute={self.recompute}")

    # ------------------------------------------------------------ forward pieces

    def _check_x(self, x: torch.Tensor) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"x: expected dtype torch.float32 or torch.bfloat16, got {x.dtype}")
        if x.dim() < 1 or x.shape[-1] != self.hidden_size:
            raise ValueError(f"x: expected shape (..., {self.hidden_size}), got {tuple(x.shape)}")

    def route(self, x_TH: torch.Tensor) -> Routing:
        """Router on [T, H] tokens (bf16, or fp32 rounded to bf16): gate logits, scores, top-k
        (`mok.reference.router_forward`, or its GPU version on the fast backend)."""
        self._ensure_ready()
        return Routing(*ops.router(x_TH, self.w_router_EH, self.top_k, score=self.score, normalize=self.normalize,
                                   backend=self.backend_in_use))

    def compute_experts(self, x_TH: torch.Tensor, topk_idx_TK: torch.Tensor, topk_weight_TK: torch.Tensor) -> torch.Tensor:
        """The layer (shared + routed experts) on [T, H] tokens (bf16, or fp32 rounded to bf16) with a
        given routing; y [T, H] bf16.
        With a group, T is this rank's token count (the same on every rank)."""
        self._ensure_ready()
        return ops.moe(x_TH, topk_idx_TK, topk_weight_TK, self.w_shared_gate_SH, self.w_shared_up_SH,
                       self.w_shared_down_HS, self.w_gate_LIH, self.w_up_LIH, self.w_down_LHI,
                       group=self.group, backend=self.backend_in_use, recompute=self.recompute)

    def router_losses(self, routing: Routing) -> RouterLosses:
        """Load-balancing loss and z-loss of `routing` (over its T tokens), deterministic."""
        return RouterLosses(*ops.router_losses(routing.scores, routing.logits, routing.topk_idx, score=self.score,
                                               backend=self.backend_in_use))

    def forward(self, x: torch.Tensor, *, return_router_losses: bool = False):
        """y = MoE(x).

        Args:
            x: [..., H] float32 or bfloat16 (rounded to bf16 for the layer).
            return_router_losses: also return `RouterLosses` (weight them into your loss yourself).
        Returns:
            y with x's shape and dtype (bf16-valued), or (y, RouterLosses).
        """
        self._check_x(x)
        x_TH = x.reshape(-1, self.hidden_size)  # the ops round to bf16 inside: no bf16 math in the graph
        routing = self.route(x_TH)
        y = self.compute_experts(x_TH, routing.topk_idx, routing.topk_weight).to(x.dtype).view(x.shape)
        if return_router_losses:
            return y, self.router_losses(routing)
        return y

"""mok as a transformers experts implementation: `model.set_experts_implementation("mok")`.

transformers (>= 5) routes every MoE layer built with `@use_experts_implementation` through
`ALL_EXPERTS_FUNCTIONS[config._experts_implementation](experts, hidden_states, top_k_index,
top_k_weights)`. The model keeps its own parameters (checkpoint keys unchanged), router, shared
experts, scaling and aux loss; only the routed experts' SwiGLU and the weighted sum over the top-k run
in mok's layer (`mok.nn.ops.moe_gate_up`), on the backend "auto" picks (the CUDA fast path on an H100/H200,
the bit-exact reference elsewhere).

Supported experts: fused `gate_up_proj` [E, 2I, H] (gate rows first, or interleaved) and `down_proj`
[E, H, I] (or both transposed), bias-free, SiLU-gated, no post-expert norm. Anything else raises
NotImplementedError naming what mok's layer does not compute (e.g. GPT-OSS's biases and clamped SwiGLU).

Expert parallelism follows transformers' convention: with `experts._is_expert_parallel`, `num_experts`
is the local count and ids >= num_experts are other ranks' experts, whose weights are zero. Those
slots go to zero "null" experts appended per slot (mok needs distinct ids per token), so they add
exactly nothing and get no gradient.
"""

from __future__ import annotations

import torch
from torch import nn

from ..nn import backend as _backend
from ..nn import ops
from ..nn.routing_inputs import check_routing_dtypes
from ..reference import check_precision

NAME = "mok"


def _is_silu(act) -> bool:
    if isinstance(act, nn.SiLU):
        return True
    return type(act).__name__ == "SiLUActivation"  # transformers.activations' own SiLU


def unsupported(experts: nn.Module) -> list[str]:
    """What mok's layer would not compute for this transformers experts module ([] when it fits)."""
    from transformers.integrations.moe import _default_apply_gate

    missing = []
    if not getattr(experts, "has_gate", True) or not hasattr(experts, "gate_up_proj"):
        missing.append("ungated experts (no fused gate_up_proj; mok's experts are SwiGLU)")
    if getattr(experts, "has_bias", False):
        missing.append("expert biases (gate_up_proj_bias, down_proj_bias)")
    if getattr(experts, "has_post_expert_norm", False):
        missing.append("a norm after each expert (has_post_expert_norm)")
    if getattr(type(experts), "_apply_gate", _default_apply_gate) is not _default_apply_gate:
        what = [f"{name}={getattr(experts, name)}" for name in ("limit", "alpha") if hasattr(experts, name)]
        missing.append(f"a custom gated activation ({type(experts).__name__}._apply_gate"
                       + (f": clamped SwiGLU with {', '.join(what)}" if what else "") + ")")
    elif not _is_silu(getattr(experts, "act_fn", None)):
        missing.append(f"the activation {type(getattr(experts, 'act_fn', None)).__name__} (mok's experts use SiLU)")
    for name in ("gate_up_proj", "down_proj"):
        w = getattr(experts, name, None)
        if w is not None and w.dtype not in (torch.float32, torch.bfloat16):
            missing.append(f"{name} of dtype {w.dtype} (mok takes float32 or bfloat16 weights)")
    return missing


def check(experts: nn.Module) -> None:
    """Raise NotImplementedError naming every feature of `experts` that mok's layer does not compute."""
    missing = unsupported(experts)
    if missing:
        raise NotImplementedError(
            f"experts_implementation={NAME!r}: {type(experts).__name__} has {'; '.join(missing)}, which mok's "
            f"layer (bias-free SwiGLU experts: bf16(silu(x·gateᵀ) * (x·upᵀ)) · downᵀ) does not compute. "
            f"Use another experts_implementation (e.g. 'grouped_mm') for this model.")


def check_model(model: nn.Module) -> list[str]:
    """Check every experts module of `model` (raises like `check`); returns their qualified names."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module (a transformers model), got {type(model).__name__}")
    names = []
    for name, module in model.named_modules():
        if hasattr(module, "has_gate") and hasattr(module, "_is_expert_parallel"):  # @use_experts_implementation
            check(module)
            names.append(name)
    return names


def _plain(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # an expert-sharded DTensor: this rank's experts


def _weights(experts: nn.Module, H: int):
    """(gate_up [L, 2I, H], gate rows first, contiguous; down [L, H, I] contiguous): the module's own
    tensors when stored so (no copy), else one copy of each in that layout."""
    gate_up, down = _plain(experts.gate_up_proj), _plain(experts.down_proj)
    if getattr(experts, "is_transposed", False):
        gate_up, down = gate_up.transpose(1, 2), down.transpose(1, 2)
    L, two_I, H_w = gate_up.shape
    I = two_I // 2
    if H_w != H or two_I != 2 * I or tuple(down.shape) != (L, H, I):
        raise ValueError(f"{type(experts).__name__}: expected gate_up_proj [L, 2I, {H}] and down_proj [L, {H}, I] "
                         f"(H = hidden_states.shape[-1]), got {tuple(gate_up.shape)} and {tuple(down.shape)}")
    if not getattr(experts, "is_concatenated", True):  # interleaved rows: gate rows first
        gate_up = torch.cat([gate_up[:, 0::2], gate_up[:, 1::2]], dim=1)
    return gate_up.contiguous(), down.contiguous()


def _check_inputs(hidden_states, top_k_index, top_k_weights) -> None:
    """Types, dtypes (`check_routing_dtypes`) and shapes of the experts function's inputs, named as transformers
    names them."""
    check_routing_dtypes(("hidden_states", hidden_states), ("top_k_index", top_k_index),
                         ("top_k_weights", top_k_weights))
    if hidden_states.dim() != 2:
        raise ValueError(f"hidden_states: expected 2 dimensions [T, H], got shape {tuple(hidden_states.shape)}")
    T = hidden_states.shape[0]
    if top_k_index.dim() != 2 or top_k_index.shape[0] != T:
        raise ValueError(f"top_k_index: expected shape [T = {T}, K] (T = hidden_states.shape[0]), "
                         f"got {tuple(top_k_index.shape)}")
    if top_k_weights.shape != top_k_index.shape:
        raise ValueError(f"top_k_weights: expected the shape of top_k_index {tuple(top_k_index.shape)}, "
                         f"got {tuple(top_k_weights.shape)}")


def _pick(requested: str, device: torch.device, H: int, I: int) -> str:
    """The backend for a layer of sizes (H, I) on `device`, chosen (and built) once and logged once."""
    return _backend.pick(requested, device, world_size=1, sizes=(H, I, 0))


def _null_experts(gate_up, down, top_k_index, top_k_weights, L: int):
    """Expert-parallel sentinels (ids >= L, weight 0) to K zero experts L + k: distinct ids, exact zeros."""
    K = top_k_index.shape[1]
    off = top_k_index >= L
    slot = torch.arange(L, L + K, device=top_k_index.device).expand_as(top_k_index)
    idx = torch.where(off, slot, top_k_index)
    w = top_k_weights.masked_fill(off, 0.0)  # no gradient to the other ranks' slots
    pad = [t.new_zeros((K, *t.shape[1:])) for t in (gate_up, down)]
    return torch.cat([gate_up, pad[0]]), torch.cat([down, pad[1]]), idx, w


def make_experts_forward(backend: str = "auto", recompute: bool = False, precision: str = "bf16"):
    """An experts function for `ALL_EXPERTS_FUNCTIONS` running mok's layer.

    backend: "auto" (fast path on H100/H200 when available, else reference), "reference" or "fast".
    recompute: as `mok.MoE` (save only the inputs; same bits, less activation memory).
    precision: as `mok.MoE` ("bf16" or "fp8", the recipe of docs/numerics.md).
    """
    check_precision(precision)
    if backend not in _backend.CHOICES:
        raise ValueError(f"backend: expected one of {_backend.CHOICES}, got {backend!r}")
    if not isinstance(recompute, bool):
        raise TypeError(f"recompute: expected a bool, got {recompute!r}")

    def mok_experts_forward(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                            top_k_weights: torch.Tensor) -> torch.Tensor:
        """Routed experts of a transformers MoE layer through mok.

        Args:
            self: the experts module (gate_up_proj [L, 2I, H], down_proj [L, H, I]; fp32 or bf16).
            hidden_states: [T, H] float32 or bfloat16. top_k_index: [T, K] integer expert ids (int64 from
                transformers' routers; local ids under expert parallelism, >= num_experts for other ranks' experts).
            top_k_weights: [T, K] routing weights, float32, bfloat16 or float16 (used in fp32, exactly as given).
        Returns:
            [T, H] in hidden_states' dtype: Σ_k w_k · expert_k(x), one bf16 rounding per token.
        """
        check(self)
        _check_inputs(hidden_states, top_k_index, top_k_weights)
        H = hidden_states.shape[-1]
        gate_up, down = _weights(self, H)
        idx, w = top_k_index.long(), top_k_weights.float()
        if getattr(self, "_is_expert_parallel", False):
            gate_up, down, idx, w = _null_experts(gate_up, down, idx, w, self.num_experts)
        name = _pick(backend, hidden_states.device, H, gate_up.shape[1] // 2)
        # one [gate; up] tensor in, one gradient out: the fast path reads and writes it as is (no concatenation)
        y = ops.moe_gate_up(hidden_states.contiguous(), idx.contiguous(), w.contiguous(), None, None, gate_up, down,
                            backend=name, recompute=recompute, precision=precision)
        return y.to(hidden_states.dtype)

    return mok_experts_forward


def register(name: str = NAME, *, backend: str = "auto", recompute: bool = False, precision: str = "bf16") -> str:
    """Register mok in transformers' `ALL_EXPERTS_FUNCTIONS` under `name` (idempotent); returns `name`.

    Then `model.set_experts_implementation(name)` or `from_pretrained(..., experts_implementation=name)`.
    backend, recompute, precision: as `make_experts_forward` (register several names for several settings).
    """
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    except ImportError as e:
        raise ImportError("mok.hf.register: needs transformers >= 5 (transformers.integrations.moe); "
                          f"import failed: {e}") from e
    if not isinstance(name, str) or not name:
        raise ValueError(f"name: expected a non-empty str, got {name!r}")
    ALL_EXPERTS_FUNCTIONS.register(name, make_experts_forward(backend, recompute, precision))
    return name

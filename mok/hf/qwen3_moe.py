"""Conversion between `mok.MoE` and transformers' Qwen3-MoE sparse block (`Qwen3MoeSparseMoeBlock`).

Supported layouts (detected from the block, so either release works):
- transformers >= 5: `gate.weight` [E, H]; `experts.gate_up_proj` [E, 2I, H] (gate rows first, then
  up, as `chunk(2)` splits them); `experts.down_proj` [E, H, I]. Tested with transformers 5.24.0.
- transformers 4.x: `gate` an `nn.Linear(H, E)`; `experts[e].gate_proj/up_proj/down_proj.weight`.

Qwen3-MoE has softmax scores, a bias-free router and no shared expert; `norm_topk_prob` maps to
`normalize`. OLMoE's block is the same layer and converts too. Any other block (a shared expert, a
sigmoid/biased/group-limited router, a routed scaling factor, expert biases, another activation...)
raises ValueError naming what mok.MoE lacks: run such models through
`experts_implementation="mok"` (`mok.hf.experts`), which keeps the model's own router and shared experts.
Numerics differ by design: HF rounds router logits and top-k weights to bf16 and accumulates the
experts' outputs in bf16; mok keeps fp32 weights and rounds once per output.
"""

from __future__ import annotations

import torch
from torch import nn

from ..nn import MoE
from ..reference import world

# routers that are softmax -> top-k -> optional renormalisation, bias-free (mok.MoE's "softmax" router)
_ROUTERS = ("Qwen3MoeTopKRouter", "OlmoeTopKRouter")


def _is_v5(block) -> bool:
    return hasattr(block.experts, "gate_up_proj")


def _legacy_unsupported(block) -> list[str]:
    """What a transformers 4.x block (gate nn.Linear, experts a ModuleList) has that mok.MoE lacks."""
    missing = []
    if not hasattr(block, "norm_topk_prob") or not hasattr(block, "top_k"):
        missing.append("a router without top_k / norm_topk_prob attributes (not Qwen3-MoE's, e.g. Mixtral's)")
    if block.gate.bias is not None:
        missing.append("a router bias (block.gate.bias)")
    first = block.experts[0]
    if not all(hasattr(first, n) for n in ("gate_proj", "up_proj", "down_proj")):
        missing.append(f"experts of type {type(first).__name__} (expected gate_proj / up_proj / down_proj)")
    elif any(getattr(first, n).bias is not None for n in ("gate_proj", "up_proj", "down_proj")):
        missing.append("expert biases")
    return missing


def unsupported(block) -> list[str]:
    """What `block` has that a Qwen3-MoE `mok.MoE` cannot hold ([] when it converts exactly)."""
    from .experts import unsupported as experts_unsupported

    missing = []
    for name in ("shared_expert", "shared_experts"):
        if getattr(block, name, None) is not None:
            missing.append(f"a shared expert (block.{name})")
    if getattr(block, "shared_expert_gate", None) is not None:
        missing.append("a sigmoid shared-expert gate (block.shared_expert_gate)")
    if getattr(block, "jitter_noise", 0):
        missing.append(f"router jitter noise ({block.jitter_noise})")
    where = "gate"
    if getattr(block, "gate", None) is None and getattr(block, "router", None) is not None:
        where = "router"
        missing.append(f"a router at block.router ({type(block.router).__name__})")
    gate = getattr(block, where, None)
    if gate is None or not hasattr(block, "experts"):
        return missing + ["no .gate router and .experts"]
    if getattr(gate, "e_score_correction_bias", None) is not None:
        missing.append(f"sigmoid scores with an expert score-correction bias (block.{where}.e_score_correction_bias)")
    groups = getattr(gate, "num_group", getattr(gate, "n_group", 1)) or 1
    if groups > 1:
        missing.append(f"group-limited top-k (n_group={groups}, topk_group={getattr(gate, 'topk_group', None)})")
    scale = getattr(gate, "routed_scaling_factor", 1.0)
    if scale not in (None, 1.0):
        missing.append(f"a routed scaling factor ({scale})")
    if isinstance(getattr(gate, "bias", None), torch.Tensor):
        missing.append(f"a router bias (block.{where}.bias)")
    if isinstance(gate, nn.Linear) and isinstance(block.experts, nn.ModuleList):
        return missing + _legacy_unsupported(block)
    if type(gate).__name__ not in _ROUTERS and not missing:
        missing.append(f"the router {type(gate).__name__} (mok converts only the softmax top-k routers {_ROUTERS})")
    if hasattr(block.experts, "gate_up_proj"):
        missing += experts_unsupported(block.experts)
        if getattr(block.experts, "is_transposed", False) or not getattr(block.experts, "is_concatenated", True):
            missing.append("a transposed or interleaved gate_up_proj layout")
    else:
        missing.append(f"experts of type {type(block.experts).__name__} (expected a fused gate_up_proj)")
    return missing


def check_block(block) -> None:
    """Raise unless `block` converts exactly to a `mok.MoE` (TypeError: not an MoE block; ValueError: a
    feature mok.MoE lacks, named, with a pointer to the experts interface where that fits)."""
    from .experts import unsupported as experts_unsupported

    if not hasattr(block, "experts") or not (hasattr(block, "gate") or hasattr(block, "router")):
        raise TypeError(f"block: expected a Qwen3MoeSparseMoeBlock (with .gate and .experts), "
                        f"got {type(block).__name__}")
    missing = unsupported(block)
    if not missing:
        return
    experts_missing = experts_unsupported(block.experts) if hasattr(block.experts, "gate_up_proj") else []
    if experts_missing:
        hint = (f"mok's transformers experts interface does not run these experts either "
                f"({'; '.join(experts_missing)}): keep an experts implementation such as 'grouped_mm' for this model.")
    else:
        hint = ("To train this model with mok, keep its blocks and run the routed experts through transformers' "
                "experts interface: `import mok.hf; model.set_experts_implementation(\"mok\")` (or "
                "from_pretrained(..., experts_implementation=\"mok\")); the model's router and shared experts stay.")
    raise ValueError(f"block: expected a Qwen3-MoE sparse block (softmax top-k router, routed SwiGLU experts only), "
                     f"got {type(block).__name__} with {'; '.join(missing)}, which mok.MoE cannot hold. {hint}")


def _shape_error(what: str, expected: str, got) -> ValueError:
    return ValueError(f"{what}: expected {expected}, got {tuple(got)}")


def _dims(block) -> tuple[int, int, int, int, bool]:
    """(H, I, E, K, normalize) of a Qwen3MoeSparseMoeBlock of either layout, after checking that the router's
    and every expert's weight shapes agree (ValueError naming the attribute) and that norm_topk_prob is a real
    bool (TypeError: bool("false") would be True)."""
    if block.gate.weight.dim() != 2:
        raise _shape_error("block.gate.weight", "[E, H] (2 dimensions)", block.gate.weight.shape)
    E, H = block.gate.weight.shape
    if _is_v5(block):
        where = "block.gate"
        gate_up, down = block.experts.gate_up_proj, block.experts.down_proj
        if gate_up.dim() != 3 or gate_up.shape[0] != E or gate_up.shape[2] != H or gate_up.shape[1] % 2:
            raise _shape_error("block.experts.gate_up_proj", f"[E, 2I, H] = [{E}, 2I, {H}] (E, H of block.gate.weight "
                               f"{tuple(block.gate.weight.shape)}; an even number 2I of gate and up rows)",
                               gate_up.shape)
        I = gate_up.shape[1] // 2
        if tuple(down.shape) != (E, H, I):
            raise _shape_error("block.experts.down_proj", f"[E, H, I] = [{E}, {H}, {I}] (I = half the rows of "
                               f"block.experts.gate_up_proj {tuple(gate_up.shape)})", down.shape)
        K, normalize = block.gate.top_k, block.gate.norm_topk_prob
    else:
        where = "block"
        if len(block.experts) != E:
            raise ValueError(f"block.experts: expected E = {E} experts (block.gate.weight "
                             f"{tuple(block.gate.weight.shape)}), got {len(block.experts)}")
        I = block.experts[0].gate_proj.weight.shape[0]
        for e, m in enumerate(block.experts):
            for name, shape in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
                w = getattr(m, name).weight
                if tuple(w.shape) != shape:
                    raise _shape_error(f"block.experts[{e}].{name}.weight", f"{list(shape)} (I = {I} of "
                                       f"block.experts[0].gate_proj, H = {H} of block.gate.weight)", w.shape)
        K, normalize = block.top_k, block.norm_topk_prob
    if not isinstance(normalize, bool):
        raise TypeError(f"{where}.norm_topk_prob: expected a bool, got {normalize!r}")
    return H, I, E, K, normalize


def hf_expert_weights(block) -> dict:
    """{"router" [E, H], "gate" [E, I, H], "up" [E, I, H], "down" [E, H, I]} of a Qwen3-MoE block (copies)."""
    check_block(block)
    _dims(block)  # consistent shapes (ValueError naming the attribute)
    with torch.no_grad():
        if _is_v5(block):
            I = block.experts.gate_up_proj.shape[1] // 2
            gu = block.experts.gate_up_proj.detach()
            return {"router": block.gate.weight.detach().clone(), "gate": gu[:, :I].clone(),
                    "up": gu[:, I:].clone(), "down": block.experts.down_proj.detach().clone()}
        ex = block.experts
        return {"router": block.gate.weight.detach().clone(),
                "gate": torch.stack([m.gate_proj.weight.detach() for m in ex]),
                "up": torch.stack([m.up_proj.weight.detach() for m in ex]),
                "down": torch.stack([m.down_proj.weight.detach() for m in ex])}


def _local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if hasattr(p, "to_local") else p


def from_hf_qwen3_moe(block, *, dtype=None, backend: str = "auto", group=None, recompute: bool = False) -> MoE:
    """A `mok.MoE` with the weights of a transformers Qwen3-MoE (or OLMoE) sparse block.

    Args:
        block: `Qwen3MoeSparseMoeBlock` (transformers 5 fused-expert layout or 4.x per-expert layout).
            Other blocks raise ValueError naming what mok.MoE lacks (see `check_block`).
        dtype: parameter dtype (float32 or bfloat16); default the block's.
        backend, group, recompute: as `mok.MoE`; with a group (or a 1-D DeviceMesh) this rank takes its L experts.
    Returns:
        mok.MoE on the block's device, softmax scores, normalize = block's norm_topk_prob.
    """
    w = hf_expert_weights(block)
    H, I, E, K, normalize = _dims(block)
    dtype = dtype or w["router"].dtype
    m = MoE(H, I, E, K, score="softmax", normalize=normalize, backend=backend, group=group, recompute=recompute,
            dtype=dtype, device=w["router"].device)
    _, rank = world(m.group)
    L = m.local_experts
    with torch.no_grad():
        _local(m.w_router_EH).copy_(w["router"])
        _local(m.w_gate_up_L2IH).copy_(torch.cat([w["gate"], w["up"]], dim=1)[rank * L : (rank + 1) * L])
        _local(m.w_down_LHI).copy_(w["down"][rank * L : (rank + 1) * L])
    return m


def to_hf_qwen3_moe(moe: MoE, *, dtype=None):
    """A transformers `Qwen3MoeSparseMoeBlock` with the weights of `moe` (installed release's layout).

    Args:
        moe: mok.MoE with W = 1, no shared expert, softmax scores.
        dtype: the block's parameter dtype; default the module's.
    """
    if not isinstance(moe, MoE):
        raise TypeError(f"moe: expected a mok.MoE, got {type(moe).__name__}")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype: expected None or a floating torch.dtype, got {dtype!r}")
    if moe.shared_intermediate_size:
        raise ValueError(f"moe.shared_intermediate_size: expected 0 (Qwen3-MoE has no shared expert), "
                         f"got {moe.shared_intermediate_size}")
    if moe.score != "softmax":
        raise ValueError(f"moe.score: expected 'softmax' (Qwen3-MoE's router), got {moe.score!r}")
    if moe.world_size != 1:
        raise ValueError(f"moe.group: expected no expert parallelism (W = 1), got W = {moe.world_size}")
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    cfg = Qwen3MoeConfig(hidden_size=moe.hidden_size, moe_intermediate_size=moe.intermediate_size,
                         num_experts=moe.num_experts, num_experts_per_tok=moe.top_k, norm_topk_prob=moe.normalize,
                         hidden_act="silu")
    dtype = dtype or moe.w_router_EH.dtype
    block = Qwen3MoeSparseMoeBlock(cfg).to(device=moe.w_router_EH.device, dtype=dtype)
    with torch.no_grad():
        block.gate.weight.copy_(moe.w_router_EH)
        if _is_v5(block):
            block.experts.gate_up_proj.copy_(moe.w_gate_up_L2IH)  # the same [gate; up] layout
            block.experts.down_proj.copy_(moe.w_down_LHI)
        else:
            for e, m in enumerate(block.experts):
                m.gate_proj.weight.copy_(moe.w_gate_LIH[e])
                m.up_proj.weight.copy_(moe.w_up_LIH[e])
                m.down_proj.weight.copy_(moe.w_down_LHI[e])
    return block

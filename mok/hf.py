"""Conversion between `mok.MoE` and Hugging Face transformers' Qwen3-MoE sparse block.

Supported layouts (detected from the block, so either release works):
- transformers >= 5: `gate.weight` [E, H]; `experts.gate_up_proj` [E, 2I, H] (gate rows first, then
  up, as `chunk(2)` splits them); `experts.down_proj` [E, H, I]. Tested with transformers 5.24.0.
- transformers 4.x: `gate` an `nn.Linear(H, E)`; `experts[e].gate_proj/up_proj/down_proj.weight`.

Qwen3-MoE has softmax scores and no shared expert; `norm_topk_prob` maps to `normalize`.
Numerics differ by design: HF rounds router logits and top-k weights to bf16 and accumulates the
experts' outputs in bf16; mok follows SPEC §2 (fp32 weights, one rounding per output).
transformers is imported only by `to_hf_qwen3_moe`.
"""

from __future__ import annotations

import torch

from .nn import MoE
from .reference import world


def _is_v5(block) -> bool:
    return hasattr(block.experts, "gate_up_proj")


def _dims(block) -> tuple[int, int, int, int, bool]:
    """(H, I, E, K, normalize) of a Qwen3MoeSparseMoeBlock of either layout."""
    if _is_v5(block):
        E, two_I, H = block.experts.gate_up_proj.shape
        return H, two_I // 2, E, block.gate.top_k, bool(block.gate.norm_topk_prob)
    E, H = block.gate.weight.shape
    return H, block.experts[0].gate_proj.weight.shape[0], E, block.top_k, bool(block.norm_topk_prob)


def hf_expert_weights(block) -> dict:
    """{"router" [E, H], "gate" [E, I, H], "up" [E, I, H], "down" [E, H, I]} of a Qwen3-MoE block (copies)."""
    if not hasattr(block, "experts") or not hasattr(block, "gate"):
        raise TypeError(f"block: expected a Qwen3MoeSparseMoeBlock (with .gate and .experts), got {type(block).__name__}")
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


def from_hf_qwen3_moe(block, *, dtype=None, backend: str = "auto", group=None, recompute: bool = False) -> MoE:
    """A `mok.MoE` with the weights of a transformers Qwen3-MoE sparse block.

    Args:
        block: `Qwen3MoeSparseMoeBlock` (transformers 5 fused-expert layout or 4.x per-expert layout).
        dtype: parameter dtype (float32 or bfloat16); default the block's.
        backend, group, recompute: as `mok.MoE`; with a group this rank takes its L experts.
    Returns:
        mok.MoE on the block's device, softmax scores, normalize = block's norm_topk_prob.
    """
    w = hf_expert_weights(block)
    H, I, E, K, normalize = _dims(block)
    dtype = dtype or w["router"].dtype
    m = MoE(H, I, E, K, score="softmax", normalize=normalize, backend=backend, group=group, recompute=recompute,
            dtype=dtype, device=w["router"].device)
    W, rank = world(group)
    L = E // W
    with torch.no_grad():
        m.w_router_EH.copy_(w["router"])
        m.w_gate_LIH.copy_(w["gate"][rank * L : (rank + 1) * L])
        m.w_up_LIH.copy_(w["up"][rank * L : (rank + 1) * L])
        m.w_down_LHI.copy_(w["down"][rank * L : (rank + 1) * L])
    return m


def to_hf_qwen3_moe(moe: MoE, *, dtype=None):
    """A transformers `Qwen3MoeSparseMoeBlock` with the weights of `moe` (installed release's layout).

    Args:
        moe: mok.MoE with W = 1, no shared expert, softmax scores.
        dtype: the block's parameter dtype; default the module's.
    """
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
            block.experts.gate_up_proj.copy_(torch.cat([moe.w_gate_LIH, moe.w_up_LIH], dim=1))
            block.experts.down_proj.copy_(moe.w_down_LHI)
        else:
            for e, m in enumerate(block.experts):
                m.gate_proj.weight.copy_(moe.w_gate_LIH[e])
                m.up_proj.weight.copy_(moe.w_up_LIH[e])
                m.down_proj.weight.copy_(moe.w_down_LHI[e])
    return block

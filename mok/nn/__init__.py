"""PyTorch modules built on the mok layer."""

from .moe import MoE, RouterLosses, Routing

__all__ = ["MoE", "RouterLosses", "Routing"]

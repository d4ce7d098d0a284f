"""Bit-exact pure-PyTorch reference MoE layer (SPEC §2–3, docs/numerics.md)."""

from .autograd import MoEFunction, moe
from .exact import CONTRACT_VERSION
from .layer import backward, forward
from .router import route

__all__ = ["forward", "backward", "moe", "MoEFunction", "route", "CONTRACT_VERSION"]

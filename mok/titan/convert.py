"""Turning torchtitan's routed experts into mok's in a model config tree, before the model is built.

`to_mok(routed_experts_config)` checks one `RoutedExperts.Config` and returns the `MokRoutedExperts.Config` with the
same fields (`torchtitan.config.derive`); `convert(model_config)` does it for every MoE layer of a model config;
`MokConverter` is the same as a torchtitan model converter (`model_registry(flavor, converters=[...])`). What mok's
layer does not compute raises NotImplementedError naming it, at conversion, before anything is built.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchtitan.config import derive
from torchtitan.models.common.moe import GroupedExperts, RoutedExperts
from torchtitan.models.common.token_dispatcher import AllToAllTokenDispatcher, LocalTokenDispatcher
from torchtitan.protocols.model import ModelConfigConverter

from ..nn import backend as _backend
from .experts import MokRoutedExperts

# dispatchers whose semantics mok's dropless dispatch keeps (the others pad, drop by capacity or run their own
# communication kernels, which mok would silently replace)
_DISPATCHERS = (LocalTokenDispatcher.Config, AllToAllTokenDispatcher.Config)


def unsupported(config: RoutedExperts.Config) -> list[str]:
    """What mok's layer would not compute for this routed-experts config ([] when it fits)."""
    missing = []
    inner = config.inner_experts
    if type(inner) is not GroupedExperts.Config:
        missing.append(f"experts {type(inner).__qualname__} (mok computes torchtitan's GroupedExperts: bias-free "
                       f"SwiGLU w2(silu(w1 x) * w3 x) in bf16, e.g. not GPT-OSS's biased, clamped experts nor "
                       f"float8/MXFP8 grouped GEMMs)")
    if type(config.token_dispatcher) not in _DISPATCHERS:
        missing.append(f"the token dispatcher {type(config.token_dispatcher).__qualname__} (mok runs its own dropless "
                       f"dispatch; torchtitan's standard one, moe_comm_backend='standard', is replaced by it)")
    return missing


def to_mok(config: RoutedExperts.Config, *, backend: str = "auto", recompute: bool = False) -> MokRoutedExperts.Config:
    """The `MokRoutedExperts.Config` for one `RoutedExperts.Config` (its fields copied, nested configs shared).

    Args:
        config: a torchtitan RoutedExperts.Config (one MoE layer's routed experts).
        backend: "auto" (the CUDA fast path on an H100/H200, else the bit-exact reference), "reference" or "fast".
        recompute: save only the layer's inputs and run its forward again in backward.
    Raises:
        TypeError for anything but a RoutedExperts.Config or a non-bool recompute; ValueError for an unknown backend;
        NotImplementedError naming what mok does not compute.
    """
    if not isinstance(config, RoutedExperts.Config):
        raise TypeError(f"config: expected a torchtitan RoutedExperts.Config, got {type(config).__qualname__}")
    if backend not in _backend.CHOICES:
        raise ValueError(f"backend: expected one of {_backend.CHOICES}, got {backend!r}")
    if not isinstance(recompute, bool):
        raise TypeError(f"recompute: expected a bool, got {recompute!r}")
    if isinstance(config, MokRoutedExperts.Config):
        return derive(config, MokRoutedExperts.Config, backend=backend, recompute=recompute)
    missing = unsupported(config)
    if missing:
        raise NotImplementedError(f"mok routed experts: this layer has {'; and '.join(missing)}, which mok's layer "
                                  f"does not compute; leave it to torchtitan")
    return derive(config, MokRoutedExperts.Config, backend=backend, recompute=recompute)


def convert(model_config, *, backend: str = "auto", recompute: bool = False):
    """`model_config` with every routed-experts config replaced by mok's (in place; returned).

    Args:
        model_config: a torchtitan model config (e.g. `model_registry("debugmodel").model`), before `build()`.
        backend, recompute: as `to_mok`.
    Raises:
        ValueError when the model has no routed experts; what `to_mok` raises.
    """
    found = list(model_config.traverse(RoutedExperts.Config))
    if not found:
        raise ValueError(f"model_config: {type(model_config).__qualname__} has no routed experts (RoutedExperts.Config)"
                         f" to run in mok")
    for _fqn, config, parent, attr in found:
        new = to_mok(config, backend=backend, recompute=recompute)
        if parent is None:
            model_config = new
        elif isinstance(parent, list):
            parent[attr] = new
        else:
            setattr(parent, attr, new)
    return model_config


class MokConverter(ModelConfigConverter):
    """torchtitan model converter: `model_registry(flavor, converters=[MokConverter.Config()])` builds the model with
    mok's routed experts (`convert`). Config: backend, recompute (as `to_mok`)."""

    @dataclass(kw_only=True, slots=True)
    class Config(ModelConfigConverter.Config):
        backend: str = "auto"
        recompute: bool = False

    def __init__(self, config: Config):
        self.config = config

    def convert(self, model_config):
        return convert(model_config, backend=self.config.backend, recompute=self.config.recompute)

"""mok in torchtitan (>= 0.3.0): the routed experts of its MoE models (DeepSeek-V3, Qwen3-MoE, ...) run in mok's layer.

Three ways in, each keeping the model's parameters, their names, layouts, sharding and checkpoints:

- torchtitan's override mechanism: `--override.imports mok.titan.mok_experts` on the command line (or
  `config.override.imports.append("mok.titan.mok_experts")`); options as `mok.titan.mok_experts={"backend":
  "reference"}`.
- torchtitan's model converters: `model_registry("debugmodel", converters=[mok.titan.MokConverter.Config()])`.
- a model config you build yourself: `mok.titan.convert(model_config)` before `model_config.build()`.

torchtitan keeps the router (scores, expert bias, group-limited top-k, route_norm, route_scale), the load-balancing
bias update, the shared experts and everything else; mok computes Σ_k score_k · expert_k(x) per token
(`MokRoutedExperts`). Importing this module needs torchtitan (and what torchtitan imports). See docs/torchtitan.md.
"""

try:
    from torchtitan.config import override
    from torchtitan.models.common.moe import RoutedExperts
except ImportError as e:  # noqa: F841 - named in the message
    raise ImportError(f"mok.titan needs torchtitan >= 0.3.0 (pip install torchtitan): {e}") from e

from .convert import MokConverter, convert, to_mok, unsupported
from .experts import MokRoutedExperts

__all__ = ["MokRoutedExperts", "MokConverter", "convert", "to_mok", "unsupported", "mok_experts"]


@override(target=RoutedExperts.Config, description="mok: deterministic routed experts (mok.nn.ops.moe)")
def mok_experts(config: RoutedExperts.Config, backend: str = "auto", recompute: bool = False):
    """The override torchtitan applies for `override.imports = ["mok.titan.mok_experts"]`: `to_mok` on every
    routed-experts config of the trainer's config tree (backend, recompute: as `to_mok`)."""
    return to_mok(config, backend=backend, recompute=recompute)

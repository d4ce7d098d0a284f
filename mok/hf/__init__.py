"""mok and Hugging Face transformers.

- `mok.hf.experts`: mok as a transformers experts implementation. Importing `mok.hf` registers it as
  "mok" in `transformers.integrations.moe.ALL_EXPERTS_FUNCTIONS` (when transformers >= 5 is installed),
  so `model.set_experts_implementation("mok")` or `from_pretrained(..., experts_implementation="mok")`
  runs the routed experts of unmodified HF MoE models (Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE,
  DeepSeek-V3, ...) in mok's layer, keeping the model's parameters, checkpoint keys, router and aux loss.
  `register(name, backend=, recompute=)` adds other settings under other names.
- `mok.hf.qwen3_moe`: conversion of a Qwen3-MoE block to and from `mok.MoE` (`from_hf_qwen3_moe`,
  `to_hf_qwen3_moe`); other blocks raise, naming what mok.MoE lacks.

transformers is imported here only to register (the package imports without it); the conversions
import its model classes when called. See docs/hf.md.
"""

import importlib.util

from .experts import NAME, check, check_model, make_experts_forward, register, unsupported
from .qwen3_moe import check_block, from_hf_qwen3_moe, hf_expert_weights, to_hf_qwen3_moe

__all__ = ["NAME", "register", "make_experts_forward", "check", "check_model", "unsupported",
           "from_hf_qwen3_moe", "to_hf_qwen3_moe", "hf_expert_weights", "check_block"]


def _register_if_installed() -> None:
    if importlib.util.find_spec("transformers") is None:
        return
    try:
        register()
    except ImportError:  # transformers 4.x: no experts interface; the conversions still work
        pass


_register_if_installed()

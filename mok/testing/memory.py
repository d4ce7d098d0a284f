"""Measuring what autograd keeps alive between forward and backward (for recomputation)."""

from __future__ import annotations

import torch


def saved_activation_bytes(model: torch.nn.Module, *inputs) -> tuple[int, torch.Tensor]:
    """(bytes of distinct storages autograd saves for backward, parameters excluded; the output).

    Args:
        model: the module to run forward.
        inputs: its forward arguments.
    """
    params = {p.data_ptr() for p in model.parameters()}
    seen, total = set(), [0]

    def pack(t):
        key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        if t.data_ptr() not in params and key not in seen:
            seen.add(key)
            total[0] += key[1]
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = model(*inputs)
    return total[0], y

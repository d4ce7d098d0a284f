"""The dtypes a framework's router may hand to mok's layer (mok.hf, mok.titan): one rule for every integration.

Only what widens exactly is taken: activations float32 or bfloat16 (rounded to bf16 inside, as the layer does),
expert ids of an integer dtype that widens to int64 exactly (uint64 could wrap), routing weights of a floating
dtype that widens to float32 exactly (float64 would be rounded). Nothing is truncated, rounded or reinterpreted on
the way in; shapes stay each integration's own check (their layouts differ).
"""
from __future__ import annotations

import torch

ACTIVATION_DTYPES = (torch.float32, torch.bfloat16)
ID_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
WEIGHT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_routing_dtypes(x: tuple[str, object], ids: tuple[str, object], weights: tuple[str, object]) -> None:
    """Raise TypeError naming the argument unless each is a tensor of an accepted dtype.

    Args:
        x, ids, weights: (the caller's name for the argument, the argument): the activations, the expert ids and
            the routing weights (any shapes).
    """
    for name, t in (x, ids, weights):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    (x_name, x_t), (ids_name, ids_t), (w_name, w_t) = x, ids, weights
    if x_t.dtype not in ACTIVATION_DTYPES:
        raise TypeError(f"{x_name}: expected dtype torch.float32 or torch.bfloat16, got {x_t.dtype}")
    if ids_t.dtype not in ID_DTYPES:
        raise TypeError(f"{ids_name}: expected integer expert ids (dtype torch.int64 or another of {ID_DTYPES}), "
                        f"got {ids_t.dtype}")
    if w_t.dtype not in WEIGHT_DTYPES:
        raise TypeError(f"{w_name}: expected floating routing weights of dtype torch.float32, torch.bfloat16 or "
                        f"torch.float16 (exact in float32), got {w_t.dtype}")

"""In-place edits between a functional forward and its backward, caught as autograd catches them.

`forward` records the version counter (`Tensor._version`, which every in-place operation bumps) of each
input its backward reads; `backward` compares them and raises PyTorch's usual RuntimeError naming the
argument, instead of computing gradients from changed inputs.
"""

from __future__ import annotations

import torch


def record_versions(named: dict) -> tuple:
    """((name, tensor, version), ...) for each tensor of `named` {argument name: tensor or None}. Inference
    tensors have no version counter and are skipped (as autograd saves none of them)."""
    out = []
    for name, t in named.items():
        if isinstance(t, torch.Tensor) and not t.is_inference():
            out.append((name, t, t._version))
    return tuple(out)


def check_versions(recorded: tuple, forward: str, backward: str) -> None:
    """RuntimeError naming the first argument of `recorded` changed in place since it was recorded."""
    for name, t, version in recorded:
        if t._version != version:
            raise RuntimeError(
                f"{name}: modified by an inplace operation between {forward} and {backward}: "
                f"[{t.dtype} {list(t.shape)}] is at version {t._version}; expected version {version} instead. "
                f"backward needs the forward's inputs unchanged: run the forward again after changing them")

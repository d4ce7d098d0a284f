"""Argument checks shared by the reference and the fast path (docs/bad_input.md).

Every failure raises with the argument's name, the expected and the actual value.
Shape/dtype/device problems raise TypeError (wrong type or dtype) or ValueError.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Dims:
    """Sizes of one call, the shape legend of docs/layer.md (E = L * W)."""

    T: int
    H: int
    I: int
    S: int
    E: int
    K: int
    L: int
    W: int


def _tensor(name: str, t, dtype: torch.dtype, ndim: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}, got {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")


def _shape(name: str, t: torch.Tensor, expected: tuple) -> None:
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{name}: expected shape {tuple(expected)}, got {tuple(t.shape)}")


def _device(name: str, t: torch.Tensor, device: torch.device, of: str = "x") -> None:
    if t.device != device:
        raise ValueError(f"{name}: expected device {device} (the device of {of}), got {t.device}")


def check_layer_args(
    x, topk_idx, topk_weight, shared_gate, shared_up, shared_down,
    routed_gate, routed_up, routed_down, world_size: int = 1,
) -> Dims:
    """Check the layer's arguments (docs/layer.md, docs/bad_input.md) and return their sizes.

    Does not look at the values of `topk_idx` (see `check_expert_ids`), so it never syncs.
    """
    _tensor("x", x, torch.bfloat16, 2)
    if x.device.type == "meta":
        raise ValueError("x: expected a tensor with data (the layer reads the expert ids), got device meta; "
                         "for shapes only, call mok.nn.ops.moe on meta tensors")
    T, H = x.shape
    _tensor("topk_idx", topk_idx, torch.int64, 2)
    K = topk_idx.shape[1]
    _shape("topk_idx", topk_idx, (T, K))
    _tensor("topk_weight", topk_weight, torch.float32, 2)
    _shape("topk_weight", topk_weight, (T, K))
    _tensor("routed_gate", routed_gate, torch.bfloat16, 3)
    L, I, H_w = routed_gate.shape
    if H_w != H:
        raise ValueError(f"routed_gate: expected shape (L, I, {H}) with H = x.shape[1], got {tuple(routed_gate.shape)}")
    if L < 1 or I < 1:
        raise ValueError(f"routed_gate: expected L >= 1 and I >= 1, got shape {tuple(routed_gate.shape)}")
    _tensor("routed_up", routed_up, torch.bfloat16, 3)
    _shape("routed_up", routed_up, (L, I, H))
    _tensor("routed_down", routed_down, torch.bfloat16, 3)
    _shape("routed_down", routed_down, (L, H, I))
    shared = (shared_gate, shared_up, shared_down)
    if any(s is None for s in shared) and not all(s is None for s in shared):
        missing = [n for n, s in zip(("shared_gate", "shared_up", "shared_down"), shared) if s is None]
        raise ValueError(f"{missing[0]}: expected a tensor when any shared expert weight is given, got None")
    S = 0
    if shared_gate is not None:
        _tensor("shared_gate", shared_gate, torch.bfloat16, 2)
        S = shared_gate.shape[0]
        _shape("shared_gate", shared_gate, (S, H))
        _tensor("shared_up", shared_up, torch.bfloat16, 2)
        _shape("shared_up", shared_up, (S, H))
        _tensor("shared_down", shared_down, torch.bfloat16, 2)
        _shape("shared_down", shared_down, (H, S))
    if H < 1:
        raise ValueError(f"x: expected H >= 1, got shape {tuple(x.shape)}")
    E = L * world_size
    if K < 1 or K > E:
        raise ValueError(f"topk_idx: expected 1 <= K <= E = {E}, got K = {K}")
    named = [("topk_idx", topk_idx), ("topk_weight", topk_weight), ("routed_gate", routed_gate),
             ("routed_up", routed_up), ("routed_down", routed_down)]
    named += [(n, s) for n, s in zip(("shared_gate", "shared_up", "shared_down"), shared) if s is not None]
    for name, t in named:
        _device(name, t, x.device)
    return Dims(T=T, H=H, I=I, S=S, E=E, K=K, L=L, W=world_size)


def _int(name: str, v) -> None:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name}: expected an int, got {type(v).__name__} {v!r}")


def check_ep_split(num_experts: int, world_size: int, name: str = "num_experts") -> int:
    """E experts over W ranks: E an int >= 1, W an int >= 1 and E % W == 0. Returns L = E // W."""
    _int(name, num_experts)
    _int("world_size", world_size)
    if world_size < 1:
        raise ValueError(f"group: expected a world size >= 1, got {world_size}")
    if num_experts < 1:
        raise ValueError(f"{name}: expected E >= 1 experts, got E = {num_experts}")
    if num_experts % world_size:
        raise ValueError(
            f"{name}: expected E divisible by the expert-parallel world size W = {world_size}, got E = {num_experts}"
        )
    return num_experts // world_size


def check_devices(named) -> None:
    """Every tensor of the (name, tensor or None) pairs `named` on the device of the first: ValueError naming the
    first that differs (as the layer's checks word it)."""
    first, ref = named[0]
    for name, t in named[1:]:
        if t is not None:
            _device(name, t, ref.device, first)


def check_expert_ids(topk_idx: torch.Tensor, num_experts: int, name: str = "topk_idx", distinct: bool = True) -> None:
    """Ids: a [T, K] int64 tensor, values in [0, E) and (unless `distinct` is False: the router losses only count
    picks) distinct within each row. Reads values: syncs on CUDA."""
    _tensor(name, topk_idx, torch.int64, 2)
    _int("num_experts", num_experts)
    if num_experts < 1:
        raise ValueError(f"num_experts: expected E >= 1 experts, got E = {num_experts}")
    if topk_idx.numel() == 0:
        return
    lo, hi = int(topk_idx.min()), int(topk_idx.max())
    if lo < 0 or hi >= num_experts:
        bad = ((topk_idx < 0) | (topk_idx >= num_experts)).nonzero()[0].tolist()
        raise ValueError(
            f"{name}: expected expert ids in [0, {num_experts}), got {int(topk_idx[tuple(bad)])} at index {tuple(bad)}"
        )
    if not distinct:
        return
    srt = topk_idx.sort(dim=1).values
    dup = (srt[:, 1:] == srt[:, :-1]).any(dim=1)
    if bool(dup.any()):
        row = int(dup.nonzero()[0, 0])
        raise ValueError(
            f"{name}: expected distinct expert ids within each row, got {topk_idx[row].tolist()} in row {row}"
        )


PRECISIONS = ("bf16", "fp8")  # the layer's recipes (docs/numerics.md); the index is the pre-flight's code


def check_precision(precision) -> str:
    """`precision` if it names a recipe of PRECISIONS, else ValueError naming the argument."""
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ValueError(f"precision: expected one of {PRECISIONS}, got {precision!r}")
    return precision


def check_grad_out(dy, T: int, H: int, device: torch.device) -> None:
    """dy: [T, H] bf16 on the layer's device."""
    _tensor("dy", dy, torch.bfloat16, 2)
    _shape("dy", dy, (T, H))
    _device("dy", dy, device)

"""Bit-preserving collectives for the reference's expert parallelism.

Tensors travel as raw bytes (a uint8 view), so no backend converts or reduces them:
what arrives is bitwise what was sent. Only all_gather is used (gloo and nccl both have it).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def world(group) -> tuple[int, int]:
    """(W, rank) of `group`; (1, 0) for None."""
    if group is None:
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


def _gather_bytes(t: torch.Tensor, group) -> list[torch.Tensor]:
    W, _ = world(group)
    raw = t.contiguous().view(-1).view(torch.uint8)
    out = [torch.empty_like(raw) for _ in range(W)]
    dist.all_gather(out, raw, group=group)
    return [o.view(t.dtype).view(t.shape) for o in out]


def all_gather_cat(t: torch.Tensor, group) -> torch.Tensor:
    """Concatenate every rank's `t` (same shape on all ranks) along dim 0, in rank order."""
    if world(group)[0] == 1:
        return t
    return torch.cat(_gather_bytes(t, group), dim=0)


def all_gather_varlen(t: torch.Tensor, group) -> list[torch.Tensor]:
    """Every rank's `t` ([n_r, ...], same trailing shape, any n_r), as a list in rank order."""
    W, _ = world(group)
    if W == 1:
        return [t]
    n = torch.tensor([t.shape[0]], dtype=torch.int64, device=t.device)
    counts = [int(c) for c in _gather_bytes(n, group)]
    n_max = max(counts)
    if n_max == 0:
        return [t.new_empty((0, *t.shape[1:])) for _ in counts]
    pad = t.new_zeros((n_max, *t.shape[1:]))
    pad[: t.shape[0]] = t
    return [g[:c] for g, c in zip(_gather_bytes(pad, group), counts)]


def check_same_across_ranks(value: int, name: str, group) -> None:
    """Raise on every rank if `value` differs between ranks (e.g. T)."""
    if world(group)[0] == 1:
        return
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else "cpu"
    vals = [int(v) for v in _gather_bytes(torch.tensor([value], dtype=torch.int64, device=device), group)]
    if len(set(vals)) != 1:
        raise ValueError(f"{name}: expected the same value on every rank of the group, got {vals} by rank")

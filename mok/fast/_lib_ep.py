"""The binding to csrc/ep.cu, the expert-parallel kernels (docs/expert_parallel.md): row exchanges through tables of
peer pointers, region concatenation, and the device-side flags the ranks wait on. Same rules as `_lib` (checks at
the boundary, its `_call` on the tensors' device and current stream, never a host synchronisation).
"""
from __future__ import annotations

import torch

from . import _lib
from ._lib import _BF16, _I32, _I64, _check_tensor, _p


def _check_table(name: str, table: torch.Tensor, dev: torch.device) -> int:
    """A device table of peer pointers (int64 [W]); returns W."""
    _check_tensor(name, table, _I64, dev)
    if table.dim() != 1 or table.numel() < 1:
        raise ValueError(f"{name}: expected a 1-d table of W >= 1 pointers, got shape {tuple(table.shape)}")
    return table.numel()


def _check_rows(name: str, rows, peers, row_pair, offsets, L: int):
    """Checks of a row exchange: (device, capacity, H, W) of local rows [capacity, H] bf16."""
    dev = rows.device
    capacity, H = rows.shape
    W = _check_table("peers", peers, dev)
    _check_tensor(name, rows, _BF16, dev)
    _check_tensor("row_pair", row_pair, _I32, dev, numel=capacity)
    _check_tensor("offsets", offsets, _I32, dev, numel=L + 1)
    return dev, capacity, H, W


def ep_gather_rows(peers, per_rank: int, div: int, row_pair, offsets, L: int, out) -> None:
    """out[r] (bf16 [capacity, H]) = row i of rank p, item = row_pair[r] // div = p * per_rank + i, for the
    rows placed (offsets[L]); peers: int64 [W] device table of the ranks' bf16 [per_rank, H] regions."""
    dev, capacity, H, W = _check_rows("out", out, peers, row_pair, offsets, L)
    _lib._call("mok_ep_gather_rows", dev, _p(peers), W, per_rank, div, _p(row_pair), _p(offsets), L, H, capacity,
          _p(out))


def ep_scatter_rows(rows, row_pair, offsets, L: int, per_rank: int, peers) -> None:
    """Row (row_pair[r] % per_rank) of rank (row_pair[r] // per_rank) = rows[r] (bf16 [capacity, H]), for the
    rows placed; peers: int64 [W] device table of the ranks' bf16 [per_rank, H] regions."""
    dev, capacity, H, W = _check_rows("rows", rows, peers, row_pair, offsets, L)
    _lib._call("mok_ep_scatter_rows", dev, _p(rows), _p(row_pair), _p(offsets), L, H, capacity, W, per_rank, _p(peers))


def ep_concat(peers, out) -> None:
    """out (contiguous, W times the bytes of one rank's region) = every rank's region in rank order."""
    dev = out.device
    W = _check_table("peers", peers, dev)
    _check_tensor("out", out, out.dtype, dev)
    nbytes = out.numel() * out.element_size()
    if nbytes % (8 * W):
        raise ValueError(f"out: expected W = {W} regions of a multiple of 8 bytes, got {nbytes} bytes")
    _lib._call("mok_ep_concat", dev, _p(peers), W, nbytes // W, _p(out))


def ep_enable_peer_access(device: torch.device, peer: torch.device) -> None:
    """Let kernels on `device` access `peer`'s memory (the IPC mappings of other ranks' buffers)."""
    handle = _lib.lib()
    if handle.mok_ep_enable_peer_access(device.index, peer.index) != 0:
        raise RuntimeError(f"mok.fast ep_enable_peer_access failed: {handle.mok_last_error().decode()}")


def ep_next_epoch(epoch) -> None:
    _check_tensor("epoch", epoch, _I32, epoch.device, shape=(1,))
    _lib._call("mok_ep_next_epoch", epoch.device, _p(epoch))


def ep_signal(peer_flags, phase: int, rank: int, epoch) -> None:
    """Store *epoch into flags[phase][rank] of every rank (peer_flags: int64 [W] table of flag arrays)."""
    dev = epoch.device
    W = _check_table("peer_flags", peer_flags, dev)
    _check_tensor("epoch", epoch, _I32, dev, shape=(1,))
    _lib._call("mok_ep_signal", dev, _p(peer_flags), W, phase, rank, _p(epoch))


def ep_wait(flags, phase: int, rank: int, epoch, timeout_s: float) -> None:
    """Wait on the device until flags[phase][p] (int32 [phases, W]) reaches *epoch for every p; after
    timeout_s the kernel prints who it waited for and traps."""
    dev = epoch.device
    _check_tensor("flags", flags, _I32, dev)
    _check_tensor("epoch", epoch, _I32, dev, shape=(1,))
    W = flags.shape[-1]
    if flags.dim() != 2 or not 0 <= phase < flags.shape[0]:
        raise ValueError(f"flags: expected [phases, W] with phase {phase} in range, got shape {tuple(flags.shape)}")
    _lib._call("mok_ep_wait", dev, _p(flags), W, _p(epoch), int(timeout_s * 1e9), rank, phase)

"""Peer-visible buffers for the fast path's expert parallelism (docs/expert_parallel.md).

Each rank allocates one device buffer per (group, device, T, H, K, S) and shares it with the other
ranks of the group as a CUDA IPC handle (`torch.multiprocessing.reductions.reduce_tensor`, exchanged
once with `all_gather_object` over the group: gloo or nccl). Every rank then holds a mapping of every
other rank's buffer: on one GPU (W processes sharing it, the test bed) or on peers over NVLink. The
kernels take device tables of the W region pointers (csrc/ep.cu); no host is involved after setup.

Regions of one rank's buffer (bf16 unless said; T tokens of this rank):
  x [T, H], idx int64 [T, K]                  forward: published for the expert owners to pull
  o_slots [T*K, H]                            forward: expert outputs pushed by their owners, (t, k) order
  go [T*K, H]                                 backward: bf16(w * dy) per (t, k), pulled by the owners
  dx_slots [T*K, H]                           backward: d_x rows pushed by the owners
  x_b, dy [T, H], a_s [T, S], dg_s [T, 2S]    backward: shared-expert rows every rank pulls
  wg_s bytes [3 * (S/W) * H * 4]              backward: this rank's slice of the shared expert's weight
                                              gradients (when S is a multiple of 8*W), pulled by all
  flags int32 [5, W]                          phase p, source rank q: epoch of q's last signal
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..reference import world
from . import _lib

PHASES = 5  # forward: 0 inputs published, 1 rows pushed; backward: 2 rows published, 3 rows pushed, 4 shared slices
ALIGN = 256
TIMEOUT_ENV = "MOK_EP_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 120.0


def shared_slice(S: int, W: int) -> int:
    """Columns of the shared expert's intermediate dimension whose weight gradients each rank computes
    (S / W when that is a whole number of 16-byte bf16 rows, else 0: every rank computes all S)."""
    return S // W if S and S % (8 * W) == 0 else 0


def _regions(T: int, H: int, K: int, S: int, W: int) -> list[tuple[str, torch.dtype, tuple]]:
    b16 = torch.bfloat16
    return [("x", b16, (T, H)), ("idx", torch.int64, (T, K)), ("o_slots", b16, (T * K, H)), ("go", b16, (T * K, H)),
            ("dx_slots", b16, (T * K, H)), ("x_b", b16, (T, H)), ("dy", b16, (T, H)), ("a_s", b16, (T, S)),
            ("dg_s", b16, (T, 2 * S)), ("wg_s", torch.uint8, (3 * shared_slice(S, W) * H * 4,)),
            ("flags", torch.int32, (PHASES, W))]


def _layout(regions) -> tuple[dict, int]:
    """name -> (byte offset, dtype, shape), and the total bytes; every region 256-byte aligned."""
    out, off = {}, 0
    for name, dtype, shape in regions:
        out[name] = (off, dtype, shape)
        off += -(-math.prod(shape) * dtype.itemsize // ALIGN) * ALIGN
    return out, max(off, ALIGN)


def _view(raw: torch.Tensor, spec) -> torch.Tensor:
    off, dtype, shape = spec
    return raw[off: off + math.prod(shape) * dtype.itemsize].view(dtype).view(shape)


def timeout_s() -> float:
    """Seconds a device-side wait may take before it traps (MOK_EP_TIMEOUT_S, default 120)."""
    raw = os.environ.get(TIMEOUT_ENV, "")
    try:
        v = float(raw) if raw else DEFAULT_TIMEOUT_S
    except ValueError:
        raise ValueError(f"{TIMEOUT_ENV}: expected a number of seconds, got {raw!r}") from None
    if not v > 0:
        raise ValueError(f"{TIMEOUT_ENV}: expected a positive number of seconds, got {raw!r}")
    return v


@dataclass
class EPBuffer:
    """One rank's buffer, its mappings of the others' and the device pointer tables."""
    W: int
    rank: int
    local: dict                      # region name -> this rank's tensor view
    tables: dict                     # region name -> int64 [W] device table of every rank's region
    epoch_fwd: torch.Tensor          # int32 [1], advanced once per forward call
    epoch_bwd: torch.Tensor          # int32 [1], advanced once per backward call
    ident: torch.Tensor              # int32 [T*K] = arange: (t, k) slot of each pair
    timeout_s: float
    keep: list = field(default_factory=list)  # this rank's raw buffer and the mapped peer buffers


def _share(raw: torch.Tensor, group) -> list[torch.Tensor]:
    """Every rank's raw buffer, mapped into this process (this rank's own is `raw`)."""
    from torch.multiprocessing.reductions import reduce_tensor

    W, rank = world(group)
    handles = [None] * W
    dist.all_gather_object(handles, reduce_tensor(raw), group=group)
    return [raw if p == rank else fn(*args) for p, (fn, args) in enumerate(handles)]


def create(group, device: torch.device, T: int, H: int, K: int, S: int) -> EPBuffer:
    """Allocate, zero the flags, share with the group (a collective: every rank calls it together)."""
    W, rank = world(group)
    layout, nbytes = _layout(_regions(T, H, K, S, W))
    raw = torch.empty(nbytes, dtype=torch.uint8, device=device)
    local = {name: _view(raw, spec) for name, spec in layout.items()}
    local["flags"].zero_()
    torch.cuda.synchronize(device)  # flags are zero before any peer can signal into them
    peers = _share(raw, group)
    for p in {q.device for q in peers if q.device != device}:  # one GPU per rank: P2P to each peer device
        _lib.ep_enable_peer_access(device, p)
    tables = {name: torch.tensor([_view(p, spec).data_ptr() for p in peers], dtype=torch.int64, device=device)
              for name, spec in layout.items()}
    zero = torch.zeros(1, dtype=torch.int32, device=device)
    return EPBuffer(W, rank, local, tables, zero.clone(), zero.clone(),
                    torch.arange(T * K, dtype=torch.int32, device=device), timeout_s(), [raw, *peers])


_CACHE: dict = {}


def get(group, device: torch.device, T: int, H: int, K: int, S: int) -> EPBuffer:
    """The buffer for these sizes, created on first use. One buffer per (group, device): a call with
    other sizes replaces it (every rank does the same, as the pre-flight made them agree on the sizes);
    contexts saved for backward keep theirs alive."""
    key = (group.group_name, device.index)
    sizes = (T, H, K, S)
    hit = _CACHE.get(key)
    if hit is None or hit[0] != sizes:
        _CACHE[key] = (sizes, create(group, device, T, H, K, S))
    return _CACHE[key][1]


def release() -> None:
    """Drop every cached buffer (e.g. before destroying the process group)."""
    _CACHE.clear()

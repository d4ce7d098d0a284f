"""Deterministic, sharding-independent initialisation of `mok.MoE`'s weights.

Each weight is a slice of one *global* tensor (router [E, H], routed experts [E, I, H] / [E, H, I],
shared expert [S, H] / [H, S]); a rank holds a box of it (its L experts, an FSDP2 shard, a DTensor
shard) and computes only that box, so every world size and every sharding gives the same global values.

Two sources of values:
- a CPU generator (or None: torch's global one): the values of one `torch.randn(global shape)` per
  weight, in order, from that stream (what mok has always drawn). The stream is replayed in chunks
  of whole rows whose sizes are multiples of 16 (CPU `randn` fills 16 values at a time), so memory
  stays one chunk; time is that of drawing every global weight on every rank. Values go to the
  parameter's device.
- a generator on the parameters' device (CUDA, ...): one seed is taken from it per call, and each
  routed expert (and each dense weight) is drawn on that device from its own generator seeded from
  (seed, weight, expert): each rank draws only its experts. Not the CPU draw's values.
"""

from __future__ import annotations

import math

import torch

_CHUNK = 1 << 22  # elements per CPU chunk (16 MiB of fp32)
_MASK = (1 << 64) - 1


def _mix(*values: int) -> int:
    """A 63-bit seed from integers (splitmix64 steps)."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = (h ^ (v & _MASK)) * 0xBF58476D1CE4E5B9 & _MASK
        h = (h ^ (h >> 31)) * 0x94D049BB133111EB & _MASK
        h ^= h >> 29
    return h >> 1


def local_box(param: torch.Tensor, row_offset: int = 0) -> tuple[torch.Tensor, tuple[int, ...], tuple[int, ...]]:
    """(writable local tensor, its shape, its offset in the global tensor) of a plain tensor or a DTensor.

    row_offset: added to the dim-0 offset (a rank's first expert when the tensor holds L of E experts).
    """
    from torch.distributed.tensor import DTensor

    if isinstance(param, DTensor):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
        local = param.to_local()
        if tuple(local.shape) != tuple(shape):
            raise ValueError(f"param: a DTensor shard of shape {tuple(local.shape)} is not the box {tuple(shape)} "
                             f"its placements {param.placements} describe")
    else:
        local, shape, offset = param, tuple(param.shape), (0,) * param.dim()
    return local, tuple(shape), (offset[0] + row_offset, *offset[1:])


def _slices(shape, offset) -> tuple:
    return tuple(slice(o, o + n) for o, n in zip(offset, shape))


class Source:
    """Where the values come from (see the module docstring), for one `reset_parameters` call.

    generator: None, a CPU `torch.Generator`, or one on `device`. device: the parameters' device.
    per_expert: force the per-expert seeded draws (default: when the generator is not a CPU one).
    """

    def __init__(self, generator: torch.Generator | None, device: torch.device, per_expert: bool | None = None):
        self.device = device
        self.generator = generator
        on_device = generator is not None and generator.device.type != "cpu"
        if on_device and generator.device.type != device.type:
            raise ValueError(f"generator: expected a CPU generator or one on the parameters' device {device}, "
                             f"got one on {generator.device}")
        self.on_device = on_device if per_expert is None else per_expert
        if self.on_device:
            if generator is None:
                raise ValueError("generator: expected a torch.Generator for per-expert draws, got None")
            seed = torch.randint(0, 2**62, (1,), generator=generator, device=generator.device)
            self.seed = int(seed.item())

    def _cpu_rows(self, global_shape, rows: range, scale: float):
        """Rows `rows` of `randn(global_shape) * scale` replayed from the CPU stream (every row is drawn)."""
        n_rows = global_shape[0]
        row = math.prod(global_shape[1:])
        step = 16 // math.gcd(row, 16)  # rows per aligned block: a multiple of 16 values
        per = step * max(1, _CHUNK // max(1, step * row))
        bounds = list(range(0, n_rows, per)) + [n_rows]
        if len(bounds) > 2 and (bounds[-1] - bounds[-2]) * row < 16:
            del bounds[-2]  # a tail under 16 values is drawn with the chunk before it, as one call would
        out = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            chunk = torch.randn((b - a, *global_shape[1:]), generator=self.generator, dtype=torch.float32) * scale
            lo, hi = max(a, rows.start), min(b, rows.stop)
            if lo < hi:
                out.append(chunk[lo - a : hi - a])
        return torch.cat(out) if out else torch.empty((0, *global_shape[1:]))

    def fill(self, param: torch.Tensor, global_shape: tuple, fan_in: int, slot: int, *, experts: bool,
             row_offset: int = 0) -> None:
        """Write this rank's box of the global weight `randn(global_shape) / sqrt(fan_in)` into `param`.

        slot: the weight's index in the drawing order; experts: dim 0 is the expert dim (one draw per
        expert on the device path); row_offset: as `local_box`.
        """
        local, shape, offset = local_box(param, row_offset)
        scale = fan_in**-0.5
        rows = range(offset[0], offset[0] + shape[0])
        inner = (slice(None), *_slices(shape[1:], offset[1:]))
        if not self.on_device:
            vals = self._cpu_rows(global_shape, rows, scale)[inner]
        elif experts:
            g = torch.Generator(device=self.device)
            parts = []
            for e in rows:
                g.manual_seed(_mix(self.seed, slot, e))
                parts.append(torch.randn(global_shape[1:], generator=g, device=self.device) * scale)
            vals = (torch.stack(parts) if parts else torch.empty((0, *global_shape[1:]), device=self.device))[inner]
        else:
            g = torch.Generator(device=self.device).manual_seed(_mix(self.seed, slot))
            vals = (torch.randn(global_shape, generator=g, device=self.device) * scale)[_slices(shape, offset)]
        local.copy_(vals.to(local.dtype))

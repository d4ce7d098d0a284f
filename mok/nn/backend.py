"""Choosing the layer's backend: the CUDA fast path (`mok.fast`) or the bit-exact reference.

The choice never builds anything: `mok.fast.is_available` says whether the fast path can run, and
its kernels are compiled on the module's first forward (`ensure_ready`), with a message saying so.
"""

from __future__ import annotations

import logging

import torch

CHOICES = ("auto", "reference", "fast")
# Whether the fast path's expert parallelism has passed its GPU tests (tests/gpu/test_fast_ep.py) on the
# device machine (it has: docs/expert_parallel.md, "Status"). False makes "auto" keep the reference for
# W > 1, `mok verify --device cuda` skip its checks and `mok diff-grads --device cuda` default to the
# reference; backend="fast" and mok.fast.forward(group=...) always use it as asked.
FAST_EP_PROVEN = True
log = logging.getLogger("mok")
_announced: set = set()
_picked: dict = {}


def fast_status(device: torch.device, *, world_size: int = 1, sizes: tuple = ()) -> tuple[bool, str]:
    """(usable, reason): whether `mok.fast` can run a layer on `device`, without building it.

    world_size: the layer's W (W > 1: the fast path's expert parallelism). sizes: (H, I, S) to check
    against its alignment rule (multiples of 8; S = 0 allowed).
    """
    if device.type != "cuda":
        return False, f"the layer is on {device}, the fast path needs a CUDA device"
    from ..fast import is_available
    from ..fast._checks import sizes_problem

    problem = sizes_problem(*sizes) if sizes else None
    if problem:
        return False, problem

    return is_available(device)


def resolve(requested: str, device: torch.device, **layer) -> tuple[str, str]:
    """The backend to use for a layer on `device`: ("reference" | "fast", reason).

    "auto" picks "fast" when usable, "reference" otherwise; "fast" raises when it cannot run
    on `device` unless that is the CPU or meta (a module built there and moved to the GPU later).
    layer: world_size and sizes for `fast_status`.
    """
    if requested not in CHOICES:
        raise ValueError(f"backend: expected one of {CHOICES}, got {requested!r}")
    if requested == "reference":
        return "reference", "requested"
    ok, why = fast_status(device, **layer)
    if requested == "fast":
        if not ok and device.type not in ("cpu", "meta"):
            raise ValueError(f"backend: 'fast' cannot run here: {why}")
        return "fast", "requested" if ok else f"requested (not runnable yet: {why})"
    W = layer.get("world_size", 1)
    if ok and W > 1 and not FAST_EP_PROVEN:
        return "reference", (f"the fast path's expert parallelism (W = {W}) is not yet proven on GPUs, so 'auto' "
                             f"does not pick it; backend='fast' uses it")
    return ("fast", why) if ok else ("reference", why)


def ensure_ready(requested: str) -> tuple[bool, str]:
    """Load (building on first use) the fast path's binding and kernels. (True, "") when ready; for "auto" a failed
    build gives (False, why) so the caller falls back to the reference; for "fast" it raises."""
    from ..fast import _build

    try:
        _build.load()
    except Exception as e:  # no nvcc / CUTLASS / compiler error: reported, and raised unless "auto"
        if requested != "auto":
            raise
        return False, f"building mok.fast failed ({type(e).__name__}: {e})"
    return True, ""


def announce(requested: str, picked: str, reason: str, device: torch.device) -> None:
    """Log the choice once per process; a warning when "auto" falls back on a CUDA device."""
    key = (requested, picked, reason)
    if key in _announced:
        return
    _announced.add(key)
    level = logging.WARNING if (requested == "auto" and picked == "reference" and device.type == "cuda") else logging.INFO
    log.log(level, "mok.MoE backend=%r uses %r: %s", requested, picked, reason)


def pick(requested: str, device: torch.device, *, world_size: int = 1, sizes: tuple = ()) -> str:
    """The backend ("reference" | "fast") for a layer on `device` with W = `world_size` and sizes (H, I, S):
    `resolve`d, the fast path built when chosen (`ensure_ready`: "auto" falls back to the reference if the build
    fails), logged once (`announce`); chosen once per (requested, device, world_size, sizes) and remembered. For
    integrations that hold no `mok.MoE` (mok.hf, mok.titan)."""
    key = (requested, device, world_size, tuple(sizes))
    if key not in _picked:
        name, why = resolve(requested, device, world_size=world_size, sizes=sizes)
        if name == "fast":
            ok, fail = ensure_ready(requested)
            if not ok:
                name, why = "reference", fail
        announce(requested, name, why, device)
        _picked[key] = name
    return _picked[key]

"""Choosing the layer's backend: the CUDA fast path (`mok.fast`) or the bit-exact reference."""

from __future__ import annotations

import importlib
import logging

import torch

CHOICES = ("auto", "reference", "fast")
log = logging.getLogger("mok")
_announced: set = set()


def fast_status(device: torch.device, *, world_size: int = 1, sizes: tuple = ()) -> tuple[bool, str]:
    """(usable, reason): whether `mok.fast` can run a layer on `device`.

    Loads (building on first use) the fast path's library, so "built" means it really loads.
    world_size: the layer's W (the fast path is single-GPU for now). sizes: (H, I, S) to check
    against its alignment rule (multiples of 8; S = 0 allowed).
    """
    if device.type != "cuda":
        return False, f"the layer is on {device}, the fast path needs a CUDA device"
    cap = torch.cuda.get_device_capability(device)
    if cap != (9, 0):
        return False, f"the fast path needs an sm_90 GPU, {device} is sm_{cap[0]}{cap[1]}"
    if world_size != 1:
        return False, f"the fast path has no expert parallelism yet (W = {world_size})"
    if any(v % 8 for v in sizes):
        return False, f"the fast path needs H, I, S multiples of 8, got {tuple(sizes)}"
    try:
        fast = importlib.import_module("mok.fast")
        if not (hasattr(fast, "forward") and hasattr(fast, "backward")):
            return False, "mok.fast has no forward/backward yet"
        is_available = getattr(fast, "is_available", None)
        if callable(is_available):
            if not is_available():
                return False, "mok.fast.is_available() is False"
        else:
            importlib.import_module("mok.fast._build").library()  # builds or loads; raises if it cannot
    except Exception as e:  # not built / cannot build / being written
        return False, f"mok.fast is not usable ({type(e).__name__}: {e})"
    return True, "sm_90 GPU and mok.fast is built"


def resolve(requested: str, device: torch.device, **layer) -> tuple[str, str]:
    """The backend to use for a layer on `device`: ("reference" | "fast", reason).

    "auto" picks "fast" when usable, "reference" otherwise; "fast" raises when it cannot run
    on `device` unless that is the CPU (a module built on the CPU and moved to the GPU later).
    layer: world_size and sizes for `fast_status`.
    """
    if requested not in CHOICES:
        raise ValueError(f"backend: expected one of {CHOICES}, got {requested!r}")
    if requested == "reference":
        return "reference", "requested"
    ok, why = fast_status(device, **layer)
    if requested == "fast":
        if not ok and device.type != "cpu":
            raise ValueError(f"backend: 'fast' cannot run here: {why}")
        return "fast", "requested" if ok else f"requested (not runnable yet: {why})"
    return ("fast", why) if ok else ("reference", why)


def announce(requested: str, picked: str, reason: str, device: torch.device) -> None:
    """Log the choice once per process; a warning when "auto" falls back on a CUDA device."""
    key = (requested, picked, reason)
    if key in _announced:
        return
    _announced.add(key)
    level = logging.WARNING if (requested == "auto" and picked == "reference" and device.type == "cuda") else logging.INFO
    log.log(level, "mok.MoE backend=%r uses %r: %s", requested, picked, reason)

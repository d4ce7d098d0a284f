"""Cheap host-side validation of the fast path's inputs (shapes, dtypes, devices, contiguity).

Expert ids are checked on the device (see docs/fast_path.md), never here, so nothing syncs.
"""
from __future__ import annotations

import torch


def _fail(name: str, expected: str, actual) -> None:
    raise ValueError(f"mok.fast: argument '{name}': expected {expected}, got {actual}")


def check_tensor(name: str, t, shape: tuple, dtype: torch.dtype, device: torch.device) -> None:
    """Raise ValueError naming `name` unless t is a contiguous tensor of this shape/dtype/device."""
    if not isinstance(t, torch.Tensor):
        _fail(name, "a torch.Tensor", type(t).__name__)
    if t.dtype != dtype:
        _fail(name, f"dtype {dtype}", t.dtype)
    if tuple(t.shape) != tuple(shape):
        _fail(name, f"shape {tuple(shape)}", tuple(t.shape))
    if t.device != device:
        _fail(name, f"device {device}", t.device)
    if not t.is_contiguous():
        _fail(name, "a contiguous tensor", f"strides {t.stride()}")


def check_group(group) -> int:
    """World size of `group` (1 for None); raises NotImplementedError for more than one rank."""
    if group is None:
        return 1
    import torch.distributed as dist

    size = dist.get_world_size(group)
    if size != 1:
        raise NotImplementedError(
            f"mok.fast: argument 'group': expert parallelism over {size} ranks is not implemented yet "
            "(only a group of size 1 or None); see docs/fast_path.md for the plan")
    return 1


def check_inputs(x, topk_idx, topk_weight, shared_gate, shared_up, shared_down, routed_gate, routed_up,
                 routed_down) -> tuple[int, int, int, int, int, int]:
    """Validate the layer's inputs (SPEC §2); returns (T, H, I, S, E, K)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        _fail("x", "a 2-D tensor [T, H]", getattr(x, "shape", type(x).__name__))
    dev = x.device
    if dev.type != "cuda":
        _fail("x", "a CUDA tensor", dev)
    cap = torch.cuda.get_device_capability(dev)
    if cap != (9, 0):
        raise RuntimeError(f"mok.fast: needs a compute capability 9.0 GPU (sm_90a); {dev} is {cap[0]}.{cap[1]}")
    T, H = x.shape
    if T < 1:
        _fail("x", "at least one token (T >= 1)", f"T={T}")
    if not isinstance(routed_gate, torch.Tensor) or routed_gate.dim() != 3:
        _fail("routed_gate", "a 3-D tensor [L, I, H]", getattr(routed_gate, "shape", type(routed_gate).__name__))
    E, I, _ = routed_gate.shape
    if not isinstance(topk_idx, torch.Tensor) or topk_idx.dim() != 2:
        _fail("topk_idx", "a 2-D tensor [T, K]", getattr(topk_idx, "shape", type(topk_idx).__name__))
    K = topk_idx.shape[1]
    check_tensor("x", x, (T, H), torch.bfloat16, dev)
    check_tensor("topk_idx", topk_idx, (T, K), torch.int64, dev)
    check_tensor("topk_weight", topk_weight, (T, K), torch.float32, dev)
    check_tensor("routed_gate", routed_gate, (E, I, H), torch.bfloat16, dev)
    check_tensor("routed_up", routed_up, (E, I, H), torch.bfloat16, dev)
    check_tensor("routed_down", routed_down, (E, H, I), torch.bfloat16, dev)
    if not 1 <= K <= E:
        _fail("topk_idx", f"K in [1, E={E}] columns", K)
    shared = [shared_gate, shared_up, shared_down]
    if any(s is None for s in shared) and not all(s is None for s in shared):
        _fail("shared_gate/shared_up/shared_down", "all three tensors or all None",
              [None if s is None else tuple(s.shape) for s in shared])
    S = 0
    if shared_gate is not None:
        if not isinstance(shared_gate, torch.Tensor) or shared_gate.dim() != 2:
            _fail("shared_gate", "a 2-D tensor [S, H]", getattr(shared_gate, "shape", type(shared_gate).__name__))
        S = shared_gate.shape[0]
        check_tensor("shared_gate", shared_gate, (S, H), torch.bfloat16, dev)
        check_tensor("shared_up", shared_up, (S, H), torch.bfloat16, dev)
        check_tensor("shared_down", shared_down, (H, S), torch.bfloat16, dev)
        if S % 8 or S == 0:
            _fail("shared_gate", "S a positive multiple of 8 (16-byte rows for TMA)", f"S={S}")
    if H % 8:
        _fail("x", "H a multiple of 8 (16-byte rows for TMA)", f"H={H}")
    if I % 8:
        _fail("routed_gate", "I a multiple of 8 (16-byte rows for TMA)", f"I={I}")
    if T * K >= 2**31 or T * K * max(H, 2 * I) >= 2**62:
        _fail("x", "T*K < 2^31 rows", f"T*K={T * K}")
    return T, H, I, S, E, K


def check_dy(dy, T: int, H: int, device: torch.device) -> None:
    """dy must be bf16 [T, H], contiguous, on the forward's device."""
    check_tensor("dy", dy, (T, H), torch.bfloat16, device)

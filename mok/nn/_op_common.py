"""What the custom ops of `mok.nn.ops` (the layer) and `mok.nn.router_ops` (the router and its losses) share:
the backends, the once-per-step bf16 rounding of float32 inputs, and the eager path.

Eager path: a plain eager call (every tensor argument a plain tensor or parameter with data, nothing being
compiled) runs an op's Python body through a `torch.autograd.Function` built by `eager_function` from the op's
own setup and backward functions, instead of the registered custom op. The registered ops are what torch.compile,
export, meta tensors and tensor subclasses see; the same functions run either way, so the bits are the same.
Why two paths, not one: the registered op's torch.library autograd wrapper (pytree, defaults, a second dispatch)
costs host time the layer's own Python does not: a layer forward+backward whose backend computes nothing took
208-224 us through the Function and 550-604 us through the registered ops (CPU, torch 2.13).
"""

from __future__ import annotations

import importlib
from typing import Optional

import torch
from torch import Tensor

from .. import reference

BACKENDS = ("reference", "fast")
_WEIGHT_DTYPES = (torch.float32, torch.bfloat16)


# ---------------------------------------------------------------- helpers


def _group(group_name: Optional[str]):
    if group_name is None:
        return None
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(group_name)


def group_name(group) -> Optional[str]:
    """The name the ops take for a process group (None for no expert parallelism). `reference.world`'s check:
    TypeError naming `group` for anything else than a ProcessGroup or None (a group's name, a world size, a
    DeviceMesh), ValueError for a group this process cannot use."""
    reference.world(group)
    return None if group is None else group.group_name


def check_tensors(named, optional=()) -> None:
    """Each (name, value) of `named` a torch.Tensor (None allowed for the names in `optional`): TypeError naming the
    first that is not."""
    for name, t in named:
        if not isinstance(t, Tensor) and not (t is None and name in optional):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")


def _impl(backend: str):
    if backend == "reference":
        return reference
    if backend == "fast":
        return importlib.import_module("mok.fast")
    raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")




def _cast_plan(named: list, pairs=()) -> list[tuple[int, ...]]:
    """Which of the (name, tensor) pairs are rounded to bf16, as groups of positions: each float32
    (gate, up) pair of `pairs` as one [gate; up] tensor (the fast path's d_x GEMM reads it without a
    concatenation), every other float32 tensor alone. Depends on dtypes and shapes only, so the fake
    implementations agree. TypeError for a dtype other than float32 / bfloat16."""
    for name, t in named:
        if t is not None and t.dtype not in _WEIGHT_DTYPES:
            raise TypeError(f"{name}: expected dtype torch.float32 or torch.bfloat16, got {t.dtype}")
    ts = [t for _, t in named]
    f32 = [t is not None and t.dtype == torch.float32 for t in ts]
    paired = [p for p in pairs if f32[p[0]] and f32[p[1]] and ts[p[0]].shape == ts[p[1]].shape]
    singles = [(i,) for i in range(len(ts)) if f32[i] and not any(i in p for p in paired)]
    return sorted(paired + singles)


def _cast_shape(tensors: list, group: tuple) -> tuple:
    """Shape of a group's bf16 rounding: a pair [..., n, H] gives [..., 2n, H]."""
    t = tensors[group[0]]
    return tuple(t.shape) if len(group) == 1 else (*t.shape[:-2], 2 * t.shape[-2], t.shape[-1])


def _parts(cast: Tensor, n: int) -> list[Tensor]:
    """The bf16 versions inside one cast: itself, or the gate and up halves (views) of a pair's."""
    return [cast] if n == 1 else list(cast.chunk(2, dim=-2))


def _casts(tensors: list, plan, cast_pair=None) -> list[Tensor]:
    """The bf16 roundings of `plan`'s groups (a pair's written into one tensor, gate rows first).
    cast_pair(first, second, out): the backend's kernel for a contiguous CUDA pair (PyTorch's copy into
    the strided halves runs without vector stores: 0.98 against 0.59 ms on Qwen3-30B-A3B), the same bits."""
    out = []
    for group in plan:
        cast = torch.empty(_cast_shape(tensors, group), dtype=torch.bfloat16, device=tensors[group[0]].device)
        parts = [tensors[i] for i in group]
        if len(group) == 2 and cast_pair is not None and cast.is_cuda and all(t.is_contiguous() for t in parts):
            cast_pair(*parts, cast)
        else:
            for t, part in zip(parts, _parts(cast, len(group))):
                part.copy_(t)
        out.append(cast)
    return out


def _with_casts(tensors: list, plan, casts) -> list:
    """`tensors` with each rounded one replaced by its bf16 version (a pair by the halves of its cast)."""
    out = list(tensors)
    for group, cast in zip(plan, casts):
        for i, part in zip(group, _parts(cast, len(group))):
            out[i] = part
    return out


def _fake_casts(tensors: list, plan) -> list[Tensor]:
    return [tensors[g[0]].new_empty(_cast_shape(tensors, g), dtype=torch.bfloat16) for g in plan]


def _empty(dtype, device, *shape):
    return torch.empty(shape, dtype=dtype, device=device)


def eager_function(name: str, forward, setup_context, backward, backward_body) -> type:
    """A `torch.autograd.Function` running an op's Python body `forward`, then the op's own `setup_context`, with the
    op's `backward` calling the backward op's body `backward_body`: what eager calls run instead of the custom op,
    whose torch.library autograd wrapper (pytree, defaults, a second dispatch) costs about 2.5 times the host time
    (module docstring). The same functions, so the same bits. Under create_graph=True the backward calls the registered backward op instead, whose outputs then refuse a
    second differentiation as before. (forward takes ctx itself: a separate setup_context would make every apply
    bind its arguments with inspect.)"""
    def run(ctx, *inputs):
        out = tuple(forward(*inputs))
        setup_context(ctx, inputs, out)
        return out

    def grad(ctx, *grads):
        return backward(ctx, *grads, bwd=None if torch.is_grad_enabled() else backward_body)

    return type(name, (torch.autograd.Function,), {"forward": staticmethod(run), "backward": staticmethod(grad)})


_PLAIN = (Tensor, torch.nn.Parameter)
_EAGER = True  # False: every call takes the registered ops (the tests compare the two paths)


def apply(op, function: type, *args):
    """`op(*args)` (the registered custom op: what torch.compile, export, fake, meta and other tensor subclasses
    see) or, in plain eager calls (every tensor argument a plain tensor or parameter with data),
    `function.apply(*args)`."""
    plain = all(type(a) in _PLAIN and not a.is_meta for a in args if isinstance(a, Tensor))
    if not _EAGER or not plain or torch.compiler.is_compiling():
        return op(*args)
    return function.apply(*args)

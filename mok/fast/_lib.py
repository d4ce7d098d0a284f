"""The binding to the kernels' C ABI (csrc/mok_fast.h), taking torch tensors: the table, the checks, the call,
the grouped GEMMs, and the layer's, router's and losses' kernels (the expert-parallel ones: `_lib_ep`).

One table, `SIGNATURES`, holds every C function's ctypes types; tests/fast/test_binding.py parses
the header and checks the table, the structs and the enum against it. Every wrapper checks its
tensors at the boundary (dtype, device, shape, contiguity), launches on the current stream of the
tensors' device with that device set (the guard), and never synchronises the host.
Pointer arithmetic is the kernels' business: Python passes base pointers and element offsets.
"""
from __future__ import annotations

import ctypes
import functools
import math
from dataclasses import dataclass

import torch

from ._build import library

(GEMM_TN_F32, GEMM_TN_BF16, GEMM_NN_F32, GEMM_NN_BF16, GEMM_TT_F32, GEMM_TT_BF16, GEMM_NN_SWIGLU_BWD,
 GEMM_TN_SWIGLU_FWD, GEMM_TT_F32_SMALL) = range(9)
GEMM_KINDS = {"MOK_GEMM_TN_F32": GEMM_TN_F32, "MOK_GEMM_TN_BF16": GEMM_TN_BF16, "MOK_GEMM_NN_F32": GEMM_NN_F32,
              "MOK_GEMM_NN_BF16": GEMM_NN_BF16, "MOK_GEMM_TT_F32": GEMM_TT_F32, "MOK_GEMM_TT_BF16": GEMM_TT_BF16,
              "MOK_GEMM_NN_SWIGLU_BWD": GEMM_NN_SWIGLU_BWD, "MOK_GEMM_TN_SWIGLU_FWD": GEMM_TN_SWIGLU_FWD,
              "MOK_GEMM_TT_F32_SMALL": GEMM_TT_F32_SMALL}
# Kinds whose segments carry operand aux, with the dtypes of (d, aux): the SwiGLU backward reads fp32 [p | q] (the
# forward's u * silu'(g) | silu(g)) and writes bf16 [dg | du]; the SwiGLU forward writes fp32 [p | q] (d) and bf16 a
# (aux).
FUSED_KINDS = {GEMM_NN_SWIGLU_BWD: (torch.bfloat16, torch.float32),
               GEMM_TN_SWIGLU_FWD: (torch.float32, torch.bfloat16)}
MAX_SEGMENTS = 4
ROUTER_MAX_E = 8192
NUM_GEMM_VARIANTS = 6  # tile variants of every kind (csrc/grouped_gemm.cuh; chosen in _tiles.py)

_i32, _i64, _sz, _vp = ctypes.c_int, ctypes.c_int64, ctypes.c_size_t, ctypes.c_void_p


class MokOperand(ctypes.Structure):
    _fields_ = [("base", _vp), ("offset", _i64), ("expert_stride", _i64), ("row_stride", _i64), ("ld", _i64)]


class MokSegment(ctypes.Structure):
    _fields_ = [("num_groups", _i32), ("rows_dim", _i32), ("fixed_rows", _i32), ("m", _i32), ("n", _i32),
                ("k", _i32), ("offsets", _vp), ("a", MokOperand), ("b", MokOperand), ("d", MokOperand),
                ("aux", MokOperand), ("b_up", MokOperand)]


# name: (restype, argtypes); pointers and cudaStream_t are c_void_p.
SIGNATURES = {
    "mok_last_error": (ctypes.c_char_p, []),
    "mok_gemm_workspace_bytes": (_sz, [_i32, _i32, _i32, _i32]),
    "mok_grouped_gemm": (_i32, [_i32, _i32, ctypes.POINTER(MokSegment), _i32, _vp, _sz, _i32, _vp]),
    "mok_schedule_scratch_ints": (_sz, [_i32, _i32, _i32]),
    "mok_schedule": (_i32, [_vp, _i32, _i32, _i32, _i32, _i32, _i32, _vp, _vp, _vp, _vp, _vp, _vp]),
    "mok_gather_rows": (_i32, [_vp, _vp, _i32, _i32, _i32, _i32, _vp, _vp]),
    "mok_swiglu_fwd": (_i32, [_vp, _i64, _vp, _i32, _i32, _i32, _i32, _vp, _vp]),
    "mok_combine_fwd": (_i32, [_vp, _vp, _vp, _vp, _vp, _i32, _i32, _i32, _vp, _vp]),
    "mok_combine_bwd_pre": (_i32, [_vp, _vp, _vp, _vp, _vp, _i32, _i32, _i32, _vp, _vp, _vp]),
    "mok_swiglu_bwd": (_i32, [_vp, _vp, _i64, _vp, _i32, _i32, _i32, _i32, _vp, _vp]),
    "mok_combine_bwd_dx": (_i32, [_vp, _vp, _vp, _vp, _i32, _i32, _i32, _vp, _vp]),
    "mok_zero_empty": (_i32, [_vp, _vp, _i32, _i64, _vp, _vp]),
    "mok_poison": (_i32, [_vp, _i64, _i32, _vp, _vp]),
    "mok_cast_pair_bf16": (_i32, [_vp, _vp, _i64, _i64, _vp, _vp]),
    "mok_router_topk": (_i32, [_vp, _i32, _i32, _i32, _i32, _i32, _i32, _vp, _vp, _vp, _vp]),
    "mok_router_bwd": (_i32, [_vp, _vp, _vp, _vp, _vp, _i32, _i32, _i32, _i32, _i32, _i32, _vp, _vp]),
    "mok_router_losses_scratch_bytes": (_sz, [_i32, _i32]),
    "mok_router_losses": (_i32, [_vp, _vp, _vp, _i32, _i32, _i32, _i32, _vp, _vp, _vp, _vp]),
    "mok_router_losses_bwd": (_i32, [_vp, _vp, _vp, _vp, _vp, _i32, _i32, _i32, _i32, _vp, _vp, _vp, _vp]),
    "mok_ep_gather_rows": (_i32, [_vp, _i32, _i64, _i32, _vp, _vp, _i32, _i32, _i32, _vp, _vp]),
    "mok_ep_scatter_rows": (_i32, [_vp, _vp, _vp, _i32, _i32, _i32, _i32, _i64, _vp, _vp]),
    "mok_ep_concat": (_i32, [_vp, _i32, _i64, _vp, _vp]),
    "mok_ep_enable_peer_access": (_i32, [_i32, _i32]),
    "mok_ep_next_epoch": (_i32, [_vp, _vp]),
    "mok_ep_signal": (_i32, [_vp, _i32, _i32, _i32, _vp, _vp]),
    "mok_ep_wait": (_i32, [_vp, _i32, _vp, _i64, _i32, _i32, _vp]),
}


@functools.lru_cache(maxsize=None)
def lib() -> ctypes.CDLL:
    """The loaded library (built on first use) with every function of `SIGNATURES` typed."""
    handle = library()
    for name, (res, args) in SIGNATURES.items():
        fn = getattr(handle, name)
        fn.restype, fn.argtypes = res, args
    return handle


# ---------------------------------------------------------------- boundary checks


def _check_tensor(name: str, t: torch.Tensor, dtype: torch.dtype, device: torch.device, numel: int | None = None,
                  shape: tuple | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name}: expected device {device}, got {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor, got strides {t.stride()}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(t.shape)}")
    if numel is not None and t.numel() < numel:
        raise ValueError(f"{name}: expected at least {numel} elements, got {t.numel()}")


def _p(t: torch.Tensor | None) -> ctypes.c_void_p:
    return ctypes.c_void_p(None if t is None else t.data_ptr())


# The current stream of a CUDA device as its cudaStream_t value: `torch.cuda.current_stream(index).cuda_stream`
# without building a Stream object (the C calls run tens of times a layer step).
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda index: torch.cuda.current_stream(index).cuda_stream)


def _call(name: str, device: torch.device, *args) -> None:
    """Call C function `name` with `device` current and its current stream appended; raise its message."""
    handle = lib()
    current = torch.cuda.current_device()
    index = current if device.index is None else device.index
    stream = ctypes.c_void_p(_raw_stream(index))
    if index == current:
        rc = getattr(handle, name)(*args, stream)
    else:  # the guard: launch on the tensors' device, not the current one
        with torch.cuda.device(index):
            rc = getattr(handle, name)(*args, stream)
    if rc != 0:
        raise RuntimeError(f"mok.fast {name} failed: {handle.mok_last_error().decode()}")


# ---------------------------------------------------------------- grouped GEMMs


@dataclass
class Operand:
    """Matrix operand of a grouped GEMM: group e starts at element
    ``offset + e * expert_stride + row_offset(e) * row_stride`` of `tensor`; leading dimension `ld`."""
    tensor: torch.Tensor
    expert_stride: int
    row_stride: int
    ld: int
    offset: int = 0

    def c(self) -> MokOperand:
        return MokOperand(self.tensor.data_ptr(), self.offset, self.expert_stride, self.row_stride, self.ld)


@dataclass
class Segment:
    """`num_groups` GEMMs sharing one formula. rows(e) come from `offsets` (int32 [>= num_groups + 1])
    or are `fixed_rows`, and are the M (rows_dim=0) or the K (rows_dim=2) of each GEMM; the other two
    sizes are the constants m, n, k. `aux`: the extra operand of a fused epilogue, with D's row structure
    (GEMM_NN_SWIGLU_BWD's fp32 [p | q] input, GEMM_TN_SWIGLU_FWD's bf16 a output), None for the other kinds.
    `b_up`: B's second half as another tensor with b's ld and strides, for GEMM_TN_SWIGLU_FWD the up rows of B
    [n, k] (`b` then holds the n / 2 gate rows), for GEMM_NN_BF16 (the d_x GEMM) B [k, n]'s K rows [k/2, k) (`b`
    holds rows [0, k/2); k/2 a multiple of B_UP_K_TILE); None: B is `b` alone (for GEMM_TN_SWIGLU_FWD its up rows
    follow its gate rows). Build one with the named constructors below."""
    num_groups: int
    rows_dim: int
    m: int
    n: int
    k: int
    a: Operand
    b: Operand
    d: Operand
    offsets: torch.Tensor | None = None
    fixed_rows: int = 0
    aux: Operand | None = None
    b_up: Operand | None = None

    @classmethod
    def expert_rows(cls, offsets: torch.Tensor, groups: int, n: int, k: int, a: Operand, b: Operand, d: Operand,
                    aux: Operand | None = None, b_up: Operand | None = None):
        """Per-expert GEMM whose M is the expert's routed rows: D_e [rows(e), n] = A_e [rows(e), k] · B_e
        (or, for GEMM_NN_SWIGLU_BWD, D_e [rows(e), 2n] the SwiGLU backward of that product, reading aux_e; for
        GEMM_TN_SWIGLU_FWD, with [g | u] the product as for GEMM_TN_F32, D_e = [p | q] = [u * silu'(g) | silu(g)]
        and aux_e [rows(e), n / 2] = bf16(silu(g) * u), B_e's up rows from b_up when given)."""
        return cls(groups, 0, 0, n, k, a, b, d, offsets=offsets, aux=aux, b_up=b_up)

    @classmethod
    def all_rows(cls, rows: int, n: int, k: int, a: Operand, b: Operand, d: Operand, aux: Operand | None = None,
                 b_up: Operand | None = None):
        """One GEMM over a fixed row count (the shared expert, the router): D [rows, n] = A [rows, k] · B."""
        return cls(1, 0, 0, n, k, a, b, d, fixed_rows=rows, aux=aux, b_up=b_up)

    @classmethod
    def expert_wgrad(cls, offsets: torch.Tensor, groups: int, m: int, n: int, a: Operand, b: Operand, d: Operand):
        """Per-expert weight gradient, reduced over the expert's routed rows in order: D_e [m, n] = A_eᵀ B_e."""
        return cls(groups, 2, m, n, 0, a, b, d, offsets=offsets)

    @classmethod
    def all_wgrad(cls, rows: int, m: int, n: int, a: Operand, b: Operand, d: Operand):
        """Weight gradient reduced over a fixed row count in order: D [m, n] = Aᵀ B."""
        return cls(1, 2, m, n, 0, a, b, d, fixed_rows=rows)

    def c(self) -> MokSegment:
        return MokSegment(self.num_groups, self.rows_dim, self.fixed_rows, self.m, self.n, self.k,
                          _p(self.offsets), self.a.c(), self.b.c(), self.d.c(),
                          self.aux.c() if self.aux is not None else MokOperand(),
                          self.b_up.c() if self.b_up is not None else MokOperand())


def offsets_from_counts(counts_G: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The offsets array [2G + 1] int32 that Segment.expert_rows and Segment.expert_wgrad read, on `device`, for G
    groups of counts_G [G] (any integer dtype) rows laid end to end: entries 0 … G the first row of each group (entry
    G the total), entries G + 1 … 2G the rows of each. What the schedule kernels write for routed experts; for callers
    that choose the group sizes themselves (benchmarks, tests)."""
    if counts_G.dim() != 1 or counts_G.is_floating_point() or bool((counts_G < 0).any()):
        raise ValueError(f"counts_G: expected a 1-D tensor of non-negative integers, got {counts_G.dtype} "
                         f"{tuple(counts_G.shape)}")
    G = counts_G.numel()
    offsets = torch.zeros(2 * G + 1, dtype=torch.int32)
    offsets[1:G + 1] = counts_G.cpu().cumsum(0)
    offsets[G + 1:] = counts_G.cpu()
    return offsets.to(device)


@functools.lru_cache(maxsize=None)
def _workspace_bytes(kind: int, variant: int, groups: int, device_index: int) -> int:
    return int(lib().mok_gemm_workspace_bytes(kind, variant, groups, device_index))


def grouped_gemm(kind: int, segments: list[Segment], device: torch.device, variant: int = 0) -> None:
    """One grouped GEMM launch over `segments` (at most MAX_SEGMENTS) on `device`'s current stream, with
    tile variant `variant` in [0, NUM_GEMM_VARIANTS) (the same bits for every variant; see _tiles.py)."""
    check_segments(kind, segments, device, variant)
    index = device.index if device.index is not None else torch.cuda.current_device()
    groups = sum(s.num_groups for s in segments)
    ws = torch.empty(_workspace_bytes(kind, variant, groups, index), dtype=torch.uint8, device=device)
    arr = (MokSegment * len(segments))(*[s.c() for s in segments])
    _call("mok_grouped_gemm", device, kind, variant, arr, len(segments), _p(ws), ws.numel(), index)


def check_segments(kind: int, segments: list[Segment], device: torch.device, variant: int) -> None:
    """`grouped_gemm`'s checks of its arguments (ValueError / TypeError naming the argument); the tests' CPU
    stand-in of the GEMMs makes them too."""
    if not 1 <= len(segments) <= MAX_SEGMENTS:
        raise ValueError(f"segments: expected 1 to {MAX_SEGMENTS}, got {len(segments)}")
    if not (isinstance(variant, int) and 0 <= variant < NUM_GEMM_VARIANTS):
        raise ValueError(f"variant: expected an int in [0, {NUM_GEMM_VARIANTS}), got {variant!r}")
    fused = kind in FUSED_KINDS
    for s in segments:
        if (s.aux is not None) != fused:
            raise ValueError(f"segments: operand aux must be {'given' if fused else 'None'} for GEMM kind {kind} "
                             f"(only the fused kinds {tuple(FUSED_KINDS)} have it)")
        if s.b_up is not None:
            _check_b_up(kind, s)
        for which in ("a", "b", "d") + (("aux",) if fused else ()) + (("b_up",) if s.b_up is not None else ()):
            t = getattr(s, which).tensor
            if t.device != device or not t.is_contiguous():
                raise ValueError(f"segments: operand {which} must be a contiguous tensor on {device}")
        if fused and (s.d.tensor.dtype, s.aux.tensor.dtype) != FUSED_KINDS[kind]:
            want = " and ".join(str(t).removeprefix("torch.") for t in FUSED_KINDS[kind])
            raise TypeError(f"segments: GEMM kind {kind} takes d and aux of {want}, got {s.d.tensor.dtype} and "
                            f"{s.aux.tensor.dtype}")


# Kinds whose segments may carry operand b_up, B's second half as another tensor: the fused gate/up kind's up rows
# (csrc/mainloop_gate_up.cuh) and the d_x kind's K rows [k/2, k) (csrc/mainloop_k_halves.cuh, whose K tile is
# B_UP_K_TILE).
B_UP_KINDS = (GEMM_TN_SWIGLU_FWD, GEMM_NN_BF16)
B_UP_K_TILE = 64


def _check_b_up(kind: int, s: Segment) -> None:
    """A segment's b_up (B's second half as another tensor): what the kernel's one tensormap over both halves
    needs, the checks the C side makes too."""
    if kind not in B_UP_KINDS:
        raise ValueError(f"segments: operand b_up is only for GEMM kinds {B_UP_KINDS} (gate/up + SwiGLU, d_x), "
                         f"got kind {kind}")
    if kind == GEMM_NN_BF16 and s.k % (2 * B_UP_K_TILE):
        raise ValueError(f"segments: with operand b_up, GEMM kind {kind}'s k / 2 (the rows of each half of B) must "
                         f"be a multiple of {B_UP_K_TILE}, got k = {s.k}")
    b, u = s.b, s.b_up
    if u.tensor.dtype != b.tensor.dtype or (u.ld, u.expert_stride, u.row_stride) != (b.ld, b.expert_stride,
                                                                                      b.row_stride):
        raise ValueError("segments: operand b_up must have operand b's dtype, ld, expert_stride and row_stride")
    size = b.tensor.element_size()
    for which, op in (("b", b), ("b_up", u)):
        if op.tensor.data_ptr() % 16 or op.offset * size % 16:
            raise ValueError(f"segments: operand {which} must start on a whole number of 16 bytes when b_up is set "
                             f"(one tensormap spans both halves)")
    if u.tensor.data_ptr() == b.tensor.data_ptr() and u.offset == b.offset:
        raise ValueError("segments: operand b_up must lie a nonzero distance from operand b (the gate rows)")


# ---------------------------------------------------------------- schedule and per-row kernels

_I32, _I64, _F32, _BF16 = torch.int32, torch.int64, torch.float32, torch.bfloat16


def schedule(topk_idx: torch.Tensor, E: int, e0: int, L: int, capacity: int, offsets: torch.Tensor,
             row_pair: torch.Tensor, pair_row: torch.Tensor, flag: torch.Tensor) -> None:
    """Fill offsets (int32 [2L+1]), row_pair (int32 [capacity]), pair_row (int32 [T*K]), flag (int32 [1])."""
    dev = topk_idx.device
    T, K = topk_idx.shape
    _check_tensor("topk_idx", topk_idx, _I64, dev)
    _check_tensor("offsets", offsets, _I32, dev, shape=(2 * L + 1,))
    _check_tensor("row_pair", row_pair, _I32, dev, numel=capacity)
    _check_tensor("pair_row", pair_row, _I32, dev, shape=(T * K,))
    _check_tensor("flag", flag, _I32, dev, shape=(1,))
    n = int(lib().mok_schedule_scratch_ints(T, K, L))
    scratch = torch.empty(n, dtype=_I32, device=dev)
    _call("mok_schedule", dev, _p(topk_idx), T, K, E, e0, L, capacity, _p(offsets), _p(row_pair), _p(pair_row),
          _p(flag), _p(scratch))


def gather_rows(x_TH, pair_row, capacity, x_RH) -> None:
    """x_RH[pair_row[t*K + k]] = x_TH[t] for every pair placed (pair_row >= 0); x_TH [T, H] bf16, pair_row
    int32 [T*K], x_RH [capacity, H] bf16 (the rows of pairs not placed are not written)."""
    dev = x_TH.device
    T, H = x_TH.shape
    _check_tensor("x_TH", x_TH, _BF16, dev)
    _check_tensor("pair_row", pair_row, _I32, dev)
    if T and pair_row.numel() % T:
        raise ValueError(f"pair_row: expected T*K entries for T={T}, got {pair_row.numel()}")
    _check_tensor("x_RH", x_RH, _BF16, dev, shape=(capacity, H))
    if T:
        _call("mok_gather_rows", dev, _p(x_TH), _p(pair_row), T, pair_row.numel() // T, H, capacity, _p(x_RH))


def swiglu_fwd(gu, offsets, L, fixed_rows, I, capacity, a) -> None:
    """a [capacity, I] bf16 = bf16(silu(g) * u) of gu [capacity, 2I] fp32 (g | u), which becomes [p | q] =
    [u * silu'(g) | silu(g)] in place (what `swiglu_bwd` reads), for the rows placed (offsets[L]) or `fixed_rows`
    when offsets is None."""
    dev = gu.device
    _check_tensor("gu", gu, _F32, dev, shape=(capacity, 2 * I))
    if offsets is not None:
        _check_tensor("offsets", offsets, _I32, dev, numel=L + 1)
    _check_tensor("a", a, _BF16, dev, shape=(capacity, I))
    _call("mok_swiglu_fwd", dev, _p(gu), 2 * I, _p(offsets), L, fixed_rows, I, capacity, _p(a))


def swiglu_bwd(da, pq, offsets, L, fixed_rows, I, capacity, dgu) -> None:
    """dgu [capacity, 2I] bf16 = [bf16(da * p) | bf16(da * q)] from da [capacity, I] fp32 and pq [capacity, 2I]
    fp32 (`swiglu_fwd`'s [p | q])."""
    dev = pq.device
    _check_tensor("da", da, _F32, dev, shape=(capacity, I))
    _check_tensor("pq", pq, _F32, dev, shape=(capacity, 2 * I))
    if offsets is not None:
        _check_tensor("offsets", offsets, _I32, dev, numel=L + 1)
    _check_tensor("dgu", dgu, _BF16, dev, shape=(capacity, 2 * I))
    _call("mok_swiglu_bwd", dev, _p(da), _p(pq), 2 * I, _p(offsets), L, fixed_rows, I, capacity, _p(dgu))


def _check_pairs(dev, T, K, w_TK, pair_row, flag):
    _check_tensor("topk_weight", w_TK, _F32, dev, shape=(T, K))
    _check_tensor("pair_row", pair_row, _I32, dev, shape=(T * K,))
    _check_tensor("flag", flag, _I32, dev, shape=(1,))


def combine_fwd(s_TH, o_RH, w_TK, pair_row, flag, y_TH) -> None:
    """y = bf16(((s + w0*o0) + w1*o1) + ...) per token (s = 0 when s_TH is None)."""
    dev = y_TH.device
    T, H = y_TH.shape
    K = w_TK.shape[1]
    _check_tensor("y_TH", y_TH, _BF16, dev)
    _check_pairs(dev, T, K, w_TK, pair_row, flag)
    _check_tensor("o_RH", o_RH, _BF16, dev)
    if s_TH is not None:
        _check_tensor("s_TH", s_TH, _BF16, dev, shape=(T, H))
    _call("mok_combine_fwd", dev, _p(s_TH), _p(o_RH), _p(w_TK), _p(pair_row), _p(flag), T, K, H, _p(y_TH))


def combine_bwd_pre(dy_TH, o_RH, w_TK, pair_row, flag, d_w_TK, go_RH) -> None:
    """d_w[t,k] = Σ_h dy[t,h] o_k[h] and go[row(t,k)] = bf16(w[t,k] dy[t])."""
    dev = dy_TH.device
    T, H = dy_TH.shape
    K = w_TK.shape[1]
    _check_tensor("dy_TH", dy_TH, _BF16, dev)
    _check_pairs(dev, T, K, w_TK, pair_row, flag)
    _check_tensor("o_RH", o_RH, _BF16, dev)
    _check_tensor("d_w_TK", d_w_TK, _F32, dev, shape=(T, K))
    _check_tensor("go_RH", go_RH, _BF16, dev, shape=tuple(o_RH.shape))
    _call("mok_combine_bwd_pre", dev, _p(dy_TH), _p(o_RH), _p(w_TK), _p(pair_row), _p(flag), T, K, H, _p(d_w_TK),
          _p(go_RH))


def combine_bwd_dx(dxs_TH, dx_RH, pair_row, flag, K, dx_TH) -> None:
    """d_x = bf16(((dx_s + dx_0) + dx_1) + ...) per token (dx_s = 0 when dxs_TH is None)."""
    dev = dx_TH.device
    T, H = dx_TH.shape
    _check_tensor("dx_TH", dx_TH, _BF16, dev)
    _check_tensor("dx_RH", dx_RH, _BF16, dev)
    _check_tensor("pair_row", pair_row, _I32, dev, shape=(T * K,))
    _check_tensor("flag", flag, _I32, dev, shape=(1,))
    if dxs_TH is not None:
        _check_tensor("dxs_TH", dxs_TH, _BF16, dev, shape=(T, H))
    _call("mok_combine_bwd_dx", dev, _p(dxs_TH), _p(dx_RH), _p(pair_row), _p(flag), T, K, H, _p(dx_TH))


def zero_empty(d, offsets, L, flag) -> None:
    """Zero d[e] (fp32 or bf16 [L, ...]) of every expert e with no rows."""
    dev = d.device
    if d.dtype not in (_F32, _BF16):
        raise TypeError(f"d: expected dtype torch.float32 or torch.bfloat16, got {d.dtype}")
    _check_tensor("d", d, d.dtype, dev)
    _check_tensor("offsets", offsets, _I32, dev, numel=L + 1)
    _call("mok_zero_empty", dev, _p(d), _p(offsets), L, d[0].numel() * d.element_size() // 2, _p(flag))


def poison(t, flag) -> None:
    """Fill t (fp32 or bf16) with NaN when the routing flag is set."""
    dev = t.device
    if t.dtype not in (_F32, _BF16):
        raise TypeError(f"t: expected dtype torch.float32 or torch.bfloat16, got {t.dtype}")
    _check_tensor("t", t, t.dtype, dev)
    _check_tensor("flag", flag, _I32, dev, shape=(1,))
    _call("mok_poison", dev, _p(t), t.numel(), 1 if t.dtype == _BF16 else 0, _p(flag))


def cast_pair_bf16(first, second, out) -> None:
    """out = [bf16(first); bf16(second)] stacked along dim -2: first, second fp32 [..., n, H] (the same
    shape, contiguous), out bf16 [..., 2n, H] contiguous. Bitwise what `out.narrow(-2, 0, n).copy_(first)`
    (and the same for second) gives, with vector loads and stores."""
    dev = out.device
    _check_tensor("first", first, _F32, dev)
    _check_tensor("second", second, _F32, dev, shape=tuple(first.shape))
    if first.dim() < 2:
        raise ValueError(f"first: expected at least 2 dims [..., n, H], got shape {tuple(first.shape)}")
    *lead, n, H = first.shape
    _check_tensor("out", out, _BF16, dev, shape=(*lead, 2 * n, H))
    _call("mok_cast_pair_bf16", dev, _p(first), _p(second), math.prod(lead), n * H, _p(out))


# ---------------------------------------------------------------- router


def router_topk(logits, E: int, K: int, softmax: bool, normalize: bool, scores, topk_idx, topk_w) -> None:
    """scores [T, E], topk_idx [T, K] int64, topk_w [T, K] from logits [T, ld >= E] fp32."""
    dev = logits.device
    T, ld = logits.shape
    if not 1 <= K <= E <= min(ld, ROUTER_MAX_E):
        raise ValueError(f"E, K: expected 1 <= K <= E <= {ROUTER_MAX_E} and E <= logits.shape[1], got E={E} K={K}")
    _check_tensor("logits", logits, _F32, dev)
    _check_tensor("scores", scores, _F32, dev, shape=(T, E))
    _check_tensor("topk_idx", topk_idx, _I64, dev, shape=(T, K))
    _check_tensor("topk_w", topk_w, _F32, dev, shape=(T, K))
    _call("mok_router_topk", dev, _p(logits), T, E, ld, K, int(softmax), int(normalize), _p(scores), _p(topk_idx),
          _p(topk_w))


def router_bwd(scores, topk_idx, d_w, d_scores, d_logits, softmax: bool, normalize: bool, hl) -> None:
    """hl [T, 2 * ld_half] bf16: hi | lo parts of the logit gradient (see csrc/mok_fast.h)."""
    dev = scores.device
    T, E = scores.shape
    K = topk_idx.shape[1]
    ld_half = hl.shape[1] // 2
    _check_tensor("scores", scores, _F32, dev)
    _check_tensor("topk_idx", topk_idx, _I64, dev, shape=(T, K))
    for name, t, shape in (("d_topk_weight", d_w, (T, K)), ("d_scores", d_scores, (T, E)),
                           ("d_logits", d_logits, (T, E))):
        if t is not None:
            _check_tensor(name, t, _F32, dev, shape=shape)
    _check_tensor("hl", hl, _BF16, dev, shape=(T, 2 * ld_half))
    if ld_half < E:
        raise ValueError(f"hl: expected at least {2 * E} columns, got {hl.shape[1]}")
    _call("mok_router_bwd", dev, _p(scores), _p(topk_idx), _p(d_w), _p(d_scores), _p(d_logits), T, E, K,
          int(softmax), int(normalize), ld_half, _p(hl))


def router_losses(scores, logits, topk_idx, normalize_rows: bool, balance, z) -> None:
    """balance [] fp32 = E * sum_e f_e * P_e, z [] fp32 = mean over tokens of logsumexp(logits)^2 (see
    csrc/mok_fast.h): scores, logits fp32 [T, E] (T >= 1), topk_idx int64 [T, K]; fixed-order sums."""
    dev = scores.device
    T, E = scores.shape
    K = topk_idx.shape[1]
    _check_tensor("scores", scores, _F32, dev)
    _check_tensor("logits", logits, _F32, dev, shape=(T, E))
    _check_tensor("topk_idx", topk_idx, _I64, dev, shape=(T, K))
    for name, t in (("balance", balance), ("z", z)):
        _check_tensor(name, t, _F32, dev, shape=())
    scratch = torch.empty(int(lib().mok_router_losses_scratch_bytes(T, E)), dtype=torch.uint8, device=dev)
    _call("mok_router_losses", dev, _p(scores), _p(logits), _p(topk_idx), T, E, K, int(normalize_rows), _p(scratch),
          _p(balance), _p(z))


def router_losses_bwd(d_balance, d_z, scores, logits, topk_idx, normalize_rows: bool, d_scores, d_logits) -> None:
    """d_scores, d_logits fp32 [T, E]: the gradients of `router_losses` for the loss gradients d_balance and d_z
    (fp32 [] device scalars)."""
    dev = scores.device
    T, E = scores.shape
    K = topk_idx.shape[1]
    for name, t in (("d_balance", d_balance), ("d_z", d_z)):
        _check_tensor(name, t, _F32, dev, shape=())
    _check_tensor("scores", scores, _F32, dev)
    for name, t in (("logits", logits), ("d_scores", d_scores), ("d_logits", d_logits)):
        _check_tensor(name, t, _F32, dev, shape=(T, E))
    _check_tensor("topk_idx", topk_idx, _I64, dev, shape=(T, K))
    scratch = torch.empty(int(lib().mok_router_losses_scratch_bytes(T, E)), dtype=torch.uint8, device=dev)
    _call("mok_router_losses_bwd", dev, _p(d_balance), _p(d_z), _p(scores), _p(logits), _p(topk_idx), T, E, K,
          int(normalize_rows), _p(scratch), _p(d_scores), _p(d_logits))

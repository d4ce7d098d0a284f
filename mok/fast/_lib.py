"""ctypes bindings of the C ABI in csrc/mok_fast.h, taking torch tensors.

Every call launches on the current CUDA stream and never synchronises the host.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from ._build import library

GEMM_TN_F32, GEMM_TN_BF16, GEMM_NN_F32, GEMM_NN_BF16, GEMM_TT_F32 = range(5)
MAX_SEGMENTS = 4


class MokOperand(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("expert_stride", ctypes.c_int64),
                ("row_stride", ctypes.c_int64), ("ld", ctypes.c_int64)]


class MokSegment(ctypes.Structure):
    _fields_ = [("num_groups", ctypes.c_int), ("rows_dim", ctypes.c_int), ("fixed_rows", ctypes.c_int),
                ("m", ctypes.c_int), ("n", ctypes.c_int), ("k", ctypes.c_int),
                ("offsets", ctypes.c_void_p), ("a", MokOperand), ("b", MokOperand), ("d", MokOperand)]


@dataclass
class Operand:
    """Matrix operand of a grouped GEMM: group e uses
    ``tensor + elem_offset + e * expert_stride + row_offset(e) * row_stride`` (elements), leading dim `ld`."""
    tensor: torch.Tensor
    expert_stride: int
    row_stride: int
    ld: int
    elem_offset: int = 0

    def c(self) -> MokOperand:
        ptr = self.tensor.data_ptr() + self.elem_offset * self.tensor.element_size()
        return MokOperand(ptr, self.expert_stride, self.row_stride, self.ld)


@dataclass
class Segment:
    """`num_groups` GEMMs; rows(e) from offsets (int32 [>= num_groups + 1]) or `fixed_rows`,
    placed in M (rows_dim=0) or K (rows_dim=2); the other two dims are the constants m, n, k."""
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

    def c(self) -> MokSegment:
        off = self.offsets.data_ptr() if self.offsets is not None else None
        return MokSegment(self.num_groups, self.rows_dim, self.fixed_rows, self.m, self.n, self.k,
                          off, self.a.c(), self.b.c(), self.d.c())


def _stream(device: torch.device) -> ctypes.c_void_p:
    return ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream)


def _p(t: torch.Tensor | None, elem_offset: int = 0) -> ctypes.c_void_p:
    if t is None:
        return ctypes.c_void_p(None)
    return ctypes.c_void_p(t.data_ptr() + elem_offset * t.element_size())


def _check(rc: int, what: str) -> None:
    if rc != 0:
        msg = library().mok_last_error().decode()
        raise RuntimeError(f"mok.fast {what} failed: {msg}")


def _setup(lib: ctypes.CDLL) -> None:
    if getattr(lib, "_mok_typed", False):
        return
    lib.mok_last_error.restype = ctypes.c_char_p
    lib.mok_gemm_workspace_bytes.restype = ctypes.c_size_t
    lib.mok_gemm_workspace_bytes.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
    lib.mok_grouped_gemm.argtypes = [ctypes.c_int, ctypes.POINTER(MokSegment), ctypes.c_int, ctypes.c_void_p,
                                     ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    i64 = ctypes.c_int64
    vp = ctypes.c_void_p
    ci = ctypes.c_int
    lib.mok_schedule.argtypes = [vp, ci, ci, ci, ci, ci, ci, vp, vp, vp, vp, vp, vp]
    lib.mok_schedule_scratch_ints.restype = ctypes.c_size_t
    lib.mok_schedule_scratch_ints.argtypes = [ci, ci, ci]
    lib.mok_gather_rows.argtypes = [vp, vp, vp, ci, ci, ci, ci, vp, vp]
    lib.mok_swiglu_fwd.argtypes = [vp, i64, vp, ci, ci, ci, vp, vp]
    lib.mok_combine_fwd.argtypes = [vp, vp, vp, vp, vp, ci, ci, ci, vp, vp]
    lib.mok_combine_bwd_pre.argtypes = [vp, vp, vp, vp, vp, ci, ci, ci, vp, vp, vp]
    lib.mok_swiglu_bwd.argtypes = [vp, vp, i64, vp, ci, ci, ci, vp, vp]
    lib.mok_combine_bwd_dx.argtypes = [vp, vp, vp, vp, ci, ci, ci, vp, vp]
    lib.mok_zero_empty.argtypes = [vp, vp, ci, i64, vp, vp]
    lib.mok_poison.argtypes = [vp, i64, ci, vp, vp]
    lib._mok_typed = True


def lib() -> ctypes.CDLL:
    """The typed library handle."""
    handle = library()
    _setup(handle)
    return handle


_WS_BYTES: dict[tuple[int, int, int], int] = {}


def grouped_gemm(kind: int, segments: list[Segment], device: torch.device) -> None:
    """Run one grouped GEMM launch over `segments` (at most 4) on the current stream."""
    L = lib()
    groups = sum(s.num_groups for s in segments)
    dev = device.index if device.index is not None else torch.cuda.current_device()
    key = (kind, groups, dev)
    if key not in _WS_BYTES:
        _WS_BYTES[key] = int(L.mok_gemm_workspace_bytes(kind, groups, dev))
    ws = torch.empty(_WS_BYTES[key], dtype=torch.uint8, device=device)
    arr = (MokSegment * len(segments))(*[s.c() for s in segments])
    _check(L.mok_grouped_gemm(kind, arr, len(segments), _p(ws), ws.numel(), dev, _stream(device)), "grouped_gemm")


def schedule(topk_idx: torch.Tensor, E: int, e0: int, L_: int, capacity: int, offsets: torch.Tensor,
             row_pair: torch.Tensor, pair_row: torch.Tensor, flag: torch.Tensor) -> None:
    """Fill offsets (int32 [2L+1]), row_pair (int32 [capacity]), pair_row (int32 [T*K]), flag (int32 [1])."""
    T, K = topk_idx.shape
    handle = lib()
    scratch = torch.empty(int(handle.mok_schedule_scratch_ints(T, K, L_)), dtype=torch.int32,
                          device=topk_idx.device)
    _check(handle.mok_schedule(_p(topk_idx), T, K, E, e0, L_, capacity, _p(offsets), _p(row_pair),
                               _p(pair_row), _p(flag), _p(scratch), _stream(topk_idx.device)), "schedule")


def gather_rows(x_TH, row_pair, offsets, L_, K, capacity, x_RH) -> None:
    _check(lib().mok_gather_rows(_p(x_TH), _p(row_pair), _p(offsets), L_, K, x_TH.shape[1], capacity,
                                 _p(x_RH), _stream(x_TH.device)), "gather_rows")


def swiglu_fwd(gu, ld, n_rows_ptr, fixed_rows, I, capacity, a) -> None:
    _check(lib().mok_swiglu_fwd(_p(gu), ld, n_rows_ptr, fixed_rows, I, capacity, _p(a),
                                _stream(gu.device)), "swiglu_fwd")


def combine_fwd(s_TH, o_RH, w_TK, pair_row, flag, y_TH) -> None:
    T, H = y_TH.shape
    _check(lib().mok_combine_fwd(_p(s_TH), _p(o_RH), _p(w_TK), _p(pair_row), _p(flag), T, w_TK.shape[1], H,
                                 _p(y_TH), _stream(y_TH.device)), "combine_fwd")


def combine_bwd_pre(dy_TH, o_RH, w_TK, pair_row, flag, d_w_TK, go_RH) -> None:
    T, H = dy_TH.shape
    _check(lib().mok_combine_bwd_pre(_p(dy_TH), _p(o_RH), _p(w_TK), _p(pair_row), _p(flag), T, w_TK.shape[1],
                                     H, _p(d_w_TK), _p(go_RH), _stream(dy_TH.device)), "combine_bwd_pre")


def swiglu_bwd(da, gu, ld, n_rows_ptr, fixed_rows, I, capacity, dgu) -> None:
    _check(lib().mok_swiglu_bwd(_p(da), _p(gu), ld, n_rows_ptr, fixed_rows, I, capacity, _p(dgu),
                                _stream(gu.device)), "swiglu_bwd")


def combine_bwd_dx(dxs_TH, dx_RH, pair_row, flag, K, dx_TH) -> None:
    T, H = dx_TH.shape
    _check(lib().mok_combine_bwd_dx(_p(dxs_TH), _p(dx_RH), _p(pair_row), _p(flag), T, K, H, _p(dx_TH),
                                    _stream(dx_TH.device)), "combine_bwd_dx")


def zero_empty(d, offsets, L_, per_expert, flag) -> None:
    _check(lib().mok_zero_empty(_p(d), _p(offsets), L_, per_expert, _p(flag), _stream(d.device)), "zero_empty")


def poison(t, flag) -> None:
    _check(lib().mok_poison(_p(t), t.numel(), 1 if t.dtype == torch.bfloat16 else 0, _p(flag),
                            _stream(t.device)), "poison")

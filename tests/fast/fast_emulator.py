"""A CPU stand-in for mok.fast's kernels (test helper, never shipped): every `mok.fast._lib` function the
stages and the expert-parallel protocol call, emulated with PyTorch on the CPU, so the Python
orchestration of `mok/fast/_forward.py`, `_backward.py` and `_ep.py` runs unchanged in gloo processes.

What it can show: indexing, row order, phases, regions and saved contexts are right, and the outputs do
not depend on W (its arithmetic is deterministic and row independent: GEMMs are the reference's exact
`matmul_exact` / `rows_outer_sum`, elementwise steps fp32 in the kernels' order). The FP8 recipe's quantisers are the
reference's, its GEMMs each K block's exact sum of e4m3 products (float64), rounded to fp32 and added times
sfa * sfb, K blocks in order. What it cannot show: the CUDA kernels' bits, IPC and device-side waits
(tests/gpu/test_fast_ep*.py do).

Peer buffers are files in /dev/shm mapped by every rank (`torch.from_file(shared=True)`); the pointer
tables hold the views' addresses in this process, resolved back to the views through a registry.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import time
import uuid

import torch
import torch.distributed as dist

from mok import reference
from mok.fast import _checks, _context, _ep_buffer, _lib

_VIEWS: dict[int, torch.Tensor] = {}  # address in this process -> the tensor view it starts
_FILES: list[str] = []


def _resolve(table: torch.Tensor) -> list[torch.Tensor]:
    return [_VIEWS[int(p)] for p in table.tolist()]


# ---------------------------------------------------------------- W = 1 kernels


def schedule(topk_idx, E, e0, L, capacity, offsets, row_pair, pair_row, flag):
    T, K = topk_idx.shape
    idx = topk_idx.reshape(-1)
    bad = int(((idx < 0) | (idx >= E)).any()) * 1
    srt = topk_idx.sort(dim=1).values
    bad |= int((srt[:, 1:] == srt[:, :-1]).any()) * 2 if K > 1 else 0
    le = idx - e0
    local = (le >= 0) & (le < L)
    pairs = torch.nonzero(local).reshape(-1)
    order = torch.argsort(le[pairs] * (T * K) + pairs, stable=True)  # canonical: expert, then pair index
    placed = pairs[order]
    counts = torch.bincount(le[placed], minlength=L)[:L]
    starts = torch.cumsum(counts, 0) - counts
    pair_row.fill_(-1)
    n = min(int(placed.numel()), capacity)
    if placed.numel() > capacity:
        bad |= 4
    row_pair[:n] = placed[:n].to(torch.int32)
    pair_row[placed[:n]] = torch.arange(n, dtype=torch.int32)
    offsets[:L] = starts.clamp(max=capacity).to(torch.int32)
    offsets[L] = n
    offsets[L + 1:] = counts.to(torch.int32)
    flag.fill_(bad)


def gather_rows(x_TH, pair_row, capacity, x_RH):
    K = pair_row.numel() // x_TH.shape[0]
    placed = (pair_row >= 0) & (pair_row < capacity)
    x_RH[pair_row[placed].long()] = x_TH[torch.nonzero(placed).flatten() // K]


def _operand(op, e: int, row_off: int, rows: int, cols: int) -> torch.Tensor:
    start = op.offset + e * op.expert_stride + row_off * op.row_stride  # elements from op.tensor's first one
    return op.tensor.as_strided((rows, cols), (op.ld, 1), op.tensor.storage_offset() + start)


def _fp8_product(a_q, a_s, b_q, b_s, rows_per_scale: int) -> torch.Tensor:
    """fp32 [M, N] = Σ over K blocks kb in order of fp32(exact Σ of the block's products) * (sfa * sfb): A a_q [M, Kp]
    e4m3 with a_s [M, Kb], B b_q [N, Kp] e4m3 with b_s [ceil(N / rows_per_scale), Kb]."""
    M, Kp = a_q.shape
    N, Kb = b_q.shape[0], Kp // 128
    a = a_q.double().view(M, Kb, 128)
    b = b_q.double().view(N, Kb, 128)
    sums = torch.einsum("mkc,nkc->kmn", a, b).float()  # exact in float64: products of e4m3 values, 128 of them
    sfb = b_s.repeat_interleave(rows_per_scale, 0)[:N]  # [N, Kb]
    out = torch.zeros(M, N)
    for kb in range(Kb):
        out = out + sums[kb] * (a_s[:, kb:kb + 1] * sfb[None, :, kb])
    return out


def _fp8_gemm(kind, s, e, off, rows):
    a_q, a_s = _operand(s.a, e, off, rows, s.k), _operand(s.sfa, e, off, rows, s.k // 128)
    if kind != _lib.GEMM_FP8_TN_SWIGLU_FWD:
        b_q, b_s = _operand(s.b, e, off, s.n, s.k), _operand(s.sfb, e, off, -(-s.n // 128), s.k // 128)
        _operand(s.d, e, off, rows, s.n).copy_(_fp8_product(a_q, a_s, b_q, b_s, 128).to(s.d.tensor.dtype))
        return
    I = s.n // 2  # B: the interleaved [gate; up] (mok.fast._fp8.GateUp), 64 gate rows then 64 up rows, ...
    n = 2 * -(-I // 64) * 64
    b_q, b_s = _operand(s.b, e, off, n, s.k), _operand(s.sfb, e, off, n // 64, s.k // 128)
    out = _fp8_product(a_q, a_s, b_q, b_s, 64).view(rows, n // 128, 2, 64)
    gu = torch.cat([out[:, :, 0].reshape(rows, -1)[:, :I], out[:, :, 1].reshape(rows, -1)[:, :I]], 1)
    _swiglu_fwd_rows(gu, _operand(s.aux, e, off, rows, I), I)  # the epilogue: a, and [g | u] becomes [p | q]
    _operand(s.d, e, off, rows, s.n).copy_(gu)


def grouped_gemm(kind, segments, device, variant=0):
    _lib.check_segments(kind, segments, device, variant)  # the real launch's checks (contiguous operands, ...)
    for s in segments:
        for e in range(s.num_groups):
            if s.offsets is not None:
                off, rows = int(s.offsets[e]), int(s.offsets[e + 1] - s.offsets[e])
            else:
                off, rows = 0, s.fixed_rows
            if rows <= 0:
                continue
            if kind in _lib.GEMM_FP8_KINDS:
                _fp8_gemm(kind, s, e, off, rows)
                continue
            if s.rows_dim == 0:  # D [rows, n] = A [rows, k] . B
                a = _operand(s.a, e, off, rows, s.k)
                if kind == _lib.GEMM_TN_SWIGLU_FWD and s.b_up is not None:  # gate rows in b, up rows in b_up
                    b_nk = torch.cat([_operand(s.b, e, off, s.n // 2, s.k), _operand(s.b_up, e, off, s.n // 2, s.k)])
                elif kind in (_lib.GEMM_TN_F32, _lib.GEMM_TN_BF16, _lib.GEMM_TN_SWIGLU_FWD):
                    b_nk = _operand(s.b, e, off, s.n, s.k)
                elif s.b_up is not None:  # NN, B [k, n] with K rows [0, k/2) in b and [k/2, k) in b_up
                    b_nk = torch.cat([_operand(s.b, e, off, s.k // 2, s.n), _operand(s.b_up, e, off, s.k // 2, s.n)]).t()
                else:  # NN: B [k, n]
                    b_nk = _operand(s.b, e, off, s.k, s.n).t()
                out = reference.matmul_exact(a.contiguous(), b_nk.contiguous())
                if kind == _lib.GEMM_NN_SWIGLU_BWD:  # the epilogue: [dg | du] of da = out, reading [p | q]
                    pq = _operand(s.aux, e, off, rows, 2 * s.n)
                    _swiglu_bwd_rows(out, pq, _operand(s.d, e, off, rows, 2 * s.n), s.n)
                    continue
                if kind == _lib.GEMM_TN_SWIGLU_FWD:  # the epilogue: a of out = [g | u], which becomes [p | q]
                    _swiglu_fwd_rows(out, _operand(s.aux, e, off, rows, s.n // 2), s.n // 2)
                d = _operand(s.d, e, off, rows, s.n)
            else:  # TT: D [m, n] = A [rows, m]^T . B [rows, n], reduced over rows in order
                a = _operand(s.a, e, off, rows, s.m)
                b = _operand(s.b, e, off, rows, s.n)
                out = reference.rows_outer_sum(a.contiguous(), b.contiguous())
                d = _operand(s.d, e, off, s.m, s.n)
            d.copy_(out.to(d.dtype))


def fp8_quant_rows(x, parts, count, q, scales):
    """The reference's quantize_rows_1x128 of each row's `parts` parts (the first count[0] rows, or all)."""
    n = x.shape[0] if count is None else int(count[0])
    P = x.shape[1] // parts
    Pp, Pb = q.shape[1] // parts, scales.shape[1] // parts
    for j in range(parts):
        rq, rs = reference.quantize_rows_1x128(x[:n, j * P:(j + 1) * P])
        q[:n, j * Pp:(j + 1) * Pp].view(torch.uint8).zero_()
        q[:n, j * Pp:j * Pp + P] = rq
        scales[:n, j * Pb:(j + 1) * Pb] = rs


def fp8_quant_blocks(w, q, s, qT, off_qT, sT, off_sT):
    """The reference's quantize_blocks_128x128 of w ([L, N, K] or [N, K]) into q, s, and its transpose into qT, sT at
    column offsets (any of them may be None)."""
    rq, rs = reference.quantize_blocks_128x128(w)
    N, K = w.shape[-2:]
    if q is not None:
        q.view(torch.uint8).zero_()
        q[..., :K] = rq
    if s is not None:
        s.copy_(rs)
    if qT is not None:
        Np = -(-N // 128) * 128
        qT[..., off_qT:off_qT + Np].view(torch.uint8).zero_()
        qT[..., off_qT:off_qT + N] = rq.transpose(-1, -2)
    if sT is not None:
        sT[..., off_sT:off_sT + rs.shape[-2]] = rs.transpose(-1, -2)


def _rows(offsets, L, fixed_rows):
    return int(offsets[L]) if offsets is not None else fixed_rows


def _swiglu_fwd_rows(gu, a, I):
    """a = bf16(silu(g) * u) of gu = [g | u] (fp32 [n, 2I]), and gu becomes [p | q] = [u * silu'(g) | silu(g)] in
    place (csrc/swiglu_math.cuh's swiglu_fwd_one, with sigmoid = 1 / (1 + exp(-g)), exp rounded to fp32 from
    float64: torch's fp32 exp and sigmoid give other bits at the scalar tails of their vector loops, so an element's
    bits would depend on the shape of the tensor it is computed in, the fused GEMM's groups or the whole rows)."""
    g, u = gu[:, :I].clone(), gu[:, I:2 * I].clone()
    sig = 1 / (1 + torch.exp(-g.double()).float())
    q = g * sig
    a.copy_((q * u).to(torch.bfloat16))
    gu[:, :I] = u * (sig * (1 + g * (1 - sig)))
    gu[:, I:2 * I] = q


def swiglu_fwd(gu, offsets, L, fixed_rows, I, capacity, a):
    n = _rows(offsets, L, fixed_rows)
    _swiglu_fwd_rows(gu[:n], a[:n], I)


def _swiglu_bwd_rows(da, pq, dgu, I):
    """[dg | du] = [bf16(da * p) | bf16(da * q)] of the forward's pq = [p | q] (fp32 [n, 2I])."""
    dgu[:, :I] = (da * pq[:, :I]).to(torch.bfloat16)
    dgu[:, I:2 * I] = (da * pq[:, I:2 * I]).to(torch.bfloat16)


def swiglu_bwd(da, pq, offsets, L, fixed_rows, I, capacity, dgu):
    n = _rows(offsets, L, fixed_rows)
    _swiglu_bwd_rows(da[:n], pq[:n], dgu[:n], I)


def _combine(first, rows_RH, pair_row, flag, K, w=None):
    T = pair_row.numel() // K
    pr = pair_row.view(T, K).long()
    acc = first.float() if first is not None else torch.zeros(T, rows_RH.shape[1])
    bad = torch.full((T, 1), bool(int(flag)))
    for k in range(K):
        r = pr[:, k]
        ok = r >= 0
        bad |= ~ok.unsqueeze(1)
        v = rows_RH[r.clamp(min=0)].float()
        if w is not None:
            v = w[:, k:k + 1] * v
        acc = torch.where(ok.unsqueeze(1), acc + v, acc)
    return torch.where(bad, torch.full_like(acc, float("nan")), acc).to(torch.bfloat16)


def combine_fwd(s_TH, o_RH, w_TK, pair_row, flag, y_TH):
    y_TH.copy_(_combine(s_TH, o_RH, pair_row, flag, w_TK.shape[1], w_TK))


def combine_bwd_pre(dy_TH, o_RH, w_TK, pair_row, flag, d_w_TK, go_RH):
    T, K = w_TK.shape
    pr = pair_row.view(T, K).long()
    bad = bool(int(flag))
    for k in range(K):
        r = pr[:, k]
        ok = r >= 0
        dots = (dy_TH.double() * o_RH[r.clamp(min=0)].double()).sum(1).float()
        d_w_TK[:, k] = torch.where(ok & ~torch.tensor(bad), dots, torch.tensor(float("nan")))
        go = (w_TK[:, k:k + 1] * dy_TH.float())
        go = torch.full_like(go, float("nan")) if bad else go
        go_RH[r[ok]] = go[ok].to(torch.bfloat16)


def combine_bwd_dx(dxs_TH, dx_RH, pair_row, flag, K, dx_TH):
    dx_TH.copy_(_combine(dxs_TH, dx_RH, pair_row, flag, K))


def zero_empty(d, offsets, L, flag):
    counts = offsets[L + 1: 2 * L + 1]
    d[counts == 0] = 0


def poison(t, flag):
    if int(flag):
        t.fill_(float("nan"))


# ---------------------------------------------------------------- expert-parallel kernels and buffers


def ep_gather_rows(peers, per_rank, div, row_pair, offsets, L, out):
    regions = _resolve(peers)
    n = int(offsets[L])
    item = row_pair[:n].long() // div
    for r in range(n):
        p, i = divmod(int(item[r]), per_rank)
        out[r] = regions[p][i]


def ep_scatter_rows(rows, row_pair, offsets, L, per_rank, peers):
    regions = _resolve(peers)
    for r in range(int(offsets[L])):
        p, j = divmod(int(row_pair[r]), per_rank)
        regions[p][j] = rows[r]


def ep_concat(peers, out):
    regions = _resolve(peers)
    per = out.numel() * out.element_size() // len(regions)  # bytes from the start of each region
    parts = [t.reshape(-1).view(torch.uint8)[:per] for t in regions]
    out.view(-1).view(torch.uint8).copy_(torch.cat(parts))


def ep_next_epoch(epoch):
    epoch += 1


def ep_signal(peer_flags, phase, rank, epoch):
    for f in _resolve(peer_flags):
        f[phase, rank] = int(epoch)


def ep_wait(flags, phase, rank, epoch, timeout_s):
    t0, want = time.monotonic(), int(epoch)
    while bool((flags[phase] < want).any()):
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError(f"mok EP (emulated): rank {rank} waited {timeout_s} s in phase {phase}: "
                               f"{flags[phase].tolist()} < {want}")
        time.sleep(1e-4)


def ep_enable_peer_access(device, peer):
    pass


def create(group, device, T, H, K, S):
    W, rank = reference.world(group)
    layout, nbytes = _ep_buffer._layout(_ep_buffer._regions(T, H, K, S, W))
    run = [uuid.uuid4().hex if rank == 0 else None]
    dist.broadcast_object_list(run, src=0, group=group)
    paths = [f"/dev/shm/mok-ep-emu-{run[0]}-{p}" for p in range(W)]
    with open(paths[rank], "wb") as f:
        f.truncate(nbytes)  # zeros: the flags start at 0
    _FILES.append(paths[rank])
    dist.barrier(group=group)
    raws = [torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8) for path in paths]
    local = {name: _ep_buffer._view(raws[rank], spec) for name, spec in layout.items()}
    tables = {}
    for name, spec in layout.items():
        views = [_ep_buffer._view(r, spec) for r in raws]
        for v in views:
            _VIEWS[v.data_ptr()] = v
        tables[name] = torch.tensor([v.data_ptr() for v in views], dtype=torch.int64)
    zero = torch.zeros(1, dtype=torch.int32)
    return _ep_buffer.EPBuffer(W, rank, local, tables, zero.clone(), zero.clone(),
                               torch.arange(T * K, dtype=torch.int32), _ep_buffer.timeout_s(), raws)


@atexit.register
def _remove_files():
    for p in _FILES:
        try:
            os.unlink(p)
        except OSError:
            pass


def _check_inputs(*args, world_size: int = 1):
    """The layer's shared checks and the fast path's size rules, without the GPU ones."""
    d = reference.check_layer_args(*args, world_size=world_size)
    problem = _checks.sizes_problem(d.H, d.I, d.S)
    if problem:
        raise ValueError(f"x: {problem}")
    return d


def install() -> None:
    """Replace the kernels (and the GPU-only input checks) in this process."""
    import mok.fast

    for name in ("schedule", "gather_rows", "grouped_gemm", "swiglu_fwd", "swiglu_bwd", "combine_fwd",
                 "combine_bwd_pre", "combine_bwd_dx", "zero_empty", "poison", "fp8_quant_rows", "fp8_quant_blocks"):
        setattr(_lib, name, globals()[name])
    for name in ("ep_gather_rows", "ep_scatter_rows", "ep_concat", "ep_next_epoch", "ep_signal", "ep_wait",
                 "ep_enable_peer_access"):
        setattr(_lib, name, globals()[name])
    _ep_buffer.create = create
    mok.fast.check_inputs = _check_inputs
    _context.check_inputs = _check_inputs
    _checks.check_inputs = _check_inputs


class _NoStream:
    cuda_stream = 0

    def wait_stream(self, other):
        pass


def stub_streams() -> None:
    """Make the W = 1 path's stream calls (current stream, the side stream, `torch.cuda.stream`) no-ops in this
    process, so it runs on a machine without CUDA (the emulated tests of tests/fast/)."""
    from mok.fast import _backward

    _backward._side_stream = lambda dev: _NoStream()
    torch.cuda.current_stream = lambda dev=None: _NoStream()
    torch.cuda.stream = lambda s: contextlib.nullcontext()
    torch.cuda.current_device = lambda: 0

"""The expert-parallel kernels of csrc/ep.cu in one process, against plain-PyTorch refs bit for bit:
the "ranks" are W slices of one local tensor, so a failure here is the kernel's, not IPC's or the
protocol's (tests/gpu/test_fast_ep.py covers those)."""
import subprocess
import sys
import textwrap

import pytest
import torch

from mok.fast import _lib
from mok.testing.bits import assert_bitwise_equal

pytestmark = [pytest.mark.gpu, pytest.mark.sm90]


def _table(regions) -> torch.Tensor:
    return torch.tensor([r.data_ptr() for r in regions], dtype=torch.int64, device="cuda")


def _schedule_like(W, per_rank, capacity, placed, g):
    """A row_pair of `placed` distinct items of [0, W*per_rank) (rows past `placed` hold -1: never read)
    and offsets whose [L] entry is `placed` (L = 2)."""
    items = torch.randperm(W * per_rank, generator=g)[:placed].to(torch.int32)
    row_pair = torch.full((capacity,), -1, dtype=torch.int32)
    row_pair[:placed] = items
    offsets = torch.tensor([0, placed // 2, placed, 0, 0], dtype=torch.int32)
    return row_pair.cuda(), offsets.cuda()


def gather_ref(regions, per_rank, div, row_pair, placed, out):
    """out[r] = regions[item // per_rank][item % per_rank], item = row_pair[r] // div, r < placed."""
    flat = torch.cat(list(regions))
    out = out.clone()
    item = row_pair[:placed].long() // div
    out[:placed] = flat[item]
    return out


@pytest.mark.parametrize("W, T, K, H, div_by_k", [
    (2, 8, 2, 16, True),      # x rows by token (item = pair // K)
    (4, 5, 3, 64, True),      # odd T and K
    (3, 7, 2, 8, False),      # go rows by pair (div = 1), H = 8 (one vector per row)
    (8, 16, 4, 256, False),   # W = 8
])
def test_gather_rows_from_w_regions_is_the_ref(W, T, K, H, div_by_k):
    g = torch.Generator().manual_seed(W * 100 + T)
    per_rank = T if div_by_k else T * K
    div = K if div_by_k else 1
    big = torch.randn(W * per_rank, H, generator=g).to(torch.bfloat16).cuda()
    regions = list(big.split(per_rank))
    capacity = W * T * K
    placed = capacity - 3
    # row_pair holds pair indices in [0, W*T*K); item = pair // div lies in [0, W*per_rank)
    pairs = torch.randperm(W * T * K, generator=g)[:placed].to(torch.int32)
    row_pair = torch.full((capacity,), -1, dtype=torch.int32)
    row_pair[:placed] = pairs
    row_pair, offsets = row_pair.cuda(), torch.tensor([0, placed // 2, placed, 0, 0], dtype=torch.int32).cuda()
    out = torch.full((capacity, H), 7.0, dtype=torch.bfloat16, device="cuda")
    want = gather_ref(regions, per_rank, div, row_pair, placed, out)
    _lib.ep_gather_rows(_table(regions), per_rank, div, row_pair, offsets, 2, out)
    torch.cuda.synchronize()
    assert_bitwise_equal(out, want, "gathered rows")


@pytest.mark.parametrize("W, T, K, H", [
    (2, 8, 2, 16),     # two regions, H = 16: two 16-byte vectors per row
    (4, 5, 3, 64),     # odd T and K
    (8, 16, 4, 128),   # W = 8
])
def test_scatter_rows_into_w_regions_is_the_ref(W, T, K, H):
    g = torch.Generator().manual_seed(W * 7 + K)
    per_rank = T * K
    capacity = W * T * K
    placed = capacity - 5
    row_pair, offsets = _schedule_like(W, per_rank, capacity, placed, g)
    rows = torch.randn(capacity, H, generator=g).to(torch.bfloat16).cuda()
    big = torch.full((W * per_rank, H), -2.0, dtype=torch.bfloat16, device="cuda")
    want = big.clone()
    want[row_pair[:placed].long()] = rows[:placed]
    _lib.ep_scatter_rows(rows, row_pair, offsets, 2, per_rank, _table(big.split(per_rank)))
    torch.cuda.synchronize()
    assert_bitwise_equal(big, want, "scattered regions")


@pytest.mark.parametrize("W, shape, dtype", [
    (2, (8, 2), torch.int64),        # ids
    (4, (5, 24), torch.bfloat16),    # shared-expert rows, odd T
    (8, (3, 8), torch.bfloat16),     # one 16-byte vector per row
])
def test_concat_of_w_regions_is_torch_cat(W, shape, dtype):
    g = torch.Generator().manual_seed(W)
    parts = [(torch.randn(*shape, generator=g) * 100).to(dtype).cuda() for _ in range(W)]
    out = torch.empty((W * shape[0], *shape[1:]), dtype=dtype, device="cuda")
    _lib.ep_concat(_table(parts), out)
    torch.cuda.synchronize()
    assert_bitwise_equal(out, torch.cat(parts), "concatenated regions")  # raw bits: -0 is not +0


def test_signal_then_wait_passes_for_every_simulated_rank():
    """W flag arrays on this GPU: each 'rank' signals all, then every array has reached the epoch."""
    W, phases = 3, 4
    flags = [torch.zeros(phases, W, dtype=torch.int32, device="cuda") for _ in range(W)]
    epoch = torch.zeros(1, dtype=torch.int32, device="cuda")
    for step in range(1, 4):
        _lib.ep_next_epoch(epoch)
        for rank in range(W):
            _lib.ep_signal(_table(flags), 2, rank, epoch)
        for rank in range(W):
            _lib.ep_wait(flags[rank], 2, rank, epoch, timeout_s=5.0)
        torch.cuda.synchronize()
        assert int(epoch) == step
        for f in flags:
            assert f[2].tolist() == [step] * W and f[[0, 1, 3]].eq(0).all()


def test_a_wait_nobody_signals_traps_after_its_timeout():
    code = textwrap.dedent("""
        import time, torch
        from mok.fast import _lib
        flags = torch.zeros(4, 2, dtype=torch.int32, device="cuda")
        epoch = torch.zeros(1, dtype=torch.int32, device="cuda")
        _lib.ep_next_epoch(epoch)
        t0 = time.monotonic()
        _lib.ep_wait(flags, 1, 0, epoch, timeout_s=1.0)
        try:
            torch.cuda.synchronize()
        except RuntimeError as e:
            print("raised after", round(time.monotonic() - t0, 1), "s:", str(e).splitlines()[0])
        else:
            print("no error")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    out = r.stdout + r.stderr
    assert "raised after" in out, out  # (the kernel also prints who waited for whom, if the trap lets it)
    seconds = float(out.split("raised after")[1].split()[0])
    assert 0.9 <= seconds < 30, out

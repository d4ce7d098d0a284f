"""The device schedule places rows in canonical order: by expert, then token, then k (the order of a
stable sort of the flattened ids), with per-expert offsets and the inverse map."""
import pytest
import torch

from mok.fast import _lib
from mok.testing.bits import assert_bitwise_equal

pytestmark = [pytest.mark.gpu, pytest.mark.sm90]


@pytest.mark.parametrize("T,K,E,e0,L", [
    (1, 1, 1, 0, 1),            # one token, one expert
    (37, 3, 8, 0, 8),           # T not a multiple of anything
    (1000, 8, 128, 0, 128),     # qwen3-like routing, several 256-pair chunks
    (4099, 6, 64, 0, 64),       # a partial last chunk
    (513, 2, 16, 4, 8),         # local experts [4, 12) only (expert-parallel slice): other pairs unplaced
    (300, 4, 2000, 0, 2000),    # more experts than pairs: most experts empty
])
def test_schedule_matches_stable_sort(T, K, E, e0, L):
    g = torch.Generator(device="cuda").manual_seed(T * 31 + E)
    idx = torch.stack([torch.randperm(E, device="cuda", generator=g)[:K] for _ in range(T)])
    if T > 10:
        idx[: T // 2, 0] = e0  # skew onto one expert
        idx[: T // 2, 1:] = torch.where(idx[: T // 2, 1:] == e0, (e0 + 1) % E, idx[: T // 2, 1:]) if K > 1 else idx[: T // 2, 1:]
    idx = idx.contiguous()
    R = T * K
    i32 = dict(dtype=torch.int32, device="cuda")
    offsets, row_pair, pair_row, flag = (torch.empty(2 * L + 1, **i32), torch.full((R,), -7, **i32),
                                         torch.empty(R, **i32), torch.empty(1, **i32))
    _lib.schedule(idx, E, e0, L, R, offsets, row_pair, pair_row, flag)
    flat = idx.reshape(-1)
    local = (flat >= e0) & (flat < e0 + L)
    order = torch.argsort(torch.where(local, flat, E + 1), stable=True)[: int(local.sum())]
    counts = torch.bincount(flat[local] - e0, minlength=L)
    assert int(flag.item()) == (2 if bool((idx[:, :, None] == idx[:, None, :]).sum() > T * K) else 0)
    assert_bitwise_equal(offsets[: L + 1].long(), torch.cat([counts.new_zeros(1), counts.cumsum(0)]), "offsets")
    assert_bitwise_equal(offsets[L + 1:].long(), counts, "counts")
    n = int(local.sum())
    assert_bitwise_equal(row_pair[:n].long(), order, "row_pair")
    expect_pair_row = torch.full((R,), -1, dtype=torch.long, device="cuda")
    expect_pair_row[order] = torch.arange(n, device="cuda")
    assert_bitwise_equal(pair_row.long(), expect_pair_row, "pair_row")

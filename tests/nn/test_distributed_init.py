"""Large-model initialisation of mok.MoE: meta-device construction (nothing allocated or drawn) and
`reset_parameters`, which gives the same global layer whatever part of it a rank holds
(the multi-process cases, DTensor and FSDP2 shards, are in test_distributed_moe.py)."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import mok
from mok.testing.bits import assert_bitwise_equal
from mok.nn import _init


def _old_draw(H, I, E, S, generator):
    """What mok.MoE drew before sharding-aware init: one CPU randn per full weight, in order."""
    shapes = [((E, H), H), ((E, I, H), H), ((E, I, H), H), ((E, H, I), I)]
    if S:
        shapes += [((S, H), H), ((S, H), H), ((H, S), S)]
    return [torch.randn(*shape, generator=generator) * fan_in**-0.5 for shape, fan_in in shapes]


class _RealElements(TorchDispatchMode):
    """Counts the elements of every tensor an op makes off the meta device (what construction allocates)."""

    def __init__(self):
        super().__init__()
        self.count, self.ops = 0, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and not t.is_meta:
                self.count += t.numel()
                self.ops.append(f"{func}{tuple(t.shape)}")
        return out


def test_meta_construction_of_a_large_layer_allocates_nothing():
    mok.MoE(8, 8, 2, 1, device="meta")  # first use imports mok.nn
    with _RealElements() as real:
        m = mok.MoE(2048, 768, 128, 8, device="meta")  # 604 M parameters: 2.4 GB in fp32 if materialised
    assert real.count == 0, f"construction made {real.count} real elements: {real.ops[:5]}"
    with _RealElements() as control:  # the counter sees a CPU construction's parameters (not vacuous)
        mok.MoE(16, 8, 4, 2)
    assert control.count >= 4 * 16 + 3 * 4 * 8 * 16, control.count
    assert all(p.is_meta for p in m.parameters())
    assert sum(p.numel() for p in m.parameters()) == 128 * 2048 + 3 * 128 * 768 * 2048
    assert m.backend_in_use == "reference"  # re-chosen after to_empty on the real device


@pytest.mark.parametrize("H, I, E, S, chunk", [
    (16, 8, 4, 8, 1 << 22),   # each weight in one call
    (16, 8, 8, 8, 256),       # experts in 4 chunks of 2 (128 values a row)
    (6, 5, 20, 3, 64),        # rows of 6 / 30 values: chunks of 8 rows, last chunk not a multiple of 16 values
    (4, 2, 5, 0, 16),         # a last chunk under 16 values, drawn with the chunk before it; no shared expert
    (2, 1, 3, 1, 1 << 22),    # weights under 16 values (CPU randn's scalar path)
])
def test_cpu_generator_gives_the_values_of_one_full_draw(H, I, E, S, chunk, monkeypatch):
    monkeypatch.setattr(_init, "_CHUNK", chunk)
    m = mok.MoE(H, I, E, 1, shared_intermediate_size=S, device="meta").to_empty(device="cpu")
    m.reset_parameters(torch.Generator().manual_seed(7))
    old = _old_draw(H, I, E, S, torch.Generator().manual_seed(7))
    # the same values, each gate/up pair in its one [gate; up] parameter
    want = [old[0], torch.cat(old[1:3], 1), old[3]] + ([torch.cat(old[4:6]), old[6]] if S else [])
    for (n, p), w in zip(m.named_parameters(), want, strict=True):
        assert_bitwise_equal(p.detach(), w, n)


def test_meta_then_reset_equals_eager_construction():
    torch.manual_seed(3)
    eager = mok.MoE(16, 8, 4, 2, shared_intermediate_size=8, dtype=torch.bfloat16)
    lazy = mok.MoE(16, 8, 4, 2, shared_intermediate_size=8, dtype=torch.bfloat16, device="meta")
    lazy.to_empty(device="cpu")
    torch.manual_seed(3)
    lazy.reset_parameters()
    for (n, p), q in zip(eager.named_parameters(), lazy.parameters(), strict=True):
        assert_bitwise_equal(q.detach(), p.detach(), n)


def _fill(shape, rows, per_expert, seed, experts=True, slot=1):
    """Rows `rows` of the global weight `shape` as a rank holding only them computes them."""
    src = _init.Source(torch.Generator().manual_seed(seed), torch.device("cpu"), per_expert=per_expert)
    out = torch.empty(len(rows), *shape[1:])
    src.fill(out, shape, shape[-1], slot, experts=experts, row_offset=rows.start)
    return out


@pytest.mark.parametrize("per_expert", [
    False,  # the CPU stream (every rank replays all of it)
    True,   # per-expert seeds (the path a CUDA generator takes; each rank draws only its experts)
])
@pytest.mark.parametrize("experts", [True, False])  # routed experts (one seed each) / a dense weight
def test_any_rows_a_rank_holds_are_rows_of_the_same_global_weight(per_expert, experts):
    shape = (8, 6, 16)
    full = _fill(shape, range(8), per_expert, seed=0, experts=experts)
    for W in (2, 4, 8):
        L = 8 // W
        parts = [_fill(shape, range(r * L, (r + 1) * L), per_expert, seed=0, experts=experts) for r in range(W)]
        assert_bitwise_equal(torch.cat(parts), full, f"W={W}")
    assert not torch.equal(_fill(shape, range(8), per_expert, seed=1, experts=experts), full)  # the seed matters
    assert full.std().item() == pytest.approx(16**-0.5, rel=0.2)  # 1 / sqrt(fan_in)


def test_per_expert_draws_do_not_depend_on_the_other_weights():
    a = _fill((4, 3, 16), range(4), True, seed=5, slot=1)
    b = _fill((4, 3, 16), range(4), True, seed=5, slot=2)  # another weight: other values
    assert not torch.equal(a, b)
    assert_bitwise_equal(_fill((4, 3, 16), range(2, 3), True, seed=5, slot=1), a[2:3], "expert 2 alone")


@pytest.mark.gpu
def test_cuda_generator_draws_on_the_device_deterministically():
    def make():
        m = mok.MoE(64, 32, 8, 2, shared_intermediate_size=32, device="meta").to_empty(device="cuda")
        m.reset_parameters(torch.Generator(device="cuda").manual_seed(0))
        return m

    a, b = make(), make()
    for (n, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        assert p.is_cuda
        assert_bitwise_equal(q.detach(), p.detach(), n)
    cpu = mok.MoE(64, 32, 8, 2, shared_intermediate_size=32, device="meta").to_empty(device="cuda")
    with pytest.raises(ValueError, match="generator: expected a CPU generator or one on the parameters' device"):
        cpu.cpu().reset_parameters(torch.Generator(device="cuda"))

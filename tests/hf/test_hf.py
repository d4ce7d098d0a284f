"""Conversion from and to transformers' Qwen3-MoE sparse block, and the accuracy rule against it.

Rule (docs/determinism.md's 2x rule, applied to HF): against a float64 evaluation of the same block (bf16-valued weights and
input widened to float64), mok's relative error (‖a − ref‖ / ‖ref‖) is at most twice that of the
transformers block run in bf16, for y, d_x and every weight gradient.
"""

import copy

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")
from transformers import Qwen3MoeConfig  # noqa: E402
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock  # noqa: E402

import mok  # noqa: E402
from mok.testing.bits import assert_bitwise_equal, rel_error  # noqa: E402
from mok.hf import from_hf_qwen3_moe, to_hf_qwen3_moe  # noqa: E402


def _hf_block(H=64, I=32, E=8, K=2, normalize=True, seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    cfg = Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=I, num_experts=E, num_experts_per_tok=K,
                         norm_topk_prob=normalize)
    block = Qwen3MoeSparseMoeBlock(cfg)
    with torch.no_grad():
        for p in block.parameters():  # HF leaves the 3-D expert weights uninitialised
            p.normal_(0.0, p.shape[-1] ** -0.5)
    return block.to(dtype)


@pytest.mark.parametrize("dtype", [
    torch.float32,   # fp32 master weights kept as they are
    torch.bfloat16,  # bf16 weights, the layer's compute dtype
])
def test_hf_to_mok_to_hf_round_trip_is_bitwise(dtype):
    block = _hf_block(dtype=dtype)
    m = from_hf_qwen3_moe(block)
    assert m.w_gate_LIH.dtype == dtype and m.top_k == 2 and m.normalize and m.shared_intermediate_size == 0
    back = to_hf_qwen3_moe(m)
    ref = block.state_dict()
    assert back.state_dict().keys() == ref.keys()
    for k, v in back.state_dict().items():
        assert_bitwise_equal(v, ref[k], k)


def test_mok_to_hf_to_mok_round_trip_is_bitwise():
    torch.manual_seed(0)
    m = mok.MoE(32, 16, 4, 2, normalize=False)
    m2 = from_hf_qwen3_moe(to_hf_qwen3_moe(m))
    assert not m2.normalize
    for (n, a), b in zip(m.named_parameters(), m2.parameters(), strict=True):
        assert_bitwise_equal(b, a, n)


def test_gate_and_up_halves_are_not_swapped():
    block = _hf_block()
    m = from_hf_qwen3_moe(block)
    I = m.intermediate_size
    assert_bitwise_equal(m.w_gate_LIH, block.experts.gate_up_proj.detach()[:, :I], "gate = first I rows")
    assert_bitwise_equal(m.w_up_LIH, block.experts.gate_up_proj.detach()[:, I:], "up = last I rows")


def _run(block_or_moe, x, dy):
    x = x.detach().clone().requires_grad_()
    y = block_or_moe(x)
    y.backward(dy.to(y.dtype))
    return y, x.grad


@pytest.mark.parametrize("H, I, E, K, normalize, seed", [
    (64, 32, 8, 2, True, 0),    # Qwen3-style: normalised top-k
    (64, 32, 8, 2, False, 1),   # raw softmax weights
    (96, 48, 16, 4, True, 2),   # more experts, K = 4
    (48, 24, 4, 1, True, 3),    # K = 1
])
def test_mok_matches_hf_within_twice_hf_bf16_error(H, I, E, K, normalize, seed):
    b16 = _hf_block(H, I, E, K, normalize, seed, dtype=torch.bfloat16)
    b64 = copy.deepcopy(b16).to(torch.float64)
    m = from_hf_qwen3_moe(b16, dtype=torch.float32)  # fp32 master copy of the same bf16 values
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 20, H, generator=g).to(torch.bfloat16)
    dy = torch.randn(3, 20, H, generator=g, dtype=torch.float64)
    y64, dx64 = _run(b64, x.double(), dy)
    y_hf, dx_hf = _run(b16, x, dy)
    y_mok, dx_mok = _run(m, x, dy)
    pairs = {
        "y": (y_mok, y_hf, y64),
        "d_x": (dx_mok, dx_hf, dx64),
        "d_router": (m.w_router_EH.grad, b16.gate.weight.grad, b64.gate.weight.grad),
        "d_gate": (m.w_gate_up_L2IH.grad[:, :I], b16.experts.gate_up_proj.grad[:, :I], b64.experts.gate_up_proj.grad[:, :I]),
        "d_up": (m.w_gate_up_L2IH.grad[:, I:], b16.experts.gate_up_proj.grad[:, I:], b64.experts.gate_up_proj.grad[:, I:]),
        "d_down": (m.w_down_LHI.grad, b16.experts.down_proj.grad, b64.experts.down_proj.grad),
    }
    for name, (ours, hf, ref) in pairs.items():
        e_mok, e_hf = rel_error(ours, ref), rel_error(hf, ref)
        assert e_hf > 0, name  # the bf16 block is really inexact, so the rule is not vacuous
        assert e_mok <= 2 * e_hf, f"{name}: mok error {e_mok:.3g} > 2 x HF bf16 error {e_hf:.3g}"


@pytest.mark.parametrize("kw, msg", [
    (dict(shared_intermediate_size=8), "moe.shared_intermediate_size: expected 0"),  # Qwen3 has no shared expert
    (dict(score="sigmoid"), "moe.score: expected 'softmax'"),                        # Qwen3 routes by softmax only
])
def test_to_hf_refuses_what_qwen3_cannot_hold(kw, msg):
    with pytest.raises(ValueError, match=msg):
        to_hf_qwen3_moe(mok.MoE(16, 8, 4, 2, **kw))


def test_from_hf_rejects_other_modules():
    with pytest.raises(TypeError, match="block: expected a Qwen3MoeSparseMoeBlock"):
        from_hf_qwen3_moe(nn.Linear(4, 4))


class _LegacyExpert(nn.Module):
    def __init__(self, H, I):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(H, I, bias=False), nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)


class _LegacyBlock(nn.Module):
    """The transformers 4.x layout (per-expert modules, gate an nn.Linear)."""

    def __init__(self, H=16, I=8, E=4, K=2):
        super().__init__()
        self.num_experts, self.top_k, self.norm_topk_prob = E, K, False
        self.gate = nn.Linear(H, E, bias=False)
        self.experts = nn.ModuleList(_LegacyExpert(H, I) for _ in range(E))


def test_from_hf_reads_the_legacy_per_expert_layout():
    torch.manual_seed(0)
    block = _LegacyBlock()
    m = from_hf_qwen3_moe(block)
    assert (m.num_experts, m.top_k, m.intermediate_size, m.normalize) == (4, 2, 8, False)
    for e in range(4):
        assert_bitwise_equal(m.w_gate_LIH[e], block.experts[e].gate_proj.weight, f"gate {e}")
        assert_bitwise_equal(m.w_up_LIH[e], block.experts[e].up_proj.weight, f"up {e}")
        assert_bitwise_equal(m.w_down_LHI[e], block.experts[e].down_proj.weight, f"down {e}")
    assert_bitwise_equal(m.w_router_EH, block.gate.weight, "router")


@pytest.mark.parametrize("value", [
    "false",  # a string from a hand-edited config: bool("false") is True
    None,     # missing: bool(None) would silently mean False
    1,        # an int, not a bool
])
@pytest.mark.parametrize("legacy", [
    False,  # transformers 5: block.gate.norm_topk_prob
    True,   # transformers 4.x: block.norm_topk_prob
])
def test_from_hf_norm_topk_prob_must_be_a_bool(value, legacy):
    block = _LegacyBlock() if legacy else _hf_block(16, 8, 4, 2)
    setattr(block if legacy else block.gate, "norm_topk_prob", value)
    where = "block" if legacy else "block.gate"
    with pytest.raises(TypeError, match=f"^{where}.norm_topk_prob: expected a bool, got {value!r}"):
        from_hf_qwen3_moe(block)


def _cut(block, name, index):
    owner, attr = (block.gate, "weight") if name == "gate.weight" else (block.experts, name)
    setattr(owner, attr, nn.Parameter(getattr(owner, attr).detach()[index].clone()))
    return block


@pytest.mark.parametrize("edit, starts", [
    # a router for 3 experts against 4
    (lambda b: _cut(b, "gate.weight", slice(0, 3)), "block.experts.gate_up_proj: expected [E, 2I, H] = [3, 2I, 16]"),
    # an odd number of gate + up rows: no I splits them
    (lambda b: _cut(b, "gate_up_proj", (slice(None), slice(0, 15))), "block.experts.gate_up_proj: expected"),
    # down_proj for I = 4 against gate_up_proj's I = 8
    (lambda b: _cut(b, "down_proj", (Ellipsis, slice(0, 4))),
     "block.experts.down_proj: expected [E, H, I] = [4, 16, 8]"),
    # down_proj for H = 8 against the router's H = 16
    (lambda b: _cut(b, "down_proj", (slice(None), slice(0, 8))), "block.experts.down_proj: expected"),
    # gate_up_proj with another hidden size than the router
    (lambda b: _cut(b, "gate_up_proj", (Ellipsis, slice(0, 8))), "block.experts.gate_up_proj: expected"),
    # a router weight that is not a matrix
    (lambda b: _cut(b, "gate.weight", 0), "block.gate.weight: expected [E, H] (2 dimensions)"),
])
def test_from_hf_refuses_inconsistent_shapes_naming_the_tensor(edit, starts):
    block = edit(_hf_block(16, 8, 4, 2))
    for call in (from_hf_qwen3_moe, mok.hf.hf_expert_weights):
        with pytest.raises(ValueError) as e:
            call(block)
        assert str(e.value).startswith(starts), str(e.value)


@pytest.mark.parametrize("edit, starts", [
    # a 5th expert's weights against a router for 4
    (lambda b: b.experts.append(_LegacyExpert(16, 8)), "block.experts: expected E = 4 experts"),
    # expert 2's up_proj for I = 4 against expert 0's I = 8
    (lambda b: setattr(b.experts[2], "up_proj", nn.Linear(16, 4, bias=False)),
     "block.experts[2].up_proj.weight: expected [8, 16]"),
    # expert 1's down_proj for H = 12 against the router's H = 16
    (lambda b: setattr(b.experts[1], "down_proj", nn.Linear(8, 12, bias=False)),
     "block.experts[1].down_proj.weight: expected [16, 8]"),
])
def test_from_hf_refuses_inconsistent_legacy_shapes_naming_the_tensor(edit, starts):
    block = _LegacyBlock()
    edit(block)
    with pytest.raises(ValueError) as e:
        from_hf_qwen3_moe(block)
    assert str(e.value).startswith(starts), str(e.value)


@pytest.mark.parametrize("moe, kw, starts", [
    (None, {}, "moe: expected a mok.MoE, got NoneType"),             # nothing given
    (nn.Linear(2, 2), {}, "moe: expected a mok.MoE, got Linear"),    # another module
    ("mok", {"dtype": torch.int64}, "dtype: expected None or a floating torch.dtype"),  # an integer block dtype
    ("mok", {"dtype": "bfloat16"}, "dtype: expected None or a floating torch.dtype"),   # a name, not a dtype
])
def test_to_hf_refuses_bad_arguments_naming_them(moe, kw, starts):
    moe = mok.MoE(16, 8, 4, 2) if moe == "mok" else moe
    with pytest.raises(TypeError) as e:
        to_hf_qwen3_moe(moe, **kw)
    assert str(e.value).startswith(starts), str(e.value)

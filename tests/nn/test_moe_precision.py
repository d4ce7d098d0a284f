"""mok.MoE and the custom ops take the layer's recipe (`precision`, docs/numerics.md "FP8 recipe"): "fp8" gives the
reference's fp8 layer bit for bit (eager and through the registered ops, recompute or not), and a bad value raises
naming the argument. CPU, reference backend."""
import pytest
import torch

import mok
import mok.reference
from mok.nn import _op_common, ops
from mok.testing.bits import assert_bitwise_equal


def _layer(precision: str, recompute: bool = False) -> mok.MoE:
    torch.manual_seed(0)
    return mok.MoE(64, 40, 4, 2, shared_intermediate_size=16, backend="reference", precision=precision,
                   recompute=recompute, dtype=torch.bfloat16)


@pytest.mark.parametrize("eager", [True, False])
@pytest.mark.parametrize("recompute", [False, True])
def test_fp8_module_is_the_reference_fp8_layer(monkeypatch, eager, recompute):
    monkeypatch.setattr(_op_common, "_EAGER", eager)
    m = _layer("fp8", recompute)
    x = torch.randn(12, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16).requires_grad_(True)
    r = m.route(x)
    y = m.compute_experts(x, r.topk_idx, r.topk_weight.detach())  # x.grad: the layer's d_x alone
    dy = torch.randn(12, 64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    y.backward(dy)
    gate, up = m.w_gate_up_L2IH.detach().chunk(2, dim=1)
    sg, su = m.w_shared_gate_up_2SH.detach().chunk(2, dim=0)
    ref_y, ctx = mok.reference.forward(x.detach(), r.topk_idx, r.topk_weight.detach(), sg, su,
                                       m.w_shared_down_HS.detach(), gate, up, m.w_down_LHI.detach(), precision="fp8")
    ref = mok.reference.backward(ctx, dy)
    assert_bitwise_equal(y.detach(), ref_y, "y")
    assert_bitwise_equal(x.grad, ref[0], "d_x")
    assert_bitwise_equal(m.w_down_LHI.grad, ref[4].to(torch.bfloat16), "d_routed_down")


def test_fp8_differs_from_bf16():
    x = torch.randn(12, 64, generator=torch.Generator().manual_seed(1))
    assert not torch.equal(_layer("fp8")(x), _layer("bf16")(x))


@pytest.mark.parametrize("bad", ["fp16", "FP8", None])
def test_a_bad_precision_is_named(bad):
    with pytest.raises(ValueError, match=r"^precision: expected one of \('bf16', 'fp8'\)"):
        _layer(bad)
    w = torch.zeros(2, 8, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"^precision: expected one of"):
        ops.moe(torch.zeros(3, 8, dtype=torch.bfloat16), torch.zeros(3, 1, dtype=torch.long), torch.ones(3, 1),
                None, None, None, w, w, w, precision=bad)

"""Gate and up as the two halves of one [gate; up] tensor (mok/fast/_checks.py `stacked_gate_up`): which
pairs of tensors are recognised, and that mok.nn.ops rounds float32 gate/up pairs into such a tensor and
transformers' fused gate_up_proj reaches the layer as one, so the fast path's backward concatenates
nothing; and which pairs the fused gate/up GEMM reads as two tensors (`gate_up_halves`) and what the binding
refuses there. The kernels reading them are tested in tests/fast/test_ep_emulated.py (CPU stand-ins),
tests/gpu/test_fast_determinism.py (bits: test_gate_up_halves_of_one_tensor_give_the_separate_tensors_bits) and
tests/gpu/test_fast_fused_fwd.py (two tensors against one)."""
import pytest
import torch

from mok.fast import _lib
from mok.fast._checks import gate_up_halves, stacked_gate_up
from mok.testing.cases import two_gate_up_tensors
from mok.nn import ops

L, I, H, S = 3, 8, 16, 8


def _w(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("make", [
    lambda: _w(L, 2 * I, H).chunk(2, dim=1),                       # routed: transformers' gate_up_proj halves
    lambda: (lambda w: (w[:, :I], w[:, I:]))(_w(L, 2 * I, H)),     # the same by slicing
    lambda: _w(2 * S, H).chunk(2),                                  # shared: [2S, H] halves (each contiguous)
    lambda: _w(1, 2 * I, H).chunk(2, dim=1),                        # one expert
    lambda: (lambda w: (w[1:, :I], w[1:, I:]))(_w(L, 2 * I, H)),    # an expert-sharded slice of it
])
def test_halves_of_one_tensor_are_recognised(make):
    gate, up = make()
    both = stacked_gate_up(gate, up)
    assert both is not None and both.is_contiguous()
    assert both.data_ptr() == gate.data_ptr()  # a view: nothing copied
    assert torch.equal(both, torch.cat([gate, up], dim=gate.dim() - 2))


@pytest.mark.parametrize("make", [
    lambda: (_w(L, I, H), _w(L, I, H)),                             # two tensors
    lambda: tuple(reversed(_w(L, 2 * I, H).chunk(2, dim=1))),       # up rows first
    lambda: (lambda w: (w[:, 0::2], w[:, 1::2]))(_w(L, 2 * I, H)),  # interleaved rows
    lambda: (lambda w: (w[:, :I - 1], w[:, I:2 * I - 1]))(_w(L, 2 * I, H)),  # not adjacent
    lambda: _w(L, H, 2 * I).transpose(1, 2).chunk(2, dim=1),        # transposed storage
    lambda: (lambda w: (w[:, :I], w[:, I:].to(torch.bfloat16)))(_w(L, 2 * I, H)),  # dtypes differ
    lambda: (_w(S, H), None),                                       # no up
])
def test_other_pairs_are_not(make):
    assert stacked_gate_up(*make()) is None


def test_the_op_rounds_float32_gate_up_pairs_into_one_tensor():
    """What `mok.nn.ops.moe_fwd` hands the backend and saves for backward: halves of one bf16 tensor."""
    tensors = [_w(5, H), _w(S, H), _w(S, H), _w(H, S), _w(L, I, H), _w(L, I, H), _w(L, H, I)]
    plan = ops._layer_plan(tensors)
    casts = ops._casts(tensors, plan)
    x16, sg, su, sd, rg, ru, rd = ops._with_casts(tensors, plan, casts)
    assert len(casts) == 5  # x, [sg; su], sd, [rg; ru], rd
    for got, t in zip((x16, sg, su, sd, rg, ru, rd), tensors, strict=True):
        assert got.dtype == torch.bfloat16 and torch.equal(got, t.to(torch.bfloat16))
    assert stacked_gate_up(rg, ru) is not None and stacked_gate_up(sg, su) is not None


def test_one_stacked_float32_tensor_is_rounded_as_one():
    """`mok.nn.ops.moe_gate_up` (and mok.MoE): a float32 [gate; up] tensor is one cast, whose halves the backend gets."""
    tensors = [_w(5, H), _w(2 * S, H), None, _w(H, S), _w(L, 2 * I, H), None, _w(L, H, I)]
    plan = ops._layer_plan(tensors)
    casts = ops._casts(tensors, plan)
    assert len(casts) == 5 and [tuple(c.shape) for c in casts][1::2] == [(2 * S, H), (L, 2 * I, H)]
    x16, sgu, _, sd, rgu, _, rd = ops._with_casts(tensors, plan, casts)
    for half in (ops._halves(sgu, None), ops._halves(rgu, None)):
        assert stacked_gate_up(*half) is not None


def test_bf16_halves_pass_through_the_op_as_they_are():
    gate, up = _w(L, 2 * I, H).to(torch.bfloat16).chunk(2, dim=1)
    tensors = [_w(5, H).to(torch.bfloat16), None, None, None, gate, up, _w(L, H, I).to(torch.bfloat16)]
    assert ops._layer_plan(tensors) == []  # nothing rounded, nothing copied


def test_transformers_gate_up_proj_reaches_the_layer_as_one_tensor(monkeypatch):
    pytest.importorskip("transformers")
    from mok.hf import experts as hf_experts

    seen = {}

    def spy(x, idx, w, sgu, sd, rgu, rd, **kw):
        seen["stacked"] = stacked_gate_up(*rgu.chunk(2, dim=1))
        return torch.zeros_like(x, dtype=torch.bfloat16)

    monkeypatch.setattr(hf_experts.ops, "moe_gate_up", spy)
    for transposed, concatenated in ((False, True), (True, True), (False, False)):
        mod = torch.nn.Module()
        w = _w(L, H, 2 * I) if transposed else _w(L, 2 * I, H)
        mod.gate_up_proj = torch.nn.Parameter(w.to(torch.bfloat16))
        mod.down_proj = torch.nn.Parameter((_w(L, I, H) if transposed else _w(L, H, I)).to(torch.bfloat16))
        mod.is_transposed, mod.is_concatenated, mod.num_experts = transposed, concatenated, L
        monkeypatch.setattr(hf_experts, "check", lambda m: None)
        monkeypatch.setattr(hf_experts, "_pick", lambda *a: "reference")
        fwd = hf_experts.make_experts_forward("reference")
        fwd(mod, _w(4, H).to(torch.bfloat16), torch.tensor([[0, 1]] * 4), torch.full((4, 2), 0.5))
        assert seen["stacked"] is not None, (transposed, concatenated)
        if not transposed and concatenated:  # stored so: the parameter itself, no copy
            assert seen["stacked"].data_ptr() == mod.gate_up_proj.data_ptr()


def _apart(n_gap: int, up_first: bool, *shape):
    """gate and up, two contiguous bf16 tensors of `shape` in one buffer, n_gap elements between them."""
    n = torch.Size(shape).numel()
    flat = torch.zeros(2 * n + n_gap, dtype=torch.bfloat16)
    first, second = flat[:n].view(shape), flat[n + n_gap:].view(shape)
    return (second, first) if up_first else (first, second)


@pytest.mark.parametrize("make, stacked", [
    (lambda: _w(L, 2 * I, H).to(torch.bfloat16).chunk(2, dim=1), True),   # halves of one tensor: b = [gate; up]
    (lambda: (_w(L, I, H), _w(L, I, H)), False),                         # two tensors
    (lambda: _apart(8, False, L, I, H), False),                          # 16 bytes apart, no whole rows
    (lambda: _apart(8, True, L, I, H), False),                           # up first in memory
    (lambda: _apart(8, False, S, H), False),                             # shared: [S, H] each
    (lambda: two_gate_up_tensors(*_w(2, L, I, H).to(torch.bfloat16), True), False),  # the GPU tests' helper
])
def test_pairs_the_fused_gate_up_gemm_reads(make, stacked):
    gate, up = make()
    b, b_up, expert_stride = gate_up_halves(gate, up)
    if stacked:
        assert b_up is None and b.data_ptr() == gate.data_ptr() and expert_stride == 2 * I * H
    else:
        assert b is gate and b_up is up and expert_stride == (I * H if gate.dim() == 3 else 0)


@pytest.mark.parametrize("make", [
    lambda: _apart(4, False, L, I, H),                              # 8 bytes apart: no TMA stride
    lambda: (lambda w: (w, w))(_w(L, I, H)),                        # one tensor twice
    lambda: (lambda w: (w[:, 0::2], w[:, 1::2]))(_w(L, 2 * I, H)),  # interleaved rows: not contiguous
    lambda: tuple(reversed(_w(L, 2 * I, H).chunk(2, dim=1))),       # up rows first in one tensor: strided halves
    lambda: (_w(L, I, H), _w(L, I, H + 8)),                         # shapes differ
    lambda: (_w(L, I, H), _w(L, I, H).to(torch.bfloat16)),          # dtypes differ
    lambda: (_w(S, H), None),                                       # no up
])
def test_pairs_it_does_not(make):
    assert gate_up_halves(*make()) is None


def _fused_segment(b_up, kind=_lib.GEMM_TN_SWIGLU_FWD):
    x, w = torch.zeros(4, H, dtype=torch.bfloat16), torch.zeros(2 * I, H, dtype=torch.bfloat16)
    d, a = torch.zeros(4, 2 * I), torch.zeros(4, I, dtype=torch.bfloat16)
    fused = kind == _lib.GEMM_TN_SWIGLU_FWD
    return _lib.Segment.all_rows(4, 2 * I, H, _lib.Operand(x, 0, 0, H), _lib.Operand(w, 0, 0, H),
                                 _lib.Operand(d, 0, 0, 2 * I), aux=_lib.Operand(a, 0, 0, I) if fused else None,
                                 b_up=b_up(w))


@pytest.mark.parametrize("b_up, kind, match", [
    (lambda w: _lib.Operand(w, 0, 0, H, offset=I * H), _lib.GEMM_TN_F32, "only for GEMM kind"),  # no up rows elsewhere
    (lambda w: _lib.Operand(w, 0, 0, H + 8, offset=I * H), _lib.GEMM_TN_SWIGLU_FWD, "ld"),       # another row stride
    (lambda w: _lib.Operand(w, 1, 0, H, offset=I * H), _lib.GEMM_TN_SWIGLU_FWD, "expert_stride"),
    (lambda w: _lib.Operand(w, 0, 0, H, offset=4), _lib.GEMM_TN_SWIGLU_FWD, "16 bytes"),          # 8 bytes apart
    (lambda w: _lib.Operand(w, 0, 0, H), _lib.GEMM_TN_SWIGLU_FWD, "nonzero"),                     # the gate rows again
])
def test_the_binding_refuses_b_up_the_kernel_cannot_read(mok_binding, b_up, kind, match):
    with pytest.raises(ValueError, match=match):
        _lib.check_segments(kind, [_fused_segment(b_up, kind)], torch.device("cpu"), 0)


@pytest.mark.parametrize("make, want", [
    (lambda: _w(L, 128, H).to(torch.bfloat16).chunk(2, dim=1), "stacked"),  # halves of one tensor: read as it is
    (lambda: _apart(8, True, L, 64, H), "apart"),                           # two tensors, I = 64: read apart
    (lambda: _apart(8, False, L, 72, H), "concat"),                         # I = 72: a K tile would straddle them
    (lambda: (lambda w: (w[:, 0::2], w[:, 1::2]))(_w(L, 128, H)), "concat"),  # strided views
    (lambda: (None, None), "none"),                                          # no shared expert
])
def test_how_the_d_x_gemm_reads_each_pair(make, want):
    from mok.fast._backward import dx_reads

    gate, up = make()
    got = dx_reads(gate, up)
    if want == "stacked":
        assert got[1] is None and got[0].data_ptr() == gate.data_ptr() and got[0].shape[-2] == 2 * gate.shape[-2]
    elif want == "apart":
        assert got[0] is gate and got[1] is up
    elif want == "concat":
        assert got is None
    else:
        assert got == (None, None)

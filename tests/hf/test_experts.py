"""mok inside unmodified transformers MoE models: `experts_implementation="mok"` (`mok.hf.experts`).

Tiny random models of each supported family are built from configs (nothing downloaded). Checked:
- the 2x rule: against a float64 evaluation of the same model (bf16-valued weights and inputs widened to
  float64), mok's relative error (‖a − ref‖ / ‖ref‖) is at most twice that of the model run in bf16 with
  transformers' default experts implementation, for the output and every gradient. Per MoE block (bf16
  and fp32 master weights), and for a whole one-MoE-layer model (logits and every parameter's gradient).
  With two or more MoE layers the rule is not a meaningful per-tensor test: a token whose top-k is a
  near-tie in layer 2 may pick another expert after equally accurate but different rounding in layer 1,
  a discontinuity of either run; the two-layer models check the rest below;
- mok really runs (once per MoE layer), HF's router and aux loss are untouched (output_router_logits),
  the checkpoint that save_pretrained writes is the one transformers writes, and it reloads bitwise;
- transformers' expert-parallel sentinels (ids >= num_experts, weight 0) add nothing and get no gradient;
- transposed and interleaved gate_up layouts; refusals naming what mok does not compute (GPT-OSS, GELU).
"""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import (AutoModelForCausalLM, DeepseekV3Config, GptOssConfig, MixtralConfig,  # noqa: E402
                          OlmoeConfig, Qwen2MoeConfig, Qwen3MoeConfig)
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, use_experts_implementation  # noqa: E402

import mok.hf  # noqa: E402  (registers "mok")
from mok.testing.bits import assert_bitwise_equal, rel_error  # noqa: E402
from mok.nn import ops  # noqa: E402

H, V = 64, 128


def _config(family: str, layers: int = 2, **kw):
    """A tiny config of `family`: H = 64, 8 experts, top-2, `layers` decoder layers (all MoE)."""
    common = dict(vocab_size=V, hidden_size=H, num_hidden_layers=layers, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, bos_token_id=0, eos_token_id=1, pad_token_id=2)
    common.update(kw)
    if family == "qwen3_moe":
        return Qwen3MoeConfig(**common, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                              norm_topk_prob=True, head_dim=16)
    if family == "qwen2_moe":
        return Qwen2MoeConfig(**common, moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=8,
                              num_experts_per_tok=2)
    if family == "mixtral":
        return MixtralConfig(**common, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2)
    if family == "olmoe":
        return OlmoeConfig(**common, intermediate_size=32, num_experts=8, num_experts_per_tok=2)
    if family == "deepseek_v3":
        return DeepseekV3Config(**common, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2,
                                n_group=2, topk_group=1, n_shared_experts=1, first_k_dense_replace=0,
                                routed_scaling_factor=2.5, q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=8,
                                qk_nope_head_dim=8, v_head_dim=16,
                                rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    if family == "gpt_oss":
        return GptOssConfig(**common, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2, head_dim=16)
    raise ValueError(family)


FAMILIES = [
    "qwen3_moe",    # softmax top-k, renormalised
    "qwen2_moe",    # + shared expert with a sigmoid gate (computed by HF)
    "mixtral",      # softmax top-k in fp32, renormalised
    "olmoe",        # softmax top-k, not renormalised
    "deepseek_v3",  # sigmoid + score-correction bias, group-limited top-k, scaling factor, shared expert (HF)
]
HAS_AUX_LOSS = {"qwen3_moe", "qwen2_moe", "mixtral", "olmoe"}


def _model(family, layers=2, seed=0):
    """fp32 model with every matrix ~ N(0, 1/fan_in) (HF's 0.02 makes routing a near-tie everywhere)."""
    torch.manual_seed(seed)
    m = AutoModelForCausalLM.from_config(_config(family, layers))
    with torch.no_grad():
        for n, p in m.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, p.shape[-1] ** -0.5)
    return m


def _ids(seed=1, B=2, S=16):
    return torch.randint(3, V, (B, S), generator=torch.Generator().manual_seed(seed))


def _check_rule(results: dict):
    """results: name -> (mok, hf bf16, float64). The 2x rule, and HF's bf16 run really is inexact."""
    for name, (ours, hf, ref) in results.items():
        e_mok, e_hf = rel_error(ours, ref), rel_error(hf, ref)
        assert e_hf > 0, name
        assert e_mok <= 2 * e_hf, f"{name}: mok error {e_mok:.3g} > 2 x HF bf16 error {e_hf:.3g}"


def _set(module, impl):
    module.config._experts_implementation = impl
    return module


# ---------------------------------------------------------------- the 2x rule


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", [
    torch.bfloat16,  # the same bf16 block as HF's run
    torch.float32,   # fp32 master weights holding the same bf16 values (fp32 gradients)
])
def test_block_within_twice_hf_bf16_error(family, dtype):
    block = _model(family, layers=1).model.layers[0].mlp
    b16 = copy.deepcopy(block).to(torch.bfloat16)
    runs = {"hf": (b16, torch.bfloat16, None), "f64": (copy.deepcopy(b16).double(), torch.float64, "eager"),
            "mok": (copy.deepcopy(b16).to(dtype), dtype, "mok")}
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 24, H, generator=g).bfloat16()
    dy = torch.randn(2, 24, H, generator=g, dtype=torch.float64)
    out = {}
    for key, (blk, dt, impl) in runs.items():
        if impl:
            _set(blk.experts, impl)
        xi = x.to(dt).detach().clone().requires_grad_()
        y = blk(xi)
        y.backward(dy.to(y.dtype))
        out[key] = (y, xi.grad, {n: p.grad for n, p in blk.named_parameters()})
    assert b16.experts.config._experts_implementation == "grouped_mm"  # HF's default
    order = ("mok", "hf", "f64")
    results = {"y": tuple(out[k][0] for k in order), "d_x": tuple(out[k][1] for k in order)}
    for n in out["f64"][2]:
        results[f"d_{n}"] = tuple(out[k][2][n] for k in order)
    assert all(out["mok"][2][n].dtype == dtype for n in out["mok"][2])
    _check_rule(results)


@pytest.mark.parametrize("family", FAMILIES)
def test_one_layer_model_within_twice_hf_bf16_error(family):
    m = _model(family, layers=1).to(torch.bfloat16)
    models = {"mok": copy.deepcopy(m), "hf": m, "f64": copy.deepcopy(m).double()}
    models["mok"].set_experts_implementation("mok")
    models["f64"].set_experts_implementation("eager")
    out = {}
    for key, model in models.items():
        o = model(_ids(), labels=_ids())
        o.loss.backward()
        out[key] = (o.logits, {n: p.grad for n, p in model.named_parameters()})
    results = {"logits": tuple(out[k][0] for k in ("mok", "hf", "f64"))}
    for n, g in out["f64"][1].items():
        if g is not None:
            results[f"d_{n}"] = tuple(out[k][1][n] for k in ("mok", "hf", "f64"))
    _check_rule(results)


# ---------------------------------------------------------------- inside whole models


@pytest.mark.parametrize("family", FAMILIES)
def test_two_layer_model_runs_mok_and_keeps_hf_router_and_aux_loss(family, monkeypatch):
    calls = []
    real = ops.moe_gate_up
    monkeypatch.setattr(ops, "moe_gate_up", lambda *a, **k: calls.append(a[0].shape) or real(*a, **k))
    hf = _model(family, layers=2).to(torch.bfloat16)
    ours = copy.deepcopy(hf)
    ours.set_experts_implementation("mok")
    assert mok.hf.check_model(ours) == ["model.layers.0.mlp.experts", "model.layers.1.mlp.experts"]
    aux = family in HAS_AUX_LOSS
    o_hf = hf(_ids(), labels=_ids(), output_router_logits=aux)
    assert not calls
    o = ours(_ids(), labels=_ids(), output_router_logits=aux)
    assert calls == [(32, H), (32, H)]  # one call per MoE layer, all B * S tokens
    torch.testing.assert_close(o.loss, o_hf.loss, rtol=2e-2, atol=0)  # the same model, rounded differently
    if aux:  # layer 0's router sees the same input in both runs: HF's router is untouched
        assert_bitwise_equal(o.router_logits[0], o_hf.router_logits[0], "layer 0 router logits")
        assert torch.isfinite(o.aux_loss) and o.aux_loss > 0
        torch.testing.assert_close(o.aux_loss, o_hf.aux_loss, rtol=2e-2, atol=0)
        o.aux_loss.backward(retain_graph=True)
        for layer in ours.model.layers:  # the aux loss trains every router
            assert layer.mlp.gate.weight.grad.abs().sum() > 0
        ours.zero_grad()
    o.loss.backward()
    for n, p in ours.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), n


@pytest.mark.parametrize("family", FAMILIES)
def test_save_pretrained_writes_hf_checkpoint_and_reloads_bitwise(family, tmp_path):
    from safetensors.torch import load_file

    hf = _model(family, layers=2)
    ours = copy.deepcopy(hf)
    ours.set_experts_implementation("mok")
    logits = ours(_ids()).logits
    hf.save_pretrained(tmp_path / "hf")
    ours.save_pretrained(tmp_path / "mok")
    a, b = load_file(tmp_path / "hf" / "model.safetensors"), load_file(tmp_path / "mok" / "model.safetensors")
    assert a.keys() == b.keys()  # transformers' own (hub) key names
    for k in a:
        assert_bitwise_equal(b[k], a[k], k)
    back = AutoModelForCausalLM.from_pretrained(str(tmp_path / "mok"), experts_implementation="mok")
    assert back.config._experts_implementation == "mok"
    for (n, p), q in zip(ours.state_dict().items(), back.state_dict().values(), strict=True):
        assert_bitwise_equal(q, p, n)
    assert_bitwise_equal(back(_ids()).logits, logits, "logits after reload")
    plain = AutoModelForCausalLM.from_pretrained(str(tmp_path / "mok"))  # the checkpoint does not need mok
    assert plain.config._experts_implementation != "mok"


# ---------------------------------------------------------------- expert parallelism and layouts


def _experts_call(experts, x, idx, w):
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = ALL_EXPERTS_FUNCTIONS["mok"](experts, x, idx, w)
    y.float().square().sum().backward()
    return y, x.grad, w.grad


def test_expert_parallel_sentinels_add_nothing_and_get_no_gradient():
    """transformers' AllReduceEP on one process: rank r holds experts [4r, 4r + 4); other ranks' slots come as
    id num_experts (= 4) with weight 0. The ranks' outputs sum to the unsharded layer's."""
    full = _set(_model("qwen3_moe", layers=1).model.layers[0].mlp.experts, "mok")
    g = torch.Generator().manual_seed(3)
    T = 20
    x = torch.randn(T, H, generator=g).bfloat16()
    idx = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(T)])
    w = torch.rand(T, 2, generator=g)
    y_full = ALL_EXPERTS_FUNCTIONS["mok"](full, x, idx, w)
    total = torch.zeros(T, H)
    for r in range(2):
        local = copy.deepcopy(full)
        with torch.no_grad():
            local.gate_up_proj = torch.nn.Parameter(full.gate_up_proj[4 * r : 4 * r + 4].clone())
            local.down_proj = torch.nn.Parameter(full.down_proj[4 * r : 4 * r + 4].clone())
        local.num_experts, local._is_expert_parallel = 4, True
        off = (idx // 4) != r
        y, _, d_w = _experts_call(local, x, torch.where(off, 4, idx % 4), w.masked_fill(off, 0.0))
        assert (d_w[off] == 0).all() and (d_w[~off] != 0).all()
        total += y.float()
    torch.testing.assert_close(total, y_full.float(), rtol=1e-2, atol=1e-2)  # two bf16 roundings vs one


@use_experts_implementation(is_transposed=True)
class _TransposedExperts(torch.nn.Module):
    """gate_up_proj [E, H, 2I], down_proj [E, I, H] (Aria-style)."""

    def __init__(self, config):
        super().__init__()
        self.num_experts = config.num_experts
        self.gate_up_proj = torch.nn.Parameter(torch.empty(8, H, 64))
        self.down_proj = torch.nn.Parameter(torch.empty(8, 32, H))
        self.act_fn = torch.nn.SiLU()


@use_experts_implementation(is_concatenated=False)
class _InterleavedExperts(torch.nn.Module):
    """gate_up_proj [E, 2I, H] with gate and up rows interleaved (GPT-OSS-style layout)."""

    def __init__(self, config):
        super().__init__()
        self.num_experts = config.num_experts
        self.gate_up_proj = torch.nn.Parameter(torch.empty(8, 64, H))
        self.down_proj = torch.nn.Parameter(torch.empty(8, H, 32))
        self.act_fn = torch.nn.SiLU()


@pytest.mark.parametrize("cls", [
    _TransposedExperts,   # weights stored transposed
    _InterleavedExperts,  # gate and up rows interleaved (gate0, up0, gate1, ...)
])
def test_other_weight_layouts_give_the_standard_layouts_bits(cls):
    std = _set(_model("qwen3_moe", layers=1).model.layers[0].mlp.experts, "mok")
    cfg = std.config
    other = cls(cfg)
    gu, dn = std.gate_up_proj.detach(), std.down_proj.detach()
    with torch.no_grad():
        if cls is _TransposedExperts:
            other.gate_up_proj.copy_(gu.transpose(1, 2))
            other.down_proj.copy_(dn.transpose(1, 2))
        else:
            other.gate_up_proj.copy_(torch.stack([gu[:, :32], gu[:, 32:]], dim=2).reshape(8, 64, H))
            other.down_proj.copy_(dn)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(12, H, generator=g)
    idx = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(12)])
    w = torch.rand(12, 2, generator=g)
    for a, b, name in zip(_experts_call(other, x, idx, w), _experts_call(std, x, idx, w), ("y", "d_x", "d_w"),
                          strict=True):
        assert_bitwise_equal(a, b, name)


def test_compiled_fullgraph_gives_eager_bits():
    """The experts function traces into one graph (mok's layer is an opaque custom op): same y and grads."""
    experts = _set(_model("qwen3_moe", layers=1).model.layers[0].mlp.experts, "mok").to(torch.bfloat16)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(20, H, generator=g).bfloat16()
    idx = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(20)])
    w = torch.rand(20, 2, generator=g)

    def run(fn):
        experts.zero_grad()
        xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = fn(xi, idx, wi)
        y.float().square().sum().backward()
        return y, xi.grad, wi.grad, experts.gate_up_proj.grad.clone(), experts.down_proj.grad.clone()

    eager = run(experts)
    compiled = run(torch.compile(lambda *a: experts(*a), fullgraph=True))
    for a, b, name in zip(compiled, eager, ("y", "d_x", "d_w", "d_gate_up", "d_down"), strict=True):
        assert_bitwise_equal(a, b, name)


# ---------------------------------------------------------------- refusals


def test_gpt_oss_is_refused_naming_biases_and_clamped_swiglu():
    m = AutoModelForCausalLM.from_config(_config("gpt_oss", layers=1))
    m.set_experts_implementation("mok")
    for call in (lambda: mok.hf.check_model(m), lambda: m(_ids())):
        with pytest.raises(NotImplementedError) as e:
            call()
        msg = str(e.value)
        assert "GptOssExperts" in msg and "expert biases" in msg and "clamped SwiGLU" in msg and "limit=" in msg
        assert "grouped_mm" in msg


def test_non_silu_experts_are_refused_naming_the_activation():
    m = AutoModelForCausalLM.from_config(_config("qwen3_moe", layers=1, hidden_act="gelu"))
    m.set_experts_implementation("mok")
    with pytest.raises(NotImplementedError, match="the activation GELUActivation"):
        m(_ids())


def test_register_other_settings_and_bad_arguments():
    assert mok.hf.register("mok_reference", backend="reference", recompute=True) == "mok_reference"
    m = _model("olmoe", layers=1)
    ref = copy.deepcopy(m)
    m.set_experts_implementation("mok_reference")
    ref.set_experts_implementation("mok")
    for model in (m, ref):
        model(_ids(), labels=_ids()).loss.backward()
    # recompute: the same bits; auto = reference
    for (n, p), q in zip(m.named_parameters(), ref.parameters(), strict=True):
        assert_bitwise_equal(p.grad, q.grad, n)
    with pytest.raises(ValueError, match="backend: expected one of"):
        mok.hf.register("x", backend="cuda")
    with pytest.raises(ValueError, match=r"^precision: expected one of \('bf16', 'fp8'\)"):
        mok.hf.register("x", precision="e4m3")
    with pytest.raises(TypeError, match="hidden_states: expected dtype"):
        ALL_EXPERTS_FUNCTIONS["mok"](m.model.layers[0].mlp.experts, torch.zeros(2, H, dtype=torch.float16),
                                     torch.zeros(2, 2, dtype=torch.long), torch.ones(2, 2))


def test_fp8_experts_run_the_fp8_recipe():
    """precision="fp8": the block's experts are the reference's fp8 layer (not the bf16 one), bit for bit."""
    mok.hf.register("mok_fp8", backend="reference", precision="fp8")
    experts = _model("olmoe", layers=1).model.layers[0].mlp.experts
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, H, generator=gen).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(8, generator=gen)[:2] for _ in range(6)])
    w = torch.rand(6, 2, generator=gen)
    got = ALL_EXPERTS_FUNCTIONS["mok_fp8"](experts, x, idx, w)
    gate_up, down = experts.gate_up_proj.detach().to(torch.bfloat16), experts.down_proj.detach().to(torch.bfloat16)
    want = ops.moe_gate_up(x, idx, w, None, None, gate_up, down, precision="fp8")
    assert_bitwise_equal(got, want, "fp8 experts")
    assert not torch.equal(got, ALL_EXPERTS_FUNCTIONS["mok"](experts, x, idx, w))


@pytest.mark.parametrize("family, features", [
    # Qwen3's nearest kin: only the gated shared expert is missing
    ("qwen2_moe", ["a shared expert (block.shared_expert)", "a sigmoid shared-expert gate"]),
    # the most to name: shared experts and three router features
    ("deepseek_v3", ["a shared expert (block.shared_experts)", "expert score-correction bias",
                     "group-limited top-k (n_group=2, topk_group=1)", "a routed scaling factor (2.5)"]),
    ("mixtral", ["the router MixtralTopKRouter"]),  # always-renormalising router, no norm_topk_prob
    ("gpt_oss", ["a router at block.router", "a router bias (block.router.bias)", "expert biases", "clamped SwiGLU",
                 "does not run these experts either"]),  # nothing to point at
])
def test_from_hf_qwen3_moe_refuses_other_blocks_naming_what_is_missing(family, features):
    block = AutoModelForCausalLM.from_config(_config(family, layers=1)).model.layers[0].mlp
    with pytest.raises(ValueError) as e:
        mok.hf.from_hf_qwen3_moe(block)
    msg = str(e.value)
    assert msg.startswith("block: expected a Qwen3-MoE sparse block") and type(block).__name__ in msg
    for f in features:
        assert f in msg, (f, msg)
    assert ('experts_implementation="mok"' in msg) == (family != "gpt_oss")


def test_from_hf_qwen3_moe_converts_olmoe_the_same_layer():
    block = _model("olmoe", layers=1).model.layers[0].mlp
    m = mok.hf.from_hf_qwen3_moe(block)
    assert not m.normalize and m.score == "softmax" and m.top_k == 2  # OLMoE: norm_topk_prob=False
    assert_bitwise_equal(m.w_router_EH, block.gate.weight, "router")
    assert_bitwise_equal(m.w_gate_LIH, block.experts.gate_up_proj[:, :32], "gate")
    assert_bitwise_equal(m.w_down_LHI, block.experts.down_proj, "down")


# ---------------------------------------------------------------- the experts function's inputs


def _experts_inputs(T=6, seed=6):
    experts = _set(_model("qwen3_moe", layers=1).model.layers[0].mlp.experts, "mok")
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g)
    idx = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(T)])
    w = torch.rand(T, 2, generator=g)
    return experts, x, idx, w


@pytest.mark.parametrize("change, exc, starts", [
    # float ids: .long() would truncate 2.9 to 2, silently routing to another expert
    (lambda x, i, w: (x, i.float() + 0.9, w), TypeError, "top_k_index: expected integer expert ids"),
    # bool ids are not expert ids
    (lambda x, i, w: (x, i > 3, w), TypeError, "top_k_index: expected integer expert ids"),
    # uint64 ids could wrap to negative int64
    (lambda x, i, w: (x, i.to(torch.uint64), w), TypeError, "top_k_index: expected integer expert ids"),
    # integer weights: not routing probabilities
    (lambda x, i, w: (x, i, (w * 3).long()), TypeError, "top_k_weights: expected floating routing weights"),
    # float64 weights would be rounded to float32
    (lambda x, i, w: (x, i, w.double()), TypeError, "top_k_weights: expected floating routing weights"),
    # a list, not a tensor
    (lambda x, i, w: (x, i, w.tolist()), TypeError, "top_k_weights: expected a torch.Tensor, got list"),
    # no ids at all
    (lambda x, i, w: (x, None, w), TypeError, "top_k_index: expected a torch.Tensor, got NoneType"),
    # hidden_states not flattened to [T, H]
    (lambda x, i, w: (x[None], i, w), ValueError, "hidden_states: expected 2 dimensions [T, H]"),
    # ids for fewer tokens than hidden_states has
    (lambda x, i, w: (x, i[:-1], w[:-1]), ValueError, "top_k_index: expected shape [T = 6, K]"),
    # 1-D ids
    (lambda x, i, w: (x, i[:, 0], w), ValueError, "top_k_index: expected shape [T = 6, K]"),
    # weights for fewer slots than ids
    (lambda x, i, w: (x, i, w[:, :1]), ValueError, "top_k_weights: expected the shape of top_k_index (6, 2)"),
])
def test_experts_function_refuses_bad_inputs_naming_them(change, exc, starts):
    experts, x, idx, w = _experts_inputs()
    with pytest.raises(exc) as e:
        ALL_EXPERTS_FUNCTIONS["mok"](experts, *change(x, idx, w))
    assert str(e.value).startswith(starts), str(e.value)


@pytest.mark.parametrize("idx_dtype, w_dtype", [
    (torch.int64, torch.float32),   # what transformers passes for an fp32 model (topk's int64 ids)
    (torch.int64, torch.bfloat16),  # a bf16 model: weights in the model dtype
    (torch.int32, torch.float16),   # narrower ids and fp16 weights: both widen exactly
])
def test_experts_function_accepts_exact_dtypes_with_the_bits_of_their_widening(idx_dtype, w_dtype):
    experts, x, idx, w = _experts_inputs()
    w = w.to(w_dtype)
    fn = ALL_EXPERTS_FUNCTIONS["mok"]
    assert_bitwise_equal(fn(experts, x, idx.to(idx_dtype), w), fn(experts, x, idx, w.float()), "y")


def test_check_model_refuses_a_non_module():
    with pytest.raises(TypeError, match="^model: expected a torch.nn.Module"):
        mok.hf.check_model(None)

"""Turning torchtitan's routed experts into mok's (`mok.titan`): the three ways in give torchtitan's parameter names,
shapes and dtypes; one layer on its own matches torchtitan's within the 2x rule against float64; what mok does not
compute, and bad arguments, are refused naming what is wrong. One process, no process group."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("torchtitan.models.common.moe", reason="needs torchtitan >= 0.3.0 (and triton, which it imports)")

from torchtitan.config.override import OverrideConfig, apply_overrides  # noqa: E402
from torchtitan.models.common.moe import RoutedExperts  # noqa: E402
from torchtitan.models.deepseek_v3 import model_registry  # noqa: E402

import mok.titan  # noqa: E402
from mok.testing.bits import rel_error  # noqa: E402
from mok.testing.titan import Float64RoutedExperts  # noqa: E402
from mok.testing.tolerance import REL_SLACK  # noqa: E402
from mok.titan import MokConverter, MokRoutedExperts  # noqa: E402

MOE_LAYERS = 5  # DeepSeek-V3's debug model: 6 layers, the first dense


def _routed(model_config):
    return [c for _fqn, c, _p, _a in model_config.traverse(RoutedExperts.Config)]


def test_the_command_line_override_replaces_every_routed_experts_config():
    """What `torchrun -m torchtitan.train --module deepseek_v3 --config ... --override.imports ...` does before
    building: torchtitan's own parser, then its override pass over the trainer's config tree."""
    from torchtitan.config.manager import ConfigManager

    cfg = ConfigManager().parse_args(["--module", "deepseek_v3", "--config", "deepseek_v3_debugmodel",
                                      "--override.imports", 'mok.titan.mok_experts={"backend": "reference"}'])
    lines = apply_overrides(cfg.override, cfg)
    routed = _routed(cfg.model_spec.model)
    assert len(lines) == len(routed) == MOE_LAYERS
    assert all(type(c) is MokRoutedExperts.Config and c.backend == "reference" for c in routed)


def test_the_override_on_a_model_config_defaults_to_auto():
    cfg = model_registry("debugmodel").model
    apply_overrides(OverrideConfig(imports=["mok.titan.mok_experts"]), cfg)
    assert [c.backend for c in _routed(cfg)] == ["auto"] * MOE_LAYERS


@pytest.mark.parametrize("module, flavor, moe_layers", [
    ("deepseek_v3", "debugmodel", MOE_LAYERS),  # 8 experts top-3, 2 shared experts, expert bias
    ("qwen3", "debugmodel_moe", 8),             # 64 experts top-8, no shared expert
])
def test_converter_and_convert_keep_torchtitans_parameters(module, flavor, moe_layers):
    import importlib

    registry = importlib.import_module(f"torchtitan.models.{module}").model_registry

    def params(model_config):
        with torch.device("meta"):
            model = model_config.build()
        return model, {n: (tuple(t.shape), t.dtype) for n, t in model.state_dict().items()}

    ref_model, ref = params(registry(flavor).model)
    for cfg in (registry(flavor, converters=[MokConverter.Config()]).model,
                mok.titan.convert(registry(flavor).model, recompute=True)):
        model, got = params(cfg)
        assert got == ref  # names (inner_experts.w1_EFD, ...), shapes and dtypes: the same checkpoint keys
        mods = [m for m in model.modules() if isinstance(m, RoutedExperts)]
        assert len(mods) == moe_layers and all(type(m) is MokRoutedExperts for m in mods)
    assert sum(isinstance(m, MokRoutedExperts) for m in ref_model.modules()) == 0


def _layer(cls, seed=0):
    """One MoE layer's routed experts (the debug model's: D = 256, F = 256, E = 8, K = 3) of class `cls`, seeded."""
    base = _routed(model_registry("debugmodel").model)[0]
    cfg = mok.titan.to_mok(base, backend="reference") if cls is MokRoutedExperts else \
        dataclasses.replace(base) if cls is RoutedExperts else Float64RoutedExperts.Config(
            inner_experts=base.inner_experts, token_dispatcher=base.token_dispatcher)
    layer = cfg.build()
    torch.manual_seed(seed)
    layer.init_states()
    return layer


def test_one_layer_within_twice_torchtitans_error_against_float64():
    """y and the gradients of x, the scores and the three expert weights, for 32 tokens routed top-3 of 8."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 16, 256, generator=g)
    scores = torch.rand(2, 16, 3, generator=g)
    ids = torch.rand(2, 16, 8, generator=g).argsort(-1)[..., :3].contiguous()
    dy = torch.randn(2, 16, 256, generator=g)
    counts = torch.bincount(ids.flatten(), minlength=8)
    out = {}
    for cls in (RoutedExperts, MokRoutedExperts, Float64RoutedExperts):
        layer = _layer(cls)
        xs = (x.double() if cls is Float64RoutedExperts else x).detach().clone().requires_grad_()
        s = scores.clone().requires_grad_()
        y = layer(xs, s, ids, counts)
        y.backward(dy.to(y.dtype))
        e = layer.inner_experts
        out[cls] = {"y": y.detach(), "d_x": xs.grad, "d_scores": s.grad, "d_w1": e.w1_EFD.grad,
                    "d_w2": e.w2_EDF.grad, "d_w3": e.w3_EFD.grad}
    f64 = out[Float64RoutedExperts]
    for name, ref in f64.items():
        e_mok, e_titan = rel_error(out[MokRoutedExperts][name], ref), rel_error(out[RoutedExperts][name], ref)
        assert e_mok <= 2 * e_titan + REL_SLACK, f"{name}: mok {e_mok:.3e} vs torchtitan {e_titan:.3e}"
        assert e_mok > 0, name  # bf16 experts: an error is there to measure


def test_gpt_oss_experts_are_refused():
    from torchtitan.models.gpt_oss import model_registry as gpt_oss

    with pytest.raises(NotImplementedError, match="GptOssGroupedExperts"):
        mok.titan.convert(gpt_oss("debugmodel").model)


def test_a_capacity_bounded_dispatcher_is_refused():
    cfg = model_registry("debugmodel", moe_comm_backend="hybridep", non_blocking_capacity_factor=1.0).model
    with pytest.raises(NotImplementedError, match="HybridEPTokenDispatcher"):
        mok.titan.convert(cfg)


def test_tensor_parallel_experts_are_refused():
    layer = _layer(MokRoutedExperts)
    dims = SimpleNamespace(tp_enabled=True, ep_enabled=False, tp=2)
    with pytest.raises(NotImplementedError, match="tensor_parallel_degree=2"):
        layer.parallelize(dims)


def test_bad_arguments_are_named():
    base = _routed(model_registry("debugmodel").model)[0]
    with pytest.raises(ValueError, match="^backend: "):
        mok.titan.to_mok(base, backend="cuda")
    with pytest.raises(TypeError, match="^recompute: "):
        mok.titan.to_mok(base, recompute=1)
    with pytest.raises(TypeError, match="^config: "):
        mok.titan.to_mok(base.inner_experts)
    from torchtitan.models.llama3 import model_registry as llama3

    with pytest.raises(ValueError, match="^model_config: .* no routed experts"):
        mok.titan.convert(llama3("debugmodel").model)
    layer = _layer(MokRoutedExperts)
    x, s, ids = torch.randn(1, 4, 256), torch.rand(1, 4, 3), torch.tensor([[[0, 1, 2]] * 4])
    counts = torch.zeros(8)
    with pytest.raises(TypeError, match="^topk_expert_ids_BLK: "):
        layer(x, s, ids.float(), counts)
    with pytest.raises(TypeError, match="^topk_scores_BLK: "):
        layer(x, s.double(), ids, counts)
    with pytest.raises(ValueError, match="^topk_scores_BLK, topk_expert_ids_BLK: "):
        layer(x, s[:, :3], ids[:, :3], counts)
    with pytest.raises(ValueError, match="^x_BLD: "):
        layer(x[0], s, ids, counts)
    with pytest.raises(TypeError, match="^x_BLD: "):
        layer(x.double(), s, ids, counts)

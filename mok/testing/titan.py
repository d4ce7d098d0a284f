"""Training torchtitan's debug MoE model a few steps, with or without mok (`mok.titan`), the way torchtitan's trainer
does (its model registry, parallelize function with FSDP2 and expert parallelism, optimizer and load-balancing hook),
minus the data and tokenizer: the tokens are bytes of the Python standard library's source. For mok's tests, example
and GPU check; needs torchtitan.

Two things differ from torchtitan's own runs, neither inside the MoE layers: the attention is torchtitan's SDPA module
on PyTorch's math backend (`MathAttention`: its FlexAttention has no CPU backward, and the flash and cuDNN backward
kernels are not deterministic), and on the CPU torchtitan's meshes are built on "cpu" (`use_cpu_meshes`) and FSDP
reduces gradients with SUM (gloo has no PREMUL_SUM; torchtitan's FSDP gradients are sums already).
"""

from __future__ import annotations

import functools
import os
import sysconfig
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend

from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig, derive
from torchtitan.distributed import ParallelDims
from torchtitan.distributed import utils as dist_utils
from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention
from torchtitan.models.common.moe import RoutedExperts

FLAVORS = {"deepseek_v3": "debugmodel", "qwen3": "debugmodel_moe"}


@dataclass
class Setup:
    """What one training run is: the model (a torchtitan module name in FLAVORS, its first `n_layers` layers), the
    experts ("titan": torchtitan's GroupedExperts; "reference" / "fast" / "auto": mok's backend; "float64": the
    float64 evaluation, `Float64RoutedExperts`), the mesh (expert-parallel degree `ep`, world size from the process
    group) and the run (`steps` of `batch` sequences of `seq_len` tokens per rank, fp32 or bf16 FSDP parameters)."""

    model: str = "deepseek_v3"
    n_layers: int = 2
    experts: str = "reference"
    ep: int = 1
    steps: int = 3
    batch: int = 2
    seq_len: int = 32
    lr: float = 1e-3
    param_dtype: str = "float32"
    seed: int = 0
    spmd_backend: str = "spmd_types"


class MathAttention(ScaledDotProductAttention):
    """torchtitan's SDPA attention on PyTorch's math backend only: runs on the CPU (forward and backward) and is
    deterministic on the GPU."""

    sdpa_backends = [SDPBackend.MATH]

    @dataclass(kw_only=True, slots=True)
    class Config(ScaledDotProductAttention.Config):
        pass


class Float64RoutedExperts(RoutedExperts):
    """torchtitan's routed experts evaluated in float64: Σ_k score_k · w2(silu(w1 x) * w3 x) per token, expert by
    expert, with the weights and x as they are (the float64 evaluation the 2x rule measures against)."""

    @dataclass(kw_only=True, slots=True)
    class Config(RoutedExperts.Config):
        pass

    def forward(self, x_BLD: Tensor, topk_scores_BLK: Tensor, topk_expert_ids_BLK: Tensor,
                num_local_tokens_per_expert_E: Tensor) -> Tensor:
        """x_BLD [B, L, D] float64; topk_scores_BLK [B, L, K] any float; topk_expert_ids_BLK [B, L, K] int64;
        num_local_tokens_per_expert_E unused. Returns [B, L, D] float64."""
        e = self.inner_experts
        w_gate_LIH, w_down_LHI, w_up_LIH = (w.double() for w in (e.w1_EFD, e.w2_EDF, e.w3_EFD))
        D, K = x_BLD.shape[-1], topk_expert_ids_BLK.shape[-1]
        x_TD = x_BLD.double().reshape(-1, D)
        ids_TK, s_TK = topk_expert_ids_BLK.reshape(-1, K), topk_scores_BLK.double().reshape(-1, K)
        y_TD = torch.zeros_like(x_TD)
        for expert in range(w_gate_LIH.shape[0]):
            t, k = (ids_TK == expert).nonzero(as_tuple=True)
            x = x_TD[t]
            h = F.silu(x @ w_gate_LIH[expert].T) * (x @ w_up_LIH[expert].T)
            y_TD = y_TD.index_add(0, t, s_TK[t, k, None] * (h @ w_down_LHI[expert].T))
        return y_TD.view(x_BLD.shape)


def use_cpu_meshes() -> None:
    """Build torchtitan's device meshes on "cpu" (gloo): torchtitan picks "cuda" when no accelerator is present."""
    import torchtitan.distributed.parallel_dims as parallel_dims

    parallel_dims.device_type = "cpu"


def model_spec(setup: Setup):
    """torchtitan's ModelSpec of the setup's debug model, its experts chosen, its attention `MathAttention`."""
    import importlib

    if setup.model not in FLAVORS:
        raise ValueError(f"setup.model: expected one of {sorted(FLAVORS)}, got {setup.model!r}")
    registry = importlib.import_module(f"torchtitan.models.{setup.model}").model_registry
    spec = registry(FLAVORS[setup.model])
    cfg = spec.model
    cfg.layers = cfg.layers[:setup.n_layers]
    for _fqn, _c, parent, attr in list(cfg.traverse(FlexAttention.Config)):
        setattr(parent, attr, MathAttention.Config())
    if setup.experts == "float64":
        for _fqn, c, parent, attr in list(cfg.traverse(RoutedExperts.Config)):
            setattr(parent, attr, derive(c, Float64RoutedExperts.Config))
    elif setup.experts != "titan":
        from ..titan import convert

        spec.model = convert(cfg, backend=setup.experts)
    return spec


def parallel_dims(setup: Setup, world_size: int) -> ParallelDims:
    """The ParallelDims (FSDP over every rank, ep as set) with its meshes built."""
    par = ParallelismConfig(expert_parallel_degree=setup.ep, spmd_backend=setup.spmd_backend)
    dist_utils.set_spmd_backend(par.spmd_backend)
    dims = ParallelDims.from_config(par, world_size)
    dims.build_mesh()
    return dims


def build(setup: Setup, dims: ParallelDims, device: str):
    """(model, spec): the model built on meta, parallelized by torchtitan's parallelize function (FSDP2, ep),
    materialized on `device` and initialized from `setup.seed` (the same weights with any experts)."""
    from types import SimpleNamespace

    spec = model_spec(setup)
    parallelism = ParallelismConfig(expert_parallel_degree=setup.ep, spmd_backend=setup.spmd_backend)
    spec.model.update_from_config(config=SimpleNamespace(parallelism=parallelism))  # the sharding configs
    with torch.device("meta"):
        model = spec.model.build()
    training = TrainingConfig(local_batch_size=setup.batch, seq_len=setup.seq_len, steps=setup.steps,
                              mixed_precision_param=setup.param_dtype)
    model = spec.parallelize_fn(model, parallel_dims=dims, training=training, parallelism=parallelism,
                                compile_config=CompileConfig(), ac_config=None, dump_folder="/tmp")
    if device == "cpu":  # gloo has no PREMUL_SUM; torchtitan's FSDP gradients are plain sums (divide factor 1)
        from torch.distributed.fsdp import FSDPModule

        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_force_sum_reduction_for_comms(True)
    model.to_empty(device=device)
    torch.manual_seed(setup.seed)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()
    return model, spec


@functools.lru_cache(maxsize=1)
def _text(n_bytes: int = 1 << 20) -> Tensor:
    """The Python standard library's own source as bytes (a learnable token stream, nothing downloaded): uint8
    [n_bytes], files in name order, repeated if short."""
    root, parts, n = sysconfig.get_paths()["stdlib"], [], 0
    for name in sorted(os.listdir(root)):
        if name.endswith(".py") and n < n_bytes:
            with open(os.path.join(root, name), "rb") as f:
                parts.append(f.read())
            n += len(parts[-1])
    data = b"".join(parts)
    data = data * (n_bytes // max(1, len(data)) + 1)
    return torch.frombuffer(bytearray(data[:n_bytes]), dtype=torch.uint8)


def tokens(setup: Setup, step: int, rank: int) -> Tensor:
    """[batch, seq_len + 1] int64 token ids (bytes < the debug models' vocabulary of 2048) of one rank's step:
    windows of `_text` at offsets seeded by (seed, step, rank). Inputs are [:, :-1], labels [:, 1:]."""
    text = _text()
    g = torch.Generator().manual_seed(1_000_003 * setup.seed + 1009 * step + rank)
    starts = torch.randint(0, text.numel() - setup.seq_len - 1, (setup.batch,), generator=g).tolist()
    return torch.stack([text[s:s + setup.seq_len + 1] for s in starts]).long()


def loss_of(model, dims: ParallelDims, tok: Tensor, device: str) -> Tensor:
    """Next-token cross-entropy of `model` on this rank's `tok` [B, L + 1], summed and divided by the tokens of all
    data-parallel ranks (as torchtitan's trainer scales it: FSDP then sums the gradients), float32 []."""
    from torchtitan.distributed import full_dtensor
    from torchtitan.distributed.spmd_types import annotate_input_spmd_types

    tok = tok.to(device)
    B, L = tok.shape[0], tok.shape[1] - 1
    inputs, labels, kw = tok[:, :-1], tok[:, 1:], {"positions": torch.arange(L, device=device).expand(B, L)}
    if dims.spmd_backend == "spmd_types":  # as torchtitan's trainer prepares its inputs
        inputs, labels, kw = annotate_input_spmd_types(dims, inputs, labels, kw)
    elif dims.spmd_backend == "full_dtensor":
        inputs, labels, kw = full_dtensor.parallelize_inputs(dims, inputs, labels, kw)
    logits = model(inputs, **kw)
    logits = logits.to_local() if hasattr(logits, "to_local") else logits
    ranks = dims.get_mesh("batch").size() if dims.dp_enabled else 1
    return F.cross_entropy(logits.float().flatten(0, 1), tok[:, 1:].flatten(), reduction="sum") / (B * L * ranks)


def full(t: Tensor) -> Tensor:
    """A parameter, gradient or buffer as one plain CPU tensor (a DTensor gathered: every rank must call)."""
    t = t.full_tensor() if hasattr(t, "full_tensor") else t
    return t.detach().cpu().clone()


def _checkpoint(model, path: str, save: bool) -> None:
    """Save the model's state to, or load it from, the DCP checkpoint `path`, as torchtitan's checkpointer does
    (its ModelWrapper: the model's own state-dict keys)."""
    import torch.distributed.checkpoint as dcp
    from torchtitan.components.checkpointer.base import ModelWrapper

    state = ModelWrapper(model)
    sd = state.state_dict()
    if save:
        dcp.save(sd, checkpoint_id=path)
    else:
        dcp.load(sd, checkpoint_id=path)
        state.load_state_dict(sd)


def train(setup: Setup, rank: int, world_size: int, device: str = "cpu", *, load_from: str | None = None,
          save_to: str | None = None) -> dict:
    """Train `setup.steps` steps with torchtitan's AdamW and load-balancing hook.

    load_from: a DCP checkpoint directory to start from (instead of the seeded initialization); save_to: one to
    write after the last step.

    Returns {"losses": [steps] float32 (this rank's), "params0": {name: the initial parameters}, "grads0": {name: the
    first step's gradient}, "params": {name: the parameters after the last step}, "buffers": {name: the expert
    biases}}, full tensors.
    """
    from torchtitan.components.optimizer import default_adamw

    dims = parallel_dims(setup, world_size)
    model, spec = build(setup, dims, device)
    if load_from is not None:
        _checkpoint(model, load_from, save=False)
    opt = default_adamw(lr=setup.lr).build(model_parts=[model])
    if spec.post_optimizer_build_fn is not None:
        spec.post_optimizer_build_fn(opt, [model], dims)
    losses, grads0 = [], {}
    params0 = {n: full(p) for n, p in model.named_parameters()}
    for step in range(setup.steps):
        loss = loss_of(model, dims, tokens(setup, step, rank), device)
        loss.backward()
        if step == 0:
            grads0 = {n: full(p.grad) for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach().float().cpu())
    if save_to is not None:
        _checkpoint(model, save_to, save=True)
    return {"losses": torch.tensor(losses), "params0": params0, "grads0": grads0,
            "params": {n: full(p) for n, p in model.named_parameters()},
            "buffers": {n: full(b) for n, b in model.state_dict().items() if "expert_bias" in n}}


def evaluate_float64(setup: Setup, params: dict, rank: int = 0) -> dict:
    """The first step's loss and gradients in float64 on one process (no FSDP): the model with `params` ({name:
    tensor}, e.g. a run's "params0") widened to float64, its routed experts `Float64RoutedExperts`. torchtitan's
    rotary embedding computes in float32 whatever its input (ComplexRoPE), so this is float64 but for that.

    Returns {"loss": [] float64, "grads0": {name: float64 gradient}}.
    """
    spec = model_spec(Setup(**{**setup.__dict__, "experts": "float64"}))
    with torch.device("meta"):
        model = spec.model.build()
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=None)  # the buffers (rotary tables, expert bias); parameters loaded next
    missing = model.load_state_dict(params, strict=False).missing_keys
    wanted = {n for n, _ in model.named_parameters()}
    if wanted & set(missing):
        raise ValueError(f"params: missing {sorted(wanted & set(missing))[:5]}")
    model.double().train()
    tok = tokens(setup, 0, rank)
    B, L = tok.shape[0], tok.shape[1] - 1
    logits = model(tok[:, :-1], positions=torch.arange(L).expand(B, L))
    loss = F.cross_entropy(logits.flatten(0, 1), tok[:, 1:].flatten())
    loss.backward()
    return {"loss": loss.detach(), "grads0": {n: p.grad.detach().clone() for n, p in model.named_parameters()}}


def bit_mismatches(actual: dict, expected: dict, label: str) -> list[str]:
    """`assert_bitwise_equal`'s message for every entry of `expected` ({name: tensor}) whose bits `actual` does not
    reproduce (NaN-aware, the first mismatch's index and values), or that `actual` lacks; [] when all match."""
    from .bits import assert_bitwise_equal

    out = []
    for name, t in expected.items():
        if name not in actual:
            out.append(f"{label}: {name}: missing")
            continue
        try:
            assert_bitwise_equal(actual[name], t, f"{label}: {name}")
        except AssertionError as e:
            out.append(str(e))
    return out


def errors(got: dict, ref: dict) -> dict:
    """{name: ‖got − ref‖ / ‖ref‖} (`rel_error`, in float64) for every name of `ref`."""
    from .bits import rel_error

    return {name: rel_error(got[name], r) for name, r in ref.items()}

"""`MokRoutedExperts`: torchtitan's routed-experts region (dispatch, grouped experts, combine) run as one mok layer.

torchtitan's `MoE` calls `routed_experts(x_BLD, topk_scores_BLK, topk_expert_ids_BLK, num_local_tokens_per_expert_E)`
after its router; `RoutedExperts` sorts the tokens by expert (its token dispatcher, an all-to-all under expert
parallelism), runs `GroupedExperts` (`w1_EFD`, `w2_EDF`, `w3_EFD`) and scatter-adds the score-weighted outputs back.
This subclass keeps that module, its `inner_experts` parameters (names, shapes, dtypes, sharding: checkpoints are
unchanged) and its sharding config, and replaces only the forward by `mok.nn.ops.moe`, which does the dispatch,
the SwiGLU experts and the weighted combine itself, deterministically. torchtitan's layout is mok's: `w1_EFD` is the
gate [L, I, H], `w3_EFD` the up [L, I, H], `w2_EDF` the down [L, H, I] (E = L experts, F = I, D = H), passed as
they are (no copy).

Expert parallelism: when torchtitan's mesh has an `ep` dimension, the experts are sharded by whole experts over it
(rank r holds experts [r*L, (r+1)*L), as mok's expert parallelism expects) and each rank routes its own tokens;
the layer then runs mok's expert parallelism over the `ep` process group (`group=`), bypassing torchtitan's
all-to-all. Routed experts sharded any other way (expert tensor parallelism: tp > 1 without ep) raise
NotImplementedError naming the placement.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor
from torchtitan.models.common.moe import RoutedExperts

from ..nn import backend as _backend
from ..nn import ops
from ..nn.routing_inputs import check_routing_dtypes


def _local(name: str, w: Tensor) -> Tensor:
    """This rank's part of an expert weight: a plain tensor as it is, a DTensor's local shard when it is sharded only
    by whole experts (Shard(0) on the mesh dimension "ep", Replicate elsewhere); NotImplementedError otherwise."""
    if not hasattr(w, "to_local"):
        return w
    from torch.distributed.tensor import Replicate, Shard

    names = w.device_mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(w.device_mesh.ndim))
    for dim, p in zip(names, w.placements):
        if isinstance(p, Replicate) or (dim == "ep" and p == Shard(0)):
            continue
        raise NotImplementedError(
            f"{name}: mok runs routed experts sharded by whole experts over the 'ep' mesh dimension only, got "
            f"placement {p} on mesh dimension {dim!r} (placements {tuple(w.placements)} over {names}); expert tensor "
            f"parallelism is not supported: use expert_parallel_degree for the experts, or torchtitan's experts")
    return w.to_local()


def _check_routing(topk_scores_BLK: Tensor, topk_expert_ids_BLK: Tensor, x_BLD: Tensor) -> None:
    """Dtypes (`check_routing_dtypes`) and shapes of the router's outputs, named as torchtitan names them."""
    check_routing_dtypes(("x_BLD", x_BLD), ("topk_expert_ids_BLK", topk_expert_ids_BLK),
                         ("topk_scores_BLK", topk_scores_BLK))
    if x_BLD.dim() != 3:
        raise ValueError(f"x_BLD: expected 3 dimensions [B, L, D], got shape {tuple(x_BLD.shape)}")
    if topk_scores_BLK.shape != topk_expert_ids_BLK.shape or tuple(topk_scores_BLK.shape[:2]) != tuple(
            x_BLD.shape[:2]):
        raise ValueError(f"topk_scores_BLK, topk_expert_ids_BLK: expected one shape [B, L, K] with x_BLD's B, L "
                         f"{tuple(x_BLD.shape[:2])}, got {tuple(topk_scores_BLK.shape)} and "
                         f"{tuple(topk_expert_ids_BLK.shape)}")


class MokRoutedExperts(RoutedExperts):
    """torchtitan's `RoutedExperts` computed by mok's layer (same parameters, same checkpoints).

    Config fields beyond `RoutedExperts.Config`: backend ("auto": the CUDA fast path on an H100/H200, the bit-exact
    reference elsewhere; "reference"; "fast") and recompute (save only the inputs, run the layer's forward again in
    backward: the same bits, less activation memory).
    """

    @dataclass(kw_only=True, slots=True)
    class Config(RoutedExperts.Config):
        backend: str = "auto"
        recompute: bool = False

    def __init__(self, config: Config):
        super().__init__(config)
        if config.backend not in _backend.CHOICES:
            raise ValueError(f"backend: expected one of {_backend.CHOICES}, got {config.backend!r}")
        if not isinstance(config.recompute, bool):
            raise TypeError(f"recompute: expected a bool, got {config.recompute!r}")
        self.backend, self.recompute = config.backend, config.recompute
        self.ep_group = None  # the "ep" mesh dimension's process group, set by parallelize

    def parallelize(self, parallel_dims) -> None:
        """torchtitan's parallelization of this region (weights sharded, the local-tensor region set up), then the
        expert-parallel group mok's layer runs over. NotImplementedError for tensor-parallel experts (tp > 1 without
        ep), whose weights would be sharded along the hidden dimensions."""
        if parallel_dims.tp_enabled and not parallel_dims.ep_enabled:
            raise NotImplementedError(
                f"mok routed experts: tensor parallelism of the experts (tensor_parallel_degree={parallel_dims.tp} "
                f"without expert parallelism) shards each expert's hidden dimensions, which mok's layer does not "
                f"compute; set expert_parallel_degree (whole experts per rank), or use torchtitan's experts")
        super().parallelize(parallel_dims)
        mesh = parallel_dims.get_optional_mesh("ep")
        self.ep_group = mesh.get_group() if mesh is not None and mesh.size() > 1 else None

    def forward(self, x_BLD: Tensor, topk_scores_BLK: Tensor, topk_expert_ids_BLK: Tensor,
                num_local_tokens_per_expert_E: Tensor) -> Tensor:
        """Σ_k score_k · expert_k(x) per token, through `mok.nn.ops.moe`.

        Args:
            x_BLD: [B, L, D] float32 or bfloat16, this rank's tokens (rounded to bf16 inside, as GroupedExperts does).
            topk_scores_BLK: [B, L, K] routing scores (float32 from torchtitan's router), applied after the experts.
            topk_expert_ids_BLK: [B, L, K] global expert ids (int64, or an integer dtype that widens to it exactly),
                distinct per token.
            num_local_tokens_per_expert_E: [E] token counts; unused (mok's layer counts its own rows).
        Returns:
            [B, L, D] in x_BLD's dtype: one bf16 rounding of the weighted sum per token, then x_BLD's dtype.
        """
        del num_local_tokens_per_expert_E
        _check_routing(topk_scores_BLK, topk_expert_ids_BLK, x_BLD)
        B, L, D = x_BLD.shape
        K = topk_scores_BLK.shape[-1]
        experts = self.inner_experts
        w_gate_LIH = _local("w1_EFD", experts.w1_EFD)
        w_up_LIH = _local("w3_EFD", experts.w3_EFD)
        w_down_LHI = _local("w2_EDF", experts.w2_EDF)
        W = 1 if self.ep_group is None else self.ep_group.size()
        name = _backend.pick(self.backend, x_BLD.device, world_size=W, sizes=(D, w_gate_LIH.shape[1], 0))
        y_TH = ops.moe(x_BLD.reshape(B * L, D).contiguous(), topk_expert_ids_BLK.reshape(B * L, K).long().contiguous(),
                       topk_scores_BLK.reshape(B * L, K).float().contiguous(), None, None, None, w_gate_LIH, w_up_LIH,
                       w_down_LHI, group=self.ep_group, backend=name, recompute=self.recompute)
        return y_TH.to(x_BLD.dtype).view(B, L, D)

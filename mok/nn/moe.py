"""`mok.MoE`: a deterministic mixture-of-experts layer as an `nn.Module` (router + experts)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from ..reference import SCORES, check_ep_split, check_precision, check_route_args, preflight, world
from . import _init
from . import backend as _backend
from . import ops
from .router_ops import router_losses_of_router


class Routing(NamedTuple):
    """The router's output for T tokens: topk_idx [T, K] int64, topk_weight [T, K] fp32,
    scores [T, E] fp32, logits [T, E] fp32."""

    topk_idx: torch.Tensor
    topk_weight: torch.Tensor
    scores: torch.Tensor
    logits: torch.Tensor


class RouterLosses(NamedTuple):
    """load_balance: Switch-style E * Σ f_e P_e (1 when uniform); z: mean logsumexp(logits)²; [] fp32."""

    load_balance: torch.Tensor
    z: torch.Tensor


def _mesh_of(group):
    """`group` if it is a DeviceMesh (1-D), else None."""
    if group is None or not torch.distributed.is_available():
        return None
    from torch.distributed.device_mesh import DeviceMesh

    if not isinstance(group, DeviceMesh):
        return None
    if group.ndim != 1:
        raise ValueError(f"group: expected a process group or a 1-D DeviceMesh (the expert-parallel ranks), "
                         f"got a {group.ndim}-D DeviceMesh {tuple(group.mesh_dim_names or ())}: pass mesh[\"ep\"]")
    return group


def _positive_int(name: str, v, minimum: int = 1) -> int:
    """TypeError for anything but an int (a bool, a float, a str), ValueError for an int below `minimum`."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name}: expected an int >= {minimum}, got {type(v).__name__} {v!r}")
    if v < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {v!r}")
    return v


_SEPARATE = (("w_gate_LIH", "w_up_LIH", "w_gate_up_L2IH"),  # mok 0.2's keys of a pair, and the stacked parameter
             ("w_shared_gate_SH", "w_shared_up_SH", "w_shared_gate_up_2SH"))


def _stack_separate_gate_up(state_dict, prefix, *args, **kwargs) -> None:
    """Load-state-dict pre-hook: a checkpoint with separate gate and up tensors (mok 0.2 and before) gets them
    stacked into the one [gate; up] tensor the module holds (dim 1 for the routed experts [L, I, H], dim 0 for the
    shared expert [S, H]). A checkpoint with only one of a pair is left as it is (load_state_dict then names the
    missing and unexpected keys). The two must have one shape (ValueError naming both keys otherwise: gate
    [4, 7, 16] and up [4, 9, 16] would stack to the right [4, 16, 16] with the wrong rows in each half)."""
    for gate, up, stacked in _SEPARATE:
        g, u = prefix + gate, prefix + up
        if g in state_dict and u in state_dict and prefix + stacked not in state_dict:
            a, b = state_dict[g], state_dict[u]
            if a.shape != b.shape:
                raise ValueError(f"{g}, {u}: expected a gate and an up weight of one shape, got {tuple(a.shape)} "
                                 f"and {tuple(b.shape)}")
            del state_dict[g], state_dict[u]
            state_dict[prefix + stacked] = torch.cat([a, b], dim=a.dim() - 2)


def _fill_half(src: _init.Source, param, half: int, shape: tuple, fan_in: int, slot: int, experts: bool,
               first: int) -> None:
    """Draw the global weight `shape` (the gate, half 0, or the up, half 1) into its rows of the stacked `param`
    ([L, 2I, H]: every expert's rows [half * I, (half + 1) * I); [2S, H]: rows [half * S, (half + 1) * S)), as far
    as this rank's box of `param` holds them (a shard along dim 0: whole experts, or any rows of [2S, H])."""
    local, box, offset = _init.local_box(param, first)
    n = shape[-2]
    if param.dim() == 3:  # [L, 2I, H]: the box holds whole experts
        if any(offset[1:]) or box[1] != 2 * n:
            raise ValueError(f"param: expected a shard along dim 0 only, got a box {box} at offset {offset}")
        src.fill(local.narrow(1, half * n, n), shape, fan_in, slot, experts=experts, row_offset=offset[0])
        return
    lo, hi = max(offset[0], half * n), min(offset[0] + box[0], (half + 1) * n)  # global rows of this half held here
    hi = max(lo, hi)  # none: still drawn (fill replays the CPU stream past this weight)
    src.fill(local[lo - offset[0]: hi - offset[0]], shape, fan_in, slot, experts=experts, row_offset=lo - half * n)


class MoE(nn.Module):
    """Router (bias-free gate feeding `mok.reference.route`), optional shared expert, routed SwiGLU experts.

    Args:
        hidden_size: H. intermediate_size: I (routed experts). num_experts: E. top_k: K (1 <= K <= E).
        shared_intermediate_size: S, 0 for no shared expert.
        score: "softmax" or "sigmoid" router scores. normalize: renormalise the K weights to sum to 1.
        backend: "auto" (the fast path when `mok.fast.is_available()` on the parameters' device and H, I, S
                are multiples of 8, else the reference), "reference" or "fast".
            The choice is in `self.backend_in_use` (with `self.backend_reason`), re-made when the
            module moves device, and logged once (logger "mok").
        group: torch.distributed process group for expert parallelism (W ranks; this rank holds
            experts [rank * L, (rank + 1) * L), L = E / W); None for W = 1. Or a 1-D DeviceMesh over
            those ranks: the parameters are then DTensors with their global shapes (routed experts
            Shard(0) [E, ...], router and shared expert Replicate()), for FSDP2 on top and for
            distributed checkpoints that reload at another W (docs/distributed.md).
        recompute: save only the layer's inputs and recompute its intermediates in backward
            (bitwise the same gradients, less activation memory).
        dtype: parameter dtype, float32 (master weights; default) or bfloat16. The math always
            uses bf16 weights; fp32 parameters receive fp32 gradients.
        device: parameter device; "meta" allocates nothing and draws nothing (then `to_empty` and
            `reset_parameters`).
        precision: "bf16" (default) or "fp8": the layer's recipe (docs/numerics.md "FP8 recipe"; the router and the
            weight gradients stay bf16). With the fast backend, one GPU only; the weights' quantisation is made
            once per weight version (optimizer step) for bf16 parameters, once per call for fp32 ones (cast anew).

    Parameters (the shape legend of docs/layer.md): w_router_EH [E, H]; w_gate_up_L2IH [L, 2I, H] (each expert's
    gate rows, then its up rows, as transformers' `gate_up_proj`: the fast path reads and writes it as one tensor);
    w_down_LHI [L, H, I]; with S > 0 also w_shared_gate_up_2SH [2S, H] and w_shared_down_HS [H, S].
    `w_gate_LIH`, `w_up_LIH`, `w_shared_gate_SH`, `w_shared_up_SH` are views of their halves (read them, or write
    them in place under no_grad; gradients are on the stacked parameters). A state dict with the separate
    `w_gate_LIH` / `w_up_LIH` (and shared) tensors of mok 0.2 and before loads: each pair is stacked.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int, *,
                 shared_intermediate_size: int = 0, score: str = "softmax", normalize: bool = True,
                 backend: str = "auto", group=None, recompute: bool = False, dtype=torch.float32, device=None,
                 precision: str = "bf16"):
        super().__init__()
        H = _positive_int("hidden_size", hidden_size)
        I = _positive_int("intermediate_size", intermediate_size)
        E = _positive_int("num_experts", num_experts)
        K = _positive_int("top_k", top_k)
        if K > E:
            raise ValueError(f"top_k: expected an int in [1, num_experts = {E}], got {K}")
        S = _positive_int("shared_intermediate_size", shared_intermediate_size, minimum=0)
        if score not in SCORES:
            raise ValueError(f"score: expected one of {SCORES}, got {score!r}")
        if not isinstance(normalize, bool):
            raise TypeError(f"normalize: expected a bool, got {normalize!r}")
        if not isinstance(recompute, bool):
            raise TypeError(f"recompute: expected a bool, got {recompute!r}")
        if dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"dtype: expected torch.float32 or torch.bfloat16, got {dtype}")
        self.precision = check_precision(precision)
        if backend not in _backend.CHOICES:
            raise ValueError(f"backend: expected one of {_backend.CHOICES}, got {backend!r}")
        mesh = _mesh_of(group)
        if mesh is not None:
            group = mesh.get_group()
        W, rank = world(group)
        L = check_ep_split(E, W)
        self.hidden_size, self.intermediate_size, self.num_experts, self.top_k = H, I, E, K
        self.shared_intermediate_size, self.score, self.normalize = S, score, normalize
        self.group, self.world_size, self.rank, self.local_experts = group, W, rank, L
        self.recompute, self.backend, self.mesh = recompute, backend, mesh
        self._router_agreed = None  # (score, normalize) every rank of the group was checked to route with

        def p(*shape, sharded=False):
            t = torch.empty(*shape, dtype=dtype, device=device)
            if mesh is not None:
                from torch.distributed.tensor import DTensor, Replicate, Shard

                t = DTensor.from_local(t, mesh, [Shard(0) if sharded else Replicate()], run_check=False)
            return nn.Parameter(t)

        self.w_router_EH = p(E, H)
        self.w_gate_up_L2IH, self.w_down_LHI = p(L, 2 * I, H, sharded=True), p(L, H, I, sharded=True)
        if S:
            self.w_shared_gate_up_2SH, self.w_shared_down_HS = p(2 * S, H), p(H, S)
        else:
            for name in ("w_shared_gate_up_2SH", "w_shared_down_HS"):
                self.register_parameter(name, None)
        self._register_load_state_dict_pre_hook(_stack_separate_gate_up)
        if self.w_router_EH.device.type != "meta":
            self.reset_parameters()
        self._pick_backend()

    # ------------------------------------------------------------ setup

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Normal(0, 1/fan_in) weights, the same global layer for every W and every sharding (plain,
        expert-parallel group, DTensor, FSDP2): each rank computes only the values it holds.

        generator: None (torch's global CPU generator) or a CPU generator: the values of one CPU draw of
            each full weight in order (router, gate, up, down, shared gate, up, down), copied to the
            parameters' device; or a generator on the parameters' device (e.g. CUDA): drawn there, each
            expert from its own seed (fast, different values from the CPU draw). See `mok.nn._init`.
        Meta parameters are left as they are.
        """
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(f"generator: expected a torch.Generator or None, got {type(generator).__name__} "
                            f"{generator!r}")
        if self.w_router_EH.device.type == "meta":
            return
        H, I, E, S, L = (self.hidden_size, self.intermediate_size, self.num_experts,
                         self.shared_intermediate_size, self.local_experts)
        src = _init.Source(generator, self.w_router_EH.device)
        # (parameter, half: None, or 0 / 1 for the gate / up rows of a stacked one, global shape, fan-in, experts):
        # the drawing order, one slot each (gate and up drawn as separate global tensors, as before they shared one)
        plan = [("w_router_EH", None, (E, H), H, False), ("w_gate_up_L2IH", 0, (E, I, H), H, True),
                ("w_gate_up_L2IH", 1, (E, I, H), H, True), ("w_down_LHI", None, (E, H, I), I, True)]
        if S:
            plan += [("w_shared_gate_up_2SH", 0, (S, H), H, False), ("w_shared_gate_up_2SH", 1, (S, H), H, False),
                     ("w_shared_down_HS", None, (H, S), S, False)]
        for slot, (name, half, shape, fan_in, experts) in enumerate(plan):
            param = getattr(self, name)
            # a tensor of L experts (plain, or FSDP2's shard of one) starts at this rank's first expert
            first = self.rank * L if experts and param.shape[0] == L != E else 0
            if half is None:
                src.fill(param, shape, fan_in, slot, experts=experts, row_offset=first)
                continue
            _fill_half(src, param, half, shape, fan_in, slot, experts, first)

    def _pick_backend(self) -> None:
        device = self.w_router_EH.device
        sizes = (self.hidden_size, self.intermediate_size, self.shared_intermediate_size)
        self.backend_in_use, self.backend_reason = _backend.resolve(self.backend, device, world_size=self.world_size,
                                                                    sizes=sizes)
        self._fast_ready = False
        _backend.announce(self.backend, self.backend_in_use, self.backend_reason, device)

    def _ensure_ready(self) -> None:
        """Build/load the fast path's kernels on the first forward that needs them (not in __init__
        or .cuda()); with backend="auto" a failed build falls back to the reference, with a warning."""
        if self.backend_in_use != "fast" or self._fast_ready or torch.compiler.is_compiling():
            return
        ok, why = _backend.ensure_ready(self.backend)
        if not ok:
            self.backend_in_use, self.backend_reason = "reference", why
            _backend.announce(self.backend, self.backend_in_use, why, self.w_router_EH.device)
            return
        self._fast_ready = True

    def _check_router_across_ranks(self) -> None:
        """With a group, on the first eager expert computation (`forward`, `compute_experts`: collective calls
        anyway; `route` stays local) and again after `score` or `normalize` change: every rank must route with
        the same settings (the layer's own pre-flight checks T, H, K, L, I, S and the backend
        on every call, not these), else every rank raises a ValueError naming the setting and each rank's
        value. One exchange of 64 int64 per rank (`mok.reference.preflight`, op "router"); skipped while
        torch.compile traces."""
        key = (self.score, self.normalize)
        if self.group is None or getattr(self, "_router_agreed", None) == key or torch.compiler.is_compiling():
            return
        err, facts = None, [0, 0]
        try:
            check_route_args(self.num_experts, self.top_k, self.score, self.normalize)  # the router's own checks
            facts = [SCORES.index(self.score), int(self.normalize)]
        except (TypeError, ValueError) as e:  # raised on every rank by the pre-flight
            err = e
        preflight("router", err, [("score", f"router score (by index in {SCORES})", facts[0]),
                                  ("normalize", "normalize (0 False, 1 True)", facts[1])], self.group)
        self._router_agreed = key

    def _local(self, name: str) -> torch.Tensor | None:
        """Parameter `name` as a plain tensor for the ops: a DTensor's local shard (this rank's experts,
        or the replicated router / shared weights). The router's gradient is then marked Partial (it is
        over this rank's tokens only) so FSDP2 or the optimizer sums it over the group; the shared
        expert's is already the group's total (Replicate), the experts' their own (Shard(0))."""
        p = getattr(self, name)
        if p is None or not hasattr(p, "to_local"):
            return p
        if name == "w_router_EH":
            from torch.distributed.tensor import Partial

            return p.to_local(grad_placements=[Partial()] * p.device_mesh.ndim)
        return p.to_local()

    # the gate and up halves of the stacked parameters, as views
    @property
    def w_gate_LIH(self) -> torch.Tensor:
        return self.w_gate_up_L2IH.chunk(2, dim=1)[0]

    @property
    def w_up_LIH(self) -> torch.Tensor:
        return self.w_gate_up_L2IH.chunk(2, dim=1)[1]

    @property
    def w_shared_gate_SH(self) -> torch.Tensor | None:
        p = self.w_shared_gate_up_2SH
        return None if p is None else p.chunk(2, dim=0)[0]

    @property
    def w_shared_up_SH(self) -> torch.Tensor | None:
        p = self.w_shared_gate_up_2SH
        return None if p is None else p.chunk(2, dim=0)[1]

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        self._pick_backend()  # the device may have changed
        return out

    def extra_repr(self) -> str:
        return (f"H={self.hidden_size}, I={self.intermediate_size}, E={self.num_experts}, K={self.top_k}, "
                f"S={self.shared_intermediate_size}, L={self.local_experts}, W={self.world_size}, "
                f"score={self.score!r}, normalize={self.normalize}, backend={self.backend_in_use!r}, "
                f"recompute={self.recompute}, precision={self.precision!r}")

    # ------------------------------------------------------------ forward pieces

    def _check_x(self, x: torch.Tensor) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(f"x: expected dtype torch.float32 or torch.bfloat16, got {x.dtype}")
        if x.dim() < 1 or x.shape[-1] != self.hidden_size:
            raise ValueError(f"x: expected shape (..., {self.hidden_size}), got {tuple(x.shape)}")
        self._check_device(x)

    def _check_device(self, x: torch.Tensor) -> None:
        """x on the parameters' device; parameters still on meta (built with device="meta") need a real x's
        device given to them first."""
        device = self.w_router_EH.device
        if x.device == device:
            return
        if device.type == "meta":
            raise ValueError(f"x: expected device meta (the device of the module's parameters), got {x.device}: "
                             f"the parameters have no data yet; call to_empty(device=...) then reset_parameters()")
        raise ValueError(f"x: expected device {device} (the device of the module's parameters), got {x.device}")

    def _check_tokens(self, x_TH: torch.Tensor) -> None:
        self._check_x(x_TH)
        if x_TH.dim() != 2:
            raise ValueError(f"x: expected 2 dimensions [T, {self.hidden_size}], got shape {tuple(x_TH.shape)}")

    def route(self, x_TH: torch.Tensor) -> Routing:
        """Router on [T, H] tokens (bf16, or fp32 rounded to bf16): gate logits, scores, top-k
        (`mok.reference.router_forward`, or its GPU version on the fast backend)."""
        self._check_tokens(x_TH)
        return self._route(x_TH)

    def _route(self, x_TH: torch.Tensor) -> Routing:
        self._ensure_ready()
        return Routing(*ops.router(x_TH, self._local("w_router_EH"), self.top_k, score=self.score,
                                   normalize=self.normalize, backend=self.backend_in_use))

    def compute_experts(self, x_TH: torch.Tensor, topk_idx_TK: torch.Tensor, topk_weight_TK: torch.Tensor) -> torch.Tensor:
        """The layer (shared + routed experts) on [T, H] tokens (bf16, or fp32 rounded to bf16) with a
        given routing; y [T, H] bf16.
        With a group, T is this rank's token count (the same on every rank)."""
        self._check_tokens(x_TH)
        return self._compute_experts(x_TH, topk_idx_TK, topk_weight_TK)

    def _compute_experts(self, x_TH: torch.Tensor, topk_idx_TK: torch.Tensor,
                         topk_weight_TK: torch.Tensor) -> torch.Tensor:
        self._ensure_ready()
        self._check_router_across_ranks()
        w = [self._local(n) for n in ("w_shared_gate_up_2SH", "w_shared_down_HS", "w_gate_up_L2IH", "w_down_LHI")]
        return ops.moe_gate_up(x_TH, topk_idx_TK, topk_weight_TK, *w, group=self.group, backend=self.backend_in_use,
                               recompute=self.recompute, precision=self.precision)

    def router_losses(self, routing: Routing) -> RouterLosses:
        """Load-balancing loss and z-loss of `routing` (over its T tokens), deterministic."""
        return RouterLosses(*ops.router_losses(routing.scores, routing.logits, routing.topk_idx, score=self.score,
                                               backend=self.backend_in_use))

    def forward(self, x: torch.Tensor, *, return_router_losses: bool = False):
        """y = MoE(x).

        Args:
            x: [..., H] float32 or bfloat16 (rounded to bf16 for the layer).
            return_router_losses: also return `RouterLosses` (weight them into your loss yourself).
        Returns:
            y with x's shape and dtype (bf16-valued), or (y, RouterLosses).
        """
        self._check_x(x)
        if not isinstance(return_router_losses, bool):
            raise TypeError(f"return_router_losses: expected a bool, got {return_router_losses!r}")
        x_TH = x.reshape(-1, self.hidden_size)  # the ops round to bf16 inside: no bf16 math in the graph
        routing = self._route(x_TH)
        y_TH = self._compute_experts(x_TH, routing.topk_idx, routing.topk_weight)
        y = y_TH.view(x.shape).to(x.dtype, copy=True)  # a new tensor, not a view (FSDP2 hooks the output)
        if return_router_losses:  # the routing is the router's own: its ids are in range
            return y, RouterLosses(*router_losses_of_router(routing.scores, routing.logits, routing.topk_idx,
                                                            score=self.score, backend=self.backend_in_use))
        return y

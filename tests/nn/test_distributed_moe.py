"""mok.MoE under PyTorch's distributed tools, on CPU with gloo (2 and 4 processes):
DTensor parameters over an expert-parallel mesh, FSDP2 (`fully_shard`) alone and on top of expert
parallelism, meta-device construction + `reset_parameters`, and distributed checkpoints (DCP) saved at
W = 2 and loaded at W = 4 and W = 1. Every result is compared with one process running the same
global layer on the same global tokens.

Each world size is launched once (module fixtures) and runs all its scenarios in one process group.
"""

import os
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import mok
from mok.testing.bits import assert_bitwise_equal

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")

H, I, E, K, S, T = 32, 16, 8, 2, 16, 6  # T tokens per rank
LR = 1e-2


def _tokens(W):
    """[W, T, H] fp32 tokens and upstream gradients, rank r takes row r."""
    g = torch.Generator().manual_seed(1)
    return torch.randn(W, T, H, generator=g), torch.randn(W, T, H, generator=g)


def _moe(**kw):
    torch.manual_seed(0)
    return mok.MoE(H, I, E, K, shared_intermediate_size=S, **kw)


def _opt(params):
    return torch.optim.AdamW(params, lr=LR, foreach=False)


def _step(m, x, dy):
    """Forward + backward of <y, dy> (summed over ranks by the layer); (y, d_x)."""
    x = x.clone().requires_grad_()
    y = m(x)
    y.backward(dy)
    return y.detach(), x.grad


# ---------------------------------------------------------------- worker side (one process per rank)


def _full(t):
    """A copy of the global tensor (`full_tensor` of a replicated DTensor is its local tensor, not a copy)."""
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def _gather_rows(t, W):
    parts = [torch.empty_like(t) for _ in range(W)]
    dist.all_gather(parts, t.contiguous())
    return torch.stack(parts)


def _run_layer(m, rank, W, dp=1):
    """Init (meta -> to_empty -> reset_parameters), forward/backward on this rank's tokens, one AdamW step."""
    m.to_empty(device="cpu")
    m.reset_parameters()
    init = {n: _full(p) for n, p in m.named_parameters()}
    x, dy = _tokens(W)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y, dx = _step(m, x[rank], dy[rank])
    for p in m.parameters():
        p.grad.mul_(dp)  # FSDP2 averages over dp; the one-process run sums over all tokens
    grads = {n: _full(p.grad) for n, p in m.named_parameters()}
    _opt(list(m.parameters())).step()
    return dict(init=init, y=_gather_rows(y, W), dx=_gather_rows(dx, W), grads=grads,
                stepped={n: _full(p) for n, p in m.named_parameters()},
                warnings=[str(w.message) for w in caught])


def _scenario_ep(rank, W, tmp):
    """DTensor parameters over a 1-D expert-parallel mesh (every rank its E / W experts)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    mesh = init_device_mesh("cpu", (W,), mesh_dim_names=("ep",))
    m = _moe(group=mesh, device="meta")
    out = _run_layer(m, rank, W)
    out["placements"] = {n: p.placements for n, p in m.named_parameters()}
    assert isinstance(m.w_gate_up_L2IH, DTensor) and m.w_gate_up_L2IH.placements == (Shard(0),)
    assert m.w_router_EH.placements == (Replicate(),)
    return out


def _scenario_fsdp(rank, W, tmp):
    """FSDP2 over all W ranks (no expert parallelism): each rank runs every expert on its own tokens."""
    from torch.distributed.fsdp import fully_shard

    m = _moe(device="meta")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fully_shard(m)
    out = _run_layer(m, rank, W, dp=W)
    with warnings.catch_warnings(record=True) as caught_bf16:
        warnings.simplefilter("always")
        m(_tokens(W)[0][rank].bfloat16().requires_grad_())  # bf16 in, bf16 out: no cast to hide a view
    out["warnings"] += [str(w.message) for w in caught + caught_bf16]
    return out


def _scenario_ep_fsdp(rank, W, tmp):
    """EP x FSDP2: mesh (dp, ep); DTensor experts over ep, FSDP2 over dp on top (2-D)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dp = 2
    mesh = init_device_mesh("cpu", (dp, W // dp), mesh_dim_names=("dp", "ep"))
    m = _moe(group=mesh["ep"], device="meta")
    fully_shard(m, mesh=mesh["dp"])
    return _run_layer(m, rank, W, dp=dp)


def _scenario_dcp_save(rank, W, tmp):
    """Train one step at W (EP DTensors), save with torch.distributed.checkpoint."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (W,), mesh_dim_names=("ep",))
    m = _moe(group=mesh)
    x, dy = _tokens(W)
    _step(m, x[rank], dy[rank])
    _opt(list(m.parameters())).step()
    dcp.save(m.state_dict(), checkpoint_id=os.path.join(tmp, "ckpt"))
    old = dict(m.state_dict())  # the same state with mok 0.2's keys: gate and up apart (DTensor views)
    for stacked, (gate, up), dim in _PAIRS:
        old[gate], old[up] = old.pop(stacked).chunk(2, dim)
    dcp.save(old, checkpoint_id=os.path.join(tmp, "ckpt_old"))
    return {"saved": {n: _full(p) for n, p in m.named_parameters()}}


def _scenario_dcp_load(rank, W, tmp):
    """Load the W = 2 checkpoint into an EP x FSDP2 layer at this W, built on the meta device."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2, W // 2), mesh_dim_names=("dp", "ep"))
    m = _moe(group=mesh["ep"], device="meta")
    fully_shard(m, mesh=mesh["dp"])
    m.to_empty(device="cpu")
    sd = m.state_dict()
    dcp.load(sd, checkpoint_id=os.path.join(tmp, "ckpt"))
    m.load_state_dict(sd)
    return {"loaded": {n: _full(p) for n, p in m.named_parameters()}}


def _scenario_dcp_load_old(rank, W, tmp):
    """docs/distributed.md's recipe: the W = 2 checkpoint with mok 0.2's separate gate/up keys, loaded into an
    EP x FSDP2 layer at this W through views of its stacked parameters' halves."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2, W // 2), mesh_dim_names=("dp", "ep"))
    m = _moe(group=mesh["ep"], device="meta")
    fully_shard(m, mesh=mesh["dp"])
    m.to_empty(device="cpu")
    sd = m.state_dict()
    for stacked, (gate, up), dim in _PAIRS:
        sd[gate], sd[up] = (torch.empty_like(h) for h in sd.pop(stacked).chunk(2, dim))
    dcp.load(sd, checkpoint_id=os.path.join(tmp, "ckpt_old"))
    with torch.no_grad():
        for stacked, (gate, up), dim in _PAIRS:
            getattr(m, stacked).copy_(torch.cat([sd[gate], sd[up]], dim))
    return {"loaded": {n: _full(p) for n, p in m.named_parameters()}}


_PAIRS = (("w_gate_up_L2IH", ("w_gate_LIH", "w_up_LIH"), 1),  # (stacked parameter, mok 0.2's keys, stacking dim)
          ("w_shared_gate_up_2SH", ("w_shared_gate_SH", "w_shared_up_SH"), 0))
_SCENARIOS = {"ep": _scenario_ep, "fsdp": _scenario_fsdp, "ep_fsdp": _scenario_ep_fsdp,
              "dcp_save": _scenario_dcp_save, "dcp_load": _scenario_dcp_load, "dcp_load_old": _scenario_dcp_load_old}


def _worker(rank, W, tmp, scenarios):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp, f'init{W}')}", rank=rank, world_size=W)
    try:
        for name in scenarios:
            out = _SCENARIOS[name](rank, W, tmp)
            if rank == 0:
                torch.save(out, os.path.join(tmp, f"{name}.W{W}.pt"))
            dist.barrier()
    finally:
        dist.destroy_process_group()
    # Results are on disk. End here, without interpreter teardown: the DeviceMesh sub-groups torch keeps
    # cached still own gloo threads, and destroying them at static destruction intermittently aborts the
    # process ("terminate called without an active exception", SIGABRT) after the work has succeeded.
    os._exit(0)


def _launch(W, tmp, scenarios):
    mp.spawn(_worker, args=(W, str(tmp), scenarios), nprocs=W, join=True)
    return {name: torch.load(os.path.join(tmp, f"{name}.W{W}.pt"), weights_only=False) for name in scenarios}


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("mok-dist")


@pytest.fixture(scope="module")
def w2(tmp):
    return _launch(2, tmp, ["ep", "fsdp", "dcp_save"])


@pytest.fixture(scope="module")
def w4(tmp, w2):  # after w2: loads its checkpoint
    return _launch(4, tmp, ["ep", "ep_fsdp", "dcp_load", "dcp_load_old"])


# ---------------------------------------------------------------- the one-process reference


def _single(W, step=True):
    """The same global layer on all W ranks' tokens in one process: init, y, d_x, grads, after one step."""
    m = _moe()
    init = {n: p.detach().clone() for n, p in m.named_parameters()}
    x, dy = _tokens(W)
    y, dx = _step(m, x.reshape(W * T, H), dy.reshape(W * T, H))
    grads = {n: p.grad.clone() for n, p in m.named_parameters()}
    if step:
        _opt(list(m.parameters())).step()
    return dict(init=init, y=y.view(W, T, H), dx=dx.view(W, T, H), grads=grads,
                stepped={n: p.detach().clone() for n, p in m.named_parameters()})


def _check_against_single(got, W, *, bitwise_grads):
    ref = _single(W)
    for n, v in ref["init"].items():  # the same global init for every W and sharding
        assert_bitwise_equal(got["init"][n], v, f"init {n}")
    assert_bitwise_equal(got["y"], ref["y"], "y")  # mok's layer is W-invariant
    assert_bitwise_equal(got["dx"], ref["dx"], "d_x")
    for n, v in ref["grads"].items():
        if n in bitwise_grads:
            assert_bitwise_equal(got["grads"][n], v, f"grad {n}")
        else:  # summed over ranks by a collective: the same up to the summation order
            torch.testing.assert_close(got["grads"][n], v, rtol=1e-5, atol=1e-5 * v.abs().max().item())
    for n, v in ref["stepped"].items():
        torch.testing.assert_close(got["stepped"][n], v, rtol=1e-5, atol=1e-6)
    assert not [w for w in got["warnings"] if "view" in w], got["warnings"]


_MOK_REDUCED = {"w_gate_up_L2IH", "w_down_LHI", "w_shared_gate_up_2SH", "w_shared_down_HS"}


@pytest.mark.slow
@pytest.mark.parametrize("W", [
    2,  # two ranks, 4 experts each
    4,  # four ranks, 2 experts each
])
def test_dtensor_expert_parallel_equals_one_process(W, w2, w4):
    """Experts and shared expert: bitwise (mok reduces them itself); router: a Partial gradient summed by DTensor."""
    got = {2: w2, 4: w4}[W]["ep"]
    _check_against_single(got, W, bitwise_grads=_MOK_REDUCED)
    for n in ("w_gate_up_L2IH", "w_down_LHI"):
        assert "Shard(dim=0)" in str(got["placements"][n])


@pytest.mark.slow
def test_fsdp2_alone_matches_one_process_without_view_warning(w2):
    """fully_shard on a meta-built layer: same init, same outputs; gradients averaged by FSDP2; no 'returned a
    view tensor' warning (the module returns a new tensor)."""
    _check_against_single(w2["fsdp"], 2, bitwise_grads=set())


@pytest.mark.slow
def test_ep_times_fsdp2_matches_one_process(w4):
    """mesh (dp=2, ep=2): FSDP2 over dp on top of DTensor experts over ep (2-D sharding, _StridedShard)."""
    _check_against_single(w4["ep_fsdp"], 4, bitwise_grads=set())


@pytest.mark.slow
def test_dcp_saved_at_w2_loads_at_w4_and_w1(w2, w4, tmp):
    import torch.distributed.checkpoint as dcp

    saved = w2["dcp_save"]["saved"]
    assert not torch.equal(saved["w_gate_up_L2IH"], _single(2, step=False)["init"]["w_gate_up_L2IH"])  # a trained state
    for n, v in saved.items():
        assert_bitwise_equal(w4["dcp_load"]["loaded"][n], v, f"W=4 {n}")
        assert_bitwise_equal(w4["dcp_load_old"]["loaded"][n], v, f"W=4, mok 0.2's keys: {n}")
    m = _moe(device="meta").to_empty(device="cpu")  # W = 1: plain tensors with the global shapes
    sd = m.state_dict()
    dcp.load(sd, checkpoint_id=os.path.join(tmp, "ckpt"), no_dist=True)
    m.load_state_dict(sd)
    for n, p in m.named_parameters():
        assert_bitwise_equal(p.detach(), saved[n], f"W=1 {n}")

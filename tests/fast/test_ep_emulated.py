"""The fast path's expert-parallel orchestration (mok/fast/_ep.py, unchanged) on the CPU, its kernels
replaced by tests/fast_emulator.py, in W gloo processes: every output at W = 2 and 4 is bitwise the
W = 1 output, shared gradients agree on every rank, the values are the layer's (close to the
reference), and the autograd op saves and reloads the expert-parallel context. The CUDA kernels, IPC
and device waits themselves are tested on the GPU (tests/gpu/test_fast_ep*.py)."""
import os
import tempfile

import pytest
import torch
import torch.distributed as dist

from mok.testing.bits import assert_bitwise_equal, rel_error
from mok.testing.cases import LAYER_ARGS, OUTPUT_NAMES, MoEConfig, make_inputs
from mok.testing.dist import launch
from mok.testing.tolerance import GRAD_OF
from mok.testing.runner import run_layer, shard_inputs, unshard_outputs

# the emulated stages build their segments with the binding's Operand and Segment and check them with its checks
pytestmark = pytest.mark.usefixtures("mok_binding")

CFGS = {
    "shared": MoEConfig(T=16, H=16, I=8, E=4, K=2, S=8),     # shared expert, S/W not a multiple of 8: all of S per rank
    "sliced": MoEConfig(T=16, H=16, I=8, E=4, K=2, S=32),    # S/W = 16, 8: each rank computes its slice, pulls the rest
    "no_shared": MoEConfig(T=12, H=8, I=16, E=8, K=3, S=0),  # no shared expert, K = 3, W = 4: T = 3 per rank
}
# I and S / W (W <= 2) multiples of the d_x GEMM's K tile: separate gate and up tensors are read apart.
APART = MoEConfig(T=16, H=16, I=64, E=4, K=2, S=128)


def _stack_gate_up(local: dict) -> None:
    """Gate and up (routed and shared) as the halves of one [gate; up] tensor, as mok.nn.ops casts float32
    weights and transformers stores gate_up_proj."""
    for gate, up, dim in (("routed_gate", "routed_up", 1), ("shared_gate", "shared_up", 0)):
        if local[gate] is not None:
            local[gate], local[up] = torch.cat([local[gate], local[up]], dim).chunk(2, dim)


def _no_concatenation(*args):
    raise AssertionError("gate and up were concatenated although the d_x GEMM can read them as they are")


def _run(rank, world_size, group, inputs, W, via_op, stacked=False, apart=False):
    import fast_emulator

    import mok.fast
    from mok.fast import _ep
    from mok.reference import check_layer_args

    fast_emulator.install()
    tmp = None
    if W == 1:  # the expert-parallel code path with a group of one
        tmp = tempfile.mkdtemp()
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp, 'init')}", rank=0, world_size=1)
        group = dist.group.WORLD
    local = shard_inputs(inputs, rank, W)
    if stacked:
        _stack_gate_up(local)
        from mok.fast import _backward

        _backward._concat = _no_concatenation
    if apart:  # two tensors, never concatenated
        from mok.fast import _backward

        assert _backward.dx_reads(local["routed_gate"], local["routed_up"])[1] is local["routed_up"]
        _backward._concat = _no_concatenation
    args = [local[a] for a in LAYER_ARGS]
    if via_op:
        from mok.nn import ops

        leaves = {a: (v.clone().requires_grad_(True) if v is not None and v.is_floating_point() else v)
                  for a, v in zip(LAYER_ARGS, args, strict=True)}
        y = ops.moe(*leaves.values(), group=group, backend="fast")
        y.backward(local["dy"])
        out = {"y": y.detach(), **{g: (leaves[a].grad if leaves[a] is not None else None) for g, a in GRAD_OF.items()}}
    elif W == 1:
        d = check_layer_args(*args, world_size=1)
        y, ctx = _ep.run_forward_ep(*args, d, group)
        out = dict(zip(OUTPUT_NAMES, (y, *_ep.run_backward_ep(ctx, local["dy"])), strict=True))
    else:
        y, ctx = mok.fast.forward(*args, group=group)
        out = dict(zip(OUTPUT_NAMES, (y, *mok.fast.backward(ctx, local["dy"])), strict=True))
    mok.fast.release_ep_buffers()
    if tmp is not None:
        dist.destroy_process_group()
    return {k: (v.detach().clone() if v is not None else None) for k, v in out.items()}


def _world(inputs, W, via_op=False, stacked=False, apart=False):
    return unshard_outputs(launch(_run, (inputs, W, via_op, stacked, apart), W if W > 1 else 1, timeout_s=60))


@pytest.mark.parametrize("name", list(CFGS))  # the three CFGS above: shared, sliced, no_shared
def test_every_output_at_w2_and_w4_is_bitwise_the_w1_output(name):
    inputs = make_inputs(CFGS[name], seed=21, routing="skewed")
    want = _world(inputs, 1)
    for W in (2, 4):
        got = _world(inputs, W)  # unshard_outputs: the shared gradients are bitwise equal on every rank
        for k in OUTPUT_NAMES:
            assert (got[k] is None) == (want[k] is None), k
            if want[k] is not None:
                assert_bitwise_equal(got[k], want[k], f"W={W} {k}")


@pytest.mark.parametrize("name", [
    "sliced",     # the shared expert's [gate; up] halves too, S sliced across ranks
    "no_shared",  # the routed [gate; up] halves alone
])
def test_gate_up_halves_of_one_tensor_give_the_same_bits_without_a_concatenation(name):
    """Gate and up passed as views into one [gate; up] tensor: forward reads them at their strides, backward's
    d_x GEMM reads the tensor itself (no concatenation), and every output is bitwise the separate tensors'."""
    inputs = make_inputs(CFGS[name], seed=25)
    want = _world(inputs, 1)
    for W in (1, 2):
        got = _world(inputs, W, stacked=True)
        for k in OUTPUT_NAMES:
            if want[k] is not None:
                assert_bitwise_equal(got[k], want[k], f"stacked W={W} {k}")


@pytest.mark.parametrize("W", [1, 2])  # the expert-parallel code path with a group of one / two ranks
def test_two_gate_up_tensors_give_the_one_tensor_bits_without_a_concatenation(W):
    """Gate and up as two tensors whose rows are whole K tiles of the d_x GEMM: the forward's fused gate/up GEMM and
    the backward's d_x GEMM read them apart (the emulated b_up operand; no concatenation), and every output is
    bitwise that of the same weights as one [gate; up] tensor."""
    inputs = make_inputs(APART, seed=27)
    want = _world(inputs, W, stacked=True)
    got = _world(inputs, W, apart=True)
    for k in OUTPUT_NAMES:
        assert (got[k] is None) == (want[k] is None), k
        if want[k] is not None:
            assert_bitwise_equal(got[k], want[k], f"two tensors W={W} {k}")


def test_the_values_are_the_layers():
    """Bitwise W-invariance could hide a W-invariant mistake (wrong weights, wrong slots): compare with
    the reference (the emulated arithmetic is not the reference's, so within bf16 rounding)."""
    inputs = make_inputs(CFGS["shared"], seed=22)
    got, ref = _world(inputs, 2), run_layer(inputs)
    for k in OUTPUT_NAMES:
        assert rel_error(got[k].float(), ref[k].float()) < 2e-2, k


def test_autograd_op_saves_and_reloads_the_expert_parallel_context():
    inputs = make_inputs(CFGS["shared"], seed=23)
    want, got = _world(inputs, 2), _world(inputs, 2, via_op=True)
    for k in OUTPUT_NAMES:  # bf16 weights: their gradients are the fp32 ones rounded once
        assert_bitwise_equal(got[k], want[k].to(got[k].dtype), f"ops.moe {k}")


def _run_fp32_op(rank, world_size, group, inputs, W, stacked_op):
    """ops.moe (separate fp32 gate and up leaves, which the op rounds into one bf16 [gate; up]) or ops.moe_gate_up
    (one fp32 [gate; up] leaf each) on the fast backend: y, d_x and the gate/up gradients as [gate; up]."""
    import fast_emulator

    from mok.nn import ops

    fast_emulator.install()
    fast_emulator.stub_streams()  # W = 1 runs the one-GPU path (mok/fast/_backward.py run_backward)
    if W == 1:
        group = None
    local = shard_inputs(inputs, rank, W)
    leaf = {k: (v.float().requires_grad_() if isinstance(v, torch.Tensor) and v.is_floating_point() and
                k not in ("x", "topk_weight") else v) for k, v in local.items()}
    x = local["x"].clone().requires_grad_()
    out = {}
    if stacked_op:
        rgu = torch.cat([leaf["routed_gate"], leaf["routed_up"]], 1).detach().requires_grad_()
        sgu = torch.cat([leaf["shared_gate"], leaf["shared_up"]]).detach().requires_grad_()
        y = ops.moe_gate_up(x, local["topk_idx"], local["topk_weight"], sgu, leaf["shared_down"], rgu,
                            leaf["routed_down"], group=group, backend="fast")
        y.backward(local["dy"])
        out["d_rgu"], out["d_sgu"] = rgu.grad, sgu.grad
    else:
        y = ops.moe(x, local["topk_idx"], local["topk_weight"], *(leaf[k] for k in LAYER_ARGS[3:]), group=group,
                    backend="fast")
        y.backward(local["dy"])
        for k in ("routed_gate", "routed_up", "shared_gate", "shared_up"):  # two tensors each, not views of one
            assert leaf[k].grad.is_contiguous() and leaf[k].grad.dtype == torch.float32, k
        out["d_rgu"] = torch.cat([leaf["routed_gate"].grad, leaf["routed_up"].grad], 1)
        out["d_sgu"] = torch.cat([leaf["shared_gate"].grad, leaf["shared_up"].grad])
    out.update(y=y.detach(), d_x=x.grad)
    import mok.fast
    mok.fast.release_ep_buffers()
    return {k: v.detach().clone() for k, v in out.items()}


@pytest.mark.parametrize("W", [1, 2])  # the one-GPU path (no group) / the expert-parallel path over two ranks
def test_fp32_weights_through_both_ops_give_the_same_bits_and_unaliased_gradients(W):
    """fp32 master weights on the fast backend: ops.moe with separate gate and up (rounded into one bf16 [gate; up]
    that the backward reads as is) returns two separate gradient tensors, and ops.moe_gate_up (one [gate; up]
    tensor) the same values as one; y and d_x bitwise the same too."""
    inputs = make_inputs(CFGS["sliced"], seed=26)
    got = {op: launch(_run_fp32_op, (inputs, W, op), W, timeout_s=60) for op in (False, True)}
    for rank in range(W):
        for k in ("y", "d_x", "d_rgu", "d_sgu"):
            assert_bitwise_equal(got[True][rank][k], got[False][rank][k], f"W={W} rank {rank} {k}")


def test_bad_ids_on_one_rank_make_every_output_nan_on_every_rank():
    inputs = make_inputs(CFGS["shared"], seed=24)
    inputs["topk_idx"][-1, 0] = 99  # a token of the last rank
    got = _world(inputs, 2)
    for k in OUTPUT_NAMES:
        assert torch.isnan(got[k].float()).all(), k


@pytest.mark.parametrize("name", [
    "shared",     # routed and shared d_a fused, all of S on every rank
    "no_shared",  # the routed d_a alone, K = 3
])
def test_the_fused_swiglu_backward_switch_keeps_every_output(monkeypatch, name):
    """MOK_FAST_FUSE_SWIGLU_BWD=1 (the d_a GEMM with the SwiGLU backward in its epilogue; the emulator's
    GEMM_NN_SWIGLU_BWD) through the expert-parallel backward: every output bitwise the unfused (=0) W = 1 one."""
    from mok.fast import _tiles

    inputs = make_inputs(CFGS[name], seed=26)
    monkeypatch.setenv(_tiles.FUSE_ENV, "0")
    want = _world(inputs, 1)
    monkeypatch.setenv(_tiles.FUSE_ENV, "1")
    for W in (1, 2):
        got = _world(inputs, W)
        for k in OUTPUT_NAMES:
            if want[k] is not None:
                assert_bitwise_equal(got[k], want[k], f"fused W={W} {k}")


def _run_concat_lifetime(rank, world_size, group, inputs, W):
    """(concatenations made, how many of them were still alive when the gate/up weight gradients began)."""
    import weakref

    import fast_emulator

    import mok.fast
    from mok.fast import _backward

    fast_emulator.install()
    fast_emulator.stub_streams()
    made, alive = [], []
    concat, gate_up_grads = _backward._concat, _backward.gate_up_weight_grads

    def concat_seen(gate, up, dim, out):
        made.append(weakref.ref(out))
        concat(gate, up, dim, out)

    def gate_up_grads_seen(*args, **kwargs):
        alive.append(sum(r() is not None for r in made))
        return gate_up_grads(*args, **kwargs)

    _backward._concat, _backward.gate_up_weight_grads = concat_seen, gate_up_grads_seen
    local = shard_inputs(inputs, rank, W)
    y, ctx = mok.fast.forward(*(local[a] for a in LAYER_ARGS), group=group if W > 1 else None)
    mok.fast.backward(ctx, local["dy"])
    mok.fast.release_ep_buffers()
    return len(made), alive


@pytest.mark.parametrize("W", [1, 2])  # the one-GPU backward (run_backward) / the expert-parallel one (run_backward_ep)
def test_the_gate_up_concatenation_is_freed_before_the_weight_gradients(W):
    """Separate gate and up tensors are concatenated for the d_x GEMM only: that copy ([E, 2I, H] and [2S, H], as
    large as the gate/up weights) is freed before the weight gradients' buffers are allocated, so it does not add
    to the backward's peak memory (was: alive until the backward returned)."""
    inputs = make_inputs(CFGS["shared"], seed=27)
    for rank, (made, alive) in enumerate(launch(_run_concat_lifetime, (inputs, W), W, timeout_s=60)):
        assert made == 2, f"rank {rank}: {made} concatenations (routed and shared expected)"
        assert alive == [0], f"rank {rank}: {alive} concatenations alive at the gate/up weight gradients"


def _run_release(rank, world_size, group, inputs, W):
    """The expert-parallel backward without and with release_saved on two forwards of the same inputs: (outputs of
    each, the order in which the d_x rows (routed, shared) were dropped and the down gradients began, whether the x
    rows held their bytes when the down gradients began, and afterwards)."""
    import weakref

    import fast_emulator

    import mok.fast
    from mok.fast import _backward, _ep

    fast_emulator.install()
    fast_emulator.stub_streams()
    local = shard_inputs(inputs, rank, W)
    args = [local[a] for a in LAYER_ARGS]
    y, ctx = mok.fast.forward(*args, group=group)
    keep = mok.fast.backward(ctx, local["dy"])
    y2, ctx2 = mok.fast.forward(*args, group=group)
    events, refs = [], []
    scatter, combine, down_grads = _ep._lib.ep_scatter_rows, _ep._lib.combine_bwd_dx, _backward.down_weight_grads

    def drop_event(name, t):
        refs.append(weakref.ref(t, lambda _: events.append(name)))

    def watch_scatter(rows, *a):
        drop_event("drop dx_RH", rows)
        scatter(rows, *a)

    def watch_combine(dxs, *a):
        if dxs is not None:
            drop_event("drop dxs", dxs)
        combine(dxs, *a)

    def watch_down(*a, **k):
        events.append(f"down, x rows alive: {ctx2.x_RH.untyped_storage().nbytes() > 0}")
        return down_grads(*a, **k)
    _ep._lib.ep_scatter_rows, _ep._lib.combine_bwd_dx, _backward.down_weight_grads = \
        watch_scatter, watch_combine, watch_down
    rel = mok.fast.backward(ctx2, local["dy"], release_saved=True)
    x_rows_after = ctx2.x_RH.untyped_storage().nbytes()
    mok.fast.release_ep_buffers()
    return [t.clone() if t is not None else None for t in (y, *keep)], \
        [t.clone() if t is not None else None for t in (y2, *rel)], events, x_rows_after


@pytest.mark.parametrize("name", [
    "shared",     # a shared expert: its d_x rows (all of S per rank) are dropped too
    "no_shared",  # routed rows alone, W = 4
])
def test_release_frees_the_x_rows_and_drops_the_d_x_rows_before_the_down_gradients(name):
    """run_backward_ep frees what only earlier steps read before the down gradients' buffer is allocated, as the
    one-GPU backward does: the d_x rows once scattered and combined, and with release_saved the x rows once the
    gate/up gradients are queued; every output bitwise the same."""
    W = 4 if name == "no_shared" else 2
    inputs = make_inputs(CFGS[name], seed=29)
    for rank, (keep, rel, events, x_rows_after) in enumerate(launch(_run_release, (inputs, W), W, timeout_s=60)):
        for k, a, b in zip(OUTPUT_NAMES, keep, rel, strict=True):
            if a is not None:
                assert_bitwise_equal(b, a, f"rank {rank} {k}: with release_saved")
        drops = ["drop dx_RH"] + (["drop dxs"] if CFGS[name].S else [])
        assert sorted(events[:-1]) == sorted(drops), f"rank {rank}: {events}"
        assert events[-1] == "down, x rows alive: False", f"rank {rank}: {events}"
        assert x_rows_after == 0, f"rank {rank}: the x rows still hold {x_rows_after} bytes"

"""The fast backward's release_saved (mok/fast/_backward.py `release`), on the CPU with tests/fast_emulator.py's
kernels: freeing o, [p | q] and the x rows once last read (and the d_x rows, always, once combined), and making a
[gate; up] concatenation only after that, leaves every output bitwise the same; the context is spent afterwards (a
second backward is refused, naming ctx); the eager autograd path frees the saved context unless the graph is
retained, and a retained graph's second backward gives the same bits. The GPU side:
tests/gpu/test_fast_release_memory.py (the peak follows its plan) and benchmarks/bench_moe.py's peak column."""
import weakref

import pytest
import torch

from mok.testing.bits import assert_bitwise_equal
from mok.testing.cases import LAYER_ARGS, OUTPUT_NAMES, MoEConfig, make_inputs
from mok.testing.dist import launch

# the emulated stages build their segments with the binding's Operand and Segment and check them with its checks
pytestmark = pytest.mark.usefixtures("mok_binding")

CFG = MoEConfig(T=24, H=16, I=24, E=4, K=2, S=8)  # a shared expert, so its [p | q] and a_s are released too


def _stacked(inputs: dict) -> dict:
    """Gate and up (routed and shared) as the halves of one [gate; up] tensor: no concatenation in the backward."""
    out = dict(inputs)
    for gate, up, dim in (("routed_gate", "routed_up", 1), ("shared_gate", "shared_up", 0)):
        out[gate], out[up] = torch.cat([inputs[gate], inputs[up]], dim).chunk(2, dim)
    return out


def _direct(rank, world_size, group, inputs, stacked):
    """mok.fast.backward without and with release_saved on two forwards of the same inputs: (outputs of each,
    what was freed, whether [p | q] was still alive when gate and up were concatenated, the spent ctx's error)."""
    import fast_emulator

    import mok.fast
    from mok.fast import _backward

    fast_emulator.install()
    fast_emulator.stub_streams()
    inp = _stacked(inputs) if stacked else inputs
    args = [inp[a] for a in LAYER_ARGS]
    y, ctx = mok.fast.forward(*args)
    keep = mok.fast.backward(ctx, inp["dy"])
    again = mok.fast.backward(ctx, inp["dy"])  # without release_saved the context stays whole
    y2, ctx2 = mok.fast.forward(*args)
    concat_saw = []
    concat = _backward._concat

    def watch(*a):
        concat_saw.append(ctx2.pq_R2I.untyped_storage().nbytes())
        concat(*a)
    _backward._concat = watch
    # the order of: the d_x combine (queued on the side stream), the main stream waiting for the side one, the d_x
    # rows (routed, shared) being dropped, the down-weight-gradient GEMM, the first kernel after the weight gradients
    events, combine, down_grads, zero_empty = [], _backward._lib.combine_bwd_dx, _backward.down_weight_grads, \
        _backward._lib.zero_empty

    class Main(type(torch.cuda.current_stream())):
        def wait_stream(self, other):
            events.append("wait")

    def watch_combine(dxs, dx_RH, *a):
        refs.extend(weakref.ref(t, lambda _, name=name: events.append(name))
                    for name, t in (("drop dxs", dxs), ("drop dx_RH", dx_RH)))
        combine(dxs, dx_RH, *a)
        events.append("combine")

    def watch_down(*a, **k):
        events.append("down")
        return down_grads(*a, **k)

    def watch_zero_empty(*a):
        events.append("zero_empty")
        zero_empty(*a)
    refs = []
    torch.cuda.current_stream = lambda dev=None: Main()
    _backward._lib.combine_bwd_dx, _backward.down_weight_grads, _backward._lib.zero_empty = \
        watch_combine, watch_down, watch_zero_empty
    rel = mok.fast.backward(ctx2, inp["dy"], release_saved=True)
    freed = {name: getattr(ctx2, name).untyped_storage().nbytes() == 0
             for name in ("o_RH", "pq_R2I", "pq_s_T2S", "a_RI", "a_s_TS", "x_RH")}
    try:
        mok.fast.backward(ctx2, inp["dy"], release_saved=True)
        err = None
    except ValueError as e:
        err = str(e)
    def copies(*ts):
        return [t.clone() if t is not None else None for t in ts]
    return copies(y, *again), copies(y, *keep), copies(y2, *rel), freed, concat_saw, err, events


@pytest.mark.parametrize("stacked", [
    False,  # separate gate and up: the concatenation is made after [p | q] is freed, beside the down gradients
    True,   # halves of one tensor: no concatenation, the order unchanged
])
def test_release_keeps_every_output_and_spends_the_context(stacked):
    again, keep, rel, freed, concat_saw, err, events = launch(_direct, (make_inputs(CFG, seed=31), stacked), 1,
                                                      timeout_s=60)[0]
    for name, a, b, c in zip(OUTPUT_NAMES, keep, again, rel, strict=True):
        if a is not None:
            assert_bitwise_equal(b, a, f"{name}: a second backward on a kept context")
            assert_bitwise_equal(c, a, f"{name}: with release_saved")
    assert freed["o_RH"] and freed["pq_R2I"] and freed["pq_s_T2S"] and freed["x_RH"], freed
    assert freed["a_RI"] == (not stacked), freed  # a is freed early only where the down gradients move first
    assert concat_saw == ([] if stacked else [0, 0]), concat_saw  # routed and shared: each after [p | q] was freed
    assert err is not None and err.startswith("ctx: spent"), err
    # the d_x rows, read on the side stream, are dropped only after the main stream waits for it, and before the
    # down gradients where those run last (stacked); separate gate and up ran the down gradients first
    drops = [events.index(e) for e in ("drop dxs", "drop dx_RH")]
    assert "wait" in events[events.index("combine"):min(drops)], events
    assert max(drops) < events.index("zero_empty"), events
    assert (max(drops) < events.index("down")) == stacked, events


def _direct_fp8(rank, world_size, group, inputs):
    """mok.fast.backward in the FP8 recipe without and with release_saved on two forwards of the same inputs: (outputs
    of each, what was freed, the spent ctx's error)."""
    import fast_emulator

    import mok.fast

    fast_emulator.install()
    fast_emulator.stub_streams()
    args = [inputs[a] for a in LAYER_ARGS]
    y, ctx = mok.fast.forward(*args, precision="fp8")
    keep = mok.fast.backward(ctx, inputs["dy"])
    y2, ctx2 = mok.fast.forward(*args, precision="fp8")
    rel = mok.fast.backward(ctx2, inputs["dy"], release_saved=True)
    freed = {name: getattr(ctx2, name).untyped_storage().nbytes() == 0
             for name in ("o_RH", "pq_R2I", "pq_s_T2S", "x_RH")}
    try:
        mok.fast.backward(ctx2, inputs["dy"], release_saved=True)
        err = None
    except ValueError as e:
        err = str(e)
    return [t.clone() if t is not None else None for t in (y, *keep)], \
        [t.clone() if t is not None else None for t in (y2, *rel)], freed, err


def test_fp8_release_keeps_every_output_and_spends_the_context():
    keep, rel, freed, err = launch(_direct_fp8, (make_inputs(CFG, seed=33),), 1, timeout_s=120)[0]
    for name, a, b in zip(OUTPUT_NAMES, keep, rel, strict=True):
        if a is not None:
            assert_bitwise_equal(b, a, f"{name}: FP8 with release_saved")
    assert all(freed.values()), freed
    assert err is not None and err.startswith("ctx: spent"), err


def _via_op(rank, world_size, group, inputs, retain, registered=False):
    """ops.moe in eager autograd with bf16 leaves, recording the tensors it saves: (gradients of one backward, or of
    two with retain_graph, and whether each saved fp32 [R, 2I] tensor still holds its bytes). registered: through
    the registered custom ops (what torch.compile calls) instead of the eager path's autograd.Function."""
    import fast_emulator

    from mok.nn import _op_common, ops

    fast_emulator.install()
    fast_emulator.stub_streams()
    _op_common._EAGER = not registered
    leaves = {a: (v.clone().requires_grad_(True) if v is not None and v.is_floating_point() else v)
              for a, v in ((a, inputs[a]) for a in LAYER_ARGS)}
    saved = []

    def pack(t):
        saved.append(t)
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = ops.moe(*leaves.values(), backend="fast")
    R, I = CFG.T * CFG.K, CFG.I
    pq = [t for t in saved if t.dtype == torch.float32 and tuple(t.shape) == (R, 2 * I)]
    runs = []
    for _ in range(2 if retain else 1):
        for v in leaves.values():
            if isinstance(v, torch.Tensor) and v.requires_grad:
                v.grad = None
        y.backward(inputs["dy"], retain_graph=retain)
        runs.append({a: leaves[a].grad.clone() for a in ("x", "topk_weight", "routed_gate", "routed_down")})
    return runs, len(pq), [t.untyped_storage().nbytes() > 0 for t in pq]


def test_eager_autograd_frees_the_saved_context_unless_the_graph_is_retained():
    inputs = make_inputs(CFG, seed=32)
    once, n_pq, alive = launch(_via_op, (inputs, False), 1, timeout_s=60)[0]
    assert n_pq == 1 and alive == [False], "the saved [p | q] is freed by the backward"
    twice, n_pq, alive = launch(_via_op, (inputs, True), 1, timeout_s=60)[0]
    assert n_pq == 1 and alive == [True], "retain_graph=True keeps it for the next backward"
    for k in once[0]:
        assert_bitwise_equal(twice[0][k], once[0][k], f"{k}: retained graph, first backward")
        assert_bitwise_equal(twice[1][k], once[0][k], f"{k}: retained graph, second backward")


def test_the_registered_op_keeps_the_saved_context():
    """mok::moe_bwd, the op a compiled graph calls, frees nothing: AOTAutograd owns those saved tensors. The same
    gradients as the eager path's."""
    inputs = make_inputs(CFG, seed=32)
    (eager,), _, _ = launch(_via_op, (inputs, False), 1, timeout_s=60)[0]
    (got,), n_pq, alive = launch(_via_op, (inputs, False, True), 1, timeout_s=60)[0]
    assert n_pq == 1 and alive == [True], "the registered op kept [p | q]"
    for k in eager:
        assert_bitwise_equal(got[k], eager[k], f"{k}: registered op against the eager path")

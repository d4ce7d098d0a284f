"""The reference's bits do not depend on reruns, threads, W, strides, the device or the rest of the
batch (docs/determinism.md)."""

import math

import pytest
import torch

from mok.testing.bits import assert_bitwise_equal, bit_diff
from mok.testing.cases import DEFAULT, OUTPUT_NAMES, MoEConfig, make_inputs
from mok.testing.dist import run_reference_world
from mok.reference import route
from mok.testing.runner import run_layer, unshard_outputs

U = 2.0**-24
NO_SHARED = MoEConfig(T=48, H=80, I=40, E=8, K=3, S=0)


def assert_outputs_equal(got: dict, want: dict, what: str):
    for name in OUTPUT_NAMES:
        if want[name] is None:
            assert got[name] is None, f"{what}: {name} should be None"
        else:
            assert_bitwise_equal(got[name], want[name], f"{what}: {name}")


@pytest.fixture
def threads():
    """Set torch's intra-op thread count inside a test; restored afterwards."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


# ---------------------------------------------------------------- rerun, threads, seeds

@pytest.mark.parametrize("cfg", [DEFAULT, NO_SHARED])  # with and without a shared expert
def test_rerun_gives_same_bits(cfg):
    inputs = make_inputs(cfg, seed=0)
    assert_outputs_equal(run_layer(inputs), run_layer(inputs), "rerun")


def test_different_seeds_give_different_bits():
    """Equality above is not vacuous: other inputs change every output tensor."""
    a, b = run_layer(make_inputs(DEFAULT, seed=0)), run_layer(make_inputs(DEFAULT, seed=1))
    for name in OUTPUT_NAMES:
        assert not bit_diff(a[name], b[name]).equal, f"{name} is the same for seeds 0 and 1"


def test_one_ulp_of_one_input_changes_the_output():
    """The comparison sees a single-ULP change of one element of x (in that token's row only)."""
    inputs = make_inputs(DEFAULT, seed=0)
    y = run_layer(inputs)["y"]
    inputs["x"] = inputs["x"].clone()
    inputs["x"].view(torch.int16)[5, 7] += 1  # next bf16 value away from zero
    y2 = run_layer(inputs)["y"]
    assert not bit_diff(y2[5], y[5]).equal
    assert_bitwise_equal(torch.cat([y2[:5], y2[6:]]), torch.cat([y[:5], y[6:]]), "rows of other tokens")


# Big enough that PyTorch's elementwise kernels split the work across threads (grain 32768).
THREADS_CFG = MoEConfig(T=64, H=96, I=48, E=4, K=2, S=32)


def test_one_vs_two_threads(threads):
    inputs = make_inputs(THREADS_CFG, seed=0)
    threads(1)
    one = run_layer(inputs)
    threads(2)
    assert_outputs_equal(run_layer(inputs), one, "2 threads vs 1")


# ---------------------------------------------------------------- expert parallelism, real processes

@pytest.fixture(scope="module")
def world_cases():
    """Global inputs and the W = 1 in-process outputs, per case."""
    cases = {"shared": make_inputs(DEFAULT, seed=0, routing="skewed"),
             # expert 7 (rank W-1's last) never picked
             "no_shared": make_inputs(NO_SHARED, seed=1, routing="empty_expert")}
    return {k: (v, run_layer(v)) for k, v in cases.items()}


@pytest.mark.slow
@pytest.mark.parametrize("case, W", [
    ("shared", 2),     # shared expert: its gradients summed over both ranks' tokens
    ("shared", 4),     # shared expert, 4 ranks of 2 experts
    ("no_shared", 2),  # no shared expert (shared grads None), one expert without tokens
    ("no_shared", 4),  # 4 ranks; rank 3 owns the expert without tokens
])
def test_world_size_invariance(world_cases, case, W):
    inputs, want = world_cases[case]
    parts = run_reference_world(inputs, W)  # W gloo processes; unshard checks shared grads agree across ranks
    assert_outputs_equal(unshard_outputs(parts), want, f"W = {W} vs W = 1 ({case})")


# ---------------------------------------------------------------- strides

def _non_contiguous(t: torch.Tensor) -> torch.Tensor:
    """Same values, non-contiguous: a strided view into a larger buffer (1-D/2-D) or transposed storage."""
    if t.dim() == 3:  # weights: stored transposed, viewed back
        out = t.transpose(1, 2).contiguous().transpose(1, 2)
    else:  # every other column of a wider buffer
        buf = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
        buf[..., ::2] = t
        out = buf[..., ::2]
    assert not out.is_contiguous() and torch.equal(out, t)
    return out


def test_non_contiguous_inputs_give_same_bits():
    inputs = make_inputs(DEFAULT, seed=0)
    want = run_layer(inputs)
    strided = {k: (_non_contiguous(v) if v is not None and v.numel() > 1 else v) for k, v in inputs.items()}
    assert_outputs_equal(run_layer(strided), want, "non-contiguous inputs")


def test_sliced_x_gives_same_bits():
    """x as a row slice of a larger batch (contiguous rows, offset storage) and a column slice."""
    inputs = make_inputs(DEFAULT, seed=0)
    want = run_layer(inputs)
    big = torch.randn(DEFAULT.T + 3, DEFAULT.H + 5).bfloat16()
    big[2 : 2 + DEFAULT.T, 1 : 1 + DEFAULT.H] = inputs["x"]
    x = big[2 : 2 + DEFAULT.T, 1 : 1 + DEFAULT.H]
    assert not x.is_contiguous()
    assert_outputs_equal(run_layer({**inputs, "x": x}), want, "sliced x")



# ---------------------------------------------------------------- batch invariance

_PER_TOKEN = ("x", "topk_idx", "topk_weight", "dy")


@pytest.mark.parametrize("rows", [
    "first_20",      # a prefix of the batch
    "strided",       # every third token: other tokens removed from between them
    "one_token",     # T = 1
    "larger_batch",  # the batch inside a 3x larger one
])
def test_batch_invariance(rows):
    """A token's y, d_x and d_topk_weight do not change when other tokens join or leave the batch
    (weight gradients sum over the batch, so they change by definition)."""
    inputs = make_inputs(DEFAULT, seed=0)
    full = run_layer(inputs)
    T = DEFAULT.T
    if rows == "larger_batch":
        extra = make_inputs(MoEConfig(T=3 * T, H=DEFAULT.H, I=DEFAULT.I, E=DEFAULT.E, K=DEFAULT.K, S=DEFAULT.S), seed=9)
        big = {**inputs, **{k: torch.cat([extra[k][:T], inputs[k], extra[k][T:2 * T]]) for k in _PER_TOKEN}}
        got = {k: v[T:2 * T] for k, v in run_layer(big).items() if k in ("y", "d_x", "d_topk_weight")}
        sel = torch.arange(T)
    else:
        sel = {"first_20": torch.arange(20), "strided": torch.arange(1, T, 3), "one_token": torch.tensor([17])}[rows]
        got = run_layer({**inputs, **{k: inputs[k][sel] for k in _PER_TOKEN}})
    for k in ("y", "d_x", "d_topk_weight"):
        assert_bitwise_equal(got[k], full[k][sel], f"batch invariance ({rows}): {k}")


# ---------------------------------------------------------------- NaN

@pytest.mark.parametrize("name, index, token", [
    ("x", (5, 7), 5),              # NaN in one activation: that token's row
    ("topk_weight", (9, 1), 9),    # NaN routing weight
    ("routed_gate", None, None),   # NaN in a routed expert: every token routed to it
    ("shared_down", (3, 0), None), # NaN in the shared expert's down projection: column 3 of every y
])
def test_nan_propagates(name, index, token):
    inputs = make_inputs(DEFAULT, seed=0)
    clean = run_layer(inputs)
    t = inputs[name].clone()
    if name == "routed_gate":
        e = int(inputs["topk_idx"][0, 0])
        t[e, 0, 0] = math.nan
        hit = (inputs["topk_idx"] == e).any(dim=1)
    else:
        t[index] = math.nan
        hit = torch.zeros(DEFAULT.T, dtype=torch.bool)
        if token is not None:
            hit[token] = True
    y = run_layer({**inputs, name: t})["y"]
    if name == "shared_down":  # y[:, 3] is NaN for every token, other columns untouched
        assert bool(torch.isnan(y[:, 3]).all())
        assert not bool(torch.isnan(torch.cat([y[:, :3], y[:, 4:]], 1)).any())
        return
    assert bool(torch.isnan(y[hit]).all()), f"NaN in {name} did not reach every element of the rows hit"
    assert_bitwise_equal(y[~hit], clean["y"][~hit], f"rows not touched by the NaN in {name}")


# ---------------------------------------------------------------- CUDA

@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [DEFAULT, NO_SHARED])  # with and without a shared expert
def test_cpu_vs_cuda(cfg):
    inputs = make_inputs(cfg, seed=0)
    cpu = run_layer(inputs)
    gpu = run_layer({k: (v.cuda() if v is not None else None) for k, v in inputs.items()})
    for name in OUTPUT_NAMES:
        if cpu[name] is not None:
            assert gpu[name].is_cuda, name
    assert_outputs_equal({k: (v.cpu() if v is not None else None) for k, v in gpu.items()}, cpu, "CUDA vs CPU")


@pytest.mark.gpu
@pytest.mark.parametrize("score", ["softmax", "sigmoid"])  # softmax: a row-wide sum; sigmoid: one exp per expert
@pytest.mark.parametrize("normalize", [True, False])  # the top-k weights renormalised by their sum / the raw scores
def test_route_cpu_vs_cuda(score, normalize):
    logits = torch.randn(4096, 64, generator=torch.Generator().manual_seed(0)) * 3
    idx, w = route(logits, 6, score=score, normalize=normalize)
    idx_g, w_g = route(logits.cuda(), 6, score=score, normalize=normalize)
    assert_bitwise_equal(idx_g.cpu(), idx, "topk_idx CUDA vs CPU")
    assert_bitwise_equal(w_g.cpu(), w, "topk_weight CUDA vs CPU")


# ---------------------------------------------------------------- route

@pytest.mark.parametrize("score", ["softmax", "sigmoid"])  # softmax: a row-wide sum; sigmoid: one exp per expert
@pytest.mark.parametrize("normalize", [True, False])  # the top-k weights renormalised by their sum / the raw scores
def test_route_one_vs_two_threads(threads, score, normalize):
    logits = torch.randn(4096, 64, generator=torch.Generator().manual_seed(0)) * 3
    threads(1)
    idx, w = route(logits, 6, score=score, normalize=normalize)
    threads(2)
    idx2, w2 = route(logits, 6, score=score, normalize=normalize)
    assert_bitwise_equal(idx2, idx, "topk_idx 2 threads vs 1")
    assert_bitwise_equal(w2, w, "topk_weight 2 threads vs 1")


@pytest.mark.parametrize("score", ["softmax", "sigmoid"])  # either score: ties to the lower id, equal weights
@pytest.mark.parametrize("row, k, expected", [
    ([1.0, 3.0, 3.0, 0.0, 3.0], 2, [1, 2]),   # three-way tie for first: lowest two ids
    ([3.0, 3.0, 3.0, 3.0], 4, [0, 1, 2, 3]),  # all equal, K = E: ascending ids
    ([0.0, 2.0, 5.0, 2.0], 3, [2, 1, 3]),     # tie for second place behind a clear winner
    ([-1.0, -1.0], 1, [0]),                   # tie, K = 1
])
def test_route_tie_break_lower_id_first(score, row, k, expected):
    idx, w = route(torch.tensor([row]), k, score=score, normalize=False)
    assert idx.tolist() == [expected]
    tied = [w[0, i] for i in range(k) if row[expected[i]] == row[expected[0]]]
    assert all(bit_diff(t, tied[0]).equal for t in tied), "equal logits must give equal weights"


def test_route_bf16_logits_are_widened_exactly():
    logits = (torch.randn(50, 8, generator=torch.Generator().manual_seed(0)) * 3).bfloat16()
    for a, b, what in zip(route(logits, 3), route(logits.float(), 3), ("topk_idx", "topk_weight"), strict=True):
        assert_bitwise_equal(a, b, f"{what}: bf16 vs fp32 logits")


def _route_float64(logits: torch.Tensor, score: str):
    l = logits.double()
    return torch.softmax(l, dim=1) if score == "softmax" else torch.sigmoid(l)


# Route vs float64. Picked weights, relative error (u = 2^-24):
# - sigmoid: exp_exact <= 2.4u, then +1 and / add u each: <= 6u (as in test_exact).
# - softmax: fp32(l - max) is rounded, an error of u|l - max| in exp's argument, i.e. relative
#   u|l_i - m| in e_i; the denominator adds the p-weighted mean of those, the tree over E adds
#   ceil(log2 E) u, exp and the division ~4u: <= u (|l_i - m| + sum_j p_j |l_j - m| + ceil(log2 E) + 4).
# - normalize: picked weights divided by their tree sum: add the largest picked bound and
#   (ceil(log2 k) + 1) u. Measured on these fixed inputs: at most 0.73 of this bound.
# Picks: every picked float64 score >= every unpicked one, up to the same bound (fp32 ties).
@pytest.mark.parametrize("score", ["softmax", "sigmoid"])  # softmax: a row-wide sum; sigmoid: one exp per expert
@pytest.mark.parametrize("normalize", [True, False])  # the top-k weights renormalised by their sum / the raw scores
@pytest.mark.parametrize("E, k, scale", [
    (1, 1, 1.0),    # one expert: weight 1 (softmax) or sigmoid(l)
    (8, 2, 1.0),    # typical
    (8, 8, 3.0),    # K = E
    (64, 6, 8.0),   # wide logits: large |l - max|, sigmoid saturates at 1 (fp32 ties)
    (257, 4, 3.0),  # odd E: tree carries in the softmax sum
])
def test_route_vs_float64(score, normalize, E, k, scale):
    logits = torch.randn(1000, E, generator=torch.Generator().manual_seed(E)) * scale
    idx, w = route(logits, k, score=score, normalize=normalize)
    assert idx.dtype == torch.int64 and w.dtype == torch.float32 and idx.shape == w.shape == (1000, k)
    p = _route_float64(logits, score)
    if score == "softmax":
        d = (logits.double() - logits.double().max(1, keepdim=True).values).abs()
        c = d + (p * d).sum(1, keepdim=True) + math.ceil(math.log2(E)) + 4
    else:
        c = torch.full_like(p, 6.0)
    c_pick = c.gather(1, idx)
    picked, unpicked = p.gather(1, idx), p.scatter(1, idx, -1.0)
    assert bool((picked.min(1).values >= unpicked.max(1).values * (1 - U * c.max(1).values)).all()), \
        "a picked expert scores below an unpicked one beyond rounding"
    w64 = picked / picked.sum(1, keepdim=True) if normalize else picked
    if normalize:
        c_pick = c_pick + c_pick.max(1, keepdim=True).values + math.ceil(math.log2(k)) + 1
    rel = (w.double() - w64).abs() / w64
    assert bool((rel <= U * c_pick).all()), f"max error / bound {(rel / (U * c_pick)).max().item():.3g}"
    if normalize:  # the k weights sum to one up to the tree's rounding
        assert bool(((w.double().sum(1) - 1).abs() <= (math.ceil(math.log2(k)) + 2) * k * U).all())


def test_route_sigmoid_very_negative_logits():
    # regression: sigmoid_exact once flushed to 0 below -88.72 (exp(-x) overflowed)
    logits = torch.tensor([[-95.0, -100.0, -90.0]])  # sigmoid ~ 5.5e-42, 3.7e-44, 8.2e-40: fp32 subnormals, not 0
    idx, w = route(logits, 2, score="sigmoid", normalize=True)
    assert idx.tolist() == [[2, 0]], "the two largest scores"
    assert bool(torch.isfinite(w).all()), f"finite logits gave weights {w.tolist()}"


def test_assert_outputs_bitwise_equal_names_the_first_output_that_differs():
    from mok.testing.bits import assert_outputs_bitwise_equal

    want = {"y": torch.tensor([1.0, float("nan")]), "d_x": torch.tensor([2.0]), "d_shared_gate": None}
    assert_outputs_bitwise_equal({"y": want["y"].clone(), "d_x": want["d_x"].clone(), "d_shared_gate": None}, want,
                                 "same")  # NaN against the same NaN, None skipped
    with pytest.raises(AssertionError, match=r"switch: d_x: 1 of 1 elements differ"):
        assert_outputs_bitwise_equal({"y": want["y"].clone(), "d_x": torch.tensor([-2.0])}, want, "switch")

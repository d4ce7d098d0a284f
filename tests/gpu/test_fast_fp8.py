"""mok.fast's FP8 recipe (precision="fp8"; docs/numerics.md "FP8 recipe", docs/fast_path.md "FP8"): the quantisers
give the reference's e4m3 values and scales bit for bit (raw bits, first mismatch named); every output's error
against the reference's fp8 outputs is at most 2x that of the plain PyTorch FP8 implementation
(mok.testing.plain_fp8); reruns, CUDA-graph replay and a prefix of the batch give the same bits; bad ids give NaN.
MOK_FP8_RERUNS sets the rerun count (default 100; 1000 for the full check)."""
import os

import pytest
import torch

import mok.fast
from mok.fast import _fp8, _lib
from mok.reference import quantize_blocks_128x128, quantize_rows_1x128
from mok.testing.bits import assert_bitwise_equal, assert_outputs_bitwise_equal, raw_bits
from mok.testing.cases import LAYER_ARGS, OUTPUT_NAMES, MoEConfig, make_inputs, with_stacked_gate_up
from mok.testing.plain_fp8 import plain_fp8_outputs
from mok.testing.runner import assert_replays_equal, capture_layer, run_layer
from mok.testing.tolerance import error_table

pytestmark = [pytest.mark.gpu, pytest.mark.sm90]

RERUNS = int(os.environ.get("MOK_FP8_RERUNS", "100"))
CUDA = torch.device("cuda")


def _zero(t: torch.Tensor) -> bool:
    """Whether every element's raw bits are 0 (+0.0)."""
    return int(raw_bits(t).int().abs().sum()) == 0


def _full8(shape, value: float) -> torch.Tensor:
    return torch.full(shape, value, device=CUDA).to(torch.float8_e4m3fn)


def _specials(shape, seed: int) -> torch.Tensor:
    """bf16 values over bf16's whole range: each 128-column block of each row scaled by its own power of two in
    [2^-140, 2^120], with NaN, ±inf, ±0, subnormals and the largest finite values sprinkled in."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen)
    cols = shape[-1]
    exps = torch.randint(-140, 121, (*shape[:-1], -(-cols // 128)), generator=gen).float()
    x = x * torch.exp2(exps.repeat_interleave(128, -1)[..., :cols])
    flat = x.view(-1)
    n = flat.numel()
    picks = torch.randint(0, n, (8, max(1, n // 200)), generator=gen)
    values = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-40, -3.0e38, 3.3e38]
    for p, v in zip(picks, values):
        flat[p] = v
    return x.to(torch.bfloat16)


@pytest.mark.parametrize("R, P, parts", [(7, 136, 2), (33, 256, 1), (5, 40, 1), (64, 1000, 2)])
def test_row_quantiser_gives_the_reference_bits(R, P, parts):
    x = _specials((R, parts * P), seed=R + P)
    q, s = _fp8.quant_rows(x.cuda(), parts)
    Pp, Pb = _fp8.padded(P), _fp8.blocks(P)
    for j in range(parts):
        rq, rs = quantize_rows_1x128(x[:, j * P:(j + 1) * P])
        assert_bitwise_equal(q[:, j * Pp:j * Pp + P].cpu(), rq, f"values of part {j}")
        assert_bitwise_equal(s[:, j * Pb:(j + 1) * Pb].cpu(), rs, f"scales of part {j}")
        assert _zero(q[:, j * Pp + P:(j + 1) * Pp]), "padding not zero"


def test_row_quantiser_stops_at_count():
    x = _specials((20, 256), seed=5).cuda()
    q = _full8((20, 256), 3.0)
    s = torch.full((20, 2), 5.0, device="cuda")
    _lib.fp8_quant_rows(x, 1, torch.tensor([12], dtype=torch.int32, device="cuda"), q, s)
    rq, rs = quantize_rows_1x128(x[:12].cpu())
    assert_bitwise_equal(q[:12].cpu(), rq, "values")
    assert_bitwise_equal(s[:12].cpu(), rs, "scales")
    assert bool((q[12:].float() == 3.0).all()) and bool((s[12:] == 5.0).all()), "rows past count written"


@pytest.mark.parametrize("L, N, K", [(3, 200, 136), (2, 128, 256), (1, 40, 24), (4, 384, 300)])
def test_block_quantiser_and_its_transpose_give_the_reference_bits(L, N, K):
    w = _specials((L, N, K), seed=N * K)
    Np, Kp, Nb, Kb = _fp8.padded(N), _fp8.padded(K), _fp8.blocks(N), _fp8.blocks(K)
    q = torch.empty(L, N, Kp, dtype=torch.float8_e4m3fn, device="cuda")
    s = torch.empty(L, Nb, Kb, device="cuda")
    off_q, off_s = 128, 3  # the transposes at an offset inside wider buffers, as the d_x GEMM's B lays them out
    qT = _full8((L, K, off_q + Np + 16), 1.0)
    sT = torch.full((L, Kb, off_s + Nb + 1), 7.0, device="cuda")
    _lib.fp8_quant_blocks(w.cuda(), q, s, qT, off_q, sT, off_s)
    rq, rs = quantize_blocks_128x128(w)
    assert_bitwise_equal(q[..., :K].cpu(), rq, "values")
    assert _zero(q[..., K:]), "padding of q not zero"
    assert_bitwise_equal(s.cpu(), rs, "scales")
    assert_bitwise_equal(qT[..., off_q:off_q + N].cpu(), rq.transpose(-1, -2).contiguous(), "transposed values")
    assert _zero(qT[..., off_q + N:off_q + Np]), "padding of qT not zero"
    assert bool((qT[..., :off_q].float() == 1.0).all()) and bool((qT[..., off_q + Np:].float() == 1.0).all())
    assert_bitwise_equal(sT[..., off_s:off_s + Nb].cpu(), rs.transpose(-1, -2).contiguous(), "transposed scales")
    assert bool((sT[..., :off_s] == 7.0).all()) and bool((sT[..., off_s + Nb:] == 7.0).all())


def test_fp8_grouped_gemm_is_the_dequantised_product():
    """Ragged groups (one empty) of A · B_eᵀ on quantised operands: close to the exact product of the dequantised
    operands (the GEMM scales each K block's sum by sfa * sfb, powers of two; the tensor cores' FP8 sums within a
    block are not exact fp32 ones, hence 1e-3 of the largest output, far below a misread scale or layout)."""
    counts = torch.tensor([130, 0, 7, 300])
    E, n, k = 4, 264, 384
    R = int(counts.sum())
    a = torch.randn(R, k).to(torch.bfloat16)
    b = (torch.randn(E, n, k) * 0.05).to(torch.bfloat16)
    aq, as_ = _fp8.quant_rows(a.cuda())
    w = _fp8.quant_expert(b.cuda(), b.cuda(), b.transpose(1, 2).contiguous().cuda())
    d = torch.full((R, n), float("nan"), device="cuda")
    offsets = _lib.offsets_from_counts(counts, CUDA)
    _fp8.gemm(_lib.GEMM_FP8_TN_F32, [_fp8.rows_segment(offsets, E, n, aq, as_, w.gate_q, w.gate_s, d, n)], CUDA)
    ad = (aq.float().double() * as_.double().repeat_interleave(128, 1)).cpu()
    bq, bs = quantize_blocks_128x128(b)
    bd = bq.float().double() * bs.double().repeat_interleave(128, 1).repeat_interleave(128, 2)[:, :n, :k]
    starts = [0, *counts.cumsum(0).tolist()]
    for e in range(E):
        rows = slice(starts[e], starts[e + 1])
        want = ad[rows] @ bd[e].t()
        if not want.numel():  # an expert with no rows: nothing to compare
            continue
        err = (d[rows].double().cpu() - want).abs().max().item()
        assert err <= 1e-3 * max(1.0, want.abs().max().item()), f"expert {e}: max error {err}"


CONFIGS = [
    ("whole blocks", MoEConfig(T=96, H=256, I=128, E=8, K=2, S=128), "random"),
    ("partial blocks", MoEConfig(T=40, H=136, I=136, E=4, K=2, S=40), "random"),
    ("empty expert, no shared", MoEConfig(T=40, H=128, I=64, E=6, K=2, S=0), "empty_expert"),
    ("T=1", MoEConfig(T=1, H=64, I=32, E=4, K=2, S=16), "random"),
    ("skewed, multi-tile", MoEConfig(T=300, H=512, I=320, E=8, K=2, S=128), "skewed"),
]


@pytest.mark.parametrize("label, cfg, routing", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_outputs_within_2x_of_the_plain_fp8_error(label, cfg, routing):
    inputs = make_inputs(cfg, seed=17, routing=routing, device="cuda")
    got = run_layer(inputs, impl=mok.fast, precision="fp8")
    ref = run_layer(inputs, precision="fp8")
    rows = error_table(got, ref, plain_fp8_outputs(inputs))
    bad = [r for r in rows if not r[3]]
    table = "\n".join(f"  {n}: fast {ef:.3e} vs plain fp8 {ep:.3e}" for n, ef, ep, _ in rows)
    assert not bad, f"{label}: error above 2x the plain FP8 one:\n{table}"


CFG = MoEConfig(T=256, H=384, I=264, E=8, K=2, S=136)


@pytest.fixture(scope="module")
def inputs():
    return make_inputs(CFG, seed=3, routing="skewed", device="cuda")


def test_gate_up_halves_give_the_separate_tensors_bits(inputs):
    a = run_layer(inputs, impl=mok.fast, precision="fp8")
    b = run_layer(with_stacked_gate_up(inputs), impl=mok.fast, precision="fp8")
    assert_outputs_bitwise_equal(b, a, "gate/up halves")


def test_reruns_are_bitwise(inputs):
    first = run_layer(inputs, impl=mok.fast, precision="fp8")
    for i in range(RERUNS):
        if i % 10 == 0:
            _fp8.clear_cache()  # the weights' quantisation reruns too
        again = run_layer(inputs, impl=mok.fast, precision="fp8")
        assert_outputs_bitwise_equal(again, first, f"rerun {i}")


def test_a_prefix_of_the_batch_gets_its_rows_bits(inputs):
    full = run_layer(inputs, impl=mok.fast, precision="fp8")
    n = 100
    part = {k: (v[:n] if k in ("x", "topk_idx", "topk_weight", "dy") else v) for k, v in inputs.items()}
    got = run_layer(part, impl=mok.fast, precision="fp8")
    for name in ("y", "d_x", "d_topk_weight"):
        assert_bitwise_equal(got[name], full[name][:n], f"prefix {name}")


def test_cuda_graph_replay_equals_eager(inputs):
    eager = run_layer(inputs, impl=mok.fast, precision="fp8")  # also quantises the weights (cached)
    graph, out = capture_layer(dict(inputs), impl=mok.fast, precision="fp8")
    assert_replays_equal(graph, out, eager, "graph replay")


def test_weights_are_quantised_once_per_version(inputs):
    args = [inputs[a] for a in LAYER_ARGS]
    _, c1 = mok.fast.forward(*args, precision="fp8")
    _, c2 = mok.fast.forward(*args, precision="fp8")
    assert c1.fp8 is c2.fp8 and c1.precision == "fp8"
    w = inputs["routed_down"].clone()
    args[LAYER_ARGS.index("routed_down")] = w
    _, c3 = mok.fast.forward(*args, precision="fp8")
    w.mul_(2)  # an optimizer step's in-place update: a new version, a new quantisation
    _, c4 = mok.fast.forward(*args, precision="fp8")
    assert c3.fp8 is not c4.fp8
    assert torch.equal(c4.fp8.routed.down_s, 2 * c3.fp8.routed.down_s)


def test_bad_ids_give_nan_everywhere(inputs):
    bad = dict(inputs)
    bad["topk_idx"] = inputs["topk_idx"].clone()
    bad["topk_idx"][5, 0] = CFG.E + 3
    out = run_layer(bad, impl=mok.fast, precision="fp8")
    for name in OUTPUT_NAMES:
        if out[name] is not None:
            assert bool(torch.isnan(out[name].float()).all()), f"{name}: not all NaN"

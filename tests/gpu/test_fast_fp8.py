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


# ---------------------------------------------------------------- the gate/up GEMM with the SwiGLU in its epilogue
# GEMM_FP8_TN_SWIGLU_FWD (csrc/gemm_fp8_tn_swiglu_fwd.cu) on the interleaved [gate; up] (_fp8.GateUp) against the
# unfused pair, GEMM_FP8_TN_F32 and the swiglu_fwd kernel: the same [p | q] and a, bit for bit.

FUSED_SHAPES = [  # I and S multiples of 64, of 8 only (the last 64-row group partly zero), below 64; empty experts
    MoEConfig(T=1000, H=1024, I=384, E=16, K=4, S=384),  # shared expert, T % 128 != 0
    MoEConfig(T=777, H=2048, I=768, E=4, K=2, S=0),      # few large experts, no shared expert
    MoEConfig(T=300, H=512, I=200, E=64, K=8, S=96),     # many small experts, some empty; 200 = 3 x 64 + 8
    MoEConfig(T=515, H=1000, I=1000, E=4, K=2, S=40),    # 1000 = 15 x 64 + 40, H not a multiple of 128, S < 64
    MoEConfig(T=40, H=136, I=136, E=6, K=2, S=8),        # 136 = 2 x 64 + 8 (= 128 + 8), S = 8
]
FUSED_IDS = ["mid_shared", "few_large", "many_small", "partial_groups", "tiny"]


def _fused_and_unfused_gate_up(cfg, seed, scale_rows):
    """((pq, a, pq_s, a_s) fused, the same unfused, rows placed) for the layer `cfg`'s FP8 gate/up step, x's rows
    each scaled by 2^k for k cycling through `scale_rows`."""
    from mok.fast import _forward, _fp8_layer
    from mok.reference import Dims

    inputs = make_inputs(cfg, seed, routing="empty_expert" if cfg.E >= 16 else "random", device="cuda")
    x = inputs["x"].float()
    k = torch.tensor(scale_rows, dtype=torch.float32, device="cuda").repeat(-(-cfg.T // len(scale_rows)))[:cfg.T]
    x = (x * torch.exp2(k)[:, None]).to(torch.bfloat16)
    d = Dims(T=cfg.T, H=cfg.H, I=cfg.I, S=cfg.S, E=cfg.E, K=cfg.K, L=cfg.E, W=1)
    R = cfg.T * cfg.K
    w8 = _fp8.fp8_weights(*(inputs[n] for n in ("routed_gate", "routed_up", "routed_down", "shared_gate", "shared_up",
                                                "shared_down")))
    sched = _forward.build_schedule(inputs["topk_idx"], cfg.E, R)
    x_RH = torch.empty(R, cfg.H, dtype=torch.bfloat16, device="cuda")
    _lib.gather_rows(x, sched.pair_row, R, x_RH)
    xq, xs = _fp8.quant_rows(x_RH, 1, sched.offsets[cfg.E:cfg.E + 1])
    xq_s, xs_s = _fp8.quant_rows(x) if cfg.S else (None, None)
    fused = _fp8_layer._gate_up_swiglu(d, sched, w8, xq, xs, xq_s, xs_s, CUDA)
    gu, gu_s = _fp8_layer._gate_up(d, sched, w8, xq, xs, xq_s, xs_s, CUDA)
    a, a_s = _forward.swiglu(gu, gu_s, sched, d)  # [g | u] -> [p | q] in place
    return fused, (gu, a, gu_s, a_s), int(sched.offsets[cfg.E])


@pytest.mark.parametrize("cfg", FUSED_SHAPES, ids=FUSED_IDS)
@pytest.mark.parametrize("scale_rows", [
    [0],                      # the layer's own inputs
    [5],                      # pre-activations of tens: the sigmoid saturated both ways
    [-120, -60, 0, 60, 100],  # x rows near bf16's edges: the scales sfa * sfb from 2^-139 (subnormal) to 2^100
], ids=["layer_values", "saturating", "edge_scales"])
def test_fused_fp8_gate_up_gives_the_unfused_bits(cfg, scale_rows):
    (pq, a, pq_s, a_s), (want_pq, want_a, want_pq_s, want_a_s), placed = _fused_and_unfused_gate_up(cfg, 3, scale_rows)
    assert placed > 0
    assert_bitwise_equal(pq[:placed], want_pq[:placed], "[p | q]")
    assert_bitwise_equal(a[:placed], want_a[:placed], "a")
    if cfg.S:
        assert_bitwise_equal(pq_s, want_pq_s, "shared [p | q]")
        assert_bitwise_equal(a_s, want_a_s, "shared a")
    else:
        assert pq_s is None and a_s is None
    assert torch.isfinite(want_pq[:placed]).all()


def test_fused_fp8_gate_up_stores_only_its_rows_and_columns():
    """[p | q] and a in wider buffers (ld 2I + 24 and I + 16) around ragged groups (one empty), I = 72 (the last
    64-row group 8 rows of gate and of up, then zeros): nothing past column I of p, q or a, or past a group's rows, is
    written, and what is written is the unfused pair's."""
    counts = torch.tensor([70, 0, 129, 3])
    E, I, H = 4, 72, 256
    R = int(counts.sum()) + 5  # 5 rows past the last group's
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(R, H, generator=gen).to(torch.bfloat16).cuda()
    gate, up = ((torch.randn(E, I, H, generator=gen) * 0.05).to(torch.bfloat16).cuda() for _ in range(2))
    w = _fp8.quant_expert(gate, up, gate.transpose(1, 2).contiguous())
    xq, xs = _fp8.quant_rows(x)
    offsets = _lib.offsets_from_counts(counts, CUDA)
    gu = torch.empty(R, 2 * I, device="cuda")
    _fp8.gemm(_lib.GEMM_FP8_TN_F32, [_fp8.rows_segment(offsets, E, I, xq, xs, q, s, gu, 2 * I, h * I)
                                     for h, (q, s) in enumerate(((w.gate_q, w.gate_s), (w.up_q, w.up_s)))], CUDA)
    want_a = torch.empty(R, I, dtype=torch.bfloat16, device="cuda")
    _lib.swiglu_fwd(gu, offsets, E, 0, I, R, want_a)
    ld_pq, ld_a = 2 * I + 24, I + 16
    pq = torch.full((R, ld_pq), float("nan"), device="cuda")
    a = torch.full((R, ld_a), 7.0, dtype=torch.bfloat16, device="cuda")
    g = _fp8.gate_up(w)
    Kp, Kb = xq.shape[1], xs.shape[1]
    seg = _lib.Segment.expert_rows(offsets, E, 2 * I, Kp, _lib.Operand(xq, 0, Kp, Kp),
                                   _lib.Operand(g.q, g.q.shape[1] * Kp, 0, Kp),
                                   _lib.Operand(pq, 0, ld_pq, ld_pq), aux=_lib.Operand(a, 0, ld_a, ld_a),
                                   sfa=_lib.Operand(xs, 0, Kb, Kb), sfb=_lib.Operand(g.s, g.s.shape[1] * Kb, 0, Kb))
    _fp8.gemm(_lib.GEMM_FP8_TN_SWIGLU_FWD, [seg], CUDA)
    n = int(counts.sum())
    assert_bitwise_equal(pq[:n, :2 * I], gu[:n], "[p | q]")
    assert_bitwise_equal(a[:n, :I], want_a[:n], "a")
    assert bool(torch.isnan(pq[:, 2 * I:]).all()) and bool(torch.isnan(pq[n:]).all()), "[p | q] written outside"
    assert bool((a[:, I:].float() == 7.0).all()) and bool((a[n:].float() == 7.0).all()), "a written outside"


@pytest.mark.parametrize("label, cfg, routing", CONFIGS + [("module shape", CFG, "skewed")],
                         ids=[c[0] for c in CONFIGS] + ["module shape"])
def test_fused_fp8_layer_gives_the_unfused_bits(monkeypatch, label, cfg, routing):
    """The whole FP8 layer (nine outputs) with the fused gate/up + SwiGLU (the default) and without it
    (MOK_FAST_FUSE_SWIGLU_FWD_FP8=0): the same bits, the fused run having launched GEMM_FP8_TN_SWIGLU_FWD."""
    from mok.fast import _tiles

    inputs = make_inputs(cfg, seed=23, routing=routing, device="cuda")
    kinds = []
    gemm = _fp8.gemm
    monkeypatch.setattr(_fp8, "gemm", lambda kind, segs, dev: (kinds.append(kind), gemm(kind, segs, dev)))
    monkeypatch.delenv(_tiles.FUSE_FWD_FP8_ENV, raising=False)
    fused = run_layer(inputs, impl=mok.fast, precision="fp8")
    assert kinds[0] == _lib.GEMM_FP8_TN_SWIGLU_FWD, kinds
    kinds.clear()
    monkeypatch.setenv(_tiles.FUSE_FWD_FP8_ENV, "0")
    unfused = run_layer(inputs, impl=mok.fast, precision="fp8")
    assert kinds[0] == _lib.GEMM_FP8_TN_F32 and _lib.GEMM_FP8_TN_SWIGLU_FWD not in kinds, kinds
    assert_outputs_bitwise_equal(fused, unfused, f"{label}: fused vs unfused")


def test_interleaved_gate_up_is_the_reference_quantisation(inputs):
    """The cached interleaved [gate; up] of the routed and the shared expert: `_fp8.interleave_gate_up` (pure torch,
    checked row by row on the CPU in tests/fast/test_fp8_gate_up_fused.py) of the reference quantiser's outputs."""
    w8 = _fp8.fp8_weights(*(inputs[n] for n in ("routed_gate", "routed_up", "routed_down", "shared_gate", "shared_up",
                                                "shared_down")))
    for name, w, gate, up in (("routed", w8.routed, inputs["routed_gate"], inputs["routed_up"]),
                              ("shared", w8.shared, inputs["shared_gate"], inputs["shared_up"])):
        got = _fp8.gate_up(w)
        assert _fp8.gate_up(w) is got
        (gq, gs), (uq, us) = quantize_blocks_128x128(gate.cpu()), quantize_blocks_128x128(up.cpu())
        Hp = _fp8.padded(gate.shape[-1])

        def pad(q):
            out = torch.zeros((*q.shape[:-1], Hp), dtype=torch.uint8)
            out[..., :q.shape[-1]] = q.view(torch.uint8)
            return out.view(torch.float8_e4m3fn)

        want = _fp8.interleave_gate_up(pad(gq), gs, pad(uq), us)
        assert_bitwise_equal(got.q.cpu(), want.q, f"{name} interleaved values")
        assert_bitwise_equal(got.s.cpu(), want.s, f"{name} interleaved scales")

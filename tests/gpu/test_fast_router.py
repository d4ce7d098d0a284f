"""The fast path's router (mok.fast.router_forward / router_backward, csrc/router.cu) against the
reference router: the same scores, top-k and weights bit for bit on the same logits, the same logit
gradient bit for bit, logits and gradients within 2x of plain bf16's error, reruns and batch
invariance bitwise."""
import pytest
import torch
import torch.nn.functional as F

import mok.fast
from mok import reference
from mok.fast import _lib
from mok.testing.bits import assert_bitwise_equal, rel_error

pytestmark = [pytest.mark.gpu, pytest.mark.sm90]


def _inputs(T, H, E, seed=0, scale=1.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(T, H, generator=g, device="cuda").to(torch.bfloat16)
    w = (torch.randn(E, H, generator=g, device="cuda") * (scale * H**-0.5)).to(torch.bfloat16)
    return x, w


def _ref_on(logits, k, score, normalize):
    """The reference's scores, top-k and weights on given logits (on the GPU: same bits as the CPU)."""
    p = reference.router_scores(logits, score)
    idx, tw = reference.route(logits, k, score=score, normalize=normalize)
    return tw, idx, p


CASES = [
    (300, 256, 128, 8, "softmax", True),    # Qwen3-like: 128 experts, top-8, renormalised
    (77, 64, 60, 4, "softmax", True),       # E = 60 (padded to 64 inside), T not a multiple of anything
    (64, 128, 8, 2, "softmax", False),      # Mixtral-like: 8 experts, top-2, raw weights
    (50, 96, 256, 8, "sigmoid", True),      # DeepSeek-like sigmoid scores, 256 experts
    (33, 32, 5, 5, "sigmoid", False),       # K = E, tiny E (padded to 8)
]


@pytest.mark.parametrize("T, H, E, K, score, normalize", CASES)
def test_topk_and_scores_equal_the_reference_on_the_same_logits(T, H, E, K, score, normalize):
    x, w = _inputs(T, H, E)
    tw, idx, p, logits = mok.fast.router_forward(x, w, K, score, normalize)
    rtw, ridx, rp = _ref_on(logits, K, score, normalize)
    assert_bitwise_equal(p, rp, "scores")
    assert_bitwise_equal(idx, ridx, "topk_idx")
    assert_bitwise_equal(tw, rtw, "topk_weight")


def test_ties_and_nan_follow_the_reference_order():
    # equal logits (ties go to the lower id), and NaN (sorts first) in some rows
    T, E, K = 16, 24, 6
    logits = torch.zeros(T, E, device="cuda")
    logits[1:5, 3] = float("nan")
    logits[5:, ::3] = 1.0
    for score in ("softmax", "sigmoid"):
        scores = torch.empty(T, E, device="cuda")
        idx = torch.empty(T, K, dtype=torch.int64, device="cuda")
        tw = torch.empty(T, K, device="cuda")
        _lib.router_topk(logits, E, K, score == "softmax", True, scores, idx, tw)
        rtw, ridx, rp = _ref_on(logits, K, score, True)
        assert_bitwise_equal(idx, ridx, f"{score}: topk_idx")
        assert_bitwise_equal(tw, rtw, f"{score}: topk_weight")
        assert_bitwise_equal(scores, rp, f"{score}: scores")


@pytest.mark.parametrize("T, H, E, K, score, normalize", CASES)
def test_logit_gradient_equals_the_reference(T, H, E, K, score, normalize):
    x, w = _inputs(T, H, E, seed=1)
    _, idx, p, _ = mok.fast.router_forward(x, w, K, score, normalize)
    g = torch.Generator(device="cuda").manual_seed(2)
    d_tw, d_s, d_l = (torch.randn(*s, generator=g, device="cuda") for s in ((T, K), (T, E), (T, E)))
    Ep = (E + 7) // 8 * 8
    hl = torch.empty(T, 2 * Ep, dtype=torch.bfloat16, device="cuda")
    _lib.router_bwd(p, idx, d_tw, d_s, d_l, score == "softmax", normalize, hl)
    dl = reference.route_backward(p, idx, d_tw, d_s, score, normalize) + d_l
    hi, lo = reference.split_hi_lo(dl)
    assert_bitwise_equal(hl[:, :E], hi, "hi")
    assert_bitwise_equal(hl[:, Ep:Ep + E], lo, "lo")
    assert not hl[:, E:Ep].any() and not hl[:, Ep + E:].any(), "padding columns must be zero"


def _plain_router(x, w, k, score, normalize):
    """Plain bf16 PyTorch router (F.linear in bf16, torch softmax/sigmoid, topk), autograd."""
    logits = F.linear(x, w).float()
    p = logits.softmax(-1) if score == "softmax" else logits.sigmoid()
    tw, idx = p.topk(k, dim=-1)
    if normalize:
        tw = tw / tw.sum(-1, keepdim=True)
    return tw, idx, p, logits


@pytest.mark.parametrize("T, H, E, K, score, normalize", CASES[:4])  # all but the tiny K = E case: E = 8 to 256
def test_logits_and_gradients_within_2x_of_plain_bf16(T, H, E, K, score, normalize):
    x, w = _inputs(T, H, E, seed=4, scale=4.0)
    ref = reference.router_forward(x, w, K, score, normalize)
    fast = mok.fast.router_forward(x, w, K, score, normalize)
    xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
    plain = _plain_router(xl, wl, K, score, normalize)
    e_fast, e_plain = rel_error(fast[3], ref[3]), rel_error(plain[3], ref[3])
    assert e_fast <= 2 * e_plain + 1e-7, f"logits: fast {e_fast:.3e} vs plain bf16 {e_plain:.3e}"
    # gradients through the scores and the logits (same routing for all three: the reference's)
    g = torch.Generator(device="cuda").manual_seed(5)
    d_s, d_l = (torch.randn(T, E, generator=g, device="cuda") for _ in range(2))
    want = reference.router_backward(x, w, ref[2], ref[1], None, d_s, d_l, score, normalize)
    got = mok.fast.router_backward(x, w, ref[2], ref[1], None, d_s, d_l, score, normalize)
    (plain[2] * d_s).sum().add((plain[3] * d_l).sum()).backward()
    for name, a, b, c in (("d_x", got[0], want[0], xl.grad), ("d_w", got[1], want[1], wl.grad)):
        ef, ep = rel_error(a, b), rel_error(c, b)
        assert ef <= 2 * ep + 1e-7, f"{name}: fast {ef:.3e} vs plain bf16 {ep:.3e}"


def test_reruns_and_batch_invariance_bitwise():
    T, H, E, K = 1000, 256, 64, 6
    x, w = _inputs(T, H, E, seed=6)
    first = mok.fast.router_forward(x, w, K, "softmax", True)
    d_tw = torch.randn(T, K, device="cuda")
    grads = mok.fast.router_backward(x, w, first[2], first[1], d_tw, None, None, "softmax", True)
    for i in range(100):
        again = mok.fast.router_forward(x, w, K, "softmax", True)
        for name, a, b in zip(("topk_weight", "topk_idx", "scores", "logits"), again, first, strict=True):
            assert_bitwise_equal(a, b, f"rerun {i}: {name}")
    again = mok.fast.router_backward(x, w, first[2], first[1], d_tw, None, None, "softmax", True)
    assert_bitwise_equal(again[0], grads[0], "d_x rerun")
    assert_bitwise_equal(again[1], grads[1], "d_w rerun")
    for n in (1, 37, 999):  # a token's routing and its d_x do not depend on the rest of the batch
        sub = mok.fast.router_forward(x[:n].contiguous(), w, K, "softmax", True)
        for name, a, b in zip(("topk_weight", "topk_idx", "scores", "logits"), sub, first, strict=True):
            assert_bitwise_equal(a, b[:n], f"first {n} tokens: {name}")
        sub_dx = mok.fast.router_backward(x[:n].contiguous(), w, first[2][:n].contiguous(), first[1][:n].contiguous(),
                                          d_tw[:n].contiguous(), None, None, "softmax", True)[0]
        assert_bitwise_equal(sub_dx, grads[0][:n], f"first {n} tokens: d_x")


def test_tiny_sigmoid_rows_follow_the_reference_rule():
    # rows whose picked sigmoid scores sum below 2^-126 get weights 1/k and no weight gradient, as the reference
    T, E, K = 8, 16, 4
    logits = torch.randn(T, E, device="cuda")
    logits[:4] = -120.0 - torch.rand(4, E, device="cuda")  # all picks' scores subnormal or zero
    scores = torch.empty(T, E, device="cuda")
    idx = torch.empty(T, K, dtype=torch.int64, device="cuda")
    tw = torch.empty(T, K, device="cuda")
    _lib.router_topk(logits, E, K, False, True, scores, idx, tw)
    rtw, ridx, rp = _ref_on(logits, K, "sigmoid", True)
    assert_bitwise_equal(idx, ridx, "topk_idx")
    assert_bitwise_equal(tw, rtw, "topk_weight")
    assert torch.isfinite(tw).all()
    d_tw = torch.randn(T, K, device="cuda")
    hl = torch.empty(T, 2 * E, dtype=torch.bfloat16, device="cuda")
    _lib.router_bwd(scores, idx, d_tw, None, None, False, True, hl)
    hi, lo = reference.split_hi_lo(reference.route_backward(rp, ridx, d_tw, torch.zeros_like(rp), "sigmoid", True))
    assert_bitwise_equal(hl[:, :E], hi, "hi")
    assert_bitwise_equal(hl[:, E:], lo, "lo")


@pytest.mark.parametrize("T, M, N", [
    (16384, 128, 2048),  # Qwen3-30B-A3B's router weight gradient: E = 128, H = 2048, all tokens
    (1000, 8, 4096),     # Mixtral-like: 8 experts, T not a multiple of 64
    (77, 64, 200),       # N not a multiple of the tile's 128, a short reduction
])
def test_small_tile_weight_gradient_has_the_bits_of_every_layer_tile(T, M, N):
    # GEMM_TT_F32_SMALL (ping-pong 64x128) against GEMM_TT_F32 in each of its tile variants: D = Aᵀ B over T rows
    g = torch.Generator(device="cuda").manual_seed(T + M)
    a = torch.randn(T, M, generator=g, device="cuda").to(torch.bfloat16)
    b = torch.randn(T, N, generator=g, device="cuda").to(torch.bfloat16)

    def run(kind, variant):
        d = torch.full((M, N), float("nan"), device="cuda")
        seg = _lib.Segment.all_wgrad(T, M, N, _lib.Operand(a, 0, 0, M), _lib.Operand(b, 0, 0, N),
                                     _lib.Operand(d, 0, 0, N))
        _lib.grouped_gemm(kind, [seg], a.device, variant)
        return d

    small = run(_lib.GEMM_TT_F32_SMALL, 0)
    for v in range(_lib.NUM_GEMM_VARIANTS):
        assert_bitwise_equal(small, run(_lib.GEMM_TT_F32, v), f"TT_F32 variant {v}")
    # and it is the product (a missing tile, a wrong row or a garbage element is an error of order 1; the tensor
    # cores' fp32 accumulation over T terms is far below 1e-3)
    assert rel_error(small, a.double().T @ b.double()) < 1e-3

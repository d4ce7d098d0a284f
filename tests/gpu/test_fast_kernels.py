"""The gather, combine and SwiGLU kernels (csrc/elementwise.cu), called directly through mok.fast._lib, against
small PyTorch formulations with the kernels' rounding order.

- combine_fwd, combine_bwd_pre, combine_bwd_dx: every product and sum is one separately rounded fp32
  operation (__fmul_rn, __fadd_rn) in a fixed order, and a CPU PyTorch elementwise op is one IEEE
  operation, so the formulations below must give the same bits. combine_bwd_pre's d_topk_weight is
  a fixed tree: each thread sums its 8-wide vectors h = 8 * (tid + c * threads) in order, then a
  butterfly over the warp's lanes, then the warps' sums in warp order; `_d_topk_weight` writes that
  tree out with the kernel's thread count (`token_threads`).
- swiglu_fwd (a, and [g | u] turned into [p | q] = [u * silu'(g) | silu(g)] in place): the sigmoid uses CUDA's
  expf (max 2 ULP) and nvcc contracts 1 + expf(-g) into an FMA, which PyTorch does not reproduce. So: bitwise where
  the sigmoid is exact (s = 1 for g >= 20, s = 0 for g <= -90; and g = 0, where silu = 0 whatever s is), and
  within an error bound against float64 elsewhere.
- swiglu_bwd ([bf16(da * p) | bf16(da * q)]): two fp32 products and their bf16 roundings, bitwise everywhere,
  special values included.

Inputs are drawn on the CPU with a seeded generator and copied to the GPU; expectations are computed
on the CPU.
"""
import pytest
import torch
import torch.nn.functional as F

from mok.fast import _lib
from mok.testing.bits import assert_bitwise_equal

pytestmark = [pytest.mark.gpu, pytest.mark.sm90]

NAN = float("nan")
SENTINEL = 1234.0  # bf16-exact; rows a kernel must not write keep it


def _token_threads(H: int) -> int:
    """Threads of a per-token kernel (elementwise.cu: token_threads): the H / 8 vectors spread evenly over at most
    256 threads, rounded up to whole warps, at least 64."""
    vectors = H // 8
    per_thread = -(-vectors // 256)  # ceil
    threads = -(-vectors // per_thread)
    return max(-(-threads // 32) * 32, 64)


def _cuda(*ts):
    return [None if t is None else t.cuda() for t in ts]


def _pair_rows(T, K, capacity, g, missing=None):
    """pair_row [T*K] int32: the pairs scattered over distinct rows of [0, capacity) in random order
    (the kernels only follow the map; the schedule's order is tested in test_fast_schedule.py); the
    pair `missing` (t, k), if given, gets -1 (not placed)."""
    rows = torch.randperm(capacity, generator=g)[: T * K].to(torch.int32)
    if missing is not None:
        rows[missing[0] * K + missing[1]] = -1
    return rows


def _flag(value):
    return torch.tensor([value], dtype=torch.int32)


def _gather(rows_TK: torch.Tensor, r_RH: torch.Tensor) -> torch.Tensor:
    """[T, K, H] fp32 rows of r_RH (bf16) at rows_TK (-1 reads row 0; those pairs are NaN anyway)."""
    return r_RH[rows_TK.clamp(min=0).long()].float()


def _nan_rows(out: torch.Tensor, bad_T: torch.Tensor) -> torch.Tensor:
    out = out.clone()
    out[bad_T] = NAN
    return out


# ---------------------------------------------------------------- PyTorch formulations (CPU)


def _ordered_combine(first, r_RH, pair_row, K, flag, w=None):
    """bf16(((first + w_0*r_0) + w_1*r_1) + ...) per token: fp32, `first` (or +0) first, k ascending,
    r_k the pair's row of r_RH (w = 1 when None); NaN for a token with an unplaced pair, every token
    when the flag is set. combine_fwd: (s, o, w); combine_bwd_dx: (dx_s, dx, no weights)."""
    T = pair_row.numel() // K
    rows = pair_row.view(T, K)
    r_TKH = _gather(rows, r_RH)
    acc = first.float() if first is not None else torch.zeros(T, r_RH.shape[1])
    for k in range(K):
        acc = acc + (r_TKH[:, k] if w is None else w[:, k : k + 1] * r_TKH[:, k])
    bad = (rows < 0).any(1) | bool(flag.item())
    return _nan_rows(acc, bad).bfloat16()


def _d_topk_weight(dy, o, pair_row, flag):
    """d_w[t, k] = sum_h dy[t, h] * o_k[h] in combine_bwd_pre_k's order (see the module docstring)."""
    T, H = dy.shape
    K = pair_row.numel() // T
    rows = pair_row.view(T, K)
    n = _token_threads(H)
    C = -(-H // (8 * n))  # vectors per thread, at most
    prod = dy.float()[:, None, :] * _gather(rows, o)  # bf16 x bf16: exact in fp32
    # zeros past H: a thread's tail adds +0, which changes nothing (its sum starts at +0, so is never -0)
    prod = F.pad(prod, (0, C * 8 * n - H)).view(T, K, C, n, 8)
    acc = torch.zeros(T, K, n)
    for c in range(C):
        for i in range(8):
            acc = acc + prod[:, :, c, :, i]
    lanes = acc.view(T, K, n // 32, 32)
    lane = torch.arange(32)
    for off in (16, 8, 4, 2, 1):  # __shfl_xor_sync butterfly: lane l adds lane l ^ off
        lanes = lanes + lanes[..., lane ^ off]
    d_w = torch.zeros(T, K)
    for warp in range(n // 32):
        d_w = d_w + lanes[:, :, warp, 0]
    d_w[rows < 0] = NAN
    if flag.item():
        d_w[:] = NAN
    return d_w


def _go(dy, w, pair_row, flag, go_init):
    """go[row(t, k)] = bf16(w[t, k] * dy[t]) (fp32 product), NaN when the flag is set; other rows untouched."""
    T, K = w.shape
    go = go_init.clone()
    vals = (w[:, :, None] * dy.float()[:, None, :]).bfloat16()
    if flag.item():
        vals[:] = NAN
    rows = pair_row.view(T, K).long()
    placed = rows >= 0
    go[rows[placed]] = vals[placed]
    return go


# ---------------------------------------------------------------- combine kernels: bitwise

SHAPES = [
    (1, 1, 8),      # one token, one slot, one 8-wide vector: a single active thread of 64
    (5, 2, 264),    # 33 vectors on 64 threads: the second warp has one active lane
    (7, 8, 2048),   # K = 8: exactly one chunk of the backward pre-combine's 8 slots
    (3, 10, 1024),  # K = 10: two chunks (8 + 2)
    (4, 4, 9000),   # 1125 vectors on 256 threads: 4 each, and threads 0..100 take a fifth
    (2, 6, 7168),   # a real hidden size: 896 vectors on 224 threads (7 warps), 4 each
]


@pytest.mark.parametrize("T,K,H", SHAPES)
@pytest.mark.parametrize("missing", [None, (0, 0)])  # every pair placed; pair (0, 0) not placed (no row written)
def test_gather_rows_copies_each_token_to_its_rows(T, K, H, missing):
    g = torch.Generator().manual_seed(T * 1000 + K * 10 + H + 3)
    cap = T * K + 3  # rows no pair maps to keep the sentinel
    x = torch.randn(T, H, generator=g).bfloat16()
    pair_row = _pair_rows(T, K, cap, g, missing)
    want = torch.full((cap, H), SENTINEL, dtype=torch.bfloat16)
    placed = pair_row >= 0
    want[pair_row[placed].long()] = x[torch.nonzero(placed).flatten() // K]
    out = want.new_full((cap, H), SENTINEL).cuda()
    _lib.gather_rows(*_cuda(x, pair_row), cap, out)
    assert_bitwise_equal(out.cpu(), want, "x_RH")


def test_gather_rows_bad_pair_row_names_it():
    x = torch.zeros(3, 8, dtype=torch.bfloat16, device="cuda")
    out = torch.zeros(8, 8, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="pair_row"):
        _lib.gather_rows(x, torch.zeros(7, dtype=torch.int32, device="cuda"), 8, out)
    with pytest.raises(TypeError, match="pair_row"):
        _lib.gather_rows(x, torch.zeros(6, dtype=torch.int64, device="cuda"), 8, out)


@pytest.mark.parametrize("T,K,H", SHAPES)
@pytest.mark.parametrize("shared", [True, False])  # with and without the shared expert's term
def test_combine_fwd_bitwise(T, K, H, shared):
    g = torch.Generator().manual_seed(T * 1000 + K * 10 + H)
    cap = T * K + 3  # rows no pair maps to
    s = torch.randn(T, H, generator=g).bfloat16() if shared else None
    o = torch.randn(cap, H, generator=g).bfloat16()
    w = torch.rand(T, K, generator=g)  # full fp32 weights: every product w * o is rounded
    pair_row, flag = _pair_rows(T, K, cap, g), _flag(0)
    y = torch.full((T, H), SENTINEL, dtype=torch.bfloat16, device="cuda")
    _lib.combine_fwd(*_cuda(s, o, w, pair_row, flag), y)
    assert_bitwise_equal(y.cpu(), _ordered_combine(s, o, pair_row, K, flag, w), "y")


@pytest.mark.parametrize("T,K,H", SHAPES)
def test_combine_bwd_pre_bitwise(T, K, H):
    g = torch.Generator().manual_seed(T * 1000 + K * 10 + H + 1)
    cap = T * K + 3
    dy = torch.randn(T, H, generator=g).bfloat16()
    o = torch.randn(cap, H, generator=g).bfloat16()
    w = torch.rand(T, K, generator=g)
    pair_row, flag = _pair_rows(T, K, cap, g), _flag(0)
    go_init = torch.full((cap, H), SENTINEL, dtype=torch.bfloat16)
    d_w = torch.full((T, K), SENTINEL, device="cuda")
    go = go_init.cuda()
    _lib.combine_bwd_pre(*_cuda(dy, o, w, pair_row, flag), d_w, go)
    assert_bitwise_equal(d_w.cpu(), _d_topk_weight(dy, o, pair_row, flag), "d_topk_weight")
    assert_bitwise_equal(go.cpu(), _go(dy, w, pair_row, flag, go_init), "go (rows of no pair keep the sentinel)")


@pytest.mark.parametrize("T,K,H", SHAPES)
@pytest.mark.parametrize("shared", [True, False])  # with and without the shared expert's d_x
def test_combine_bwd_dx_bitwise(T, K, H, shared):
    g = torch.Generator().manual_seed(T * 1000 + K * 10 + H + 2)
    cap = T * K + 3
    dxs = torch.randn(T, H, generator=g).bfloat16() if shared else None
    dx = torch.randn(cap, H, generator=g).bfloat16()
    pair_row, flag = _pair_rows(T, K, cap, g), _flag(0)
    out = torch.full((T, H), SENTINEL, dtype=torch.bfloat16, device="cuda")
    _lib.combine_bwd_dx(*_cuda(dxs, dx, pair_row, flag), K, out)
    assert_bitwise_equal(out.cpu(), _ordered_combine(dxs, dx, pair_row, K, flag), "d_x")


@pytest.mark.parametrize("flag_value, missing", [
    (1, None),     # bit 1: an expert id out of range somewhere: every output NaN
    (2, None),     # bit 2: a repeated id in a row: every output NaN
    (4, None),     # bit 4: rows beyond capacity: every output NaN
    (0, (2, 1)),   # pair (2, 1) not placed: token 2's y and d_x NaN, d_topk_weight[2, 1] NaN, no go row
])
def test_combine_kernels_bad_routing(flag_value, missing):
    T, K, H = 6, 3, 256
    g = torch.Generator().manual_seed(flag_value)
    cap = T * K + 2
    s, dy, dxs = (torch.randn(T, H, generator=g).bfloat16() for _ in range(3))
    o, dx = (torch.randn(cap, H, generator=g).bfloat16() for _ in range(2))
    w = torch.rand(T, K, generator=g)
    pair_row, flag = _pair_rows(T, K, cap, g, missing), _flag(flag_value)
    y = torch.full((T, H), SENTINEL, dtype=torch.bfloat16, device="cuda")
    _lib.combine_fwd(*_cuda(s, o, w, pair_row, flag), y)
    go_init = torch.full((cap, H), SENTINEL, dtype=torch.bfloat16)
    d_w, go = torch.full((T, K), SENTINEL, device="cuda"), go_init.cuda()
    _lib.combine_bwd_pre(*_cuda(dy, o, w, pair_row, flag), d_w, go)
    d_x = torch.full((T, H), SENTINEL, dtype=torch.bfloat16, device="cuda")
    _lib.combine_bwd_dx(*_cuda(dxs, dx, pair_row, flag), K, d_x)

    want_y = _ordered_combine(s, o, pair_row, K, flag, w)
    want_dw = _d_topk_weight(dy, o, pair_row, flag)
    if flag_value:
        assert bool(want_y.isnan().all() and want_dw.isnan().all())  # the formulation says "all NaN"
    else:
        assert int(want_y.isnan().any(1).sum()) == 1 and int(want_dw.isnan().sum()) == 1  # one token, one slot
    assert_bitwise_equal(y.cpu(), want_y, "y")
    assert_bitwise_equal(d_w.cpu(), want_dw, "d_topk_weight")
    assert_bitwise_equal(go.cpu(), _go(dy, w, pair_row, flag, go_init), "go")
    assert_bitwise_equal(d_x.cpu(), _ordered_combine(dxs, dx, pair_row, K, flag), "d_x")


# ---------------------------------------------------------------- SwiGLU kernels


def _offsets(n_rows: int, L: int = 3) -> torch.Tensor:
    """A schedule-like offsets [2L+1] int32 whose offsets[L] (rows placed) is n_rows."""
    starts = [0, n_rows // 3, (2 * n_rows) // 3, n_rows][: L + 1]
    counts = [b - a for a, b in zip(starts, starts[1:])]
    return torch.tensor(starts + counts, dtype=torch.int32)


def _gate(kind: str, gen, rows: int, I: int) -> torch.Tensor:
    """g [rows, I] fp32. kind: "saturated" (every g >= 20, where sigmoid rounds to 1, or <= -90, where it is 0; and
    g = 0 in every 7th column, where silu = 0 whatever expf gives) or "random" (g ~ 3 N(0, 1): SwiGLU's usual range,
    including silu'(g)'s zero near g = -1.28)."""
    if kind == "saturated":
        pick = torch.rand(rows, I, generator=gen) < 0.5
        gate = torch.where(pick, 20 + 40 * torch.rand(rows, I, generator=gen),
                           -90 - 30 * torch.rand(rows, I, generator=gen))
        gate[:, ::7] = 0.0
        return gate
    return 3 * torch.randn(rows, I, generator=gen)


def _swiglu_fwd_case(kind: str, seed: int, I, n_rows, capacity, use_offsets):
    """Draw gu [capacity, 2I] = [g | u] fp32, run swiglu_fwd, check that rows past the n_rows placed were not
    written (neither a nor gu), and return (a, g, u, p, q) of the placed rows on the CPU, p | q being what the
    kernel left in gu in place of g | u."""
    gen = torch.Generator().manual_seed(seed)
    gu = torch.cat([_gate(kind, gen, capacity, I), torch.randn(capacity, I, generator=gen)], 1)
    gu[n_rows:] = NAN  # rows past the placed ones: never read into a written row
    a = torch.full((capacity, I), SENTINEL, dtype=torch.bfloat16, device="cuda")
    offsets = _offsets(n_rows).cuda() if use_offsets else None
    (gu_dev,) = _cuda(gu)
    _lib.swiglu_fwd(gu_dev, offsets, 3, 0 if use_offsets else n_rows, I, capacity, a)
    a, pq = a.cpu(), gu_dev.cpu()
    assert bool((a[n_rows:] == SENTINEL).all()), "rows of a past the rows placed were written"
    assert bool(pq[n_rows:].isnan().all()), "rows of gu past the rows placed were written"
    return a[:n_rows], gu[:n_rows, :I], gu[:n_rows, I:], pq[:n_rows, :I], pq[:n_rows, I:]


def _swiglu_bwd_case(seed: int, I, n_rows, capacity, use_offsets):
    """Draw pq [capacity, 2I] = [p | q] and da [capacity, I] fp32 over every scale and the special values, run
    swiglu_bwd, check that rows past the n_rows placed were not written, and return (dgu, p, q, da) of the placed
    rows on the CPU."""
    pq = torch.stack([_special_fp32(capacity * I, seed), _special_fp32(capacity * I, seed + 1).flip(0)], 1)
    pq = pq.reshape(capacity, I, 2).transpose(1, 2).reshape(capacity, 2 * I).contiguous()
    pq[n_rows:] = NAN
    da = _special_fp32(capacity * I, seed + 2).roll(5).reshape(capacity, I)
    dgu = torch.full((capacity, 2 * I), SENTINEL, dtype=torch.bfloat16, device="cuda")
    offsets = _offsets(n_rows).cuda() if use_offsets else None
    _lib.swiglu_bwd(*_cuda(da, pq), offsets, 3, 0 if use_offsets else n_rows, I, capacity, dgu)
    dgu = dgu.cpu()
    assert bool((dgu[n_rows:] == SENTINEL).all()), "rows past the rows placed were written"
    return dgu[:n_rows], pq[:n_rows, :I], pq[:n_rows, I:], da[:n_rows]


SWIGLU = [
    (8, 5, 9, True),        # I = 8: 2 of 256 threads active; rows from offsets[L], 4 rows of capacity unused
    (1032, 37, 40, False),  # I = 1032: a second pass over the row (4 x 256 = 1024 columns per pass); fixed_rows
    (2048, 64, 64, True),   # every row of the capacity placed
]


@pytest.mark.parametrize("I, n_rows, capacity, use_offsets", SWIGLU)
def test_swiglu_fwd_bitwise_where_sigmoid_is_exact(I, n_rows, capacity, use_offsets):
    a, gate, up, p, q = _swiglu_fwd_case("saturated", I + n_rows, I, n_rows, capacity, use_offsets)
    s = torch.where(gate >= 20, 1.0, torch.where(gate <= -90, 0.0, 0.5))  # 0.5 only where g = 0
    want = ((gate * s) * up).bfloat16()  # silu = g * s, then one fp32 product, then bf16
    assert bool(want.float().abs().max() > 1) and bool((want == 0).any())  # both regimes present
    assert_bitwise_equal(a, want, "a = bf16(silu(g) * u)")
    assert_bitwise_equal(q, gate * s, "q = silu(g)")
    sat = gate != 0  # s exactly 0 or 1: fma(g, 1 - s, 1) = 1 + g * (1 - s), g * (1 - s) exact
    assert_bitwise_equal(p[sat], up[sat] * (s[sat] * (1.0 + gate[sat] * (1.0 - s[sat]))), "p = u * silu'(g)")


@pytest.mark.parametrize("I, n_rows, capacity, use_offsets", SWIGLU)
def test_swiglu_bwd_bitwise_everywhere(I, n_rows, capacity, use_offsets):
    """The backward is two fp32 products and their bf16 roundings, which CPU PyTorch gives exactly, special values
    (NaN, +-inf, +-0, subnormals, overflow to inf, bf16 rounding ties) included."""
    dgu, p, q, d = _swiglu_bwd_case(I + n_rows + 1, I, n_rows, capacity, use_offsets)
    assert bool(p.isnan().any()) and bool(p.isinf().any()) and bool(d.isinf().any())  # the specials are there
    assert_bitwise_equal(dgu[:, :I], (d * p).bfloat16(), "dg = bf16(da * p)")
    assert_bitwise_equal(dgu[:, I:], (d * q).bfloat16(), "du = bf16(da * q)")


# fp32 errors before the bf16 rounding: expf <= 2 ULP, then a few roundings, so the fp32 value is within
# ~5 ULP (2^-24 each) of exact; bf16 rounding adds <= 2^-8 relative. BF16 bounds that, with slack.
BF16 = 2.0**-8 * (1 + 2.0**-6)
FP32 = 2.0**-19  # 16 ULP: p and q are the same few roundings, kept in fp32


def _assert_within(name, got, want64, bound):
    bad = ~((got.double() - want64).abs() <= bound)  # NaN fails
    if bool(bad.any()):
        i = tuple(int(j) for j in bad.nonzero()[0])
        raise AssertionError(f"{name}: {int(bad.sum())} of {bad.numel()} elements out of bound; first at {i}: "
                             f"got {got[i].item()!r}, float64 {want64[i].item()!r}, bound {bound[i].item()!r}")


@pytest.mark.parametrize("I, n_rows, capacity, use_offsets", SWIGLU)
def test_swiglu_fwd_close_to_float64(I, n_rows, capacity, use_offsets):
    a, gate, up, p, q = (t.double() for t in _swiglu_fwd_case("random", I + n_rows + 2, I, n_rows, capacity,
                                                              use_offsets))
    s = torch.sigmoid(gate)
    want = gate * s * up
    _assert_within("a", a, want, BF16 * want.abs() + 1e-30)
    _assert_within("q", q, gate * s, FP32 * (gate * s).abs() + 1e-38)
    want_p = up * s * (1 + gate * (1 - s))
    # silu' = s * (1 + g * (1 - s)) cancels near g = -1.28: its fp32 error is absolute, <= ~10 ULP of s * (1 + |g|)
    slack = 2.0**-20 * up.abs() * s * (1 + gate.abs())
    _assert_within("p", p, want_p, FP32 * want_p.abs() + slack + 1e-38)
    # the bound is not vacuous: swapping p and q, or dropping silu' from p, breaks it
    assert not bool(((q - want_p).abs() <= FP32 * want_p.abs() + slack).all())
    assert not bool(((p - up).abs() <= FP32 * up.abs() + slack).all())


# ---------------------------------------------------------------- cast_pair_bf16


def _special_fp32(n: int, seed: int) -> torch.Tensor:
    """n fp32 values: random normals of every scale, and NaN, ±inf, ±0, subnormals, bf16 rounding ties
    (both parities), the largest finite values (which round to inf) and values just off a tie."""
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(n, generator=g) * torch.exp2(torch.randint(-130, 128, (n,), generator=g).float())
    specials = torch.tensor([NAN, float("inf"), -float("inf"), 0.0, -0.0, 1e-40, -1e-45, 3.4e38, -3.4e38])
    ties = torch.tensor([0x3F808000, 0x3F818000, 0x3F808001, 0x3F817FFF, 0xFF7FFFFF - 2**32, 0x7F7F8000],
                        dtype=torch.int64).to(torch.int32).view(torch.float32)
    fixed = torch.cat([specials, ties])
    v[:fixed.numel()] = fixed[:n]
    return v


@pytest.mark.parametrize("lead, n, H, misalign", [
    ((3,), 5, 16, False),  # routed [L, I, H]: vector path
    ((), 7, 8, False),     # shared [S, H] (2-D): vector path
    ((2, 2), 3, 24, False),  # more leading dims
    ((3,), 5, 5, False),   # n * H not a multiple of 8: scalar path
    ((3,), 4, 8, True),    # inputs 4 bytes off 16-byte alignment: scalar path
    ((1,), 1, 8, False),   # one 8-wide vector per half
])
def test_cast_pair_bf16_matches_torch_bits(lead, n, H, misalign):
    numel = n * H
    for b in lead:
        numel *= b
    off = 1 if misalign else 0
    first = _special_fp32(numel + off, 1).cuda()[off:].view(*lead, n, H)
    second = _special_fp32(numel + off, 2).cuda()[off:].view(*lead, n, H)
    out = torch.full((*lead, 2 * n, H), SENTINEL, dtype=torch.bfloat16, device="cuda")
    _lib.cast_pair_bf16(first, second, out)
    want = torch.cat([first.to(torch.bfloat16), second.to(torch.bfloat16)], dim=-2)  # PyTorch's CUDA cast
    assert_bitwise_equal(out, want, "cast_pair_bf16")


@pytest.mark.parametrize("arg, make, err, match", [
    ("first", lambda f, s, o: (f.double(), s, o), TypeError, "first: expected dtype torch.float32"),  # fp64 input
    ("second", lambda f, s, o: (f, s[:1], o), ValueError, "second: expected shape"),  # second not first's shape
    ("out", lambda f, s, o: (f, s, o.view(2, 4, 16)), ValueError, "out: expected shape"),  # out not [..., 2n, H]
    ("out", lambda f, s, o: (f, s, o.float()), TypeError, "out: expected dtype torch.bfloat16"),  # fp32 out
    ("first", lambda f, s, o: (f.transpose(1, 2), s, o), ValueError, "first: expected a contiguous tensor"),  # strided
])
def test_cast_pair_bf16_bad_input_names_the_argument(arg, make, err, match):
    f = torch.zeros(2, 4, 8, device="cuda")
    s = torch.zeros(2, 4, 8, device="cuda")
    o = torch.zeros(2, 8, 8, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(err, match=match):
        _lib.cast_pair_bf16(*make(f, s, o))

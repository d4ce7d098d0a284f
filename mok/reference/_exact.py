"""Bit-defining primitives of the reference (numerics contract v1, docs/numerics.md).

Everything here is built from IEEE-754 basic operations on fp32 tensors (+ - * /, exact
scaling by powers of two, floor, comparisons) issued as separate elementwise PyTorch ops,
so every conforming platform (any CPU, any thread count, CUDA) rounds them the same way.
No BLAS, no library reduction over a long axis, no platform exp/sigmoid.
"""

from __future__ import annotations

import torch

from ._validate import _device, _tensor

CONTRACT_VERSION = 1

# How the tree sums are computed (no bit depends on it): the first level of one chunk of outputs is written
# reduction-axis-major into one preallocated fp32 buffer p [n, ...] (the products, or on the CPU the first level's
# two-term sums from one GEMM: see _first_level_by_gemm), and each further level is one in-place elementwise add of
# its two contiguous halves, p[:h] += p[h:2h] (plus a copy of the carried term), so no level allocates,
# concatenates or strides. Chunks split independent outputs only, never a reduction, so they change no bit; a
# chunk's buffer stays near this many elements (CPU, one thread: about an L2 cache; CUDA: few, large launches). On
# the CPU with more threads it grows to _CPU_CHUNK_CAP (larger elementwise ops amortise the threads' dispatch): at
# T, H, I, E, K = 1024, 512, 256, 16, 2 on a 2-core CPU, forward+backward took 0.87 s at 2^19 and 0.94 s at 2^20
# with one thread, 0.69 s at 2^20, 0.60 s at 2^21, 0.57 s at 2^22 and 0.62 s at 2^23 with two.
_CHUNK_ELEMS = {"cpu": 1 << 19, "cuda": 1 << 24}
_CPU_CHUNK_CAP = 1 << 22


def _float32(name: str, t) -> None:
    """The elementwise primitives' check: a float32 tensor, any shape (their bits are defined for fp32 only)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.float32:
        raise TypeError(f"{name}: expected dtype torch.float32, got {t.dtype}")


def _chunk_elems(device: torch.device) -> int:
    """First-level terms per chunk on `device` (see above): the base with one CPU thread, 8x it (up to the cap) with
    more."""
    if device.type == "cpu":
        threads = torch.get_num_threads()
        base = _CHUNK_ELEMS["cpu"]
        return base if threads == 1 else min(base * 8, max(base, _CPU_CHUNK_CAP))
    return _CHUNK_ELEMS.get(device.type, _CHUNK_ELEMS["cuda"])


def _tree_reduce_(p_D: torch.Tensor, n: int) -> torch.Tensor:
    """Reduce p_D[0:n] over dim 0 with the contract's tree, in place; returns the result p_D[0] (a view).

    One level: p[i] += p[h + i] for i < h = n // 2 (one elementwise add of two contiguous halves when p is
    contiguous), then, if n is odd, p[h] = p[2h]; n <- h + n % 2. Needs n >= 1; p_D[n:] is not read.

    Args:
        p_D: [>= n, ...] any dtype; overwritten.
        n: the number of terms, >= 1.
    Returns:
        p_D[0], shape p_D.shape[1:].
    """
    while n > 1:
        h = n // 2
        p_D[:h].add_(p_D[h : 2 * h])
        if n % 2:
            p_D[h].copy_(p_D[2 * h])
        n = h + n % 2
    return p_D[0]


def tree_sum(p: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum fp32 `p` over `dim` with the contract's fixed pairwise tree.

    Order (contract v1): with n terms v_0..v_{n-1}, one level computes
    v_i <- v_i + v_{h+i} for i < h = n // 2 and, if n is odd, carries v_{2h} to slot h;
    then n <- h + n % 2, until one term is left. n = 0 gives +0.0.

    Args:
        p: float32 (the contract's dtype; other dtypes are summed in their own dtype, in the same order),
            at least 1 dimension.
        dim: the axis to reduce, an int in [-p.dim(), p.dim()).
    Returns:
        `p`'s shape without `dim`, float32; a new tensor (never a view of `p`).
    """
    if not isinstance(p, torch.Tensor):
        raise TypeError(f"p: expected a torch.Tensor, got {type(p).__name__}")
    if p.dim() == 0:
        raise ValueError("p: expected at least 1 dimension to sum over, got a 0-d tensor")
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"dim: expected an int, got {type(dim).__name__} {dim!r}")
    if not -p.dim() <= dim < p.dim():
        raise ValueError(f"dim: expected an int in [{-p.dim()}, {p.dim()}) for p of shape {tuple(p.shape)}, "
                         f"got {dim}")
    p_N = p.movedim(dim, 0)
    n = p_N.shape[0]
    if n <= 1:
        return p_N[0].clone() if n else torch.zeros(p_N.shape[1:], dtype=p.dtype, device=p.device)
    # the first level out of place into a new contiguous tensor (p stays untouched), the rest in place on it;
    # under autograd every level out of place (the same adds, so the same bits)
    h = n // 2
    v_N = torch.cat([p_N[:h] + p_N[h : 2 * h], p_N[2 * h :]]) if n % 2 else p_N[:h] + p_N[h : 2 * h]
    if p.requires_grad and torch.is_grad_enabled():
        return _tree_sum_differentiable(v_N, h + n % 2)
    return _tree_reduce_(v_N, h + n % 2)


def _tree_sum_differentiable(v_N: torch.Tensor, n: int) -> torch.Tensor:
    """`_tree_reduce_`'s levels on v_N [n, ...] with out-of-place ops (autograd records them); returns v_N's sum."""
    while n > 1:
        h = n // 2
        head = v_N[:h] + v_N[h : 2 * h]
        v_N = torch.cat([head, v_N[2 * h : 2 * h + 1]]) if n % 2 else head
        n = h + n % 2
    return v_N[0]


# The first level of a product tree may come from a batched GEMM with two-term dots: s_i = a_i b_i + a_{h+i} b_{h+i}.
# When both products are exact and finite in fp32 (bf16 operands with no product above 2^128 or below 2^-134) and
# the sum is rounded once, every way of evaluating a two-term dot (FMA or not, either order, an accumulator
# started at zero) rounds the same exact sum, so the GEMM gives the contract's level bit for bit, except that an
# accumulator started at +0 turns (-0) + (-0) into +0. A final zero's sign is therefore set afterwards from the
# contract: a tree of IEEE adds is -0 exactly when every term is -0. Only the CPU's IEEE fp32 GEMM is used
# (oneDNN's fp32 precision "none" or "ieee": `_cpu_fp32_gemm_is_ieee`); inputs outside the exact range, other
# precisions and CUDA keep the elementwise first level. At the shape above on a 2-core CPU with 2 threads the
# layer's forward+backward went from 0.90 s to 0.50 s (with the larger chunk, gate/up in one call and the check
# read from the bf16 bits).
_PAIR_MAX = 2.0**128  # a product of two bf16 values below this is finite and exact
_PAIR_MIN = 2.0**-134  # ... and at or above this (16 significant bits above fp32's subnormal step 2^-149)


def _cpu_fp32_gemm_is_ieee() -> bool:
    """Whether a CPU fp32 GEMM rounds in IEEE fp32 (no TF32 or bf16 inputs): oneDNN's fp32 precision "none" or
    "ieee" (torch >= 2.9, whose legacy getter raises once the new setters were used), else the legacy float32
    matmul precision "highest"."""
    onednn = getattr(torch.backends.mkldnn, "matmul", None)
    if onednn is not None and hasattr(onednn, "fp32_precision"):
        return onednn.fp32_precision in ("none", "ieee")
    return torch.get_float32_matmul_precision() == "highest"


def _magnitude_bounds(t: torch.Tensor) -> tuple[float, float, bool]:
    """(largest |t|, smallest nonzero |t|, any zero) for bf16 `t` (any shape), from its bits in a few integer passes;
    NaN and inf give largest = inf; no nonzero value gives smallest = inf."""
    mag = t.view(torch.int16) & 0x7FFF  # |t|'s bits, ordered as |t| (NaN above inf); 0 only for ±0
    low, high = torch.aminmax(mag)
    below = (mag - 1).bitwise_and_(0x7FFF)  # nonzero m -> m - 1; 0 -> 0x7FFF, above every nonzero m - 1
    smallest_bits = int(below.min()) + 1
    as_float = lambda bits: float(torch.tensor(bits, dtype=torch.int16).view(torch.bfloat16))  # noqa: E731
    largest = float("inf") if int(high) >= 0x7F80 else as_float(int(high))
    smallest = float("inf") if smallest_bits > 0x7FFF else as_float(smallest_bits)
    return largest, smallest, int(low) == 0


def _first_level_by_gemm(a: torch.Tensor, b: torch.Tensor, D: int) -> tuple[bool, bool]:
    """Whether a two-term-dot GEMM gives the first level of the trees over the products of `a`'s and `b`'s values
    bit for bit (see above), and whether an operand holds a zero (only then can a product be a signed zero that
    needs `_signed_zeros_`).

    Args:
        a, b: bfloat16, any shape: the operands' values (every product of an `a` value and a `b` value counts).
        D: the length of the trees (no pair below 2).
    Returns:
        (exact, has_zero).
    """
    if a.device.type != "cpu" or D < 2 or a.numel() == 0 or b.numel() == 0 or not _cpu_fp32_gemm_is_ieee():
        return False, False
    a_max, a_min, a_zero = _magnitude_bounds(a)
    b_max, b_min, b_zero = _magnitude_bounds(b)
    return a_max * b_max < _PAIR_MAX and a_min * b_min >= _PAIR_MIN, a_zero or b_zero


def _signed_zeros_(out_MN: torch.Tensor, a_DM: torch.Tensor, b_DN: torch.Tensor) -> None:
    """Give each zero of out_MN the contract's sign, in place: -0 where every product a[d, m] * b[d, n] is -0, else +0.

    Args:
        out_MN: [M, N] float32, the tree sums of a_DM[:, m] * b_DN[:, n]. a_DM: [D, M], b_DN: [D, N] float32.
    """
    m_Z, n_Z = (out_MN == 0).nonzero(as_tuple=True)
    per = max(1, _chunk_elems(out_MN.device) // max(1, a_DM.shape[0]))
    for z0 in range(0, m_Z.numel(), per):
        m_z, n_z = m_Z[z0 : z0 + per], n_Z[z0 : z0 + per]
        p_DZ = a_DM[:, m_z] * b_DN[:, n_z]
        negative_zero_Z = ((p_DZ == 0) & torch.signbit(p_DZ)).all(dim=0)
        out_MN[m_z, n_z] = torch.where(negative_zero_Z, -0.0, 0.0)


def _tree_dot(a_DM: torch.Tensor, b_DN: torch.Tensor, gemm: tuple[bool, bool] = (False, False)) -> torch.Tensor:
    """c[m, n] = tree over d of a[d, m] * b[d, n]: exact products, the contract's tree over D.

    Per chunk of outputs [m0:m1, n0:n1], the tree's first level goes into one buffer p [n, m1 - m0, n1 - n0]
    (n = D, or the first level's ceil(D / 2) terms when `_first_level_by_gemm` holds) and `_tree_reduce_` sums
    it in place, level by level over whole slabs.

    Args:
        a_DM: [D, M] float32. b_DN: [D, N] float32, same device (unchecked: callers validate).
        gemm: `_first_level_by_gemm` of the operands.
    Returns:
        [M, N] float32; +0.0 where D = 0.
    """
    D, M = a_DM.shape
    N = b_DN.shape[1]
    out_MN = torch.zeros(M, N, dtype=torch.float32, device=a_DM.device)
    if D == 0 or M == 0 or N == 0:
        return out_MN
    pairs, has_zero = gemm
    h = D // 2
    n = h + D % 2 if pairs else D
    if pairs:  # [h, M, 2] and [h, 2, N] views: the two terms of each first-level pair (BLAS strides, no copy)
        a_hM2 = a_DM[: 2 * h].view(2, h, M).permute(1, 2, 0)
        b_h2N = b_DN[: 2 * h].view(2, h, N).permute(1, 0, 2)
    budget = _chunk_elems(a_DM.device)
    cols = min(N, max(1, budget // n))
    rows = min(M, max(1, budget // (n * cols)))
    buf = torch.empty(n * rows * cols, dtype=torch.float32, device=a_DM.device)
    for m0 in range(0, M, rows):
        m1 = min(M, m0 + rows)
        for n0 in range(0, N, cols):
            n1 = min(N, n0 + cols)
            p_nMN = buf[: n * (m1 - m0) * (n1 - n0)].view(n, m1 - m0, n1 - n0)
            if pairs:
                torch.bmm(a_hM2[:, m0:m1], b_h2N[:, :, n0:n1], out=p_nMN[:h])
                if D % 2:
                    torch.mul(a_DM[2 * h, m0:m1, None], b_DN[2 * h, None, n0:n1], out=p_nMN[h])
            else:
                torch.mul(a_DM[:, m0:m1, None], b_DN[:, None, n0:n1], out=p_nMN)
            out_MN[m0:m1, n0:n1] = _tree_reduce_(p_nMN, n)
    if pairs and has_zero:
        _signed_zeros_(out_MN, a_DM, b_DN)
    return out_MN


def matmul_exact(a_MD: torch.Tensor, b_ND: torch.Tensor) -> torch.Tensor:
    """a @ bᵀ for bf16 operands: exact fp32 products, then `tree_sum` over D.

    Args:
        a_MD: [M, D] bfloat16.
        b_ND: [N, D] bfloat16, on a's device (no broadcasting; other dtypes raise TypeError).
    Returns:
        [M, N] float32.
    """
    _tensor("a_MD", a_MD, torch.bfloat16, 2)
    _tensor("b_ND", b_ND, torch.bfloat16, 2)
    D = a_MD.shape[1]
    if b_ND.shape[1] != D:
        raise ValueError(f"b_ND: expected shape (N, {D}) with D = a_MD.shape[1], got {tuple(b_ND.shape)}")
    _device("b_ND", b_ND, a_MD.device, "a_MD")
    gemm = _first_level_by_gemm(a_MD, b_ND, D)
    return _tree_dot(a_MD.t().contiguous().float(), b_ND.t().contiguous().float(), gemm)


def rows_outer_sum(a_RM: torch.Tensor, b_RN: torch.Tensor) -> torch.Tensor:
    """Σ_r a[r]ᵀ b[r] for bf16 operands: exact products, `tree_sum` over rows in given order.

    Used for weight gradients; rows must already be in canonical order.

    Args:
        a_RM: [R, M] bfloat16.
        b_RN: [R, N] bfloat16, on a's device (no broadcasting; other dtypes raise TypeError).
    Returns:
        [M, N] float32.
    """
    _tensor("a_RM", a_RM, torch.bfloat16, 2)
    _tensor("b_RN", b_RN, torch.bfloat16, 2)
    R = a_RM.shape[0]
    if b_RN.shape[0] != R:
        raise ValueError(f"b_RN: expected shape ({R}, N) with R = a_RM.shape[0], got {tuple(b_RN.shape)}")
    _device("b_RN", b_RN, a_RM.device, "a_RM")
    gemm = _first_level_by_gemm(a_RM, b_RN, R)
    return _tree_dot(a_RM.contiguous().float(), b_RN.contiguous().float(), gemm)


def rowwise_dot(a_TH: torch.Tensor, b_TKH: torch.Tensor) -> torch.Tensor:
    """c[t, k] = Σ_h a[t, h] * b[t, k, h] for bf16 operands: exact products, `tree_sum` over H.

    Args:
        a_TH: [T, H] bfloat16.
        b_TKH: [T, K, H] bfloat16, on a's device (no broadcasting; other dtypes raise TypeError).
    Returns:
        [T, K] float32.
    """
    _tensor("a_TH", a_TH, torch.bfloat16, 2)
    _tensor("b_TKH", b_TKH, torch.bfloat16, 3)
    T, H = a_TH.shape
    if b_TKH.shape[0] != T or b_TKH.shape[2] != H:
        raise ValueError(f"b_TKH: expected shape ({T}, K, {H}) with (T, H) = a_TH.shape, got {tuple(b_TKH.shape)}")
    _device("b_TKH", b_TKH, a_TH.device, "a_TH")
    K = b_TKH.shape[1]
    out_TK = torch.zeros(T, K, dtype=torch.float32, device=a_TH.device)
    if H == 0 or T == 0 or K == 0:
        return out_TK
    a_HT = a_TH.t().contiguous().float()
    b_HTK = b_TKH.permute(2, 0, 1).contiguous().float()
    rows = min(T, max(1, _chunk_elems(a_TH.device) // (H * K)))
    buf = torch.empty(H * rows * K, dtype=torch.float32, device=a_TH.device)
    for t0 in range(0, T, rows):
        t1 = min(T, t0 + rows)
        p_HTK = buf[: H * (t1 - t0) * K].view(H, t1 - t0, K)
        torch.mul(a_HT[:, t0:t1, None], b_HTK[:, t0:t1], out=p_HTK)
        out_TK[t0:t1] = _tree_reduce_(p_HTK, H)
    return out_TK


# exp(x) = 2^n * p(r), x = n*ln2 + r, |r| <= ln2/2 (Cody-Waite split of ln2, so n*LN2_HI is exact).
_LOG2E = 1.44269502162933349609375  # fp32(1/ln2)
_LN2_HI = 0.693145751953125  # ln2 to 16 bits: n * _LN2_HI is exact for |n| < 2^8
_LN2_LO = 1.428606765330187045e-06  # fp32(ln2 - _LN2_HI)
# Taylor coefficients 1/k!, k = 7..0, each rounded to fp32; |error| < 6e-9 on |r| <= ln2/2.
_EXP_COEF = (
    1.98412701138295233249664306640625e-04,
    1.38888892251998186111450195312500e-03,
    8.33333376795053482055664062500000e-03,
    4.16666679084300994873046875000000e-02,
    1.66666671633720397949218750000000e-01,
    0.5,
    1.0,
    1.0,
)
_EXP_HI = 89.0  # exp(x) = inf in fp32 for x > 88.73
_EXP_LO = -104.0  # exp(x) = +0 in fp32 for x < -103.98


def _pow2(n: torch.Tensor) -> torch.Tensor:
    """2^n as fp32 for integer-valued int32 `n` in [-126, 127], built from its exponent bits."""
    return ((n + 127) << 23).view(torch.float32)


def exp_exact(x: torch.Tensor) -> torch.Tensor:
    """exp for float32 from basic IEEE operations only (same bits on every platform).

    Args:
        x: any shape, float32 (other dtypes raise TypeError).
    Returns:
        same shape, float32; NaN stays NaN, +inf -> inf, -inf -> 0.
    """
    _float32("x", x)
    xc = x.clamp(_EXP_LO, _EXP_HI)
    n = torch.floor(xc * _LOG2E + 0.5)
    r = (xc - n * _LN2_HI) - n * _LN2_LO
    p = torch.full_like(r, _EXP_COEF[0])
    for c in _EXP_COEF[1:]:
        p = p * r + c
    n_i = n.to(torch.int32)
    half = torch.div(n_i, 2, rounding_mode="floor")
    y = (p * _pow2(half)) * _pow2(n_i - half)
    y = torch.where(x > _EXP_HI, torch.full_like(y, float("inf")), y)
    y = torch.where(x < _EXP_LO, torch.zeros_like(y), y)
    return torch.where(torch.isnan(x), x, y)


_SIGMOID_NEG = -80.0  # below this exp(-x) would overflow near -88.7 although sigmoid(x) is > 0


def sigmoid_exact(x: torch.Tensor) -> torch.Tensor:
    """1 / (1 + exp(-x)) for x >= -80, else e / (1 + e) with e = exp(x); fp32 (other dtypes raise
    TypeError), IEEE ops only."""
    _float32("x", x)
    one = torch.ones_like(x)
    pos = one / (one + exp_exact(-x))
    e = exp_exact(torch.minimum(x, torch.full_like(x, _SIGMOID_NEG)))
    return torch.where(x < _SIGMOID_NEG, e / (one + e), pos)


def silu_exact(g: torch.Tensor) -> torch.Tensor:
    """silu(g) = g * sigmoid(g), fp32 (other dtypes raise TypeError)."""
    _float32("g", g)
    return g * sigmoid_exact(g)


def dsilu_exact(g: torch.Tensor) -> torch.Tensor:
    """silu'(g) = s * (1 + g * (1 - s)) with s = sigmoid(g), fp32 (other dtypes raise TypeError), evaluated
    in this order."""
    return silu_and_dsilu_exact(g)[1]


def silu_and_dsilu_exact(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(`silu_exact(g)`, `dsilu_exact(g)`) from one sigmoid, with their bits; fp32 (other dtypes raise TypeError)."""
    _float32("g", g)
    s = sigmoid_exact(g)
    return g * s, s * (1.0 + g * (1.0 - s))


# log on [1, inf): x = m * 2^e with m in [sqrt(1/2), sqrt(2)), log m = 2 atanh(s), s = (m-1)/(m+1);
# the Cody-Waite split of ln2 is exp_exact's.
_SQRT2 = 1.41421353816986083984375  # fp32(sqrt 2)
_ATANH_COEF = (1 / 13, 1 / 11, 1 / 9, 1 / 7, 1 / 5, 1 / 3, 1.0)  # Horner in s², highest first


def log_exact_ge1(x: torch.Tensor) -> torch.Tensor:
    """Natural log of fp32 `x` >= 1 from basic IEEE operations; NaN stays NaN.

    Only the domain the z-loss needs (a log-sum-exp argument is >= 1). |rel. error| < 1e-7.
    Outside it nothing is read back to the host (no GPU synchronisation): values below 1 (and -inf)
    give NaN, +inf gives +inf. Values in [1, inf) get the bits they always had.

    Args:
        x: any shape, float32 (other dtypes raise TypeError).
    Returns:
        same shape, float32.
    """
    _float32("x", x)
    bits = x.view(torch.int32)
    e = (bits >> 23) - 127
    m = ((bits & 0x7FFFFF) | (127 << 23)).view(torch.float32)  # [1, 2)
    big = m > _SQRT2
    m = torch.where(big, m * 0.5, m)
    e = (e + big.to(torch.int32)).to(torch.float32)
    s = (m - 1.0) / (m + 1.0)
    s2 = s * s
    p = torch.full_like(s, _ATANH_COEF[0])
    for c in _ATANH_COEF[1:]:
        p = p * s2 + c
    y = e * _LN2_HI + ((2.0 * s) * p + e * _LN2_LO)
    y = torch.where(x == float("inf"), x, y)
    y = torch.where(x < 1.0, torch.full_like(y, float("nan")), y)
    return torch.where(torch.isnan(x), x, y)


def bf16(x: torch.Tensor) -> torch.Tensor:
    """Round fp32 to bfloat16 (IEEE round-to-nearest-even)."""
    return x.to(torch.bfloat16)

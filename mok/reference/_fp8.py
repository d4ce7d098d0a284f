"""The FP8 recipe's quantiser (docs/numerics.md, "FP8 recipe"): e4m3 values with power-of-two block scales.

- Activations: 1x128 blocks along the last (reduction) dimension, one scale per row and block, so a
  row's values never depend on other rows (batch invariance).
- Weights: 128x128 blocks over the last two dimensions, so a weight's transpose reuses its scales.
- Blocks start at index 0 of each dimension; the last block of a dimension that is not a multiple of
  128 holds the remaining elements (a partial block; its amax is over those elements only).

Scale of a block: 2^n with n the smallest integer such that amax / 2^n <= 448 (e4m3's largest finite
value), computed from amax's bf16 bit pattern with integer arithmetic only, then n = max(n, -126) so the
scale and its reciprocal are normal fp32 numbers. amax is the largest |x| over the block's finite elements
(NaN and ±inf ignored); amax = 0 gives n = -126 like any amax below 2^-117. Inputs are bf16, so n <= 120.

Value: q = e4m3(x · 2^-n), round to nearest even (|x · 2^-n| <= 448, so nothing saturates); NaN and ±inf
elements give NaN (e4m3fn has no infinity). Dequantising, q · 2^n, is exact in bf16 for every q the
quantiser returns for a bf16 input (tests/reference/test_fp8.py checks it over the whole scale range),
except for elements of magnitude >= 248 · 2^120 (about 3.3e38, the top 3% of bf16's range): they round to
256 · 2^120 = 2^128, past bf16's largest value, and dequantise to ±inf.
"""

from __future__ import annotations

import torch

from ._exact import _pow2
from ._validate import _device

BLOCK = 128
E4M3_MAX = 448.0
MIN_SCALE_EXP = -126  # 2^-126 and its reciprocal 2^126 are normal fp32 numbers


def _check(name: str, t, dtype: torch.dtype, min_dim: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}, got {t.dtype}")
    if t.dim() < min_dim:
        raise ValueError(f"{name}: expected at least {min_dim} dimension{'s' * (min_dim > 1)}, got shape {tuple(t.shape)}")


def _blocks(n: int) -> int:
    return -(-n // BLOCK)


def _abs_bits(x: torch.Tensor) -> torch.Tensor:
    """|x|'s bf16 bit pattern as int32 (ordered like the values), 0 for NaN and ±inf."""
    bits = x.view(torch.int16).to(torch.int32) & 0x7FFF
    return torch.where(bits >= 0x7F80, torch.zeros_like(bits), bits)


def _scale_exponent(amax_bits: torch.Tensor) -> torch.Tensor:
    """n (int32) of each block's scale 2^n, from its amax's bf16 bits (amax = (1 + M/128) · 2^(E-127)).

    amax / 2^n <= 448 = 1.75 · 2^8 holds for n = E - 135 exactly when M <= 96 (1 + M/128 <= 1.75), else the
    smallest n is E - 134; subnormal amax (E = 0) and 0 fall below the floor."""
    e = amax_bits >> 7
    m = amax_bits & 0x7F
    return torch.clamp_min(e - 135 + (m > 96).to(torch.int32), MIN_SCALE_EXP)


def _spread_rows(s_Kb: torch.Tensor, K: int) -> torch.Tensor:
    """[..., Kb] per-block values -> [..., K] per-element (each block's value over its up to 128 elements)."""
    return s_Kb[..., None].expand(*s_Kb.shape, BLOCK).flatten(-2)[..., :K]


def _spread_blocks(s_NbKb: torch.Tensor, N: int, K: int) -> torch.Tensor:
    """[..., Nb, Kb] per-block values -> [..., N, K] per-element."""
    *lead, Nb, Kb = s_NbKb.shape
    t = s_NbKb[..., :, None, :, None].expand(*lead, Nb, BLOCK, Kb, BLOCK)
    return t.reshape(*lead, Nb * BLOCK, Kb * BLOCK)[..., :N, :K]


def _quantize(x: torch.Tensor, n_exp: torch.Tensor, spread) -> tuple[torch.Tensor, torch.Tensor]:
    inv = spread(_pow2(-n_exp))
    y = x.float() * inv  # exact: a power-of-two scaling of a bf16 value (or far below e4m3's half-ulp of 0)
    y = torch.where(torch.isfinite(x), y, torch.full_like(y, float("nan")))
    return y.to(torch.float8_e4m3fn), _pow2(n_exp)


def quantize_rows_1x128(x_MK: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise activations to e4m3 in 1x128 blocks along the last dimension.

    Args:
        x_MK: [..., K] bfloat16 (usually [M, K], K the reduction dimension of the GEMM it feeds).
    Returns:
        (q_MK [..., K] float8_e4m3fn, scale_MKb [..., ceil(K/128)] float32 powers of two); x ≈ q · scale.
    """
    _check("x_MK", x_MK, torch.bfloat16, 1)
    K = x_MK.shape[-1]
    Kb = _blocks(K)
    bits = torch.nn.functional.pad(_abs_bits(x_MK), (0, Kb * BLOCK - K))
    n_exp = _scale_exponent(bits.unflatten(-1, (Kb, BLOCK)).amax(-1))
    return _quantize(x_MK, n_exp, lambda s: _spread_rows(s, K))


def quantize_blocks_128x128(w_NK: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise weights to e4m3 in 128x128 blocks over the last two dimensions.

    Args:
        w_NK: [..., N, K] bfloat16 (e.g. one expert's [I, H], or [L, I, H] for L experts at once: each
            matrix has its own blocks).
    Returns:
        (q_NK [..., N, K] float8_e4m3fn, scale_NbKb [..., ceil(N/128), ceil(K/128)] float32 powers of two);
        w ≈ q · scale. Transposing q and the scale's last two dimensions gives the transpose's quantisation.
    """
    _check("w_NK", w_NK, torch.bfloat16, 2)
    N, K = w_NK.shape[-2:]
    Nb, Kb = _blocks(N), _blocks(K)
    bits = torch.nn.functional.pad(_abs_bits(w_NK), (0, Kb * BLOCK - K, 0, Nb * BLOCK - N))
    tiles = bits.unflatten(-1, (Kb, BLOCK)).unflatten(-3, (Nb, BLOCK)).transpose(-3, -2)  # [..., Nb, Kb, 128, 128]
    n_exp = _scale_exponent(tiles.flatten(-2).amax(-1))
    return _quantize(w_NK, n_exp, lambda s: _spread_blocks(s, N, K))


def _check_pair(q, scale, q_name: str, s_name: str, blocked: int) -> None:
    """q an e4m3 tensor, scale fp32 with ceil(n/128) blocks for each of q's last `blocked` dimensions."""
    _check(q_name, q, torch.float8_e4m3fn, blocked)
    _check(s_name, scale, torch.float32, blocked)
    lead = q.dim() - blocked
    want = (*q.shape[:lead], *(_blocks(n) for n in q.shape[lead:]))
    if tuple(scale.shape) != want:
        raise ValueError(f"{s_name}: expected shape {want} for {q_name} of shape {tuple(q.shape)}, "
                         f"got {tuple(scale.shape)}")
    _device(s_name, scale, q.device, q_name)


def dequantize_rows_1x128(q_MK: torch.Tensor, scale_MKb: torch.Tensor) -> torch.Tensor:
    """q · scale as bf16 (exact for `quantize_rows_1x128`'s outputs of a bf16 input).

    Args:
        q_MK: [..., K] float8_e4m3fn.
        scale_MKb: [..., ceil(K/128)] float32, on q's device.
    Returns:
        [..., K] bfloat16.
    """
    _check_pair(q_MK, scale_MKb, "q_MK", "scale_MKb", 1)
    K = q_MK.shape[-1]
    return (q_MK.float() * _spread_rows(scale_MKb, K)).to(torch.bfloat16)


def dequantize_blocks_128x128(q_NK: torch.Tensor, scale_NbKb: torch.Tensor) -> torch.Tensor:
    """q · scale as bf16 (exact for `quantize_blocks_128x128`'s outputs of a bf16 input).

    Args:
        q_NK: [..., N, K] float8_e4m3fn.
        scale_NbKb: [..., ceil(N/128), ceil(K/128)] float32, on q's device.
    Returns:
        [..., N, K] bfloat16.
    """
    _check_pair(q_NK, scale_NbKb, "q_NK", "scale_NbKb", 2)
    N, K = q_NK.shape[-2:]
    return (q_NK.float() * _spread_blocks(scale_NbKb, N, K)).to(torch.bfloat16)


def fp8_rows_1x128(x_MK: torch.Tensor) -> torch.Tensor:
    """The bf16 values the FP8 recipe computes with for activations x_MK ([..., K] bfloat16): quantised in
    1x128 blocks, dequantised exactly. Returns [..., K] bfloat16."""
    return dequantize_rows_1x128(*quantize_rows_1x128(x_MK))


def fp8_blocks_128x128(w_NK: torch.Tensor) -> torch.Tensor:
    """The bf16 values the FP8 recipe computes with for weights w_NK ([..., N, K] bfloat16): quantised in
    128x128 blocks, dequantised exactly. Returns [..., N, K] bfloat16."""
    return dequantize_blocks_128x128(*quantize_blocks_128x128(w_NK))

"""Bitwise comparison of tensors (NaN-aware) and error metrics used by tests and tools."""

from __future__ import annotations

from dataclasses import dataclass

import torch

_INT_VIEW = {torch.float8_e4m3fn: torch.uint8, torch.bfloat16: torch.int16, torch.float16: torch.int16,
             torch.float32: torch.int32, torch.float64: torch.int64}


def raw_bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's raw bits as an integer tensor (floats viewed, integers as they are)."""
    t = t.detach().contiguous()
    return t.view(_INT_VIEW[t.dtype]) if t.dtype in _INT_VIEW else t


def _same_mask(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    same = raw_bits(a) == raw_bits(b)
    if a.dtype.is_floating_point:
        same |= torch.isnan(a) & torch.isnan(b)  # any NaN matches any NaN (payloads may differ)
    return same


@dataclass
class BitDiff:
    """How two tensors differ: count of differing elements, max ULP distance, first mismatch."""

    n_diff: int
    max_ulp: int
    first_index: tuple | None
    first_values: tuple | None

    @property
    def equal(self) -> bool:
        return self.n_diff == 0


def _ordered(bits: torch.Tensor) -> torch.Tensor:
    """Map float bit patterns to integers whose order is the floats' order (ULP distance)."""
    b = bits.long()
    width = bits.element_size() * 8
    sign = 1 << (width - 1)
    b = b & ((1 << width) - 1) if width < 64 else b
    return torch.where(b >= sign, sign - b, b) if width < 64 else torch.where(b < 0, torch.iinfo(torch.int64).min - b, b)


def _isfinite(t: torch.Tensor) -> torch.Tensor:
    """torch.isfinite, also for float8 (widened exactly to float32 first: PyTorch has no isfinite for it)."""
    return torch.isfinite(t.float() if t.element_size() == 1 else t)


def bit_diff(actual: torch.Tensor, expected: torch.Tensor) -> BitDiff:
    """Compare raw bits; NaN equals NaN. Shapes and dtypes must match."""
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return BitDiff(-1, -1, None, (f"{actual.dtype}{tuple(actual.shape)}", f"{expected.dtype}{tuple(expected.shape)}"))
    a, e = actual.detach().cpu(), expected.detach().cpu()
    same = _same_mask(a, e)
    n_diff = int((~same).sum())
    if n_diff == 0:
        return BitDiff(0, 0, None, None)
    flat = int((~same).reshape(-1).nonzero()[0])
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), a.shape))
    max_ulp = -1
    if a.dtype in _INT_VIEW:
        ulp = (_ordered(raw_bits(a)) - _ordered(raw_bits(e))).abs()
        finite = _isfinite(a) & _isfinite(e)
        max_ulp = int(ulp[finite & ~same].max()) if bool((finite & ~same).any()) else -1
    return BitDiff(n_diff, max_ulp, index, (a.reshape(-1)[flat].item(), e.reshape(-1)[flat].item()))


def assert_bitwise_equal(actual: torch.Tensor, expected: torch.Tensor, name: str) -> None:
    """Raise AssertionError naming the first mismatch (index and both values) unless bit-identical."""
    d = bit_diff(actual, expected)
    if d.n_diff == -1:
        raise AssertionError(f"{name}: dtype/shape differ: {d.first_values[0]} vs {d.first_values[1]}")
    if not d.equal:
        raise AssertionError(
            f"{name}: {d.n_diff} of {actual.numel()} elements differ (max {d.max_ulp} ULP); "
            f"first at index {d.first_index}: {d.first_values[0]!r} vs {d.first_values[1]!r}"
        )


def assert_outputs_bitwise_equal(actual: dict, expected: dict, label: str) -> None:
    """assert_bitwise_equal for each output of `expected` ({name: tensor or None}, e.g. run_layer's) that is not
    None, named "label: name"; the first mismatching output raises."""
    for name, t in expected.items():
        if t is not None:
            assert_bitwise_equal(actual[name], t, f"{label}: {name}")


def rel_error(actual: torch.Tensor, reference: torch.Tensor) -> float:
    """‖actual − reference‖ / ‖reference‖ in float64 (inf if actual has NaN where reference has none)."""
    a, r = actual.detach().double().cpu(), reference.detach().double().cpu()
    if bool((torch.isnan(a) & ~torch.isnan(r)).any()):
        return float("inf")
    den = r.norm().item()
    return (a - r).norm().item() / den if den else (a - r).norm().item()

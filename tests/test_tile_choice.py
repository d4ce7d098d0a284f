"""The tile-variant choice (mok/fast/_tiles.py) on the CPU: the MOK_FAST_GEMM_VARIANT override is parsed
strictly, and the choice depends on the GEMM kind and the model constants only. That every variant gives
the same bits is checked on the GPU (tests/gpu/test_fast_tiles.py)."""
import inspect

import pytest

from mok.fast import _lib, _tiles

KINDS = sorted(_lib.GEMM_KINDS.values())


@pytest.mark.parametrize("text, want", [
    ("2", [2] * 7),                            # one variant for every kind
    ("3,2,1,0,3,2,1", [3, 2, 1, 0, 3, 2, 1]),  # one per kind, MokGemmKind order
    (" 1 ", [1] * 7),                          # surrounding blanks are fine
])
def test_override_gives_each_kind_its_variant(monkeypatch, text, want):
    monkeypatch.setenv(_tiles.ENV, text)
    assert [_tiles.variant(k, 2048, 768) for k in KINDS] == want


@pytest.mark.parametrize("text", [
    "4",            # out of range
    "-1",           # negative
    "1,2",          # neither one value nor one per kind
    "a",            # not an integer
    "1,2,3,0,1,2,x",  # one bad entry
    "1,2,3,0,1,2",  # one per kind of an older library (six kinds)
])
def test_bad_override_raises_naming_the_variable(monkeypatch, text):
    monkeypatch.setenv(_tiles.ENV, text)
    with pytest.raises(ValueError, match=_tiles.ENV):
        _tiles.variant(_lib.GEMM_TN_F32, 2048, 768)


def test_choice_takes_no_token_count_and_is_a_valid_variant(monkeypatch):
    monkeypatch.delenv(_tiles.ENV, raising=False)
    assert list(inspect.signature(_tiles.variant).parameters) == ["kind", "H", "I"]
    for kind in KINDS:
        for H, I in ((2048, 768), (4096, 1536), (7168, 2048), (4096, 14336), (6144, 16384), (8, 8)):
            assert 0 <= _tiles.variant(kind, H, I) < _lib.NUM_GEMM_VARIANTS


@pytest.mark.parametrize("variant", [-1, 4, 1.0, None])  # out of range, or not an int
def test_grouped_gemm_rejects_a_bad_variant_before_any_launch(variant):
    import torch

    with pytest.raises(ValueError, match="variant"):
        _lib.grouped_gemm(_lib.GEMM_TN_F32, [object()], torch.device("cpu"), variant)


def _segment(aux: bool):
    import torch

    t = torch.zeros(8, 16)
    op = _lib.Operand(t, 0, 16, 16)
    return _lib.Segment.all_rows(8, 8, 16, op, op, op, aux=op if aux else None)


@pytest.mark.parametrize("kind, aux", [
    (_lib.GEMM_NN_SWIGLU_BWD, False),  # the fused SwiGLU backward needs its [g | u] input
    (_lib.GEMM_NN_F32, True),          # a plain GEMM reads no aux operand: refusing it beats ignoring it
])
def test_grouped_gemm_checks_the_aux_operand_before_any_launch(kind, aux):
    import torch

    with pytest.raises(ValueError, match="operand aux"):
        _lib.grouped_gemm(kind, [_segment(aux)], torch.device("cpu"), 0)


@pytest.mark.parametrize("text, want", [
    (None, False),  # unset: the unfused pair (the faster one)
    ("0", False),
    ("1", True),
    (" 1 ", True),  # surrounding blanks are fine
])
def test_fuse_switch(monkeypatch, text, want):
    if text is None:
        monkeypatch.delenv(_tiles.FUSE_ENV, raising=False)
    else:
        monkeypatch.setenv(_tiles.FUSE_ENV, text)
    assert _tiles.fuse_swiglu_bwd() is want


@pytest.mark.parametrize("text", ["2", "yes", "true"])  # anything but 0 or 1 is refused, never read as a wish
def test_bad_fuse_switch_raises_naming_the_variable(monkeypatch, text):
    monkeypatch.setenv(_tiles.FUSE_ENV, text)
    with pytest.raises(ValueError, match=_tiles.FUSE_ENV):
        _tiles.fuse_swiglu_bwd()

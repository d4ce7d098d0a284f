"""The tile-variant choice (mok/fast/_tiles.py) on the CPU: the MOK_FAST_GEMM_VARIANT override is parsed
strictly, and the choice depends on the GEMM kind and the model constants only. That every variant gives
the same bits is checked on the GPU (tests/gpu/test_fast_tiles.py)."""
import inspect

import pytest

from mok.fast import _lib, _tiles

KINDS = sorted(_lib.GEMM_KINDS.values())


@pytest.mark.parametrize("text, want", [
    ("2", [2] * 6),                          # one variant for every kind
    ("3,2,1,0,3,2", [3, 2, 1, 0, 3, 2]),     # one per kind, MokGemmKind order
    (" 1 ", [1] * 6),                        # surrounding blanks are fine
])
def test_override_gives_each_kind_its_variant(monkeypatch, text, want):
    monkeypatch.setenv(_tiles.ENV, text)
    assert [_tiles.variant(k, 2048, 768) for k in KINDS] == want


@pytest.mark.parametrize("text", [
    "4",            # out of range
    "-1",           # negative
    "1,2",          # neither one value nor one per kind
    "a",            # not an integer
    "1,2,3,0,1,x",  # one bad entry
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

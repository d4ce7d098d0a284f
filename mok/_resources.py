"""Where the package's data lives: the CUDA sources (`csrc/`) and the golden files (`golden/`).

A wheel ships both inside the package (`mok/_csrc`, `mok/_golden`, placed there by the build backend); a source
checkout or an editable install reads them from the repository's top level.
"""
from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def _data_dir(name: str) -> Path:
    """The directory `name` ("csrc" or "golden"): the wheel's copy if installed, else the repository's."""
    packaged = Path(str(files("mok"))) / f"_{name}"
    if packaged.is_dir():
        return packaged
    repo = Path(__file__).resolve().parents[1] / name
    return repo if repo.is_dir() else packaged  # neither: the caller reports an incomplete install


def csrc_dir() -> Path:
    """The fast path's CUDA sources and headers."""
    return _data_dir("csrc")


def golden_dir() -> Path:
    """The reference's golden files and their manifest."""
    return _data_dir("golden")

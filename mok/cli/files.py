"""Writing files so that a crash never leaves a partial one, with stable bytes (docs/reliability.md)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from safetensors.torch import save as save_bytes


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that a reader (or a crash) sees the old file or the new one, never a part:
    a temporary file `.<name>.<random>.tmp` in the same directory, flushed to disk, then os.replace."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)  # the rename itself
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def remove_temp_files(directory: Path, names: list[str]) -> list[str]:
    """Delete the temporary files of `write_atomic` for any of `names` that a killed process left in
    `directory`; returns their names."""
    gone = []
    for p in Path(directory).glob(".*.tmp"):
        if any(p.name.startswith(f".{n}.") for n in names):
            p.unlink(missing_ok=True)
            gone.append(p.name)
    return gone


def safetensors_bytes(tensors: dict, metadata: dict) -> bytes:
    """safetensors file bytes with the metadata keys sorted (safetensors itself writes them in a
    random order per process), so equal tensors and metadata always give equal bytes."""
    data = save_bytes(tensors, metadata=metadata)
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    meta = header.pop("__metadata__", None)
    canon = ({"__metadata__": dict(sorted(meta.items()))} if meta else {}) | header
    text = json.dumps(canon, separators=(",", ":")).encode()
    if len(text) > n:  # cannot happen: same content, other order
        raise AssertionError(f"header: expected at most {n} bytes after sorting, got {len(text)}")
    return data[:8] + text.ljust(n, b" ") + data[8 + n :]

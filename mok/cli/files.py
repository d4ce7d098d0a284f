"""The golden directory's files (docs/reliability.md): written so that a crash never leaves a partial one, with
stable bytes and the umask's permissions; read only if regular and within a size bound; one regen at a time."""

from __future__ import annotations

import fcntl
import json
import os
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path

from safetensors.torch import save as save_bytes


class FileProblem(ValueError):
    """A file that cannot be read as asked: not a regular file, or larger than its bound. The message names it;
    `size` is the file's size in bytes when it was too large (else None)."""

    def __init__(self, message: str, size: int | None = None):
        super().__init__(message)
        self.size = size


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symlink")):
        if test(mode):
            return name
    return "not a regular file"


def read_bounded(path: Path, limit: int) -> bytes:
    """The bytes of the regular file `path` (symlinks followed), at most `limit` of them.

    Raises FileProblem naming the file when it is not a regular file (a FIFO, a device such as /dev/zero, a
    directory: opened without blocking and refused before any read) or is larger than `limit` bytes (refused
    before reading; a file that grows while read is cut off at limit + 1 bytes and refused); FileNotFoundError when
    it does not exist; OSError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileProblem(f"{path}: expected a regular file, got {_kind(st.st_mode)}")
        if st.st_size > limit:
            raise FileProblem(f"{path}: expected at most {limit} bytes, got {st.st_size}", st.st_size)
        os.set_blocking(fd, True)
        chunks, n = [], 0
        while n <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - n))
            if not chunk:
                break
            chunks.append(chunk)
            n += len(chunk)
        if n > limit:
            raise FileProblem(f"{path}: expected at most {limit} bytes, got more (it grew while read)", n)
        return b"".join(chunks)
    finally:
        os.close(fd)


def regular_or_absent(path: Path) -> str | None:
    """None if `path` is a regular file (symlinks followed) or does not exist, else what it is ("a FIFO", ...)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    return None if stat.S_ISREG(mode) else _kind(mode)


def _umask() -> int:
    """This process's umask (/proc/self/status on Linux; else set and restored at once)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` so that a reader (or a crash) sees the old file or the new one, never a part:
    a temporary file `.<name>.<random>.tmp` in the same directory, flushed to disk, then os.replace. The file gets
    the permissions `open(path, "w")` would give a new file (0666 less the umask), not mkstemp's private 0600."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~_umask())
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


def remove_temp_files(directory: Path, names: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    """Delete the temporary files of `write_atomic` for any of `names` that a killed process left in
    `directory`. Returns (the names deleted, [(name, what it is)] of the entries with such a name that are not
    regular files, left in place: write_atomic never makes those)."""
    gone, kept = [], []
    for p in sorted(Path(directory).glob(".*.tmp")):
        if not any(p.name.startswith(f".{n}.") for n in names):
            continue
        try:
            mode = os.lstat(p).st_mode
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(mode):
            kept.append((p.name, _kind(mode)))
            continue
        p.unlink(missing_ok=True)
        gone.append(p.name)
    return gone, kept


@contextmanager
def directory_lock(directory: Path, exclusive: bool, on_wait=None):
    """Hold a lock on `directory` (flock on the directory itself: no lock file is left): exclusive for a writer
    (`golden regen`), shared for readers (`golden check`), so a check never sees a regen half done and two regens
    of one directory run one after the other. If another process holds it, `on_wait()` is called once, then this
    waits (Ctrl-C still interrupts). Where the file system cannot lock, nothing is locked."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        op = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        try:
            fcntl.flock(fd, op | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(fd, op)
        except OSError:  # e.g. ENOLCK: a file system without locks
            pass
        yield
    finally:
        os.close(fd)  # releases the lock


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

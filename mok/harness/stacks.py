"""Where a stalled worker is: each worker registers `faulthandler` on SIGUSR1 (`stacks_on_request`), and after
a collective timed out the launcher asks the ranks still running for their Python stacks (`ask_stacks`) and
names where each one's main thread was (`where_text`), inside torch.distributed or not (docs/reliability.md)."""

from __future__ import annotations

import faulthandler
import os
import signal
import time

_STACK_SIGNAL = signal.SIGUSR1  # asks a worker to write its Python threads' stacks (faulthandler)
_STACK_WAIT_S = 1.0  # how long the launcher waits for a stalled worker's stacks
_STACK_FILE = None  # kept open for faulthandler, which writes to its file descriptor from a signal handler


def stacks_on_request(rank: int, tmp: str) -> None:
    """On _STACK_SIGNAL, write every Python thread's stack to `stack<rank>.txt` (faulthandler: works while the
    main thread is blocked in C, e.g. inside a collective). The launcher asks stalled ranks for it."""
    global _STACK_FILE
    _STACK_FILE = open(os.path.join(tmp, f"stack{rank}.txt"), "w")  # noqa: SIM115 - lives as long as the worker
    faulthandler.register(_STACK_SIGNAL, file=_STACK_FILE, all_threads=True, chain=False)


def ask_stacks(procs: list, ranks: list[int], tmp: str) -> dict[int, str]:
    """Ask each of `ranks` (running) for its Python stacks and wait up to _STACK_WAIT_S for the answers."""
    asked = []
    for r in ranks:
        try:
            os.kill(procs[r].pid, _STACK_SIGNAL)
            asked.append(r)
        except (OSError, TypeError):  # gone meanwhile
            pass
    paths = {r: os.path.join(tmp, f"stack{r}.txt") for r in asked}
    deadline = time.monotonic() + _STACK_WAIT_S
    sizes: dict[int, int] = {}
    while time.monotonic() < deadline:
        now = {r: os.path.getsize(p) if os.path.exists(p) else 0 for r, p in paths.items()}
        if all(now.values()) and now == sizes:  # every rank wrote, and nothing grew in the last 50 ms
            break
        sizes = now
        time.sleep(0.05)
    out = {}
    for r, p in paths.items():
        try:
            with open(p, encoding="utf-8", errors="replace") as f:
                out[r] = f.read()
        except OSError:
            out[r] = ""
    return out


def main_thread_frames(stacks: str) -> list[tuple[str, int, str]]:
    """(file, line, function) of the worker's main thread in faulthandler's dump `stacks`, innermost first
    (the thread whose outer frames include `_worker` of mok/harness/dist.py); [] if none is found."""
    thread: list[tuple[str, int, str]] = []
    for line in stacks.splitlines() + [""]:
        line = line.strip()
        if line.startswith("File "):
            path, _, rest = line[5:].partition(", line ")
            num, _, func = rest.partition(" in ")
            thread.append((path.strip('"'), int(num) if num.isdigit() else 0, func))
        elif thread and (not line or "thread 0x" in line.lower()):
            if any(func == "_worker" and path.endswith(os.path.join("harness", "dist.py")) for path, _, func in thread):
                return thread
            thread = []
    return []


def where_text(stacks: str) -> str:
    """' (at file:line in f, inside torch.distributed)' for the main thread of a faulthandler dump."""
    frames = main_thread_frames(stacks)
    if not frames:
        return " (no Python stack written)"
    path, line, func = frames[0]
    in_dist = any(f"torch{os.sep}distributed{os.sep}" in p for p, _, _ in frames)
    return (f" (at {os.path.basename(path)}:{line} in {func}, "
            f"{'inside torch.distributed' if in_dist else 'not in a torch.distributed call'})")

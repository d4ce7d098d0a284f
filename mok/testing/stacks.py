"""Where a stalled worker is: each worker registers `faulthandler` on SIGUSR1 (`stacks_on_request`), and after
a collective timed out the launcher asks the ranks still running for their Python stacks (`ask_stacks`) and
names where each one was (`where_text`): its thread inside torch.distributed if any, else its main thread
(docs/reliability.md)."""

from __future__ import annotations

import faulthandler
import os
import signal
import threading
import time

_STACK_SIGNAL = signal.SIGUSR1  # asks a worker to write its Python threads' stacks (faulthandler)
_STACK_WAIT_S = 1.0  # how long the launcher waits for a stalled worker's stacks
_MAIN_MARK = "mok main thread "  # first line of a stack file: the worker's main thread id, as faulthandler prints it
_STACK_FILE = None  # kept open for faulthandler, which writes to its file descriptor from a signal handler


def stacks_on_request(rank: int, tmp: str) -> None:
    """On _STACK_SIGNAL, write every Python thread's stack to `stack<rank>.txt` (faulthandler: works while the
    main thread is blocked in C, e.g. inside a collective). The launcher asks stalled ranks for it."""
    global _STACK_FILE
    path = os.path.join(tmp, f"stack{rank}.txt")
    try:
        _STACK_FILE = open(path + ".new", "w")  # noqa: SIM115 - lives as long as the worker
    except OSError:  # the run's directory is gone: the launcher is stopping the run (a signal) and kills this worker
        return
    _STACK_FILE.write(f"{_MAIN_MARK}0x{threading.main_thread().ident:016x}\n")  # the thread header to look for
    _STACK_FILE.flush()  # faulthandler writes to the descriptor, after this line
    faulthandler.register(_STACK_SIGNAL, file=_STACK_FILE, all_threads=True, chain=False)
    try:
        os.replace(path + ".new", path)  # the file appears with its header, once the handler is in place
    except OSError:
        pass  # as above: nobody will ask


def ask_stacks(procs: list, ranks: list[int], tmp: str) -> dict[int, str]:
    """Ask each of `ranks` (running) for its Python stacks and wait up to _STACK_WAIT_S for the answers: {rank: the
    stack file's text}, or None for a rank that has not registered yet (still loading its function and arguments:
    the signal's default action would kill it, so it is not sent)."""
    paths = {r: os.path.join(tmp, f"stack{r}.txt") for r in ranks}
    out: dict[int, str | None] = {r: None for r in ranks}
    base: dict[int, int] = {}
    for r in ranks:
        try:
            base[r] = os.path.getsize(paths[r])  # the header line only, until faulthandler writes
            os.kill(procs[r].pid, _STACK_SIGNAL)
        except (OSError, TypeError):  # not registered yet (no file), or gone meanwhile
            base.pop(r, None)
    deadline = time.monotonic() + _STACK_WAIT_S
    sizes: dict[int, int] = {}
    while base and time.monotonic() < deadline:
        now = {r: os.path.getsize(paths[r]) for r in base}
        if all(now[r] > base[r] for r in base) and now == sizes:  # every rank wrote; nothing grew in 50 ms
            break
        sizes = now
        time.sleep(0.05)
    for r in base:
        try:
            with open(paths[r], encoding="utf-8", errors="replace") as f:
                out[r] = f.read()
        except OSError:
            out[r] = ""
    return out


def _threads(stacks: str) -> list[tuple[bool, list[tuple[str, int, str]]]]:
    """[(whether it is the worker's main thread, its frames (file, line, function) innermost first)] of a stack
    file: its header line names the main thread's id, as faulthandler's thread headers print it."""
    main, threads = None, []
    for line in stacks.splitlines():
        line = line.strip()
        if line.startswith(_MAIN_MARK):
            main = line[len(_MAIN_MARK):]
        elif "thread 0x" in line.lower():
            threads.append((main is not None and main in line, []))
        elif line.startswith("File ") and threads:
            path, _, rest = line[5:].partition(", line ")
            num, _, func = rest.partition(" in ")
            threads[-1][1].append((path.strip('"'), int(num) if num.isdigit() else 0, func))
    return threads


def main_thread_frames(stacks: str) -> list[tuple[str, int, str]]:
    """(file, line, function) of the worker's main thread in its stack file `stacks`, innermost first (the
    thread the header line names; faulthandler prints at most 100 frames a thread); [] if it is not there."""
    return next((frames for is_main, frames in _threads(stacks) if is_main), [])


def _in_dist(frames) -> bool:
    return any(f"torch{os.sep}distributed{os.sep}" in p for p, _, _ in frames)


def where_text(stacks: str | None) -> str:
    """' (at file:line in f, inside torch.distributed)': where the worker of a stack file was. The thread inside
    torch.distributed if any (autograd runs a backward's collectives on its own thread on a GPU), else the main
    thread."""
    if stacks is None:
        return " (not started: still loading its function and arguments)"
    threads = _threads(stacks)
    if not threads:
        return " (no stack written)"
    in_dist = [(m, f) for m, f in threads if _in_dist(f)]
    is_main, frames = in_dist[0] if in_dist else next(((m, f) for m, f in threads if m), (True, []))
    if not frames:
        return " (stacks written, its main thread not among them)"
    path, line, func = frames[0]
    return (f" (at {os.path.basename(path)}:{line} in {func}{'' if is_main else ', another thread'}, "
            f"{'inside torch.distributed' if in_dist else 'not in a torch.distributed call'})")

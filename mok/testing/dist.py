"""Run a function in W worker processes joined by a torch.distributed group, and stop them all on any
failure or signal (docs/reliability.md).

Processes start from a fork server that has imported torch and mok but run nothing (no thread pool,
no CUDA context), so each launch is a fresh process that costs well under a second.

- Every worker runs `fn(rank, world_size, group, *args)` (group None for W = 1); the return values
  come back in rank order.
- A worker that raises or dies makes `launch` kill the other workers at once and raise `WorkerError`
  with the cause's rank and message (not the lost connections it causes elsewhere, see `_cause`).
  Collectives also time out on their own after `timeout_s`.
- Ctrl-C (SIGINT) or SIGTERM to the launching process: the workers are killed, the run's temporary
  directory removed, and the signal's exception (KeyboardInterrupt, or SystemExit(143) for SIGTERM)
  propagates. Workers ignore SIGINT (the launcher stops them) and die with their parent, the fork
  server, which exits when the launching process exits, however it exits.
- Device index of rank r on a GPU: r % device_count (several ranks may share one GPU: gloo then).
- Workers run with the launcher's environment as it is at the call (the fork server's dates from its
  start), as with a plain spawn.
"""

from __future__ import annotations

import ctypes
import datetime
import os
import shutil
import signal
import tempfile
import threading
import time
import traceback
from contextlib import contextmanager
from multiprocessing import connection

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .stacks import ask_stacks, stacks_on_request, where_text

# mok.testing._fork_server first: the fork server ignores Ctrl-C from then on, and removes its socket's directory when
# it exits. torch.distributed.nn.functional before mok: imported before any process group exists it binds none (see
# mok/reference/_comm.py), so destroy_process_group really stops a worker's gloo threads
_PRELOAD = ["mok.testing._fork_server", "torch", "torch.distributed", "torch.distributed.nn.functional",
            "mok.testing.runner", "mok.reference"]
TIMEOUT_ENV = "MOK_DIST_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 120.0  # collective (and rendezvous) timeout of the workers' process group
# its bounds: gloo counts whole milliseconds (1e-9 s would be a 0 ms timeout), and much above a week gets
# nowhere useful before gloo's deadline arithmetic breaks (9e9 s hung a collective; timedelta overflows at 8.6e13 s)
MIN_TIMEOUT_S, MAX_TIMEOUT_S = 0.001, 7 * 24 * 3600.0
_TIMEOUT_RANGE = f"in [{MIN_TIMEOUT_S:g}, {MAX_TIMEOUT_S:g}] (1 ms to 7 days)"
_STALL_GRACE_S = 1.0  # after a rank's collective timed out, how long the others get to report before naming stragglers
_KILL_WAIT_S = 10.0  # how long `launch` waits for killed workers to be reaped


class WorkerError(RuntimeError):
    """A worker process failed: `rank` and its message (exception type and text, or how it died).

    After a collective timed out, `stalled` lists the ranks still running without an error and `stacks` maps
    each to the Python stacks of its threads at that moment (its stack file: a header line, then faulthandler's
    text; None if it had not started `fn`): the message names where each one was, and whether inside
    torch.distributed (mok/testing/stacks.py)."""

    def __init__(self, rank: int, message: str, failed: list[int], details: str = "", stalled: list[int] = (),
                 stacks: dict | None = None):
        others = f" (ranks {failed} failed)" if len(failed) > 1 else ""
        stacks = dict(stacks or {})
        straggle = ""
        if stalled:
            where = ", ".join(f"{r}{where_text(stacks[r]) if r in stacks else ''}" for r in stalled)
            straggle = (f" [still running without an error {_STALL_GRACE_S:g} s after the timeout: "
                        f"{'rank' if len(stalled) == 1 else 'ranks'} {where}; "
                        f"a rank that never joined the collective is among them]")
        super().__init__(f"rank {rank}{others}: {message}{straggle}")
        self.rank, self.message, self.failed, self.details = rank, message, failed, details
        self.stalled, self.stacks = list(stalled), stacks


def timeout_from_env(default: float = DEFAULT_TIMEOUT_S) -> float:
    """The collective timeout in seconds: $MOK_DIST_TIMEOUT_S if set (a number of seconds in
    [MIN_TIMEOUT_S, MAX_TIMEOUT_S], 1 ms to 7 days), else `default`. ValueError naming the variable otherwise."""
    text = os.environ.get(TIMEOUT_ENV)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not MIN_TIMEOUT_S <= value <= MAX_TIMEOUT_S:  # NaN fails too
        raise ValueError(f"{TIMEOUT_ENV}: expected a number of seconds {_TIMEOUT_RANGE}, got {text!r}")
    return value


def check_timeout(timeout_s, name: str = "timeout_s") -> float:
    """`timeout_s` as a float, if a number of seconds in [MIN_TIMEOUT_S, MAX_TIMEOUT_S]; TypeError / ValueError
    starting with `name` otherwise."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
        raise TypeError(f"{name}: expected a number of seconds, got {type(timeout_s).__name__} {timeout_s!r}")
    if not MIN_TIMEOUT_S <= timeout_s <= MAX_TIMEOUT_S:
        raise ValueError(f"{name}: expected a number of seconds {_TIMEOUT_RANGE}, got {timeout_s!r}")
    return float(timeout_s)


# ---------------------------------------------------------------- inside a worker


def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent (the fork server) exits."""
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the launcher still kills workers itself
        return
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)


def _detach_from_fork_server() -> None:
    """Close this worker's copy of the launching process's end of the fork server's "alive" pipe, which
    multiprocessing hands every process the fork server starts. While any worker held it, the fork
    server would not notice the launching process's death, and so neither exit nor (through the
    death signal) take the workers with it."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass
        server._forkserver_alive_fd = None


def _setup_device(rank: int, world_size: int, device: str) -> str:
    """Select this rank's device (cuda: GPU rank % device_count) and return the process-group backend:
    nccl when every rank has its own GPU, gloo when ranks share GPUs or on the CPU."""
    if device != "cuda":
        return "gloo"
    n = torch.cuda.device_count()
    torch.cuda.set_device(rank % n)
    return "nccl" if n >= world_size else "gloo"


def _write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _report_error(rank: int, tmp: str, e: BaseException) -> None:
    """Write this rank's error with the time it was raised (CLOCK_MONOTONIC: one clock for the machine),
    before anything else happens, so the launcher reports the first error, the cause, rather than the
    "connection closed" errors it then causes on the other ranks."""
    text = f"{time.monotonic_ns()}\n{type(e).__name__}: {e}\n\n{traceback.format_exc()}"
    _write_atomic(os.path.join(tmp, f"rank{rank}.err"), text.encode(errors="replace"))


def _use_environment(env: dict) -> None:
    """This process's environment becomes `env` (the launcher's at launch time, not the fork server's from
    when it started: e.g. MOK_EP_TIMEOUT_S set by the caller in between)."""
    for k in [k for k in os.environ if k not in env]:
        del os.environ[k]
    os.environ.update(env)


def _worker(rank: int, world_size: int, tmp: str, fn, args: tuple, device: str, threads: int,
            timeout_s: float, env: dict) -> None:
    """One rank: join the group, run the function, write its result (or its error) to `tmp`.
    On an error the group is not destroyed: the process just ends (the launcher stops the others)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the launcher acts
    _die_with_parent()
    _detach_from_fork_server()
    _use_environment(env)
    stacks_on_request(rank, tmp)
    try:
        torch.set_num_threads(threads)
        backend = _setup_device(rank, world_size, device)
        group = None
        if world_size > 1:
            dist.init_process_group(backend, init_method=f"file://{os.path.join(tmp, 'init')}", rank=rank,
                                    world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))
            if backend == "gloo":
                # gloo's init returns on a rank once its own side of every pair is connected; a rank that then ran
                # a quick fn and closed its sockets made a peer still finishing the handshake fail with "Gloo
                # connectFullMesh failed ... Connection closed by peer" (about 1 launch in 200 of two ranks). So no
                # rank leaves before every rank has joined.
                dist.barrier()
            group = dist.group.WORLD
        # the result checked before the group goes: a bad one is reported before the peers see this rank leave
        data = _result_bytes(fn(rank, world_size, group, *args))
        group = None  # the last reference: destroying the group then stops its threads
        if dist.is_initialized():
            dist.destroy_process_group()
        _write_atomic(os.path.join(tmp, f"rank{rank}.pt"), data)
    except BaseException as e:  # noqa: BLE001 - reported to the launcher, which reports it to the user
        _report_error(rank, tmp, e)
        raise SystemExit(1) from None


def _to_bytes(obj) -> bytes:
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


RESULT_TYPES = "tensors, numbers, strings, bytes, None, torch dtypes/devices/sizes, and lists, tuples and dicts of them"


def _result_bytes(obj) -> bytes:
    """`obj` saved, once the worker has checked that the launcher can load it back (`torch.load(weights_only=True)`,
    which refuses arbitrary classes): otherwise TypeError naming the result's type, raised in the worker, so the
    launcher reports it with the rank."""
    import io

    try:
        data = _to_bytes(obj)
        torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as e:  # noqa: BLE001 - pickling or weights_only loading: named below
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()] or [""]
        why = next((ln.split("WeightsUnpickler error: ")[-1].split(". Please use")[0] for ln in lines
                    if "Unsupported global" in ln), lines[0])  # e.g. "Unsupported global: GLOBAL mod.Cls was not ..."
        raise TypeError(f"result: fn returned {type(obj).__module__}.{type(obj).__qualname__}, which the launcher "
                        f"cannot load back ({type(e).__name__}: {why}); return {RESULT_TYPES}") from None
    return data


# ---------------------------------------------------------------- in the launching process


def _error_report(rank: int, tmp: str) -> tuple[int, str] | None:
    """(when, text) of the error a worker reported, or None."""
    try:
        with open(os.path.join(tmp, f"rank{rank}.err"), encoding="utf-8", errors="replace") as f:
            when, _, text = f.read().partition("\n")
    except FileNotFoundError:
        return None
    return int(when), text


def _failure(rank: int, exitcode: int, tmp: str) -> tuple[str, str]:
    """(one-line message, full report with traceback) of a failed worker."""
    report = _error_report(rank, tmp)
    if report is not None:
        return report[1].split("\n\n", 1)[0], report[1]
    if exitcode < 0:
        try:
            msg = f"died from signal {signal.Signals(-exitcode).name}"
        except ValueError:
            msg = f"died from signal {-exitcode}"
    elif exitcode == 0:
        msg = "exited with status 0 without a result (fn's process ended early, e.g. os._exit(0))"
    else:
        msg = f"exited with status {exitcode} without reporting an error"
    return msg, msg


def _kill_all(procs: list) -> None:
    """SIGKILL every worker still running and reap it (bounded)."""
    for p in procs:
        if p.exitcode is None:
            try:
                p.kill()
            except (OSError, ValueError):
                pass
    for p in procs:
        try:
            p.join(_KILL_WAIT_S)
        except (OSError, ValueError, AssertionError):
            pass


@contextmanager
def sigterm_exits():
    """While active (main thread only), SIGTERM raises SystemExit(143) so `finally` blocks run."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextmanager
def _signals_deferred():
    """Hold SIGINT/SIGTERM for the block: one that arrives meanwhile is raised again when the block ends, so a Ctrl-C
    cannot cut the cleanup short, nor land between mkdtemp making the directory and the launcher holding its name.
    The Python handlers are swapped for one that notes the signal: masking the signal in the main thread is not
    enough, since the kernel hands a process-directed signal to any thread that does not block it and Python then
    runs the handler in the main thread anyway. Main thread only (signal.signal's rule); a handler installed outside
    Python (getsignal gives None) is left as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    swapped = {}
    for s in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(s) is not None:
            swapped[s] = signal.signal(s, lambda signum, frame: arrived.append(signum))
    try:
        yield
    finally:
        for s, handler in swapped.items():
            signal.signal(s, handler)
        for s in dict.fromkeys(arrived):  # each signal once, in the order they came
            signal.raise_signal(s)


def _start_fork_server() -> None:
    """Start this process's fork server, if not running, with SIGINT blocked: it unblocks SIGINT once it ignores it
    (mok.testing._fork_server), so a Ctrl-C while it starts and imports torch prints no traceback from it. The
    resource tracker is started first: starting it unblocks SIGINT in the calling thread (multiprocessing's own
    masking around its start)."""
    from multiprocessing import forkserver, resource_tracker

    mp.set_forkserver_preload(_PRELOAD)  # effective when this process first starts its fork server
    resource_tracker.ensure_running()
    with _signals_deferred():
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            forkserver.ensure_running()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


def check_world_size(world_size, device: str = "cpu") -> int:
    """W: an int >= 1 (on cuda, ranks beyond the GPU count share GPUs)."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size: expected an int >= 1, got {world_size!r}")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device: expected 'cpu' or 'cuda', got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: expected a CUDA GPU for device 'cuda', found none")
    return world_size


def launch(fn, args: tuple = (), world_size: int = 1, *, device: str = "cpu", threads: int = 1,
           timeout_s: float | None = None) -> list:
    """Run `fn(rank, world_size, group, *args)` in `world_size` fresh processes; return their results.

    Args:
        fn: a picklable function (module level); args: picklable arguments.
        world_size: W >= 1. W > 1 joins the processes in a process group (gloo on the CPU).
        device: "cpu" or "cuda" (rank r uses GPU r % device_count).
        threads: torch threads per process.
        timeout_s: collective and rendezvous timeout in seconds, 0.001 to 604800 (7 days); default
            `timeout_from_env()` (120 s).
    Returns:
        the W return values, rank order: each must be something `torch.load(weights_only=True)` reads back
        (RESULT_TYPES), else the worker fails with a TypeError naming the type.
    Raises:
        WorkerError when a worker raises, dies, exits without a result or returns what cannot be loaded
        (the others are killed at once). ValueError / TypeError for bad arguments, before any process starts.
    """
    check_world_size(world_size, device)
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads: expected an int >= 1, got {threads!r}")
    timeout_s = timeout_from_env() if timeout_s is None else check_timeout(timeout_s)
    ctx = mp.get_context("forkserver")
    _start_fork_server()
    procs: list = []
    tmp = None
    with sigterm_exits():
        try:
            with _signals_deferred():  # a Ctrl-C inside mkdtemp would leave the directory made but unnamed here
                tmp = tempfile.mkdtemp(prefix="mok-dist-")
            for rank in range(world_size):
                p = ctx.Process(target=_worker, args=(rank, world_size, tmp, fn, tuple(args), device, threads,
                                                      timeout_s, dict(os.environ)), daemon=False)
                p.start()
                procs.append(p)
            _wait(procs, tmp)
            return [_load_result(rank, tmp) for rank in range(world_size)]
        finally:
            with _signals_deferred():
                _kill_all(procs)
                if tmp is not None:
                    shutil.rmtree(tmp, ignore_errors=True)


def _load_result(rank: int, tmp: str):
    """Rank `rank`'s return value; WorkerError naming the rank if it cannot be read back."""
    try:
        with open(os.path.join(tmp, f"rank{rank}.pt"), "rb") as f:
            return torch.load(f, weights_only=True)
    except Exception as e:  # noqa: BLE001 - the worker checked it loads (_result_bytes): a damaged or missing file
        msg = f"its result could not be loaded ({type(e).__name__}: {str(e).strip().splitlines()[0] if str(e) else ''})"
        raise WorkerError(rank, msg, [rank], msg) from None


def _has_result(rank: int, tmp: str) -> bool:
    return os.path.exists(os.path.join(tmp, f"rank{rank}.pt"))


_TIMED_OUT = ("Timed out", "collective operation timeout")  # gloo's (and the store's), nccl's watchdog's words


def _stalled(procs: list, tmp: str) -> list[int]:
    """After a collective timed out: the ranks still running without an error once the others have had
    _STALL_GRACE_S to fail too (those waiting in the same collective time out or lose their peer meanwhile)."""
    deadline = time.monotonic() + _STALL_GRACE_S
    while True:
        alive = [r for r, p in enumerate(procs) if p.exitcode is None and _error_report(r, tmp) is None]
        if not alive or time.monotonic() >= deadline:
            return alive
        connection.wait([procs[r].sentinel for r in alive], timeout=max(0.0, deadline - time.monotonic()))


def _wait(procs: list, tmp: str) -> None:
    """Until every worker has exited 0 with a result; on the first failure, raise WorkerError (the caller kills
    the rest)."""
    pending = {p.sentinel: r for r, p in enumerate(procs)}
    while pending:
        ready = connection.wait(list(pending), timeout=1.0)
        failed = []
        for s in ready:
            r = pending.pop(s)
            procs[r].join()
            if procs[r].exitcode != 0 or not _has_result(r, tmp):  # exit 0 without a result: os._exit(0) in fn
                failed.append(r)
        if failed:
            # every rank that has failed or reported an error by now (a report is written before its
            # process exits, so the cause's report is there even if its exit is not seen yet)
            reports = {r: rep for r in range(len(procs)) if (rep := _error_report(r, tmp)) is not None}
            failed = sorted(set(failed) | set(reports)
                            | {r for r, p in enumerate(procs) if p.exitcode not in (None, 0)})
            first = _cause(failed, reports)
            msg, details = _failure(first, procs[first].exitcode, tmp)
            stalled = _stalled(procs, tmp) if any(w in msg for w in _TIMED_OUT) else []
            stacks = ask_stacks(procs, stalled, tmp)
            if stacks:
                details += "".join(f"\n\nrank {r}, still running: Python stacks\n{t}" for r, t in stacks.items()
                                   if t is not None)
            raise WorkerError(first, msg, failed, details, stalled, stacks)


_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "remote worker")  # gloo's words


def _cause(failed: list[int], reports: dict) -> int:
    """The rank to blame among `failed`: the earliest error raised that is not a lost connection to a
    peer; else a rank that died without reporting (a signal, os._exit), which the others' lost
    connections follow; else the earliest error."""
    own = {r: when for r, (when, text) in reports.items() if not any(w in text.split("\n\n")[0] for w in _PEER_LOST)}
    if own:
        return min(own, key=lambda r: (own[r], r))
    silent = [r for r in failed if r not in reports]
    if silent:
        return silent[0]
    return min(reports, key=lambda r: (reports[r][0], r))


# ---------------------------------------------------------------- the reference over W processes


def _layer_rank(rank: int, world_size: int, group, inputs: dict, device: str, impl: str = "reference",
                precision: str = "bf16") -> dict:
    from .runner import run_sharded

    if device == "cuda":
        inputs = {k: (v.cuda() if v is not None else None) for k, v in inputs.items()}
    return run_sharded(inputs, rank, world_size, group, impl, precision)


def run_world(inputs: dict, world_size: int, *, impl: str = "reference", threads: int = 1, device: str = "cpu",
              timeout_s: float | None = None, precision: str = "bf16") -> list:
    """Forward+backward of `impl` ("reference", or "fast" on cuda) on global `inputs` (CPU tensors), split
    over W fresh processes (on one GPU they share it), with recipe `precision` ("bf16" or "fp8").

    Arguments are checked here, before any process starts (E and T divisible by W, impl, precision).
    Returns the W per-rank output dicts (CPU tensors), rank order.
    """
    from ..reference import check_precision
    from .runner import layer_impl, shard_inputs

    check_world_size(world_size, device)
    layer_impl(impl)
    check_precision(precision)
    if impl == "fast" and device != "cuda":
        raise ValueError(f"device: expected 'cuda' for impl 'fast', got {device!r}")
    shard_inputs(inputs, 0, world_size)  # raises for E or T not divisible by W
    cpu = {k: (v.cpu() if v is not None else None) for k, v in inputs.items()}
    return launch(_layer_rank, (cpu, device, impl, precision), world_size, device=device, threads=threads, timeout_s=timeout_s)


def run_reference_world(inputs: dict, world_size: int, **kw) -> list:
    """`run_world` with the reference (keywords: threads, device, timeout_s, precision)."""
    return run_world(inputs, world_size, impl="reference", **kw)

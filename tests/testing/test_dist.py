"""mok.testing.dist.launch: results in rank order; a failing worker fails the run at once with its
message; collectives time out; Ctrl-C, SIGTERM and SIGKILL of the launching process leave no process
and (except SIGKILL) no temporary directory behind. Signals are sent to real processes, with bounded
waits, and leftovers are found by scanning /proc."""

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from mok.testing import dist as mok_dist
from mok.testing.dist import WorkerError, launch
from mok.testing.stacks import main_thread_frames, where_text

ROOT = Path(__file__).resolve().parents[2]
BOUND_S = 20  # every run below must end within this


def _gather_ranks(rank, world_size, group, extra):
    out = [torch.empty(1) for _ in range(world_size)]
    if group is not None:
        dist.all_gather(out, torch.tensor([float(rank)]), group=group)
    else:
        out = [torch.tensor([0.0])]
    return [int(t) for t in out], extra, torch.get_num_threads()


@pytest.mark.parametrize("W", [
    1,  # one worker, no process group
    2,  # the smallest group
    3,  # an odd world size
])
def test_results_in_rank_order(W):
    res = launch(_gather_ranks, ("x",), W, threads=2)
    assert res == [(list(range(W)), "x", 2)] * W


def _env(rank, world_size, group, names):
    return [os.environ.get(n) for n in names]


def test_workers_see_the_launchers_environment_at_the_call(monkeypatch):
    """Workers fork from a server started at the first launch; a variable set or removed since then (e.g.
    MOK_EP_TIMEOUT_S in a test) must still be what they see."""
    monkeypatch.setenv("MOK_TEST_REMOVED", "old")
    launch(_env, (["MOK_TEST_REMOVED"],), 1)  # the fork server exists from here on
    monkeypatch.setenv("MOK_TEST_SET", "new")
    monkeypatch.delenv("MOK_TEST_REMOVED")
    assert launch(_env, (["MOK_TEST_SET", "MOK_TEST_REMOVED"],), 2) == [["new", None]] * 2


def _rank(rank, world_size, group):
    return rank


def test_quick_two_rank_launches_never_lose_a_rank_in_the_handshake():
    """A function that returns at once, on two ranks, 400 times. Before the workers waited for each other after
    joining the group, about 1 such launch in 200 failed with "Gloo connectFullMesh failed ... Connection closed by
    peer": one rank had already left while the other was still finishing its handshake (7 of 1500 launches; 400
    launches catch that about 9 times in 10)."""
    for i in range(400):
        assert launch(_rank, (), 2) == [0, 1], f"launch {i}"


class _Opaque:
    """A result the launcher's torch.load(weights_only=True) refuses (an arbitrary class)."""


def _fail_or_wait(rank, world_size, group, how):
    if rank == 1:
        if how == "raise":
            raise ValueError("rank 1 has a bad argument")
        if how == "abort":
            os.abort()
        if how == "exit":
            os._exit(3)
        if how == "exit0":
            os._exit(0)
        if how == "object":
            return _Opaque()
        if how == "lambda":
            return lambda: None
        time.sleep(3600)  # "hang": alive, never joins the collective
    dist.all_gather([torch.empty(1) for _ in range(world_size)], torch.ones(1), group=group)


@pytest.mark.parametrize("how, timeout_s, blamed, message", [
    # the cause is named, not the lost connections it causes on ranks 0 and 2
    ("raise", 600, 1, "ValueError: rank 1 has a bad argument"),
    ("abort", 600, 1, "died from signal SIGABRT"),  # killed by a signal: no Python error to report
    ("exit", 600, 1, "exited with status 3 without reporting an error"),  # os._exit: gone without a word
    ("exit0", 600, 1, "exited with status 0 without a result"),  # os._exit(0): status 0, but nothing returned
    # a result torch.load(weights_only=True) refuses: the worker names its type (not an UnpicklingError later)
    ("object", 600, 1, "TypeError: result: fn returned test_dist._Opaque, which the launcher cannot load back"),
    ("lambda", 600, 1, "TypeError: result: fn returned builtins.function"),  # a result that cannot even be pickled
    ("hang", 3, None, "Timed out"),  # ranks 0 and 2 give up after the collective timeout; rank 1 is killed
])
def test_a_failing_worker_stops_the_run_at_once(tmp_path, monkeypatch, how, timeout_s, blamed, message):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    t0 = time.monotonic()
    with pytest.raises(WorkerError) as info:
        launch(_fail_or_wait, (how,), 3, timeout_s=timeout_s)
    assert time.monotonic() - t0 < BOUND_S
    assert message in info.value.message, str(info.value)
    if blamed is not None:
        assert info.value.rank == blamed and str(info.value).startswith(f"rank {blamed}"), str(info.value)
    if how == "hang":  # the rank that never joined is named as still running after the others timed out
        assert 1 in info.value.stalled and info.value.rank not in info.value.stalled, str(info.value)
        assert "still running without an error" in str(info.value), str(info.value)
        # its Python stack, taken when the others timed out, shows where it was: the sleep, outside any collective
        assert "rank 1 (at test_dist.py:" in str(info.value) and "in _fail_or_wait, not in a torch.distributed call" \
            in str(info.value), str(info.value)
        assert main_thread_frames(info.value.stacks[1])[0][2] == "_fail_or_wait", info.value.stacks[1]
    assert [d for d in tmp_path.iterdir() if d.name.startswith("mok-dist-")] == []  # the run's directory is gone
    assert _alive(_descendants(os.getpid()) - _forkserver_family()) == set()


def test_timeout_from_env_is_checked(monkeypatch):
    from mok.testing.dist import timeout_from_env

    # 1e-9 would be a 0 ms gloo timeout, 1e300 overflows timedelta in the workers, 9e9 hung gloo
    for bad in ("0", "-1", "abc", "inf", "nan", "1e-9", "0.0009", "604801", "9e9", "1e300"):
        monkeypatch.setenv("MOK_DIST_TIMEOUT_S", bad)
        with pytest.raises(ValueError, match=r"^MOK_DIST_TIMEOUT_S: expected a number of seconds in \[0.001, 604800\]"):
            timeout_from_env()
    for good, value in (("7.5", 7.5), ("0.001", 0.001), ("604800", 604800.0)):
        monkeypatch.setenv("MOK_DIST_TIMEOUT_S", good)
        assert timeout_from_env() == value


@pytest.mark.parametrize("timeout_s, exc", [
    (0, ValueError),       # no time at all
    (1e-9, ValueError),    # under gloo's 1 ms resolution: a 0 ms timeout
    (1e300, ValueError),   # overflows timedelta in the workers
    ("3", TypeError),      # a string, not a number
    (True, TypeError),     # a bool, not a number
])
def test_launch_checks_its_timeout_before_any_process(timeout_s, exc, monkeypatch):
    monkeypatch.setattr(mok_dist.mp, "get_context", lambda *a: pytest.fail("a process was about to start"))
    with pytest.raises(exc, match="^timeout_s: expected a number of seconds"):
        launch(_gather_ranks, ("x",), 2, timeout_s=timeout_s)


def test_an_unreadable_result_names_its_rank(monkeypatch):
    def refuse(*a, **k):
        raise RuntimeError("damaged\nsecond line")

    monkeypatch.setattr(mok_dist.torch, "load", refuse)  # the launcher's load only: workers are other processes
    with pytest.raises(WorkerError) as info:
        launch(_gather_ranks, ("x",), 1)
    assert str(info.value) == "rank 0: its result could not be loaded (RuntimeError: damaged)", str(info.value)


@pytest.mark.parametrize("W, device, threads, parts", [
    (0, "cpu", 1, ("world_size", "int >= 1", "0")),          # no workers
    (2, "tpu", 1, ("device", "'cpu' or 'cuda'", "'tpu'")),  # an unknown device
    (2, "cpu", 0, ("threads", "int >= 1", "0")),            # no threads per worker
])
def test_bad_arguments_start_nothing(W, device, threads, parts):
    with pytest.raises(ValueError) as info:
        launch(_gather_ranks, ("x",), W, device=device, threads=threads)
    assert all(p in str(info.value) for p in parts), str(info.value)


@pytest.mark.parametrize("other_thread", [
    False,  # the main thread alone takes the SIGINT
    True,   # another thread may take it
], ids=["main_thread_only", "with_another_thread"])
def test_ctrl_c_while_the_launcher_makes_its_directory_leaves_none(tmp_path, monkeypatch, other_thread):
    """A SIGINT that lands inside tempfile.mkdtemp (after the directory exists, before the launcher holds its name)
    still ends in KeyboardInterrupt with the directory removed. With another thread running, the kernel hands a
    process-directed signal to whichever thread does not block it, and Python runs the handler in the main thread at
    once: blocking the signal in the main thread alone still leaked. Only the launcher's own mkdtemp is interrupted
    (multiprocessing makes one too when it first starts the fork server)."""
    made, real_mkdtemp = [], tempfile.mkdtemp

    def mkdtemp_then_ctrl_c(*args, **kwargs):
        if kwargs.get("prefix") != "mok-dist-":  # another caller (multiprocessing starting its fork server)
            return real_mkdtemp(*args, **kwargs)
        made.append(real_mkdtemp(dir=tmp_path))
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # time for another thread to take the signal and for the main thread to act on it
        return made[-1]

    stop = threading.Event()
    if other_thread:
        threading.Thread(target=stop.wait, daemon=True).start()
    monkeypatch.setattr(mok_dist.tempfile, "mkdtemp", mkdtemp_then_ctrl_c)
    old_handler = signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal, however pytest started
    try:
        with pytest.raises(KeyboardInterrupt):
            launch(_gather_ranks, ("x",), world_size=1)
    finally:
        stop.set()
        signal.signal(signal.SIGINT, old_handler)
    assert len(made) == 1 and not os.path.exists(made[0]), made


# ---------------------------------------------------------------- processes in /proc


def _stat(pid: int):
    """(ppid, state, start time) of a live process, or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), fields[0], int(fields[19])


def _descendants(pid: int) -> set:
    """{(pid, start time)} of every live descendant of `pid`."""
    children: dict = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = _stat(int(d))
            if st is not None:
                children.setdefault(st[0], []).append((int(d), st[2]))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c[0])
    return out


def _alive(procs: set) -> set:
    """The processes of `procs` still running (same pid and start time; zombies count as gone)."""
    out = set()
    for pid, start in procs:
        st = _stat(pid)
        if st is not None and st[2] == start and st[1] not in ("Z", "X"):
            out.add((pid, start))
    return out


def _forkserver_family() -> set:
    """This test process's own fork server and resource tracker (shared by every launch; not leftovers)."""
    from multiprocessing import forkserver, resource_tracker

    pids = {forkserver._forkserver._forkserver_pid, resource_tracker._resource_tracker._pid}
    return {p for p in _descendants(os.getpid()) if p[0] in pids}


_SCRIPT = """
import os, sys, time
from mok.testing.dist import launch

def stuck(rank, world_size, group, marks):
    import torch, torch.distributed as dist
    open(os.path.join(marks, f"rank{rank}"), "w").close()
    if rank == 0:
        time.sleep(3600)
    dist.all_gather([torch.empty(1) for _ in range(world_size)], torch.ones(1), group=group)  # waits in gloo

if __name__ == "__main__":
    try:
        launch(stuck, (sys.argv[2],), int(sys.argv[1]), timeout_s=3600)
    except KeyboardInterrupt:
        sys.exit(130)
"""


def _sigint_as_at_a_terminal() -> None:
    """In a child before exec: SIGINT back to its default, as at a terminal, so Python turns a Ctrl-C into
    KeyboardInterrupt even where the test run itself was started with SIGINT ignored (a background job)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(tmp_path: Path, argv: list, ready) -> tuple:
    """Start argv in its own session with TMPDIR = tmp_path/tmp; wait (bounded) until `ready(process)`;
    return (process, its descendants then)."""
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.Popen(argv, env=env, cwd=tmp_path, start_new_session=True, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_as_at_a_terminal)
    deadline = time.monotonic() + 120  # imports and the fork server's start, on a loaded machine
    while not ready(p):
        if p.poll() is not None:
            raise AssertionError(f"exited early ({p.returncode}): {p.communicate()}")
        if time.monotonic() > deadline:
            p.kill()
            raise AssertionError(f"not ready in time: {p.communicate()}")
        time.sleep(0.05)
    time.sleep(0.5)  # let the workers reach the collective
    return p, _descendants(p.pid)


def _assert_all_gone(p, family: set, tmp_path: Path, temp_dirs_removed: bool = True) -> tuple:
    """The process exits within BOUND_S, every process it started is gone soon after, no multiprocessing
    directory (pymp-*, the fork server's socket) is left, and no mok-dist-* directory either (unless not expected).
    Returns (returncode, stdout, stderr)."""
    try:
        out, err = p.communicate(timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        p.kill()
        raise AssertionError(f"still running {BOUND_S} s after the signal: {p.communicate()}")
    deadline = time.monotonic() + 10
    while _alive(family) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _alive(family) == set(), f"left running: {_alive(family)}; {out} {err}"
    assert [d.name for d in (tmp_path / "tmp").iterdir() if d.name.startswith("pymp-")] == []
    left = sorted(d.name for d in (tmp_path / "tmp").iterdir() if d.name.startswith("mok-dist-"))
    assert (left == []) == temp_dirs_removed, left
    return p.returncode, out, err


@pytest.mark.slow
@pytest.mark.parametrize("how", [
    "ctrl-c",          # SIGINT to the whole process group, workers included: exit 130
    "ctrl-c twice",    # a second SIGINT during cleanup: 130 or killed by SIGINT
    "sigint to main",  # SIGINT to the launcher alone: it must end the workers itself
    "sigterm",         # a polite kill: exit 143, nothing left
    "sigkill",         # no cleanup possible: the workers still end, the temp directory stays
])
def test_signals_stop_every_process(tmp_path, how):
    W = 2
    marks = tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "stuck.py"
    script.write_text(_SCRIPT)
    p, family = _start(tmp_path, [sys.executable, str(script), str(W), str(marks)],
                       lambda _: len(list(marks.iterdir())) == W)
    assert len(family) >= W + 1, family  # the workers and the fork server (and a resource tracker)
    if how.startswith("ctrl-c"):  # a terminal sends SIGINT to the whole foreground process group
        os.killpg(p.pid, signal.SIGINT)
        if how == "ctrl-c twice":
            time.sleep(0.05)
            os.killpg(p.pid, signal.SIGINT)
    else:
        os.kill(p.pid, {"sigint to main": signal.SIGINT, "sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL}[how])
    code, out, err = _assert_all_gone(p, family, tmp_path, temp_dirs_removed=how != "sigkill")
    # 130: the script's own exit for KeyboardInterrupt; a second Ctrl-C, delivered once cleanup is done,
    # may instead end it the default way (killed by SIGINT)
    assert code in ({"sigterm": (143,), "sigkill": (-9,), "ctrl-c twice": (130, -2)}.get(how, (130,))), err


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [
    (signal.SIGTERM, 143),  # SIGTERM to the CLI process alone: 128 + 15
    (signal.SIGINT, 130),   # Ctrl-C to the process group: 128 + 2, "mok diff-grads: interrupted"
])
def test_cli_signal_while_workers_run(tmp_path, sig, code):
    """`mok diff-grads`, interrupted while its W = 4 workers exist: exit 143 / 130 in bounded time,
    nothing left behind."""
    argv = [sys.executable, "-m", "mok.cli.main", "diff-grads", "--world-sizes", "4", "--seeds", "0", "1",
            "--reruns", "20", "--no-progress"]
    p, family = _start(tmp_path, argv, lambda p: len(_descendants(p.pid)) >= 4 + 2)  # + fork server, tracker
    if sig == signal.SIGINT:
        os.killpg(p.pid, sig)  # Ctrl-C
    else:
        os.kill(p.pid, sig)
    rc, out, err = _assert_all_gone(p, family, tmp_path)
    assert rc == code, out + err
    if sig == signal.SIGINT:
        assert err.strip().splitlines()[-1] == "mok diff-grads: interrupted"


def _fork_server_started(p) -> bool:
    """Whether a fork server process runs under `p` (while it imports torch, before any worker exists)."""
    for pid, _ in _descendants(p.pid):
        try:
            if b"forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
        except OSError:
            pass
    return False


@pytest.mark.slow
@pytest.mark.parametrize("delay_s", [
    0.0,  # as soon as the fork server process exists: Python still starting
    0.3,  # while it imports torch (seconds on a loaded 2-core machine)
])
def test_ctrl_c_while_the_fork_server_starts_prints_no_traceback(tmp_path, delay_s):
    """Ctrl-C to the process group before any worker exists: `mok diff-grads: interrupted`, exit 130, and no
    KeyboardInterrupt traceback from the fork server (it ignores SIGINT from its first import on), nothing left."""
    argv = [sys.executable, "-m", "mok.cli.main", "diff-grads", "--config", "tiny", "--world-sizes", "2", "--seeds",
            "0", "1", "--no-progress"]
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.Popen(argv, env=env, cwd=tmp_path, start_new_session=True, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_as_at_a_terminal)
    deadline = time.monotonic() + 120
    while not _fork_server_started(p):
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < deadline, "no fork server in time"
        time.sleep(0.005)
    family = _descendants(p.pid)
    time.sleep(delay_s)
    os.killpg(p.pid, signal.SIGINT)
    rc, out, err = _assert_all_gone(p, family, tmp_path)
    assert rc == 130, out + err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.strip().splitlines() == ["mok diff-grads: interrupted"], err


_TEARDOWN = """
import os, sys, tempfile
import mok.reference  # first, as the docs advise: binds no process group (docs/reliability.md)
import torch, torch.distributed as dist

def threads():
    return sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))

dist.init_process_group("gloo", init_method="file://" + os.path.join(tempfile.mkdtemp(), "init"), rank=0,
                        world_size=1)
from mok.nn import ops
ops.router(torch.randn(4, 8), torch.randn(4, 8), 2)  # a custom op: PyTorch imports torch._dynamo here
during = threads()
dist.destroy_process_group()
import time
deadline = time.monotonic() + 10  # a stopped thread can take a moment to leave; one the group still holds never does
while any("gloo" in t for t in threads()) and time.monotonic() < deadline:
    time.sleep(0.01)
print(sum("gloo" in t for t in during), sum("gloo" in t for t in threads()))
os._exit(0)
"""


def test_destroy_process_group_stops_gloo_threads():
    """The process group must not outlive destroy_process_group (held by torch.distributed.nn.functional's
    default arguments when that module is first imported after init_process_group): its gloo threads
    would then be torn down during interpreter shutdown. A stopped thread may take a moment to leave /proc, so the
    count after is read once none is left or after 10 s."""
    r = subprocess.run([sys.executable, "-c", _TEARDOWN], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    assert r.returncode == 0, r.stderr
    during, after = map(int, r.stdout.split())
    assert during > 0 and after == 0, r.stdout + r.stderr  # gloo threads while the group lives, none after


def _stack_file(*threads, main=1):
    """A worker's stack file: its header line naming thread `main`, then faulthandler's text for each
    (thread id, [(path, line, function)] innermost first)."""
    text = f"mok main thread 0x{main:016x}\n"
    for i, (tid, frames) in enumerate(threads):
        text += f"{'Current thread' if tid == main else 'Thread'} 0x{tid:016x} (most recent call first):\n"
        text += "".join(f'  File "{p}", line {n} in {f}\n'.replace("/", os.sep) for p, n, f in frames)
        text += "\n" if i + 1 < len(threads) else ""
    return text


_WORKER = ("/src/mok/testing/dist.py", 213, "_worker")
_DUMP = _stack_file((2, [("/usr/lib/python3.11/threading.py", 320, "wait"),
                         ("/usr/lib/python3.11/threading.py", 1002, "_bootstrap")]),
                    (1, [("/venv/torch/distributed/distributed_c10d.py", 4287, "all_gather"),
                         ("/src/train.py", 12, "step"), _WORKER,
                         ("/usr/lib/python3.11/multiprocessing/process.py", 108, "run")]))


def test_main_thread_frames_picks_the_workers_thread():
    """faulthandler lists threads in no fixed order: the main thread is the one the stack file's header names; a
    rank inside a collective is told apart from one that never called it."""
    frames = main_thread_frames(_DUMP)
    assert [f for _, _, f in frames] == ["all_gather", "step", "_worker", "run"]
    assert frames[0][1] == 4287
    err = WorkerError(0, "RuntimeError: Timed out", [0], stalled=[2], stacks={2: _DUMP})
    assert "rank 2 (at distributed_c10d.py:4287 in all_gather, inside torch.distributed)" in str(err), str(err)
    assert main_thread_frames("") == [] and main_thread_frames(_DUMP.split("Current")[0]) == []


@pytest.mark.parametrize("dump, where", [
    # a backward's collective on autograd's device thread while the main thread waits in backward()
    (_stack_file((2, [("/venv/torch/distributed/distributed_c10d.py", 4287, "all_gather"),
                      ("/src/mok/nn/ops.py", 120, "_moe_bwd")]),
                 (1, [("/venv/torch/autograd/graph.py", 829, "_engine_run_backward"), _WORKER])),
     "(at distributed_c10d.py:4287 in all_gather, another thread, inside torch.distributed)"),
    # 120 nested calls: faulthandler stops at 100 frames, so _worker is cut off; the header still names the thread
    (_stack_file((1, [("/src/deep.py", i, f"f{i}") for i in range(100)])) + "  ...\n",
     "(at deep.py:0 in f0, not in a torch.distributed call)"),
    # a rank that had not registered its handler: never signalled (SIGUSR1's default action would kill it)
    (None, "(not started: still loading its function and arguments)"),
    # the header alone: it did not answer in time
    (_stack_file(), "(no stack written)"),
])
def test_where_a_stalled_rank_was(dump, where):
    assert where_text(dump) == " " + where

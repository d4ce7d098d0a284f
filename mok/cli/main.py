"""The `mok` command: `mok verify`, `mok golden regen|check`, `mok diff-grads`, `mok --version`.

Exit status (docs/reliability.md): 0 everything passed; 1 a check failed (a mismatch, a damaged golden
file, or a check that could not run); 2 bad arguments or environment (one line on stderr naming the
argument: no traceback); 130 interrupted (Ctrl-C); 143 terminated (SIGTERM). Every message of the command
starts with "mok <command>: " ("mok: " before a command is known).
--json prints one JSON object per check on stdout (JSON lines), then a summary object; -q prints only
failures and the summary line.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path

HARNESS_MODULES = ("safetensors", "tqdm", "numpy")  # the `mok[harness]` extra
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


COMMANDS = ("verify", "golden", "diff-grads")


class UsageError(Exception):
    """A bad argument or environment: exit 2 with this one-line message. `prog`: the parser that raised it
    ("mok diff-grads"), for argparse's own errors (the message then starts with it when no command is named)."""

    def __init__(self, message: str, prog: str | None = None):
        super().__init__(message)
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump
        raise UsageError(message, prog=self.prog)


def _stdout_to_devnull() -> None:
    """Point stdout's file descriptor at /dev/null (its reader went away), so that nothing written or flushed later,
    at exit included, raises BrokenPipeError again."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (e.g. captured)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


class _Out:
    """Where results go: text lines, or JSON lines (`--json`). With `finish_on_broken_pipe`, a reader of stdout
    that goes away (`| head`) does not stop the command: the rest of its output is dropped and the work goes on
    (`golden regen`, so that the files and the manifest on disk always agree)."""

    def __init__(self, command: str, as_json: bool, quiet: bool):
        self.command, self.json, self.quiet = command, as_json, quiet
        self.finish_on_broken_pipe, self.stdout_gone = False, False

    def _print(self, line: str) -> None:
        if self.stdout_gone:
            return
        try:
            print(line, flush=True)
        except BrokenPipeError:
            if not self.finish_on_broken_pipe:
                raise
            self.stdout_gone = True
            _stdout_to_devnull()

    def text(self, line: str = "", *, always: bool = False) -> None:
        if not self.json and (always or not self.quiet):
            self._print(line)

    def record(self, **fields) -> None:
        if self.json:
            self._print(json.dumps({"command": self.command, **fields}, sort_keys=False))

    def error(self, message: str) -> None:
        """One line on stderr: "mok <command>: message"."""
        print(f"mok {self.command}: {message}", file=sys.stderr, flush=True)


def _require_harness() -> None:
    missing = []
    for name in HARNESS_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise UsageError(f"the verification harness needs {', '.join(HARNESS_MODULES)}; missing: {', '.join(missing)}. "
                         f"Install them with: pip install {' '.join(missing)} "
                         f"(or, in mok's source tree: pip install -e '.[harness]')")


def _require_device(device: str) -> None:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device: expected a CUDA GPU for 'cuda', found none")


def _require_timeout() -> None:
    from ..testing.dist import timeout_from_env

    try:
        timeout_from_env()
    except ValueError as e:
        raise UsageError(str(e)) from None


def _installed_goldens() -> None:
    from .golden import GoldenInstallError, require_installed

    try:
        require_installed()
    except GoldenInstallError as e:
        raise UsageError(f"installation: {e}") from None


# ---------------------------------------------------------------- verify


def _verify(args, out: _Out) -> int:
    _require_device(args.device)
    _require_timeout()
    _installed_goldens()
    from .verify import cpu_checks, cuda_checks, format_verdicts, run_checks

    t0 = time.perf_counter()
    checks = cuda_checks() if args.device == "cuda" else cpu_checks()

    def each(c):
        out.record(check=c.name, ok=c.ok, detail=c.detail, seconds=round(c.seconds, 3))

    results = run_checks(checks, progress=args.progress, on_result=each)
    ok = all(r.ok for r in results)
    out.text(format_verdicts(results, only_failures=out.quiet), always=True)
    seconds = time.perf_counter() - t0
    out.text(f"mok verify --device {args.device}: {seconds:.1f} s")
    out.record(summary=True, ok=ok, passed=sum(r.ok for r in results), failed=sum(not r.ok for r in results),
               seconds=round(seconds, 3))
    return EXIT_OK if ok else EXIT_FAILED


# ---------------------------------------------------------------- golden


def _golden_dir(args) -> Path:
    from .golden import GOLDEN_DIR

    if args.dir is None:
        return GOLDEN_DIR
    d = Path(args.dir)
    if args.action == "check" and not d.is_dir():
        raise UsageError(f"--dir: expected an existing directory, got {args.dir!r}")
    if args.action == "regen" and d.exists() and not d.is_dir():
        raise UsageError(f"--dir: expected a directory, got the file {args.dir!r}")
    return d


def _writable_dir(d: Path, given) -> None:
    """Make `d` (regen's directory) if needed and check that a file can be written there: exit 2 naming --dir
    rather than a traceback halfway through (e.g. --dir /proc/nope, a read-only installation)."""
    import tempfile

    what = repr(str(given)) if given is not None else f"the package's golden directory {str(d)!r} (the default)"
    try:
        d.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=d):  # O_TMPFILE where supported: no name appears, nothing left behind
            pass
    except OSError as e:
        raise UsageError(f"--dir: expected a directory that can be created and written, got {what} "
                         f"({type(e).__name__}: {e.strerror or e})") from None


def _lock(golden_dir: Path, exclusive: bool, out: _Out):
    """The directory's lock (`files.directory_lock`): shared for check, exclusive for regen; a line on stderr when
    another process holds it. Nothing to lock when the directory does not exist."""
    from contextlib import nullcontext

    from .files import directory_lock

    if not golden_dir.is_dir():
        return nullcontext()
    return directory_lock(golden_dir, exclusive, on_wait=lambda: out.error(
        f"waiting for another process's `mok golden {'regen' if not exclusive else 'regen or check'}` of "
        f"{str(golden_dir)!r} to finish"))


def _golden_check(args, out: _Out) -> int:
    golden_dir = _golden_dir(args)
    _require_device(args.device)
    _require_timeout()
    with _lock(golden_dir, False, out):
        return _golden_check_locked(args, out, golden_dir)


def _golden_check_locked(args, out: _Out, golden_dir: Path) -> int:
    from .golden import GOLDEN_DIR, GoldenInstallError, check_all

    def each(r):
        out.record(case=r.name, ok=r.ok, problems=[{"what": k, "problem": p} for k, p in r.problems])
        out.text(f"{r.name}: {'ok' if r.ok else 'MISMATCH'}", always=not r.ok)
        for k, p in r.problems:
            out.text(f"  {k}: {p}", always=True)

    try:
        reports = check_all(golden_dir, device=args.device, on_case=each)
    except GoldenInstallError as e:
        raise UsageError(f"installation: {e}") from None
    bad = sum(not r.ok for r in reports)
    out.text(f"{len(reports) - bad} passed, {bad} failed", always=True)
    out.record(summary=True, ok=not bad, passed=len(reports) - bad, failed=bad,
               dir=str(golden_dir), package_dir=golden_dir.resolve() == GOLDEN_DIR)
    return EXIT_FAILED if bad else EXIT_OK


def _regular_targets(golden_dir: Path) -> None:
    """Exit 2 naming the file when a name regen writes (the manifest, a case's file) is something other than a
    regular file or nothing: a FIFO would block the read of the old file, a directory the rename."""
    from .files import regular_or_absent
    from .golden import golden_paths

    for name in golden_paths():
        what = regular_or_absent(golden_dir / name)
        if what is not None:
            raise UsageError(f"--dir: expected a regular file or nothing at {str(golden_dir / name)!r}, got {what}; "
                             f"remove it or pick another --dir")


def _golden_regen(args, out: _Out) -> int:
    out.finish_on_broken_pipe = True  # the files and the manifest must agree, whoever reads stdout
    golden_dir = _golden_dir(args)
    _require_device(args.device)
    _writable_dir(golden_dir, args.dir)
    with _lock(golden_dir, True, out):
        _regular_targets(golden_dir)
        return _golden_regen_locked(args, out, golden_dir)


def _golden_regen_locked(args, out: _Out, golden_dir: Path) -> int:
    from .files import FileProblem
    from .golden import CASES, MANIFEST, read_manifest, regen_case, remove_stale_temp_files, write_manifest

    removed, kept = remove_stale_temp_files(golden_dir)
    for name in removed:
        out.text(f"removed {name} (left by an interrupted write)")
    for name, what in kept:
        out.text(f"left {name} in place: {what}, not a temporary file of mok golden regen", always=True)
    try:
        old_entries = read_manifest(golden_dir)["cases"]
    except ValueError as e:
        old_entries = {}
        if (golden_dir / MANIFEST).exists():
            out.text(f"{MANIFEST}: not usable, rebuilt from the case list ({e})", always=True)
    labels = {"written": "written", "unchanged": "unchanged", "rewritten": "rewritten (same bits, canonical bytes)",
              "overwritten": "OVERWRITTEN", "refused": "differs, NOT overwritten (use --force)"}
    entries, refused = {}, 0
    for i, case in enumerate(CASES):
        try:
            report, entry, status = regen_case(case, golden_dir, force=args.force, device=args.device)
        except (OSError, FileProblem) as e:  # e.g. a full disk: after the directory check, a failure of this run
            return _regen_write_failed(out, golden_dir, case.file, e, entries, old_entries, CASES[i:])
        out.text(f"{case.name}: {labels[status]}", always=status in ("overwritten", "refused"))
        for k, p in report.problems:
            out.text(f"  {k}: {p}", always=True)
        out.record(case=case.name, ok=status != "refused", status=status,
                   changes=[{"what": k, "change": p} for k, p in report.problems])
        refused += status == "refused"
        if entry is None:
            entry = old_entries.get(case.name)
        if entry is not None:
            entries[case.name] = entry
    try:
        write_manifest(entries, golden_dir)
    except OSError as e:
        return _regen_write_failed(out, golden_dir, MANIFEST, e, entries, old_entries, [])
    _report_dropped(out, old_entries)
    out.record(summary=True, ok=not refused, refused=refused, dir=str(golden_dir))
    return EXIT_FAILED if refused else EXIT_OK


def _report_dropped(out: _Out, old_entries: dict) -> None:
    """Name each case of the old manifest that the manifest `golden regen` writes leaves out (not in this mok
    version's case list): a text line each, or a JSON record each."""
    from .golden import CASES, MANIFEST

    for name in sorted(set(old_entries) - {c.name for c in CASES}):
        out.text(f"{MANIFEST}: dropped case {name!r} (not in this mok version's case list)", always=True)
        out.record(dropped_case=name, ok=True)


def _regen_write_failed(out: _Out, golden_dir: Path, name: str, e: Exception, entries: dict, old_entries: dict,
                        left: list) -> int:
    """A file of `golden regen` could not be read or written after the directory check passed (a full disk, a
    file made read-only): one line naming it, no traceback, status 1. The manifest is rewritten to describe the
    files now on disk (the cases done, and the old entries of those not reached) where that can still be
    written, so `golden check` reports exactly what is stale; every file on disk is whole (atomic writes)."""
    from .golden import MANIFEST, write_manifest

    kept = {**{c.name: old_entries[c.name] for c in left if c.name in old_entries}, **entries}
    manifest = "the manifest describes the files on disk"
    if name != MANIFEST:
        try:
            write_manifest(kept, golden_dir)
            _report_dropped(out, old_entries)
        except OSError as e2:
            manifest = f"the manifest could not be updated either ({type(e2).__name__}: {e2.strerror or e2})"
    else:
        manifest = "the manifest is the old one"
    why = getattr(e, "strerror", None) or e
    msg = (f"could not read or write {str(golden_dir / name)!r} ({type(e).__name__}: {why}); {len(left)} case(s) "
           f"not regenerated, {manifest}")
    out.error(msg)
    out.record(summary=True, ok=False, error=f"mok {out.command}: {msg}", not_regenerated=[c.name for c in left],
               dir=str(golden_dir))
    return EXIT_FAILED


# ---------------------------------------------------------------- diff-grads


_FLAGS = {"shape": "--shape", "seeds": "--seeds", "world_sizes": "--world-sizes", "reruns": "--reruns",
          "threads": "--threads", "routing": "--routing", "world_size": "--world-sizes", "device": "--device",
          "impl": "--impl"}


def _as_usage(e: ValueError) -> UsageError:
    """A library ValueError 'name: ...' as a UsageError naming the command-line flag."""
    name, sep, rest = str(e).partition(": ")
    return UsageError(f"{_FLAGS[name]}: {rest}" if sep and name in _FLAGS else str(e))


def _diff_grads(args, out: _Out) -> int:
    from ..testing.cases import NAMED, MoEConfig
    from ..testing.dist import WorkerError
    from .diff_grads import check_args, default_impl, diff_grads, format_table

    _require_device(args.device)
    _require_timeout()
    try:
        cfg = MoEConfig.parse(args.shape) if args.shape else NAMED[args.config or "default"]
        check_args(cfg, args.seeds, args.world_sizes, routing=args.routing, reruns=args.reruns, device=args.device,
                   threads=args.threads, impl=args.impl)
    except ValueError as e:
        raise _as_usage(e) from None
    t0 = time.perf_counter()
    try:
        verdicts = diff_grads(cfg, args.seeds, args.world_sizes, routing=args.routing, reruns=args.reruns,
                              device=args.device, threads=args.threads, progress=args.progress, impl=args.impl)
    except WorkerError as e:
        out.error(f"a run failed: {e}")
        out.record(summary=True, ok=False, error=str(e))
        return EXIT_FAILED
    for v in verdicts:
        out.record(**v.record())
    out.text(f"config T,H,I,E,K,S = {cfg.T},{cfg.H},{cfg.I},{cfg.E},{cfg.K},{cfg.S}; seeds {args.seeds}; "
             f"world sizes {args.world_sizes}; reruns {args.reruns}; device {args.device}; "
             f"layer {args.impl or default_impl(args.device)}")
    table = format_table(verdicts, only_failures=out.quiet)
    if table:
        out.text(table, always=True)
    ok = all(v.ok for v in verdicts)
    out.text(f"verdict: {'all bit-identical where they must be' if ok else 'MISMATCH'}", always=True)
    out.record(summary=True, ok=ok, config=cfg.as_dict(), seeds=list(args.seeds), world_sizes=list(args.world_sizes),
               reruns=args.reruns, device=args.device, seconds=round(time.perf_counter() - t0, 3))
    return EXIT_OK if ok else EXIT_FAILED


# ---------------------------------------------------------------- parser and main


def _output_flags(p: argparse.ArgumentParser, json_flag: bool = True) -> None:
    if json_flag:
        p.add_argument("--json", action="store_true",
                       help="one JSON object per check on stdout (JSON lines), then a summary object")
    p.add_argument("-q", "--quiet", action="store_true", help="only failures and the summary line; no progress bar")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _golden_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", default=None, help="golden directory (default: the package's golden files)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the reference runs; its bits are the same on either (default: %(default)s)")


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__
    from ..testing.cases import NAMED, ROUTINGS

    p = _Parser(prog="mok", description="Deterministic MoE layer: verification tools")
    p.add_argument("--version", action="version", version=f"mok {__version__}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    v = sub.add_parser("verify", help="run the determinism suite on the embedded default config",
                       description="Run the determinism suite on the embedded default config: reruns, world sizes "
                                   "and the golden files, bit for bit.")
    v.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where to run (default: %(default)s)")
    _output_flags(v)
    v.set_defaults(func=_verify)
    g = sub.add_parser("golden", help="check or regenerate the golden files",
                       description="The reference's golden files (docs/determinism.md): check them or regenerate them.")
    gsub = g.add_subparsers(dest="action", required=True, parser_class=_Parser)
    gc = gsub.add_parser("check", help="reproduce every golden case with the reference, bit for bit",
                         description="Check every golden case: the manifest against the case list, each file against "
                                     "the manifest's size and hashes and the case's seed, and the reference's outputs "
                                     "(at every world size the case lists) bit for bit against the file.")
    _golden_flags(gc)
    _output_flags(gc)
    gc.set_defaults(func=_golden_check)
    gr = gsub.add_parser("regen", help="regenerate the golden files from their seeds",
                         description="Regenerate every golden case from its seed with the reference and rewrite the "
                                     "manifest. A file whose bits changed is left as it is unless --force.")
    gr.add_argument("--force", action="store_true", help="overwrite golden files whose bits changed")
    _golden_flags(gr)
    _output_flags(gr)
    gr.set_defaults(func=_golden_regen)
    d = sub.add_parser("diff-grads", help="compare y and all gradients across seeds, world sizes and reruns",
                       description="Run the layer's forward and backward for every seed, world size and rerun in "
                                   "fresh processes and compare y and the 8 gradients bit for bit: reruns and world "
                                   "sizes must agree, seeds must differ.")
    what = d.add_mutually_exclusive_group()  # one or the other: never one silently ignored
    what.add_argument("--config", choices=sorted(NAMED), default=None, help="a named config (default: default)")
    what.add_argument("--shape", help="T,H,I,E,K[,S] (T = global tokens, divisible by every W)")
    d.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], metavar="SEED",
                   help="seeds of the inputs: at least 2 distinct, in [0, 2**64 - 1] (default: 0 1 2)")
    d.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2, 4], metavar="W",
                   help="world sizes to compare, each dividing E and T (default: 1 2 4)")
    d.add_argument("--reruns", type=int, default=2, help="runs of each (seed, W), at least 2 (default: %(default)s)")
    d.add_argument("--routing", choices=ROUTINGS, default="random",
                   help="how the inputs' expert ids are drawn (default: %(default)s)")
    d.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where to run (default: %(default)s)")
    d.add_argument("--threads", type=int, default=1, help="torch threads per process (default: %(default)s)")
    d.add_argument("--impl", choices=("reference", "fast"), default=None,
                   help="the layer to run (fast: on cuda, W ranks sharing the GPUs); default: fast on cuda, "
                        "reference on cpu (docs/expert_parallel.md)")
    _output_flags(d)
    d.set_defaults(func=_diff_grads)
    return p


def _label(argv: list) -> str | None:
    """The command named in `argv` ("golden check", "diff-grads", ...), or None when there is none to name."""
    words = [a for a in argv if not a.startswith("-")]
    if not words or words[0] not in COMMANDS:
        return None
    if words[0] == "golden" and len(words) > 1 and words[1] in ("check", "regen"):
        return f"golden {words[1]}"
    return words[0]


def main(argv=None) -> int:
    """Run the `mok` command; returns the exit status. SIGTERM raises SystemExit(143) after cleanup."""
    from ..testing.dist import sigterm_exits

    argv = sys.argv[1:] if argv is None else list(argv)
    label = _label(argv)
    as_json = "--json" in argv
    try:
        with sigterm_exits():
            args = build_parser().parse_args(argv)
            label = f"golden {args.action}" if args.command == "golden" else args.command
            _require_harness()
            out = _Out(label, args.json, args.quiet)
            args.progress = not (args.no_progress or args.quiet or out.json)
            return args.func(args, out)
    except UsageError as e:
        msg = f"{'mok ' + label if label else e.prog or 'mok'}: {e}"
        print(msg, file=sys.stderr)
        if as_json:
            print(json.dumps({"command": label or "mok", "error": msg, "exit_code": EXIT_USAGE}), flush=True)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"mok {label}: interrupted" if label else "mok: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader of stdout went away (e.g. `| head`): stop quietly
        _stdout_to_devnull()
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())

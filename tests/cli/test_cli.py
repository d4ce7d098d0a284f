"""The `mok` command: verify's verdict and exit status, diff-grads' table and exit status."""

import json
import subprocess
import sys

import pytest
import torch

import mok.cli.diff_grads as diffgrads
import mok.cli.verify as verify
from mok.cli.main import main
from mok.cli.golden import CASES


@pytest.mark.slow
def test_mok_verify_passes_end_to_end():
    r = subprocess.run([sys.executable, "-m", "mok.cli.main", "verify", "--no-progress"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 failed" in r.stdout and "W=4 vs W=1" in r.stdout


def test_verify_exits_nonzero_on_a_failed_check(monkeypatch, capsys):
    def checks():
        return [("always equal", lambda: (True, "ok")), ("planted mismatch", lambda: (False, "y: 1 differs")),
                ("raises", lambda: 1 / 0)]
    monkeypatch.setattr(verify, "cpu_checks", checks)
    assert main(["verify", "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "planted mismatch" in out and "FAIL" in out and "ZeroDivisionError" in out and "1 passed, 2 failed" in out


def test_compare_outputs_names_first_mismatch():
    a = {k: torch.zeros(3) for k in ("y",)}
    b = {"y": torch.tensor([0.0, 1.0, 0.0])}
    full = dict.fromkeys(verify.OUTPUT_NAMES)
    ok, detail = verify.compare_outputs({**full, **a}, {**full, **b})
    assert not ok and "(1,)" in detail and "1 elements differ" in detail


@pytest.mark.slow
def test_diff_grads_all_match(capsys):
    assert main(["diff-grads", "--config", "tiny", "--seeds", "0", "1", "--world-sizes", "1", "2", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.count("bit-identical") >= 2 * 9 and "FAIL" not in out


def test_diff_grads_reports_a_difference(monkeypatch, capsys):
    # a fake runner: the second rerun of seed 0 differs in one element of d_x
    calls = {"n": 0}

    def fake_run(inputs, W, impl="reference", device="cpu", threads=1):
        from mok.testing.runner import run_sharded
        calls["n"] += 1
        outs = [run_sharded(inputs, r, 1, None) for r in range(1)]
        if calls["n"] == 2:
            outs[0]["d_x"] = outs[0]["d_x"].clone()
            outs[0]["d_x"].view(-1)[5] = outs[0]["d_x"].view(-1)[5] * 2 + 1
        return outs

    monkeypatch.setattr(diffgrads, "run_world", fake_run)
    assert main(["diff-grads", "--config", "tiny", "--seeds", "0", "1", "--world-sizes", "1", "--no-progress"]) == 1
    out = capsys.readouterr().out
    line = next(l for l in out.splitlines() if l.startswith("d_x "))
    assert "1 differ" in line and "FAIL" in line


@pytest.mark.parametrize("argv, flag", [
    (["--impl", "fast"], "--impl"),                                  # the fast path needs cuda
    (["--impl", "fast", "--device", "cuda", "--shape", "8,12,8,4,2"], "--shape"),  # fast on cuda: H % 8 != 0
])
def test_diff_grads_fast_impl_arguments_are_checked_before_any_process(argv, flag, monkeypatch, capsys):
    import mok.cli.main as cli
    monkeypatch.setattr(diffgrads, "check_world_size", lambda W, device="cpu": W)  # no GPU needed to get there
    monkeypatch.setattr(cli, "_require_device", lambda device: None)
    assert main(["diff-grads", "--seeds", "0", "1", "--world-sizes", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"mok diff-grads: {flag}: "), err


def test_diff_grads_needs_two_seeds():
    with pytest.raises(ValueError, match="seeds"):
        diffgrads.diff_grads(diffgrads.MoEConfig(4, 8, 4, 2, 1), [0], [1])


# ---------------------------------------------------------------- exit status, one-line errors, output modes

@pytest.fixture
def no_workers(monkeypatch):
    """Fail the test if any worker process would start."""
    import mok.testing.dist as dist

    def refuse(*a, **k):
        raise AssertionError("a worker process was started")

    monkeypatch.setattr(dist, "launch", refuse)


@pytest.mark.parametrize("argv, phrase", [
    # a world size of 0
    (["diff-grads", "--world-sizes", "0"], "--world-sizes: expected ints >= 1, got 0"),
    # W = 3 divides neither E = 4 nor T = 8 of the tiny config
    (["diff-grads", "--config", "tiny", "--world-sizes", "3"], "--world-sizes: expected divisors of both E = 4"),
    # a zero dimension in the shape
    (["diff-grads", "--shape", "8,0,8,4,2"], "--shape: expected H >= 1, got H = 0"),
    # a shape that is not integers
    (["diff-grads", "--shape", "a,b,c,d,e"], "--shape: expected 'T,H,I,E,K[,S]' (integers), got 'a,b,c,d,e'"),
    # more experts per token than experts
    (["diff-grads", "--shape", "8,8,8,4,5"], "--shape: expected K <= E = 4, got K = 5"),
    # no threads
    (["diff-grads", "--threads", "0"], "--threads: expected an int >= 1, got 0"),
    # one run leaves nothing to compare a rerun with
    (["diff-grads", "--reruns", "1"], "--reruns: expected an int >= 2, got 1"),
    # the same seed twice: only one distinct seed
    (["diff-grads", "--seeds", "3", "3"], "--seeds: expected at least 2 distinct seeds"),
    # 2**64: beyond what torch.manual_seed takes (was an OverflowError traceback, exit 1)
    (["diff-grads", "--seeds", "0", "18446744073709551616"], "--seeds: expected ints in [0, 2**64 - 1]"),
    # a negative seed: torch would alias it to 2**64 - 1
    (["diff-grads", "--seeds", "-1", "3"], "--seeds: expected ints in [0, 2**64 - 1]"),
    # --shape and --config together: one would be silently ignored
    (["diff-grads", "--shape", "8,16,8,4,2", "--config", "tiny"],
     "argument --config: not allowed with argument --shape"),
    # the same, naming the default config explicitly
    (["diff-grads", "--config", "default", "--shape", "8,16,8,4,2"],
     "argument --shape: not allowed with argument --config"),
    # empty_expert needs K < E, here K = E = 2
    (["diff-grads", "--routing", "empty_expert", "--shape", "8,8,8,2,2"], "--routing:"),
    # not an int: argparse's own message, still one line
    (["diff-grads", "--world-sizes", "a"], "argument --world-sizes: invalid int value: 'a'"),
    # cuda asked for with no GPU (skipped where one is present), in diff-grads ...
    (["diff-grads", "--device", "cuda"], "--device: expected a CUDA GPU"),
    # ... and in verify
    (["verify", "--device", "cuda"], "--device: expected a CUDA GPU"),
    # ... and in golden check
    (["golden", "check", "--device", "cuda"], "--device: expected a CUDA GPU"),
    # ... and in golden regen (was: exit 0, computed on the CPU)
    (["golden", "regen", "--device", "cuda", "--dir", "/proc/nope"], "--device: expected a CUDA GPU"),
    # --force belongs to regen: check does not take it silently
    (["golden", "check", "--force"], "unrecognized arguments: --force"),
    # an unknown flag
    (["verify", "--bogus"], "unrecognized arguments: --bogus"),
    # a golden directory that does not exist
    (["golden", "check", "--dir", "/nonexistent/golden"], "--dir: expected an existing directory"),
    # a golden directory regen cannot create (was a FileNotFoundError traceback, exit 1)
    (["golden", "regen", "--dir", "/proc/nope"], "--dir: expected a directory that can be created and written"),
    # an existing directory where no file can be written
    (["golden", "regen", "--dir", "/proc"], "--dir: expected a directory that can be created and written"),
    # an unknown golden action
    (["golden", "fix"], "argument action: invalid choice: 'fix'"),
    # no golden action
    (["golden"], "the following arguments are required: action"),
    # no command at all
    ([], "the following arguments are required: command"),
])
def test_argument_errors_exit_2_with_one_line(no_workers, capsys, argv, phrase):
    if "cuda" in argv and torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and phrase in err and "Traceback" not in err, err
    assert captured.out == ""


@pytest.mark.parametrize("value, argv", [
    ("soon", ["diff-grads", "--config", "tiny"]),   # not a number
    ("1e-9", ["diff-grads", "--config", "tiny"]),   # would be a 0 ms gloo timeout
    ("1e300", ["diff-grads", "--config", "tiny"]),  # would overflow timedelta in the workers (exit 1 after they start)
    ("1e300", ["verify"]),                          # verify checks it before any worker too
    ("1e300", ["golden", "check"]),                 # and golden check
    ("604801", ["verify"]),                         # just over the 7-day bound
])
def test_bad_timeout_environment_exits_2(no_workers, monkeypatch, capsys, value, argv):
    monkeypatch.setenv("MOK_DIST_TIMEOUT_S", value)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    command = " ".join(argv[:2] if argv[0] == "golden" else argv[:1])
    assert err == (f"mok {command}: MOK_DIST_TIMEOUT_S: expected a number of seconds in [0.001, 604800] "
                   f"(1 ms to 7 days), got {value!r}")


def test_json_error_record(no_workers, capsys):
    assert main(["diff-grads", "--threads", "0", "--json"]) == 2
    rec = json.loads(capsys.readouterr().out)
    assert rec == {"command": "diff-grads", "error": "mok diff-grads: --threads: expected an int >= 1, got 0",
                   "exit_code": 2}


@pytest.mark.parametrize("argv, prefix", [
    (["diff-grads", "--world-sizes", "a"], "mok diff-grads: argument --world-sizes"),  # argparse's own check
    (["diff-grads", "--threads", "0"], "mok diff-grads: --threads:"),                 # mok's validation
    (["diff-grads", "--bogus"], "mok diff-grads: unrecognized arguments"),           # an unknown flag
    (["golden", "check", "--dir", "/nonexistent/golden"], "mok golden check: --dir:"),
    (["golden", "regen", "--dir", "/proc/nope"], "mok golden regen: --dir:"),
    (["golden", "regen", "--bogus"], "mok golden regen: unrecognized arguments"),
    (["golden", "fix"], "mok golden: argument action"),
    (["verify", "--bogus"], "mok verify: unrecognized arguments"),
    (["bogus"], "mok: argument command: invalid choice"),  # no command to name
])
def test_every_error_has_one_prefix_style(no_workers, capsys, argv, prefix):
    """"mok <command>: " for parsing and validation errors alike (was: `mok diff-grads:` from argparse, `mok:` from
    validation)."""
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith(prefix + " " if prefix.endswith(":") else prefix)


@pytest.mark.parametrize("argv, command", [
    (["golden", "check", "--device", "cuda", "--json"], "golden check"),  # a validation error
    (["golden", "regen", "--bogus", "--json"], "golden regen"),          # a parsing error
])
def test_json_error_record_names_the_golden_action(no_workers, capsys, argv, command):
    if "cuda" in argv and torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert main(argv) == 2
    rec = json.loads(capsys.readouterr().out)
    assert rec["command"] == command and rec["error"].startswith(f"mok {command}: ") and rec["exit_code"] == 2


@pytest.mark.parametrize("action, has, lacks", [
    ("check", "Check every golden case", "--force"),  # check's own help: no regen-only flag
    ("regen", "--force", "Check every golden case"),   # regen's own help
])
def test_golden_action_help_is_its_own(capsys, action, has, lacks):
    with pytest.raises(SystemExit) as info:
        main(["golden", action, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: mok golden {action} ") and has in out and lacks not in out, out


def test_diff_grads_help_gives_every_option_a_text_and_its_default(capsys):
    with pytest.raises(SystemExit):
        main(["diff-grads", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for flag, default in (("--seeds", "0 1 2"), ("--world-sizes", "1 2 4"), ("--reruns", "2"), ("--threads", "1"),
                          ("--device", "cpu"), ("--routing", "random")):
        text = out.split(f" {flag} ", 1)[1]
        assert f"(default: {default})" in text.split(" --", 1)[0], (flag, text[:200])


def test_version(capsys):
    import mok

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"mok {mok.__version__}"


@pytest.mark.parametrize("module", [
    "tqdm",         # each module of the mok[harness] extra missing in turn: the progress bars
    "safetensors",  # the golden files' format
    "numpy",        # the golden hashes (tensor.numpy())
])
def test_missing_harness_extra_exits_2(monkeypatch, capsys, module):
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now raises ImportError
    assert main(["verify"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"missing: {module}" in err and f"pip install {module} " in err and "pip install -e '.[harness]'" in err


def _fake_checks():
    return [("always equal", lambda: (True, "ok")), ("planted mismatch", lambda: (False, "y: 1 differs"))]


def test_verify_json_lines(monkeypatch, capsys):
    monkeypatch.setattr(verify, "cpu_checks", _fake_checks)
    assert main(["verify", "--json"]) == 1
    recs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r.get("check") for r in recs[:2]] == ["always equal", "planted mismatch"]
    assert [r["ok"] for r in recs] == [True, False, False]
    assert recs[1]["detail"] == "y: 1 differs" and all(r["command"] == "verify" for r in recs)
    assert recs[2]["summary"] is True and (recs[2]["passed"], recs[2]["failed"]) == (1, 1)


def test_verify_quiet_prints_failures_only(monkeypatch, capsys):
    monkeypatch.setattr(verify, "cpu_checks", _fake_checks)
    assert main(["verify", "-q"]) == 1
    out = capsys.readouterr().out
    assert "planted mismatch" in out and "always equal" not in out and "1 passed, 1 failed" in out
    assert "mok verify --device" not in out


def test_verify_quiet_when_all_pass(monkeypatch, capsys):
    monkeypatch.setattr(verify, "cpu_checks", lambda: _fake_checks()[:1])
    assert main(["verify", "--quiet"]) == 0
    assert capsys.readouterr().out.strip() == "1 passed, 0 failed"


def test_golden_check_json_lines(monkeypatch, capsys):
    import mok.cli.golden as golden

    def fake(golden_dir, device="cpu", world_sizes=None, on_case=None):
        reports = [golden.CaseReport("base"), golden.CaseReport("k1", [("k1.safetensors", "missing")])]
        for r in reports:
            on_case(r)
        return reports

    monkeypatch.setattr(golden, "check_all", fake)
    assert main(["golden", "check", "--json"]) == 1
    recs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert recs[0] == {"command": "golden check", "case": "base", "ok": True, "problems": []}
    assert recs[1]["problems"] == [{"what": "k1.safetensors", "problem": "missing"}]
    assert recs[2]["summary"] is True and recs[2]["failed"] == 1 and recs[2]["package_dir"] is True


def _fake_world(inputs, W, impl="reference", device="cpu", threads=1):
    from mok.testing.runner import run_sharded
    return [run_sharded(inputs, 0, 1, None)]


def test_diff_grads_json_lines(monkeypatch, capsys):
    monkeypatch.setattr(diffgrads, "run_world", _fake_world)
    assert main(["diff-grads", "--config", "tiny", "--seeds", "0", "1", "--world-sizes", "1", "--json"]) == 0
    recs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["name"] for r in recs[:-1]] == list(diffgrads.OUTPUT_NAMES)
    assert all(r["ok"] and r["rerun_diff"] == 0 and r["world_diff"] == 0 for r in recs[:-1])
    assert recs[-1]["summary"] is True and recs[-1]["ok"] is True and recs[-1]["world_sizes"] == [1]


def test_diff_grads_worker_failure_exits_1_with_one_line(monkeypatch, capsys):
    from mok.testing.dist import WorkerError

    def failing(*a, **k):
        raise WorkerError(1, "ValueError: something broke", [1])

    monkeypatch.setattr(diffgrads, "run_world", failing)
    assert main(["diff-grads", "--config", "tiny", "--world-sizes", "2", "--no-progress"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == "mok diff-grads: a run failed: rank 1: ValueError: something broke"


def test_golden_regen_json_lines(tmp_path, capsys):
    assert main(["golden", "regen", "--dir", str(tmp_path / "g"), "--json"]) == 0
    recs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["case"], r["status"], r["ok"]) for r in recs[:-1]] == [(c.name, "written", True) for c in CASES]
    assert recs[-1]["summary"] is True and recs[-1]["refused"] == 0


def test_golden_regen_names_a_case_it_drops(tmp_path, capsys):
    """A manifest entry for a case this mok version does not list is left out of the new manifest, and said so."""
    import mok.cli.golden as golden

    d = tmp_path / "g"
    assert main(["golden", "regen", "--dir", str(d)]) == 0
    old = golden.read_manifest(d)["cases"]
    golden.write_manifest({**old, "gone": old[CASES[0].name]}, d)
    capsys.readouterr()
    assert main(["golden", "regen", "--dir", str(d), "--quiet"]) == 0
    assert capsys.readouterr().out.splitlines() == ["manifest.json: dropped case 'gone' (not in this mok version's "
                                                    "case list)"]
    assert sorted(golden.read_manifest(d)["cases"]) == sorted(c.name for c in CASES)


@pytest.mark.parametrize("fail_on, done, left", [
    # the second case's file: the first is written and in the manifest, the rest not regenerated
    (CASES[1].file, [CASES[0].name], [c.name for c in CASES[1:]]),
    # the manifest itself, after every case file was written
    ("manifest.json", [c.name for c in CASES], []),
])
def test_golden_regen_write_failure_is_one_line_and_status_1(fail_on, done, left, tmp_path, capsys, monkeypatch):
    """A full disk after the directory check: no traceback, the file named, and a manifest that describes the
    files on disk (was: an OSError traceback)."""
    import errno

    import mok.cli.files as files
    import mok.cli.golden as golden

    real = files.write_atomic

    def full_disk(path, data):
        if path.name == fail_on:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data)

    d = tmp_path / "g"
    assert main(["golden", "regen", "--dir", str(d)]) == 0  # a complete set first
    old = golden.read_manifest(d)["cases"]
    for c in CASES[1:]:  # then the cases past the first are stale: a manifest entry whose file is not the case's
        old[c.name] = {**old[c.name], "stale": True}
    old["gone"] = dict(old[CASES[0].name])  # a case this mok version no longer lists
    golden.write_manifest(old, d)
    for c in CASES:
        (d / c.file).unlink()
    capsys.readouterr()
    monkeypatch.setattr(golden, "write_atomic", full_disk)
    assert main(["golden", "regen", "--dir", str(d), "--json"]) == 1
    cap = capsys.readouterr()
    err = cap.err.strip()
    assert err.startswith(f"mok golden regen: could not read or write {str(d / fail_on)!r} (OSError: No space left on "
                          f"device); {len(left)} case(s) not regenerated"), err
    assert "Traceback" not in cap.err and len(err.splitlines()) == 1
    summary = json.loads(cap.out.splitlines()[-1])
    assert summary["ok"] is False and summary["not_regenerated"] == left
    dropped = [r["dropped_case"] for r in map(json.loads, cap.out.splitlines()) if "dropped_case" in r]
    on_disk = sorted(p.name for p in d.glob("*.safetensors"))
    assert on_disk == sorted(c.file for c in CASES if c.name in done)
    entries = golden.read_manifest(d)["cases"]
    if fail_on != "manifest.json":  # rewritten: fresh entries for the cases done, the old ones for those not reached
        assert sorted(entries) == sorted(c.name for c in CASES)
        assert [c.name for c in CASES if entries[c.name].get("stale")] == left
        assert dropped == ["gone"]  # left out of the rewritten manifest, and said (was: silently)
    else:  # the old manifest, untouched
        assert entries == old and dropped == []

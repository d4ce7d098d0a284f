"""The `mok` command: verify's verdict and exit status, diff-grads' table and exit status."""

import subprocess
import sys

import pytest
import torch

import mok.harness.diffgrads as diffgrads
import mok.harness.verify as verify
from mok.harness.cli import main


@pytest.mark.slow
def test_mok_verify_passes_end_to_end():
    r = subprocess.run([sys.executable, "-m", "mok.harness.cli", "verify", "--no-progress"],
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

    def fake_run(inputs, W, device="cpu", threads=1):
        from mok.harness.runner import run_sharded
        calls["n"] += 1
        outs = [run_sharded(inputs, r, 1, None) for r in range(1)]
        if calls["n"] == 2:
            outs[0]["d_x"] = outs[0]["d_x"].clone()
            outs[0]["d_x"].view(-1)[5] = outs[0]["d_x"].view(-1)[5] * 2 + 1
        return outs

    monkeypatch.setattr(diffgrads, "run_reference_world", fake_run)
    assert main(["diff-grads", "--config", "tiny", "--seeds", "0", "1", "--world-sizes", "1", "--no-progress"]) == 1
    out = capsys.readouterr().out
    line = next(l for l in out.splitlines() if l.startswith("d_x "))
    assert "1 differ" in line and "FAIL" in line


def test_diff_grads_needs_two_seeds():
    with pytest.raises(ValueError, match="seeds"):
        diffgrads.diff_grads(diffgrads.MoEConfig(4, 8, 4, 2, 1), [0], [1])

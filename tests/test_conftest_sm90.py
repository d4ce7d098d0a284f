"""tests/conftest.py's rule for `sm90` tests, run on a stand-in machine: skip without an sm_90 GPU, error in setup
(with the reason) when one is present but mok.fast cannot run, run otherwise."""

from pathlib import Path

import pytest
import torch

import mok.fast
import mok.fast._build

pytest_plugins = ["pytester"]

CONFTEST = (Path(__file__).parent / "conftest.py").read_text()
TESTS = """
import pytest

@pytest.mark.sm90
def test_fast_thing():
    pass

def test_cpu_thing():
    pass
"""


def _machine(monkeypatch, *, cuda: bool, sm90: bool, fast: tuple[bool, str]):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(mok.fast._build, "sm90_problem", lambda dev: None if sm90 else "compute capability 8.0")
    monkeypatch.setattr(mok.fast, "is_available", lambda device=None: fast)


@pytest.mark.parametrize("cuda, sm90, fast, outcome, words", [
    (False, False, (False, "no CUDA GPU is visible"), dict(skipped=1), "no CUDA GPU"),  # CPU box (CI): skip
    (True, False, (False, "compute capability 8.0"), dict(skipped=1), "compute capability 8.0"),  # A100: skip
    # H100 without nvcc or CUTLASS: a setup error naming the cause, not a skip
    (True, True, (False, "nvcc was not found"), dict(errors=1), "nvcc was not found"),
    (True, True, (True, "sm_90 GPU, library loaded"), dict(passed=1), None),  # H100 with mok.fast: it runs
])
def test_sm90_tests_skip_fail_or_run(pytester, monkeypatch, cuda, sm90, fast, outcome, words):
    _machine(monkeypatch, cuda=cuda, sm90=sm90, fast=fast)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(TESTS)
    result = pytester.runpytest_inprocess("-rsf", "-p", "no:cacheprovider")
    expected = dict(passed=0, skipped=0, failed=0, errors=0)
    expected.update(outcome)
    expected["passed"] += 1  # the unmarked test always runs
    result.assert_outcomes(**expected)
    if words:
        assert words in result.stdout.str(), result.stdout.str()

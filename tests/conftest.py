"""Shared pytest setup: tests marked `gpu` skip without a CUDA device; tests marked `sm90` skip without an sm_90 GPU
(H100/H200), with the reason. On an sm_90 GPU they run, and when `mok.fast.is_available()` says the fast path
cannot (no nvcc or CUTLASS headers to build the library, a MOK_FAST_LIB that is not a file) each of them errors in
setup with that reason: a Hopper test run whose every fast-path test skipped would pass and prove nothing.

Hypothesis draws the same examples on every run (profile "deterministic": a failure on CI reproduces anywhere);
HYPOTHESIS_PROFILE=explore draws new ones each run."""

import os

import pytest
import torch

try:
    from hypothesis import settings
except ImportError:  # the hypothesis tests import it themselves and fail there, saying so
    settings = None
else:
    settings.register_profile("deterministic", derandomize=True, print_blob=True)
    settings.register_profile("explore", print_blob=True)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))


def _sm90_status() -> tuple[str, str]:
    """("skip" | "fail" | "run", reason) for the sm90-marked tests of this session."""
    from mok.fast import is_available
    from mok.fast._build import sm90_problem

    if not torch.cuda.is_available():
        return "skip", "needs an sm_90 GPU: no CUDA GPU is visible"
    problem = sm90_problem(torch.device("cuda", torch.cuda.current_device()))
    if problem:
        return "skip", problem
    ok, reason = is_available()
    return ("run", reason) if ok else ("fail", f"an sm_90 GPU is present but mok.fast cannot run: {reason}")


def pytest_collection_modifyitems(config, items):
    has_cuda = torch.cuda.is_available()
    sm90 = None  # (what, reason), asked once and only when an sm90 test is collected
    for item in items:
        if item.get_closest_marker("gpu") and not has_cuda:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        elif item.get_closest_marker("sm90"):
            if sm90 is None:
                sm90 = _sm90_status()
            if sm90[0] == "skip":
                item.add_marker(pytest.mark.skip(reason=f"needs mok.fast: {sm90[1]}"))
            elif sm90[0] == "fail":
                item.user_properties.append(("mok_fast_unusable", sm90[1]))


def pytest_runtest_setup(item):
    for key, reason in item.user_properties:
        if key == "mok_fast_unusable":
            pytest.fail(reason, pytrace=False)


@pytest.fixture(scope="session")
def mok_binding():
    """mok.fast's binding (csrc/python_api.cpp: its Operand, Segment and checks), built once against this torch and
    cached, before the tests that use it (here, and in the ranks they spawn); they skip, saying why, only when no C++
    compiler is present to build it."""
    from mok.fast import _build

    try:
        _build.find_cxx()
    except _build.FastPathUnavailable as e:
        pytest.skip(str(e))
    return _build.binding()

"""tests/gpu/sanitizer_log.py against compute-sanitizer output: two recorded failing runs (tests/fixtures/) and clean summaries of one
and of several processes."""
from pathlib import Path

import pytest

from sanitizer_log import summary_problem

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CLEAN_MEMCHECK = "========= COMPUTE-SANITIZER\nSANITIZER_SCRIPT_DONE\n========= ERROR SUMMARY: 0 errors\n"
CLEAN_RACECHECK = ("========= COMPUTE-SANITIZER\nSANITIZER_SCRIPT_DONE\n"
                   "========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n")


@pytest.mark.parametrize("log, tool, problem", [
    (CLEAN_MEMCHECK, "memcheck", None),  # one process, clean
    (CLEAN_RACECHECK, "racecheck", None),  # one process, clean
    (CLEAN_MEMCHECK * 3, "memcheck", None),  # a parent and two ranks (W = 2), all clean
    # one rank of three with an error: the old check ("0 errors" somewhere in the log) passed this
    (CLEAN_MEMCHECK * 2 + "========= ERROR SUMMARY: 1 error\n", "memcheck", "not all zero"),
    # hazards that are warnings only: --error-exitcode does not fire on them, the summary count does
    (CLEAN_RACECHECK + "========= RACECHECK SUMMARY: 2 hazards displayed (0 errors, 2 warnings)\n", "racecheck",
     "not all zero"),
    ("SANITIZER_SCRIPT_DONE\n", "memcheck", "no memcheck summary"),  # the tool printed nothing: not a pass
    (CLEAN_MEMCHECK, "racecheck", "no racecheck summary"),  # a memcheck log read as racecheck's
])
def test_summary_problem(log, tool, problem):
    got = summary_problem(log, tool)
    assert (got is None) if problem is None else (got is not None and problem in got), got


@pytest.mark.parametrize("name, tool", [
    ("racecheck_hazards.txt", "racecheck"),  # a row-skip branch of the d_x kernel: 100 hazards (129 errors)
    ("memcheck_out_of_bounds.txt", "memcheck"),  # a gather reading past a K = 2 table
])
def test_recorded_failing_sanitizer_runs_are_caught(name, tool):
    assert "not all zero" in summary_problem((FIXTURES / name).read_text(errors="replace"), tool)


def test_unknown_tool_is_refused():
    with pytest.raises(ValueError, match="^tool: expected one of"):
        summary_problem(CLEAN_MEMCHECK, "synccheck")

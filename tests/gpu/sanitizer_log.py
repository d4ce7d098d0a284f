"""Reading compute-sanitizer's summaries (test helper, never shipped): tests/gpu/test_fast_sanitizer.py runs the tool
over several processes (`--target-processes all`), and each prints its own summary, so a clean run is one where every
summary of the tool counts zero, not one where some process's does."""
import re

# memcheck: "ERROR SUMMARY: 0 errors"; racecheck: "RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)"
SUMMARY = {"memcheck": re.compile(r"ERROR SUMMARY: (\d+) errors?\b"),
           "racecheck": re.compile(r"RACECHECK SUMMARY: (\d+) hazards?\b")}


def summary_problem(log: str, tool: str) -> str | None:
    """None when `log` (compute-sanitizer's stdout + stderr) holds at least one summary of `tool` ("memcheck" or
    "racecheck") and every one counts 0 (a racecheck hazard counts whether it is an error or a warning; memcheck's
    "N errors were not printed" line counts too); else what is wrong."""
    if tool not in SUMMARY:
        raise ValueError(f"tool: expected one of {sorted(SUMMARY)}, got {tool!r}")
    counts = [int(n) for n in SUMMARY[tool].findall(log)]
    if not counts:
        return f"no {tool} summary in the log"
    if any(counts):
        return f"{tool} summaries count {counts}: not all zero"
    return None

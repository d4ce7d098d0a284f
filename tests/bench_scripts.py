"""What the benchmark and device-script tests share: where benchmarks/ is, energy_probe.py's workload parser with
every config it knows, and the words a device script's printing step prints."""
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def energy_probe():
    """(energy_probe.parse_workload, {name: config} of configs.json and suite.json)."""
    sys.path.insert(0, str(BENCH))
    from bench_moe import CONFIGS, SUITE, load_configs
    from energy_probe import parse_workload

    return parse_workload, {c["name"]: c for c in load_configs(CONFIGS) + load_configs(SUITE)}


def script_step(script: str, step: str, tmp_path) -> list[str]:
    """The words `bash benchmarks/<script> <step>` prints (a step that runs nothing); it must exit 0."""
    r = subprocess.run(["bash", str(BENCH / script), step], capture_output=True, text=True, cwd=BENCH.parent,
                       env={**os.environ, "OUT": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    return r.stdout.split()

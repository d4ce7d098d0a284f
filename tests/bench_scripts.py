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


def forced_kind_pairs(script: str, step: str, tmp_path, kind: int, variant: str, n_pairs: int):
    """The configs of `bash benchmarks/<script> <step>`'s workloads, checked to be `n_pairs` pairs of one mok
    config: first as the rule runs it (nothing forced), then with only GEMM kind `kind` (MOK_FAST_GEMM_VARIANT's
    entry in MokGemmKind order) forced to `variant`."""
    parse, configs = energy_probe()
    parsed = [parse(s, configs) for s in script_step(script, step, tmp_path)]
    assert len(parsed) == 2 * n_pairs and all(k == "mok" for k, _, _ in parsed), parsed
    from mok.fast._lib import GEMM_KINDS

    forced = [""] * len(GEMM_KINDS)
    forced[kind] = variant
    for (_, c0, env0), (_, c1, env1) in zip(parsed[::2], parsed[1::2]):
        assert c0 == c1 and env0 == {}, (c0, c1, env0)
        assert env1["MOK_FAST_GEMM_VARIANT"].split(",") == forced, env1
    return [c for _, c, _ in parsed[::2]]

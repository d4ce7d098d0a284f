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


def row_tiled_kinds() -> tuple[int, ...]:
    """The GEMM kinds whose rows are M (forward, down, d_x, the fused gate/up and d_a): all but the weight
    gradients' (GEMM_TT_F32, GEMM_TT_BF16, GEMM_TT_F32_SMALL)."""
    from mok.fast import _lib

    return tuple(k for k in _lib.GEMM_KINDS.values()
                 if k not in (_lib.GEMM_TT_F32, _lib.GEMM_TT_BF16, _lib.GEMM_TT_F32_SMALL))


def forced_entries(kinds, variant: str) -> list[str]:
    """MOK_FAST_GEMM_VARIANT's entries (MokGemmKind order) forcing each kind in `kinds` to `variant`, the rest empty."""
    from mok.fast._lib import GEMM_KINDS

    return [variant if k in kinds else "" for k in range(len(GEMM_KINDS))]


def forced_kind_pairs(script: str, step: str, tmp_path, kind, variant: str, n_pairs: int):
    """The configs of `bash benchmarks/<script> <step>`'s workloads, checked to be `n_pairs` pairs of one mok
    config: first as the rule runs it (nothing forced), then with only GEMM kind `kind` (an int, or a tuple of
    kinds; MOK_FAST_GEMM_VARIANT's entries in MokGemmKind order) forced to `variant`."""
    forced = forced_entries(kind if isinstance(kind, tuple) else (kind,), variant)
    return forced_kind_groups(script, step, tmp_path, [forced], n_pairs)


def forced_kind_groups(script: str, step: str, tmp_path, wants: list[list[str]], n_shapes: int):
    """The configs of `bash benchmarks/<script> <step>`'s workloads, checked to be `n_shapes` groups of one mok
    config each: first as the rule runs it (nothing forced), then once with each of `wants` as
    MOK_FAST_GEMM_VARIANT's entries (`forced_entries`), in that order."""
    parse, configs = energy_probe()
    parsed = [parse(s, configs) for s in script_step(script, step, tmp_path)]
    size = 1 + len(wants)
    assert len(parsed) == size * n_shapes and all(k == "mok" for k, _, _ in parsed), parsed
    for i in range(0, len(parsed), size):
        (_, c0, env0), *rest = parsed[i:i + size]
        assert env0 == {} and all(c == c0 for _, c, _ in rest), parsed[i:i + size]
        assert [env["MOK_FAST_GEMM_VARIANT"].split(",") for _, _, env in rest] == wants, rest
    return [c for _, c, _ in parsed[::size]]

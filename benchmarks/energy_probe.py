"""Energy per step under the GPU's power limit: what a training loop meets when it runs for seconds, not bursts.

For each workload it first times a burst as `bench_moe.py` does (3 warm-ups, median of 10 queued, after --cool
seconds idle), then runs it back to back for --seconds and reads NVML's energy counter (mJ) and the SM clock
between chunks of about 0.25 s of calls. Printed per workload: burst ms, steady ms (the calls after the first
second), J per call, mean W, mean SM MHz, and TFLOP/s in both regimes (FLOPs as configs.json counts them; the
matmul: 2·8192³).
Workloads: `matmul` (one 8192³ bf16 product: bench_moe's peak), `mok:<config>` (mok.fast fwd+bwd, gate and up
as one tensor, bf16 weight gradients), `fused:<config>` / `unfused:<config>` (the same with
MOK_FAST_FUSE_SWIGLU_BWD=1 / =0), `grouped_mm:<config>` (the grouped_mm path), `dense:<config>` (the step's
products as dense cuBLAS matmuls of all its rows, `dense_floor.py`: a floor for GEMMs at cuBLAS's rate),
`sonic:<config>` (SonicMoE's layer on the same inputs, `sonic_peer.py`; configs without a shared expert).
`<config>@S0` drops the shared expert, `@balanced` routes every expert the same number of rows
(`bench_moe.bench_routing`; not for `dense:`, which has no routing); `+VAR=VALUE` after it sets an environment
variable for that workload's calls (e.g. `mok:qwen3-30b-a3b+MOK_FAST_GEMM_VARIANT=2`). CUDA only.

`--rounds N` runs the list N times, every second round in reverse order (so that a drift of the GPU's state
over the call weighs on every workload alike), and ends with each workload's median and range over the rounds.
`--preset issue13` runs the matmul and the four shapes of issue 13 and ends with its targets (`targets.py`);
`--preset issue13-sonic` also runs SonicMoE on each shape and ends with mok against it, side by side.

Usage: python benchmarks/energy_probe.py [workload ...] [--preset issue13|issue13-sonic] [--seconds 4] [--cool 2]
       [--rounds 1]
"""
from __future__ import annotations

import argparse
import ctypes
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dense_floor import dense_products, dense_step  # noqa: E402
from bench_moe import CONFIGS, SUITE, Method, load_configs, make_bench_inputs, timed  # noqa: E402
from mok.fast import _tiles  # noqa: E402
from sonic_peer import require_sonic  # noqa: E402
from targets import PRESETS, side_by_side_rows, target_rows  # noqa: E402

DEFAULT = ["matmul", "mok:qwen3-30b-a3b", "grouped_mm:qwen3-30b-a3b", "mok:mixtral-8x7b", "matmul"]


class Nvml:
    """The few NVML calls used here, through ctypes (no pynvml on the device machine)."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        self._ok(self.lib.nvmlInit_v2())
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        bus = f"{p.pci_domain_id:08x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0".encode()
        self.dev = ctypes.c_void_p()
        self._ok(self.lib.nvmlDeviceGetHandleByPciBusId_v2(ctypes.c_char_p(bus), ctypes.byref(self.dev)))

    @staticmethod
    def _ok(rc: int) -> None:
        if rc != 0:
            raise RuntimeError(f"NVML call failed with code {rc}")

    def energy_mj(self) -> int:
        v = ctypes.c_ulonglong()
        self._ok(self.lib.nvmlDeviceGetTotalEnergyConsumption(self.dev, ctypes.byref(v)))
        return v.value

    def sm_mhz(self) -> int:
        v = ctypes.c_uint()
        self._ok(self.lib.nvmlDeviceGetClockInfo(self.dev, 1, ctypes.byref(v)))  # NVML_CLOCK_SM
        return v.value


KINDS = ("mok", "fused", "unfused", "grouped_mm", "dense", "sonic")


def parse_workload(spec: str, configs: dict) -> tuple[str, dict | None, dict]:
    """(kind, layer config or None for the matmul, environment settings) of a workload spec
    `kind:config[@S0][+VAR=VALUE...]` or `matmul`; ValueError naming the spec for anything else."""
    if spec == "matmul":
        return "matmul", None, {}
    kind, sep, rest = spec.partition(":")
    if not sep or kind not in KINDS:
        raise ValueError(f"workload {spec!r}: expected 'matmul' or KIND:CONFIG with KIND one of {', '.join(KINDS)}")
    name, *settings = rest.split("+")
    if any("=" not in e or e.startswith("=") for e in settings):
        raise ValueError(f"workload {spec!r}: settings after the config are +VAR=VALUE")
    env = dict(e.split("=", 1) for e in settings)
    base, *tails = name.split("@")
    if base not in configs:
        raise ValueError(f"workload {spec!r}: no config {base!r} in configs.json or suite.json")
    if any(t not in ("S0", "balanced") for t in tails):
        raise ValueError(f"workload {spec!r}: only '@S0' and '@balanced' may follow the config name")
    c = dict(configs[base], routing="balanced" if "balanced" in tails else "random")
    if "S0" in tails:
        c["S"] = 0
    if kind == "dense" and "balanced" in tails:
        raise ValueError(f"workload {spec!r}: a dense floor has no routing to balance")
    if kind == "sonic" and c["S"]:
        raise ValueError(f"workload {spec!r}: SonicMoE's layer has no shared expert; add '@S0'")
    if kind in ("fused", "unfused"):
        env[_tiles.FUSE_ENV] = "1" if kind == "fused" else "0"
    return kind, c, env


def workload(spec: str, configs: dict):
    """(fn, FLOPs per call) for one workload spec (`parse_workload`)."""
    kind, c, env = parse_workload(spec, configs)
    if c is None:
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        return (lambda: a @ b), 2 * 8192**3
    flops = 3 * 6 * c["H"] * (c["T"] * c["K"] * c["I"] + c["T"] * c["S"])
    if kind == "dense":
        return dense_step(dense_products(c)), flops
    inputs = make_bench_inputs(c, c["routing"])
    meth = Method(kind if kind in ("grouped_mm", "sonic") else "mok_gu", inputs, torch.bfloat16)

    def fn():
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            meth.fwd_bwd()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return fn, flops


def measure(fn, nvml: Nvml, seconds: float, cool: float) -> dict:
    """Burst ms (bench_moe's protocol after `cool` s idle), then steady ms, J, W, MHz over `seconds` back to back."""
    fn()
    torch.cuda.synchronize()
    time.sleep(cool)
    burst = timed(fn, 3, 10, "stream")
    chunks = []  # (t_host, energy_mj, calls so far, sm MHz)
    t0, n = time.time(), 0
    chunks.append((t0, nvml.energy_mj(), 0, nvml.sm_mhz()))
    per_chunk = max(5, math.ceil(250.0 / burst))  # ~0.25 s of work between the host's reads
    while time.time() - t0 < seconds:
        for _ in range(per_chunk):
            fn()
        n += per_chunk
        torch.cuda.synchronize()
        chunks.append((time.time(), nvml.energy_mj(), n, nvml.sm_mhz()))
    settled = [c for c in chunks if c[0] - t0 >= 1.0]
    if len(settled) < 2:
        raise RuntimeError(f"--seconds {seconds} leaves fewer than two chunks after the first second")
    (ta, ea, na, _), (tb, eb, nb, _) = settled[0], settled[-1]
    calls = nb - na
    return {"burst_ms": burst, "steady_ms": (tb - ta) * 1e3 / calls, "j": (eb - ea) / 1e3 / calls,
            "w": (eb - ea) / 1e3 / (tb - ta), "mhz": sum(c[3] for c in settled) / len(settled)}


def round_order(specs: list[str], rounds: int) -> list[tuple[int, str]]:
    """(round, spec) in the order they run: round r takes the list as given when r is even, reversed when odd."""
    if rounds < 1:
        raise ValueError(f"--rounds: expected an integer >= 1, got {rounds}")
    return [(r, spec) for r in range(rounds) for spec in (specs if r % 2 == 0 else specs[::-1])]


def summarize(results: list[tuple[str, dict]]) -> list[str]:
    """Markdown rows, one per distinct spec in first-seen order: rounds, and the median (min-max) of burst and
    steady ms over them."""
    by_spec: dict[str, list[dict]] = {}
    for spec, r in results:
        by_spec.setdefault(spec, []).append(r)

    def cell(values: list[float]) -> str:
        return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"

    return [f"| {spec} | {len(rs)} | {cell([r['burst_ms'] for r in rs])} | {cell([r['steady_ms'] for r in rs])} |"
            for spec, rs in by_spec.items()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workloads", nargs="*")
    ap.add_argument("--preset", choices=tuple(PRESETS),
                    help="issue 13's workloads (after any given), and its targets; issue13-sonic: SonicMoE beside them")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--cool", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    if a.preset:
        a.workloads = a.workloads + PRESETS[a.preset]
    a.workloads = a.workloads or DEFAULT
    configs = {x["name"]: x for x in load_configs(CONFIGS) + load_configs(SUITE)}
    for spec in a.workloads:  # every spec checked before the first one runs
        if parse_workload(spec, configs)[0] == "sonic":
            require_sonic(f"workload {spec!r}")
    order = round_order(a.workloads, a.rounds)
    nvml = Nvml()
    print(f"{torch.cuda.get_device_name()}; steady = calls back to back after the first of {a.seconds} s; "
          f"burst = 3 warm-ups + median of 10 queued, after {a.cool} s idle")
    print("| workload | burst ms | steady ms | burst TFLOP/s | steady TFLOP/s | J per call | mean W | mean SM MHz "
          "| GFLOP per J |")
    print("|---|---|---|---|---|---|---|---|---|")
    results, flops_of = [], {}
    for r, spec in order:
        fn, flops = workload(spec, configs)
        m = measure(fn, nvml, a.seconds, a.cool)
        results.append((spec, m))
        flops_of[spec] = flops
        name = spec if a.rounds == 1 else f"{spec} (round {r + 1})"
        print(f"| {name} | {m['burst_ms']:.2f} | {m['steady_ms']:.2f} | {flops / m['burst_ms'] / 1e9:.0f} | "
              f"{flops / m['steady_ms'] / 1e9:.0f} | {m['j']:.3f} | {m['w']:.0f} | {m['mhz']:.0f} | "
              f"{flops / m['j'] / 1e9:.0f} |", flush=True)
        del fn
        torch.cuda.empty_cache()
    if a.rounds > 1:
        print(f"\nover {a.rounds} rounds:")
        print("| workload | rounds | burst ms, median (min-max) | steady ms, median (min-max) |")
        print("|---|---|---|---|")
        print("\n".join(summarize(results)))
    if a.preset:
        print("\nissue 13's targets (benchmarks/targets.py):")
        print("\n".join(target_rows(results, flops_of)))
        side = side_by_side_rows(results)
        if side:
            print("\nmok against SonicMoE measured in this call (burst medians):")
            print("\n".join(side))


if __name__ == "__main__":
    main()

"""Golden files (SPEC §5): safetensors per case + golden/manifest.json with config, seed,
contract version and the sha256 of every tensor. The reference must reproduce them bit-exactly."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .bits import bit_diff
from .cases import LAYER_ARGS, OUTPUT_NAMES, MoEConfig, make_inputs
from ..reference import CONTRACT_VERSION

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"  # package data
INPUT_NAMES = LAYER_ARGS + ("dy",)

_B = dict(H=48, I=24, E=8)  # odd-ish sizes: every tree level has carries


@dataclass(frozen=True)
class GoldenCase:
    """One golden case: a config, a seed, a routing, and the world sizes that must give its bits."""

    name: str
    config: MoEConfig
    seed: int
    routing: str = "random"
    world_sizes: tuple = (1,)
    note: str = ""


CASES = (
    GoldenCase("base", MoEConfig(T=32, K=2, S=16, **_B), 1, world_sizes=(1, 2, 4), note="shared expert, W = 1, 2, 4"),
    GoldenCase("no_shared", MoEConfig(T=32, K=2, S=0, **_B), 2, world_sizes=(1, 2, 4), note="S = 0"),
    GoldenCase("k1", MoEConfig(T=16, K=1, S=16, **_B), 3, world_sizes=(1, 2), note="K = 1"),
    GoldenCase("k_eq_e", MoEConfig(T=16, K=8, S=0, **_B), 4, note="K = E"),
    GoldenCase("empty_expert", MoEConfig(T=24, K=3, S=16, **_B), 5, "empty_expert", (1, 4), "expert E-1 gets no token"),
    GoldenCase("one_expert", MoEConfig(T=16, K=1, S=0, **_B), 6, "one_expert", (1, 2), "all tokens on expert 0"),
    GoldenCase("t37", MoEConfig(T=37, K=3, S=16, **_B), 7, note="T = 37, not a multiple of anything"),
    GoldenCase("t1", MoEConfig(T=1, K=2, S=16, **_B), 8, note="T = 1"),
)


def tensor_sha256(t: torch.Tensor) -> str:
    """sha256 over dtype, shape and the raw little-endian bytes."""
    t = t.detach().contiguous().cpu()
    h = hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def compute_case(case: GoldenCase, device="cpu") -> dict:
    """Inputs drawn from the case's seed plus the reference's outputs (W = 1), CPU tensors, no Nones."""
    from .runner import run_layer

    inputs = make_inputs(case.config, case.seed, case.routing, device=device)
    outputs = run_layer(inputs)
    both = {**inputs, **outputs}
    return {k: v.cpu().contiguous() for k, v in both.items() if v is not None}


def manifest_entry(case: GoldenCase, tensors: dict) -> dict:
    return {
        "config": case.config.as_dict(), "seed": case.seed, "routing": case.routing,
        "world_sizes": list(case.world_sizes), "note": case.note, "contract_version": CONTRACT_VERSION,
        "file": f"{case.name}.safetensors", "sha256": {k: tensor_sha256(v) for k, v in sorted(tensors.items())},
    }


def load_manifest(golden_dir: Path = GOLDEN_DIR) -> dict:
    path = Path(golden_dir) / "manifest.json"
    if not path.exists():
        raise FileNotFoundError(f"golden_dir: expected {path} to exist; run `mok golden regen`")
    return json.loads(path.read_text())


def load_case(name: str, golden_dir: Path = GOLDEN_DIR) -> tuple[dict, dict]:
    """(inputs, expected outputs) of a stored case; absent shared tensors come back as None."""
    entry = load_manifest(golden_dir)["cases"][name]
    stored = load_file(str(Path(golden_dir) / entry["file"]))
    inputs = {k: stored.get(k) for k in INPUT_NAMES}
    outputs = {k: stored.get(k) for k in OUTPUT_NAMES}
    return inputs, outputs


@dataclass
class CaseReport:
    """Result of checking or regenerating one case: a list of (tensor, problem) lines."""

    name: str
    problems: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def check_case(name: str, golden_dir: Path = GOLDEN_DIR, device="cpu", world_sizes=None) -> CaseReport:
    """Reproduce a stored case from its stored inputs with the reference; compare every bit and hash."""
    from .dist import run_reference_world
    from .runner import run_layer, unshard_outputs

    report = CaseReport(name)
    entry = load_manifest(golden_dir)["cases"][name]
    if entry["contract_version"] != CONTRACT_VERSION:
        report.problems.append(("contract_version", f"file {entry['contract_version']}, code {CONTRACT_VERSION}"))
        return report
    stored = load_file(str(Path(golden_dir) / entry["file"]))
    for k, v in stored.items():
        if tensor_sha256(v) != entry["sha256"].get(k):
            report.problems.append((k, "sha256 differs from the manifest"))
    inputs, expected = load_case(name, golden_dir)
    for W in world_sizes or entry["world_sizes"]:
        if W == 1:
            moved = {k: (v.to(device) if v is not None else None) for k, v in inputs.items()}
            got = run_layer(moved)
        else:
            got = unshard_outputs(run_reference_world(inputs, W, device=device))
        for k in OUTPUT_NAMES:
            if (expected[k] is None) != (got[k] is None):
                report.problems.append((f"{k} (W={W})", "present in one and absent in the other"))
            elif expected[k] is not None:
                d = bit_diff(got[k].cpu(), expected[k])
                if not d.equal:
                    report.problems.append((f"{k} (W={W})", f"{d.n_diff} elements differ, first at {d.first_index}: "
                                                            f"{d.first_values[0]!r} vs golden {d.first_values[1]!r}"))
    return report


def regen_case(case: GoldenCase, golden_dir: Path = GOLDEN_DIR, force: bool = False) -> tuple[CaseReport, dict, bool]:
    """Recompute a case; write it if new, or if it differs and `force`. Returns (what changed, entry, written)."""
    tensors = compute_case(case)
    entry = manifest_entry(case, tensors)
    path = Path(golden_dir) / entry["file"]
    report = CaseReport(case.name)
    if path.exists():
        old = load_file(str(path))
        for k in sorted(set(old) | set(tensors)):
            if k not in old or k not in tensors:
                report.problems.append((k, "added" if k in tensors else "removed"))
            else:
                d = bit_diff(tensors[k], old[k])
                if not d.equal:
                    report.problems.append((k, f"{d.n_diff} elements differ (max {d.max_ulp} ULP), first at "
                                               f"{d.first_index}: new {d.first_values[0]!r} vs old {d.first_values[1]!r}"))
        if report.ok or not force:
            return report, entry, False
    Path(golden_dir).mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={"case": case.name, "contract_version": str(CONTRACT_VERSION)})
    return report, entry, True


def write_manifest(entries: dict, golden_dir: Path = GOLDEN_DIR) -> None:
    doc = {"contract_version": CONTRACT_VERSION,
           "about": "mok reference golden files; see docs/numerics.md. Regenerate with `mok golden regen`.",
           "cases": entries}
    (Path(golden_dir) / "manifest.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")

"""Golden files (docs/determinism.md, docs/reliability.md): safetensors per case + golden/manifest.json with config, seed,
precision (the recipe of docs/numerics.md), contract version and the sha256 of every tensor. The reference must reproduce them bit-exactly.

Which cases and world sizes exist is this module's `CASES`, never the manifest alone: a case missing
from the manifest or the directory is a failure, and so is every damaged file (reported as that case's
problem; the other cases are still checked). Files are written atomically (a temporary file, then
os.replace) with stable bytes (sorted metadata), so regenerating unchanged bits gives identical files.
The package's own goldens are package data: if they are missing, mok is not installed completely
(`GoldenInstallError`), which regenerating would not fix.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load as load_bytes

from ..testing.bits import bit_diff
from ..testing.cases import LAYER_ARGS, OUTPUT_NAMES, MoEConfig, make_inputs
from .files import FileProblem, read_bounded, remove_temp_files, safetensors_bytes, write_atomic
from .._resources import golden_dir
from ..reference import CONTRACT_VERSION

GOLDEN_DIR = golden_dir()  # the wheel's copy, or the repository's golden/ in a source checkout
MANIFEST = "manifest.json"
INPUT_NAMES = LAYER_ARGS + ("dy",)
# Bounds on what is read (each golden file is under 200 KiB, the manifest about 30 KiB): a golden file whose size is
# not the manifest's `bytes` is a failure, and read (to name what differs) only if at most MAX_CASE_BYTES; a larger
# one, and a manifest over MAX_MANIFEST_BYTES, are not read at all.
MAX_CASE_BYTES = 16 * 2**20
MAX_MANIFEST_BYTES = 2**20
MANIFEST_KEYS = ("about", "cases", "contract_version")  # every key of the manifest's top level

_B = dict(H=48, I=24, E=8)  # odd-ish sizes: every tree level has carries
_FP8_W = (1, 2)  # E = 2: one expert per rank at W = 2


@dataclass(frozen=True)
class GoldenCase:
    """One golden case: a config, a seed, a routing, the world sizes that must give its bits, and the recipe
    ("bf16" or "fp8", the layer's `precision`)."""

    name: str
    config: MoEConfig
    seed: int
    routing: str = "random"
    world_sizes: tuple = (1,)
    note: str = ""
    precision: str = "bf16"

    @property
    def file(self) -> str:
        return f"{self.name}.safetensors"


CASES = (
    GoldenCase("base", MoEConfig(T=32, K=2, S=16, **_B), 1, world_sizes=(1, 2, 4), note="shared expert, W = 1, 2, 4"),
    GoldenCase("no_shared", MoEConfig(T=32, K=2, S=0, **_B), 2, world_sizes=(1, 2, 4), note="S = 0"),
    GoldenCase("k1", MoEConfig(T=16, K=1, S=16, **_B), 3, world_sizes=(1, 2), note="K = 1"),
    GoldenCase("k_eq_e", MoEConfig(T=16, K=8, S=0, **_B), 4, note="K = E"),
    GoldenCase("empty_expert", MoEConfig(T=24, K=3, S=16, **_B), 5, "empty_expert", (1, 4), "expert E-1 gets no token"),
    GoldenCase("one_expert", MoEConfig(T=16, K=1, S=0, **_B), 6, "one_expert", (1, 2), "all tokens on expert 0"),
    GoldenCase("t37", MoEConfig(T=37, K=3, S=16, **_B), 7, note="T = 37, not a multiple of anything"),
    GoldenCase("t1", MoEConfig(T=1, K=2, S=16, **_B), 8, note="T = 1"),
    GoldenCase("fp8_base", MoEConfig(T=8, H=256, I=128, E=2, K=1, S=0), 9, world_sizes=_FP8_W, precision="fp8",
               note="FP8 recipe: whole 128 blocks, two along H, W = 1, 2"),
    GoldenCase("fp8_edges", MoEConfig(T=12, H=136, I=136, E=2, K=2, S=40), 10, world_sizes=_FP8_W, precision="fp8",
               note="FP8 recipe: H = I = 136, S = 40 (partial blocks at every edge), shared expert, W = 1, 2"),
)
CASE_BY_NAME = {c.name: c for c in CASES}


class GoldenInstallError(RuntimeError):
    """The package's golden files are missing: an incomplete mok installation."""


def require_installed(golden_dir: Path | None = None) -> None:
    """Raise GoldenInstallError when the package's golden files (manifest and every case) are not all there."""
    golden_dir = Path(GOLDEN_DIR if golden_dir is None else golden_dir)
    missing = [n for n in [MANIFEST] + [c.file for c in CASES] if not (golden_dir / n).is_file()]
    if missing:
        raise GoldenInstallError(
            f"golden files missing from {golden_dir}: {', '.join(missing)}. They are package data of mok (golden/ in the source tree), "
            f"so this mok installation is incomplete: reinstall mok from its source tree "
            f"(pip install --force-reinstall --no-deps '.[harness]', or -e for an editable install)")


def tensor_sha256(t: torch.Tensor) -> str:
    """sha256 over dtype, shape and the raw little-endian bytes."""
    t = t.detach().contiguous().cpu()
    h = hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def compute_case(case: GoldenCase, device="cpu") -> dict:
    """Inputs drawn from the case's seed plus the reference's outputs (W = 1), CPU tensors, no Nones."""
    from ..testing.runner import run_layer

    inputs = make_inputs(case.config, case.seed, case.routing, device=device)
    outputs = run_layer(inputs, precision=case.precision)
    both = {**inputs, **outputs}
    return {k: v.cpu().contiguous() for k, v in both.items() if v is not None}


def _case_meta(case: GoldenCase) -> dict:
    """The manifest fields that come from the case list (everything but the file's size and hashes)."""
    return {"config": case.config.as_dict(), "seed": case.seed, "routing": case.routing, "precision": case.precision,
            "world_sizes": list(case.world_sizes), "note": case.note, "contract_version": CONTRACT_VERSION,
            "file": case.file}


ENTRY_KEYS = ("bytes", "config", "contract_version", "file", "note", "precision", "routing", "seed", "sha256",
              "world_sizes")


def manifest_entry(case: GoldenCase, tensors: dict, size: int) -> dict:
    """The manifest entry of a file of `case` holding `tensors`, `size` bytes long."""
    return {**_case_meta(case), "bytes": size, "sha256": {k: tensor_sha256(v) for k, v in sorted(tensors.items())}}


def golden_paths() -> list[str]:
    """The names regen writes in a golden directory: the manifest and every case's file."""
    return [MANIFEST] + [c.file for c in CASES]


def remove_stale_temp_files(golden_dir: Path) -> tuple[list[str], list[tuple[str, str]]]:
    """Delete the temporary files a killed regen left in `golden_dir`: (names deleted, [(name, what it is)] of
    entries with such names that are not regular files, left in place)."""
    return remove_temp_files(golden_dir, golden_paths())


def case_bytes(case: GoldenCase, tensors: dict) -> bytes:
    return safetensors_bytes(tensors, {"case": case.name, "contract_version": str(CONTRACT_VERSION)})


def read_manifest(golden_dir: Path = GOLDEN_DIR) -> dict:
    """The parsed manifest, {"cases": {name: entry}, ...}. Raises ValueError naming the file and the problem
    (missing, not a regular file, over MAX_MANIFEST_BYTES, unreadable, not JSON, no "cases" object, a top-level key
    other than MANIFEST_KEYS, a contract version other than this mok version's)."""
    path = Path(golden_dir) / MANIFEST
    try:
        text = read_bounded(path, MAX_MANIFEST_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise ValueError(f"{path}: expected a golden manifest, the file does not exist") from None
    except FileProblem as e:
        raise ValueError(str(e)) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot read it ({e})") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: expected JSON, got invalid JSON ({e}; {len(text)} bytes)") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("cases"), dict):
        raise ValueError(f'{path}: expected an object with a "cases" object, got {type(doc).__name__} '
                         f'{"without" if isinstance(doc, dict) else "instead of"} "cases"')
    unknown = sorted(set(doc) - set(MANIFEST_KEYS))
    if unknown:
        raise ValueError(f"{path}: expected only the keys {list(MANIFEST_KEYS)} at the top level, got also {unknown}")
    if doc.get("contract_version") != CONTRACT_VERSION or isinstance(doc.get("contract_version"), bool):
        raise ValueError(f"{path}: contract_version: expected {CONTRACT_VERSION} (this mok version's numerics "
                         f"contract), got {doc.get('contract_version', 'none')!r}")
    return doc


load_manifest = read_manifest  # the name tests and tools used before


def load_case(name: str, golden_dir: Path = GOLDEN_DIR) -> tuple[dict, dict]:
    """(inputs, expected outputs) of a stored case; absent shared tensors come back as None."""
    case = _case(name)
    stored = load_bytes(read_bounded(Path(golden_dir) / case.file, MAX_CASE_BYTES))
    inputs = {k: stored.get(k) for k in INPUT_NAMES}
    outputs = {k: stored.get(k) for k in OUTPUT_NAMES}
    return inputs, outputs


def _case(name: str) -> GoldenCase:
    if name not in CASE_BY_NAME:
        raise ValueError(f"name: expected one of the golden cases {sorted(CASE_BY_NAME)}, got {name!r}")
    return CASE_BY_NAME[name]


# ---------------------------------------------------------------- checking


@dataclass
class CaseReport:
    """Result of checking or regenerating one case: a list of (what, problem) lines."""

    name: str
    problems: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _entry_problems(case: GoldenCase, entry) -> list:
    """How a manifest entry disagrees with the case list (and the hashes' layout)."""
    if not isinstance(entry, dict):
        return [(MANIFEST, f"expected an object for case {case.name!r}, got {type(entry).__name__}")]
    out = []
    unknown = sorted(set(entry) - set(ENTRY_KEYS))
    if unknown:
        out.append((MANIFEST, f"{case.name}: expected only the keys {list(ENTRY_KEYS)}, got also {unknown}"))
    size = entry.get("bytes")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= MAX_CASE_BYTES:
        out.append((MANIFEST, f"{case.name}.bytes: expected the file's size, an int in [1, {MAX_CASE_BYTES}], "
                              f"got {size!r}"[:200]))
    for key, want in _case_meta(case).items():
        if key == "note":
            continue
        if key not in entry:
            out.append((MANIFEST, f"{case.name}.{key}: missing"))
        elif entry[key] != want:
            out.append((MANIFEST, f"{case.name}.{key}: expected {want!r} (this mok version's case list), "
                                  f"got {entry[key]!r}"))
    sha = entry.get("sha256")
    if not isinstance(sha, dict):
        out.append((MANIFEST, f"{case.name}.sha256: expected an object of tensor hashes, got {sha!r}"[:200]))
    else:
        names = _expected_names(case)
        for k in sorted(set(sha) - names):
            out.append((MANIFEST, f"{case.name}.sha256: lists {k!r}, not a tensor of this case"[:200]))
        for k in sorted(names - set(sha)):
            out.append((MANIFEST, f"{case.name}.sha256: no hash for the tensor {k!r}"))
    return out


def _expected_names(case: GoldenCase) -> set:
    names = set(INPUT_NAMES) | set(OUTPUT_NAMES)
    if case.config.S == 0:
        names -= {"shared_gate", "shared_up", "shared_down", "d_shared_gate", "d_shared_up", "d_shared_down"}
    return names


def _reproduce(case: GoldenCase, stored: dict, W: int, device: str) -> dict:
    from ..testing.dist import run_reference_world
    from ..testing.runner import run_layer, unshard_outputs

    inputs = {k: stored.get(k) for k in INPUT_NAMES}
    if W == 1:
        return run_layer({k: (v.to(device) if v is not None else None) for k, v in inputs.items()},
                         precision=case.precision)
    return unshard_outputs(run_reference_world(inputs, W, device=device, precision=case.precision))


def _check(case: GoldenCase, golden_dir: Path, device: str, world_sizes, report: CaseReport) -> None:
    add = report.problems.append
    entry = None
    try:
        manifest = read_manifest(golden_dir)
    except ValueError as e:
        add((MANIFEST, str(e)))
    else:
        entry = manifest["cases"].get(case.name)
        if entry is None:
            add((MANIFEST, f"no entry for case {case.name!r}"))
        else:
            report.problems += _entry_problems(case, entry)
    path = golden_dir / case.file
    size = entry.get("bytes") if isinstance(entry, dict) else None
    try:
        data = read_bounded(path, MAX_CASE_BYTES)
    except FileNotFoundError:
        add((case.file, "missing"))
        return
    except FileProblem as e:  # not a regular file, or too large to be a golden file: not read
        if e.size is not None and not isinstance(size, bool) and isinstance(size, int):
            add((case.file, f"expected {size} bytes (the manifest's size), got {e.size} (not read)"))
        else:
            add((case.file, str(e).replace(f"{path}: ", "", 1)))
        return
    except OSError as e:
        add((case.file, f"cannot read it ({type(e).__name__}: {e.strerror or e})"))
        return
    if not isinstance(size, bool) and isinstance(size, int) and len(data) != size:
        add((case.file, f"expected {size} bytes (the manifest's size), got {len(data)}"))
    try:
        stored = load_bytes(data)
    except Exception as e:  # noqa: BLE001 - any damage (bad header, truncation) is this case's failure
        add((case.file, f"cannot read it as safetensors ({type(e).__name__}: {e})"))
        return
    names = _expected_names(case)
    for k in sorted(names - set(stored)):
        add((k, f"missing from {case.file}"))
    for k in sorted(set(stored) - names):
        add((k, f"in {case.file} but not a tensor of this case"))
    sha = entry.get("sha256") if isinstance(entry, dict) else None
    if isinstance(sha, dict):
        for k, v in sorted(stored.items()):
            if tensor_sha256(v) != sha.get(k):
                add((k, "sha256 differs from the manifest"))
    seeded = make_inputs(case.config, case.seed, case.routing)
    for k in INPUT_NAMES:
        if seeded[k] is not None and k in stored and not bit_diff(stored[k], seeded[k]).equal:
            add((k, f"differs from the input drawn from the case's seed {case.seed}"))
    if names - set(stored):
        return  # cannot run the layer on incomplete inputs
    for W in world_sizes or case.world_sizes:
        try:
            got = _reproduce(case, stored, W, device)
        except Exception as e:  # noqa: BLE001 - a failed run is this case's failure, with its message
            add((f"W={W}", f"{type(e).__name__}: {e}"))
            continue
        for k in OUTPUT_NAMES:
            want = stored.get(k)
            if (want is None) != (got[k] is None):
                add((f"{k} (W={W})", "present in one and absent in the other"))
            elif want is not None:
                d = bit_diff(got[k].cpu(), want)
                if not d.equal:
                    add((f"{k} (W={W})", f"{d.n_diff} elements differ, first at {d.first_index}: "
                                         f"{d.first_values[0]!r} vs golden {d.first_values[1]!r}"))


def check_case(name: str, golden_dir: Path = GOLDEN_DIR, device="cpu", world_sizes=None) -> CaseReport:
    """Check one case of `CASES` against `golden_dir`: its manifest entry against the case list, the file's
    tensors against the manifest's hashes and the case's seed, and the reference's outputs (for each W of
    `world_sizes`, default the case's) bit for bit. Every problem, damaged files included, is reported
    in the returned report; nothing is raised for a damaged directory."""
    case = _case(name)
    report = CaseReport(name)
    try:
        _check(case, Path(golden_dir), device, world_sizes, report)
    except Exception as e:  # noqa: BLE001 - anything unforeseen still fails this case only
        report.problems.append(("error", f"{type(e).__name__}: {e}"))
    return report


def check_all(golden_dir: Path = GOLDEN_DIR, device="cpu", world_sizes=None, on_case=None) -> list[CaseReport]:
    """`check_case` for every case of `CASES`, then one failed report per manifest case that `CASES` lacks.

    The package's own directory must be complete (`require_installed`). on_case(report) is called as each
    case finishes.
    """
    if Path(golden_dir).resolve() == GOLDEN_DIR:
        require_installed(golden_dir)
    reports = []
    for case in CASES:
        reports.append(check_case(case.name, golden_dir, device, world_sizes))
        if on_case:
            on_case(reports[-1])
    try:
        extra = sorted(set(read_manifest(golden_dir)["cases"]) - set(CASE_BY_NAME))
    except ValueError:
        extra = []  # already reported for every case
    for name in extra:
        reports.append(CaseReport(name, [(MANIFEST, "lists a case this mok version does not define")]))
        if on_case:
            on_case(reports[-1])
    return reports


# ---------------------------------------------------------------- regenerating


def _tensor_changes(new: dict, old: dict) -> list:
    out = []
    for k in sorted(set(old) | set(new)):
        if k not in old or k not in new:
            out.append((k, "added" if k in new else "removed"))
            continue
        d = bit_diff(new[k], old[k])
        if not d.equal:
            detail = f"dtype/shape {d.first_values[1]} -> {d.first_values[0]}" if d.n_diff < 0 else (
                f"{d.n_diff} elements differ (max {d.max_ulp} ULP), first at {d.first_index}: "
                f"new {d.first_values[0]!r} vs old {d.first_values[1]!r}")
            out.append((k, detail))
    return out


def regen_case(case: GoldenCase, golden_dir: Path = GOLDEN_DIR, force: bool = False, device="cpu"):
    """Recompute a case from its seed (the reference on `device`); write it if new, if only its bytes differ (same
    bits), or if its bits differ and `force`. Returns (what changed as a CaseReport, manifest entry of the file now
    on disk or None, status): status "written", "unchanged", "rewritten" (same bits, canonical bytes), "overwritten"
    or "refused". The old file is read only if regular and at most MAX_CASE_BYTES (FileProblem otherwise).
    """
    tensors = compute_case(case, device)
    data = case_bytes(case, tensors)
    entry = manifest_entry(case, tensors, len(data))
    path = Path(golden_dir) / case.file
    report = CaseReport(case.name)
    status = "written"
    try:
        old_bytes = read_bounded(path, MAX_CASE_BYTES)
    except FileNotFoundError:
        old_bytes = None
    if old_bytes is not None:
        if old_bytes == data:
            return report, entry, "unchanged"
        try:
            old = load_bytes(old_bytes)
        except Exception as e:  # noqa: BLE001 - a damaged file is a difference like any other
            old = None
            report.problems.append((case.file, f"unreadable ({type(e).__name__}: {e})"))
        else:
            report.problems += _tensor_changes(tensors, old)
        if not report.ok and not force:
            return report, (manifest_entry(case, old, len(old_bytes)) if old is not None else None), "refused"
        status = "rewritten" if report.ok else "overwritten"
    Path(golden_dir).mkdir(parents=True, exist_ok=True)
    write_atomic(path, data)
    return report, entry, status


def manifest_bytes(entries: dict) -> bytes:
    doc = {"contract_version": CONTRACT_VERSION,
           "about": "mok reference golden files; see docs/numerics.md. Regenerate with `mok golden regen`.",
           "cases": entries}
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def write_manifest(entries: dict, golden_dir: Path = GOLDEN_DIR) -> None:
    """Write manifest.json atomically, keys sorted (stable bytes)."""
    write_atomic(Path(golden_dir) / MANIFEST, manifest_bytes(entries))

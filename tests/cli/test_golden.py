"""Golden files: reproduced bit-exactly by the reference (W = 1 and the W the manifest lists),
hashes and sizes as docs/determinism.md describes, and the regen tool's refusal to overwrite changed bits."""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from mok.cli.main import main
from mok.cli.golden import CASES, GOLDEN_DIR, check_all, check_case, load_manifest, tensor_sha256
from mok.reference import CONTRACT_VERSION

NAMES = [c.name for c in CASES]


def test_manifest_lists_every_case_with_version_and_hashes():
    m = load_manifest()
    assert sorted(m["cases"]) == sorted(NAMES)
    for name, entry in m["cases"].items():
        assert entry["contract_version"] == CONTRACT_VERSION, name
        stored = load_file(str(GOLDEN_DIR / entry["file"]))
        assert set(stored) == set(entry["sha256"]), name
        for k, v in stored.items():
            assert tensor_sha256(v) == entry["sha256"][k], f"{name}/{k}"


def test_goldens_are_small_and_pickle_free():
    files = list(GOLDEN_DIR.iterdir())
    assert sum(f.stat().st_size for f in files) < 5 * 2**20
    assert {f.suffix for f in files} == {".safetensors", ".json"}


def test_spec_cases_are_covered():
    by = {c.name: c for c in CASES}
    assert by["no_shared"].config.S == 0
    assert by["k1"].config.K == 1
    assert by["k_eq_e"].config.K == by["k_eq_e"].config.E
    assert by["t37"].config.T == 37
    assert {1, 2, 4} <= set(by["base"].world_sizes)
    # the routing of these cases really has an empty expert / a single expert
    _, _ = by, None
    from mok.cli.golden import load_case
    inp, _ = load_case("empty_expert")
    assert not bool((inp["topk_idx"] == by["empty_expert"].config.E - 1).any())
    inp, _ = load_case("one_expert")
    assert bool((inp["topk_idx"] == 0).all())
    # the FP8 recipe: whole blocks (two along H), partial blocks at the edges, a shared expert, W = 2
    fp8 = [c for c in CASES if c.precision == "fp8"]
    assert {c.name for c in fp8} == {"fp8_base", "fp8_edges"}
    assert by["fp8_base"].config.H == 256 and by["fp8_base"].config.I % 128 == 0
    assert by["fp8_edges"].config.H % 128 and by["fp8_edges"].config.I % 128 and by["fp8_edges"].config.S % 128
    assert all(2 in c.world_sizes for c in fp8)
    assert {c.precision for c in CASES} == {"bf16", "fp8"}


@pytest.mark.parametrize("name", NAMES)  # every golden case, by name: the reference at W = 1 gives its bits
def test_golden_reproduced_w1(name):
    r = check_case(name, world_sizes=(1,))
    assert r.ok, r.problems


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in CASES if len(c.world_sizes) > 1], ids=lambda c: c.name)  # cases with W > 1
def test_golden_reproduced_expert_parallel(case):
    # real gloo processes: W = 2 and/or 4 must give the very same file as W = 1
    r = check_case(case.name, world_sizes=tuple(w for w in case.world_sizes if w > 1))
    assert r.ok, r.problems


@pytest.fixture
def golden_copy(tmp_path):
    d = tmp_path / "golden"
    shutil.copytree(GOLDEN_DIR, d)
    return d


def _corrupt(d: Path, case: str, tensor: str):
    entry = json.loads((d / "manifest.json").read_text())["cases"][case]
    path = d / entry["file"]
    t = load_file(str(path))
    t[tensor] = t[tensor].clone()
    t[tensor].view(-1)[3] += 1
    save_file(t, str(path))
    return path


def _manifest(d: Path, edit):
    m = json.loads((d / "manifest.json").read_text())
    edit(m)
    (d / "manifest.json").write_text(json.dumps(m))


def _flip_header_byte(p: Path):
    b = bytearray(p.read_bytes())
    b[10] ^= 0xFF  # inside the JSON header
    p.write_bytes(bytes(b))


DAMAGES = {  # name -> (damage to the copy of the goldens, the failing cases, a phrase of the report)
    "flipped header byte": (lambda d: _flip_header_byte(d / "k1.safetensors"), ["k1"], "cannot read it"),
    "truncated file": (lambda d: (d / "k1.safetensors").write_bytes((d / "k1.safetensors").read_bytes()[:1000]),
                       ["k1"], "(the manifest's size), got 1000"),
    "deleted file": (lambda d: (d / "k1.safetensors").unlink(), ["k1"], "k1.safetensors: missing"),
    "bad JSON": (lambda d: (d / "manifest.json").write_text("{not json"), NAMES, "invalid JSON"),
    "empty manifest": (lambda d: (d / "manifest.json").write_bytes(b""), NAMES, "invalid JSON"),
    "deleted manifest": (lambda d: (d / "manifest.json").unlink(), NAMES, "does not exist"),
    "missing key": (lambda d: _manifest(d, lambda m: m["cases"]["k1"].pop("sha256")), ["k1"], "k1.sha256"),
    "world_sizes [0]": (lambda d: _manifest(d, lambda m: m["cases"]["k1"].update(world_sizes=[0])), ["k1"],
                        "k1.world_sizes: expected [1, 2]"),
    "world_sizes [3]": (lambda d: _manifest(d, lambda m: m["cases"]["k1"].update(world_sizes=[3])), ["k1"],
                        "got [3]"),
    "world_sizes []": (lambda d: _manifest(d, lambda m: m["cases"]["k1"].update(world_sizes=[])), ["k1"], "got []"),
    "precision bf16 for fp8": (lambda d: _manifest(d, lambda m: m["cases"]["fp8_edges"].update(precision="bf16")),
                               ["fp8_edges"], "fp8_edges.precision: expected 'fp8'"),
    "case not in manifest": (lambda d: _manifest(d, lambda m: m["cases"].pop("k1")), ["k1"], "no entry for case"),
    "no cases": (lambda d: _manifest(d, lambda m: m.update(cases={})), NAMES, "no entry for case"),
    "unknown case": (lambda d: _manifest(d, lambda m: m["cases"].update(zz={})), ["zz"], "does not define"),
    "self-consistent other seed": (lambda d: _other_seed(d, "k1"), ["k1"], "drawn from the case's seed"),
    # a file that is not a regular file, or larger than the manifest says, is refused unread, naming it
    "case file a directory": (lambda d: _replace(d / "k1.safetensors", Path.mkdir), ["k1"],
                              "k1.safetensors: expected a regular file, got a directory"),
    "case file a char device": (lambda d: _replace(d / "k1.safetensors", lambda p: p.symlink_to("/dev/null")), ["k1"],
                                "k1.safetensors: expected a regular file, got a character device"),
    "manifest a directory": (lambda d: _replace(d / "manifest.json", Path.mkdir), NAMES,
                             "manifest.json: expected a regular file, got a directory"),
    "manifest over 1 MiB": (lambda d: (d / "manifest.json").write_text(
        (d / "manifest.json").read_text() + " " * 2**20), NAMES, "manifest.json: expected at most 1048576 bytes"),
    # keys and versions this mok version does not know are refused, not ignored
    "contract_version 99": (lambda d: _manifest(d, lambda m: m.update(contract_version=99)), NAMES,
                            "contract_version: expected 1 (this mok version's numerics contract), got 99"),
    "no contract_version": (lambda d: _manifest(d, lambda m: m.pop("contract_version")), NAMES,
                            "contract_version: expected 1 (this mok version's numerics contract), got 'none'"),
    "unknown top-level key": (lambda d: _manifest(d, lambda m: m.update(extra=1)), NAMES, "got also ['extra']"),
    "unknown case key": (lambda d: _manifest(d, lambda m: m["cases"]["k1"].update(extra=1)), ["k1"],
                         "k1: expected only the keys"),
    "case contract_version 99": (lambda d: _manifest(d, lambda m: m["cases"]["k1"].update(contract_version=99)),
                                 ["k1"], "k1.contract_version: expected 1"),
    "extra sha256 key": (lambda d: _manifest(d, lambda m: m["cases"]["k1"]["sha256"].update(bogus="0" * 64)), ["k1"],
                         "k1.sha256: lists 'bogus', not a tensor of this case"),
    "sha256 key missing": (lambda d: _manifest(d, lambda m: m["cases"]["k1"]["sha256"].pop("y")), ["k1"],
                           "k1.sha256: no hash for the tensor 'y'"),
    "bytes missing": (lambda d: _manifest(d, lambda m: m["cases"]["k1"].pop("bytes")), ["k1"],
                      "k1.bytes: expected the file's size"),
}


def _replace(path: Path, make) -> None:
    """`path` deleted, then made again by make(path) (a directory, a symlink, ...)."""
    path.unlink()
    make(path)


def _other_seed(d: Path, name: str):
    """A file for another seed, its hashes written into the manifest: consistent, but not the case."""
    from dataclasses import replace

    from mok.cli.golden import CASE_BY_NAME, compute_case, manifest_entry

    case = replace(CASE_BY_NAME[name], seed=99)
    tensors = compute_case(case)
    save_file(tensors, str(d / case.file))
    entry = manifest_entry(case, tensors, (d / case.file).stat().st_size)
    _manifest(d, lambda m: m["cases"][name].update(sha256=entry["sha256"], bytes=entry["bytes"]))


@pytest.mark.parametrize("damage", DAMAGES)  # every damage of DAMAGES above: damaged files, manifests, world sizes
def test_each_damage_fails_its_case_and_the_rest_are_checked(golden_copy, damage):
    # W = 1 here; the CLI test below runs the full check (every case's world sizes) on two damages
    make, failing, phrase = DAMAGES[damage]
    make(golden_copy)
    reports = check_all(golden_copy, world_sizes=(1,))
    assert sorted(r.name for r in reports if not r.ok) == sorted(failing)
    assert {r.name for r in reports} >= set(NAMES)  # every case was checked
    bad = next(r for r in reports if not r.ok)
    assert any(phrase in f"{k}: {p}" for k, p in bad.problems), bad.problems


@pytest.mark.slow
@pytest.mark.parametrize("damage", [
    "flipped header byte",  # a damaged golden file: k1 unreadable
    "world_sizes [3]",      # a damaged manifest entry: k1's world sizes not the case list's
])
def test_cli_check_reports_the_damaged_case_and_exits_1(golden_copy, capsys, damage):
    DAMAGES[damage][0](golden_copy)
    assert main(["golden", "check", "--dir", str(golden_copy)]) == 1
    out = capsys.readouterr().out
    assert "k1: MISMATCH" in out and f"{len(NAMES) - 1} passed, 1 failed" in out
    assert all(f"{n}: ok" in out for n in NAMES if n != "k1")


def test_check_detects_a_changed_bit(golden_copy, capsys):
    _corrupt(golden_copy, "k1", "y")
    assert main(["golden", "check", "--dir", str(golden_copy)]) == 1
    out = capsys.readouterr().out
    assert "k1: MISMATCH" in out and "sha256" in out and "y (W=1)" in out


def test_regen_refuses_to_overwrite_without_force(golden_copy, capsys):
    path = _corrupt(golden_copy, "t1", "d_x")
    before = path.read_bytes()
    assert main(["golden", "regen", "--dir", str(golden_copy)]) == 1
    out = capsys.readouterr().out
    assert "t1: differs, NOT overwritten" in out and "d_x:" in out
    assert path.read_bytes() == before
    assert main(["golden", "regen", "--dir", str(golden_copy), "--force"]) == 0
    assert "t1: OVERWRITTEN" in capsys.readouterr().out
    assert main(["golden", "regen", "--dir", str(golden_copy)]) == 0  # now unchanged everywhere


def test_regen_from_seeds_reproduces_the_files(golden_copy, capsys):
    # inputs are drawn from each case's seed; regenerating must leave every file untouched
    assert main(["golden", "regen", "--dir", str(golden_copy)]) == 0
    assert capsys.readouterr().out.count("unchanged") == len(CASES)


def test_denormals_are_preserved():
    # the contract assumes no flush-to-zero: a product of two tiny bf16 values is a denormal fp32
    a = torch.tensor([2.0**-70], dtype=torch.bfloat16)
    p = a.float() * a.float()
    assert p.item() == 2.0**-140 and p.item() != 0.0


# ---------------------------------------------------------------- writing: atomic, stable bytes

def test_regenerated_files_are_byte_identical(tmp_path):
    """Same bits -> same bytes, in another process too (safetensors alone orders metadata at random)."""
    import subprocess
    import sys

    fresh = tmp_path / "fresh"
    r = subprocess.run([sys.executable, "-m", "mok.cli.main", "golden", "regen", "--dir", str(fresh)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    for f in sorted(GOLDEN_DIR.iterdir()):
        assert (fresh / f.name).read_bytes() == f.read_bytes(), f.name
    assert sorted(p.name for p in fresh.iterdir()) == sorted(p.name for p in GOLDEN_DIR.iterdir())


_KILL_ON_REPLACE = """
import os, signal, sys
from mok.cli.main import main
real = os.replace
def replace(src, dst):
    if str(dst).endswith(sys.argv[1]):
        os.kill(os.getpid(), signal.SIGKILL)  # killed after writing the new bytes, before they take the name
    return real(src, dst)
os.replace = replace
main(["golden", "regen", "--force", "--dir", sys.argv[2]])
"""


@pytest.mark.parametrize("victim", [
    "manifest.json",   # killed before the new manifest takes its name: t1 already rewritten
    "t1.safetensors",  # killed before t1's new bytes take its name: the corrupt old t1 stays
])
def test_kill_during_regen_leaves_the_old_files(golden_copy, capsys, victim):
    import subprocess
    import sys

    _corrupt(golden_copy, "t1", "d_x")  # so that regen --force rewrites t1 and the manifest
    before = {p.name: p.read_bytes() for p in golden_copy.iterdir()}
    r = subprocess.run([sys.executable, "-c", _KILL_ON_REPLACE, victim, str(golden_copy)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == -9, r.stdout + r.stderr
    after = {p.name: p.read_bytes() for p in golden_copy.iterdir() if not p.name.endswith(".tmp")}
    assert after[victim] == before[victim]  # never a partial or empty file
    assert json.loads(after["manifest.json"])  # still valid JSON
    stale = [p.name for p in golden_copy.iterdir() if p.name.endswith(".tmp")]
    assert stale and all(n.startswith(f".{victim}.") for n in stale)
    # check still works (the stale temporary file is ignored): t1 is fixed if its write went through
    fixed = victim == "manifest.json"
    failed = [r.name for r in check_all(golden_copy, world_sizes=(1,)) if not r.ok]
    assert failed == ([] if fixed else ["t1"])
    # regen cleans up and finishes the job
    assert main(["golden", "regen", "--force", "--dir", str(golden_copy)]) == 0
    assert f"removed {stale[0]}" in capsys.readouterr().out
    assert sorted(p.name for p in golden_copy.iterdir()) == sorted(before)
    assert all((golden_copy / n).read_bytes() == (GOLDEN_DIR / n).read_bytes() for n in before)


def test_regen_rebuilds_an_empty_manifest(golden_copy, capsys):
    (golden_copy / "manifest.json").write_bytes(b"")  # what a kill mid-write left before writes were atomic
    assert main(["golden", "regen", "--dir", str(golden_copy)]) == 0
    assert "manifest.json: not usable, rebuilt" in capsys.readouterr().out
    assert (golden_copy / "manifest.json").read_bytes() == (GOLDEN_DIR / "manifest.json").read_bytes()


_CHECK_W1 = """
import sys
from mok.cli.golden import check_all
reports = check_all(sys.argv[1], world_sizes=(1,))
for r in reports:
    for k, p in r.problems:
        print(f"{r.name}|{k}: {p}")
"""


@pytest.mark.parametrize("damage, failing, phrase", [
    # a FIFO as the manifest: every case fails naming it (was: blocked until killed)
    ("manifest FIFO", NAMES, "manifest.json: expected a regular file, got a FIFO"),
    # a FIFO as a case's file
    ("case FIFO", ["k1"], "k1.safetensors: expected a regular file, got a FIFO"),
    # /dev/zero behind a case's name (was: read until memory ran out)
    ("case /dev/zero", ["k1"], "k1.safetensors: expected a regular file, got a character device"),
    # /dev/zero as the manifest
    ("manifest /dev/zero", NAMES, "manifest.json: expected a regular file, got a character device"),
    # a 3 GiB sparse file (was: read whole, 3.4 GB and 21 s)
    ("case sparse 3 GiB", ["k1"], "bytes (the manifest's size), got 3221225472 (not read)"),
], ids=["manifest FIFO", "case FIFO", "case /dev/zero", "manifest /dev/zero", "case sparse 3 GiB"])
def test_check_refuses_what_would_hang_or_fill_memory(golden_copy, damage, failing, phrase):
    """Run in a child process with a time and memory bound (2 GiB of address space, 2.5 times what it needs), so a
    regression fails instead of hanging the suite or filling the machine's memory."""
    import resource
    import subprocess
    import sys

    target = golden_copy / ("manifest.json" if damage.startswith("manifest") else "k1.safetensors")
    if "sparse" in damage:
        os.truncate(target, 3 * 2**30)
    else:
        target.unlink()
        if "FIFO" in damage:
            os.mkfifo(target)
        else:
            target.symlink_to("/dev/zero")

    def bound_memory():
        resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))

    r = subprocess.run([sys.executable, "-c", _CHECK_W1, str(golden_copy)], capture_output=True, text=True,
                       timeout=120, preexec_fn=bound_memory)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert sorted({ln.split("|")[0] for ln in lines}) == sorted(failing), r.stdout
    assert all(any(ln.startswith(f"{n}|") and phrase in ln for ln in lines) for n in failing), r.stdout


@pytest.mark.parametrize("umask", [
    0o022,  # the usual: files 0644, readable by every user
    0o027,  # group-readable only: 0640
], ids=oct)
def test_regen_writes_files_with_the_umask_permissions(tmp_path, capsys, umask):
    """As open(path, "w") would create them (was: 0600 for every file, so a root regen of an installed package
    made `golden check` fail for every other user)."""
    import stat

    old = os.umask(umask)
    try:
        assert main(["golden", "regen", "--dir", str(tmp_path / "g")]) == 0
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "g").iterdir()}
    assert sorted(modes) == sorted(p.name for p in GOLDEN_DIR.iterdir())
    assert set(modes.values()) == {0o666 & ~umask}, {k: oct(v) for k, v in modes.items()}


def test_regen_leaves_a_non_regular_entry_with_a_temporary_name(golden_copy, capsys):
    """A directory named like regen's temporary files is not one of them: left in place, said so (was: an
    IsADirectoryError traceback)."""
    (golden_copy / ".base.safetensors.x.tmp").mkdir()
    assert main(["golden", "regen", "--dir", str(golden_copy)]) == 0
    out = capsys.readouterr().out
    assert "left .base.safetensors.x.tmp in place: a directory, not a temporary file of mok golden regen" in out
    assert (golden_copy / ".base.safetensors.x.tmp").is_dir()


@pytest.mark.parametrize("name, make, what", [
    ("k1.safetensors", Path.mkdir, "a directory"),  # a directory where a case's file goes
    ("manifest.json", os.mkfifo, "a FIFO"),         # a FIFO as the manifest: reading it would block
], ids=["case file a directory", "manifest a FIFO"])
def test_regen_refuses_a_non_regular_file_at_a_golden_name(golden_copy, name, make, what):
    """Exit 2 naming the file, before anything is computed or written (in a child process with a time bound: a
    FIFO once blocked regen until killed)."""
    import subprocess
    import sys

    _replace(golden_copy / name, make)
    before = {p.name: p.read_bytes() for p in golden_copy.iterdir() if p.is_file()}
    r = subprocess.run([sys.executable, "-m", "mok.cli.main", "golden", "regen", "--force", "--dir", str(golden_copy)],
                       capture_output=True, text=True, timeout=120, env=_subprocess_env())
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip() == (f"mok golden regen: --dir: expected a regular file or nothing at "
                                f"{str(golden_copy / name)!r}, got {what}; remove it or pick another --dir")
    assert {p.name: p.read_bytes() for p in golden_copy.iterdir() if p.is_file()} == before  # nothing written


def _subprocess_env():
    root = Path(__file__).resolve().parents[2]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}


def test_regen_piped_into_head_finishes_the_work(golden_copy):
    """`mok golden regen --force | head -1`: the reader goes away after the first line; regen still rewrites every
    case and then the manifest, so files and manifest agree (was: it stopped at the next line, the manifest not
    rewritten, and the next check failed)."""
    import subprocess
    import sys

    for name in ("base", "t1"):  # the first case and the last one differ: both must be rewritten
        _corrupt(golden_copy, name, "d_x")
    p = subprocess.Popen([sys.executable, "-m", "mok.cli.main", "golden", "regen", "--force", "--dir",
                          str(golden_copy)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_subprocess_env())
    first = p.stdout.readline()
    p.stdout.close()  # what `head -1` does
    err = p.stderr.read()
    assert p.wait(timeout=120) == 0, err
    assert first.startswith(b"base: OVERWRITTEN"), first
    assert b"Traceback" not in err, err
    assert [r.name for r in check_all(golden_copy, world_sizes=(1,)) if not r.ok] == []
    assert all((golden_copy / n).read_bytes() == (GOLDEN_DIR / n).read_bytes() for n in os.listdir(GOLDEN_DIR))


def test_regen_waits_for_another_regen_of_the_same_directory(golden_copy):
    """Regens of one directory are serialised by a lock on the directory: a second one waits (saying so) and only
    then cleans up temporary files, so it never deletes the first one's file in flight (was: it did, and the
    first failed with FileNotFoundError)."""
    import subprocess
    import sys

    from mok.cli.files import directory_lock

    in_flight = golden_copy / ".base.safetensors.abc123.tmp"  # as another regen's write in progress
    with directory_lock(golden_copy, exclusive=True):
        in_flight.write_bytes(b"partial")
        p = subprocess.Popen([sys.executable, "-m", "mok.cli.main", "golden", "regen", "--dir", str(golden_copy)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_subprocess_env())
        try:
            line = p.stderr.readline()  # the waiting line, or "" if it finished without waiting
            assert line.strip() == (f"mok golden regen: waiting for another process's `mok golden regen or check` of "
                                    f"{str(golden_copy)!r} to finish"), (line, p.communicate(timeout=120))
            assert in_flight.read_bytes() == b"partial" and p.poll() is None
        except BaseException:
            p.kill()
            raise
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, out + err
    assert f"removed {in_flight.name}" in out and not in_flight.exists()


# ---------------------------------------------------------------- installation

@pytest.mark.parametrize("argv", [
    ["golden", "check"],  # the golden check reads the package's goldens
    ["verify"],           # so does verify
])
def test_missing_package_goldens_are_an_installation_error(tmp_path, monkeypatch, capsys, argv):
    import mok.cli.golden as golden

    for f in GOLDEN_DIR.iterdir():
        if f.name != "k1.safetensors":
            shutil.copy(f, tmp_path / f.name)
    monkeypatch.setattr(golden, "GOLDEN_DIR", tmp_path.resolve())
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "k1.safetensors" in err and "installation is incomplete" in err and "reinstall" in err
    assert "regen" not in err


@pytest.mark.slow
def test_wheel_carries_the_goldens(tmp_path):
    """A non-editable install (a wheel built from this tree, unpacked elsewhere) finds its goldens."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    src = tmp_path / "src"
    shutil.copytree(root / "mok", src / "mok", ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.tmp"))
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(root / f, src / f)
    r = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path / "dist"),
                        str(src)], capture_output=True, text=True, timeout=300)
    if r.returncode != 0 and "No module named build" in r.stderr:
        pytest.skip("the `build` package is not installed")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    wheel = next((tmp_path / "dist").glob("mok-*.whl"))
    site = tmp_path / "site"
    shutil.unpack_archive(str(wheel), str(site), format="zip")
    code = ("import mok.cli.golden as g, sys; g.require_installed(); assert g.GOLDEN_DIR.is_relative_to(sys.argv[1]);"
            "r = g.check_all(world_sizes=(1,)); assert all(x.ok for x in r), [x.problems for x in r]; print(len(r))")
    r = subprocess.run([sys.executable, "-c", code, str(site)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(site)}, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == str(len(CASES)), r.stdout + r.stderr

"""The package as users install it: a wheel (not an editable install) carries the CUDA sources and the
golden files and passes `mok verify` and `mok golden check` from outside the source tree; the layer
imports and trains without the harness's optional dependencies."""
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from mok.cli.golden import CASES

ROOT = Path(__file__).resolve().parents[1]


def _env():
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _run(cmd, cwd, timeout=300, env=None):
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env or _env(), capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, f"{cmd} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", out, ROOT], cwd=out)
    (whl,) = out.glob("mok-*.whl")
    return whl


def test_wheel_carries_cuda_sources_and_goldens(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {n.removeprefix("mok/_csrc/") for n in names if n.startswith("mok/_csrc/")}
    assert shipped == {p.relative_to(ROOT / "csrc").as_posix() for p in (ROOT / "csrc").rglob("*") if p.is_file()}
    assert "mok/_golden/manifest.json" in names
    for case in CASES:
        assert f"mok/_golden/{case.name}.safetensors" in names, case.name


@pytest.mark.slow
def test_installed_wheel_verifies_outside_the_source_tree(wheel, tmp_path):
    venv = tmp_path / "venv"
    # the venv sees this interpreter's torch, safetensors, tqdm, numpy; mok itself comes from the wheel only
    _run([sys.executable, "-m", "venv", "--system-site-packages", venv], cwd=tmp_path)
    py, mok_cli = venv / "bin" / "python", venv / "bin" / "mok"
    if sys.prefix != sys.base_prefix:
        # run from a venv: the new venv's system site-packages are the base interpreter's, not this venv's, so
        # list this venv's too (a .pth entry: its own .pth files, e.g. an editable mok, are not processed)
        site = _run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp_path).strip()
        ours = sorted({sysconfig.get_paths()[k] for k in ("purelib", "platlib")})
        Path(site, "_outer_env.pth").write_text("\n".join(ours) + "\n")
    _run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel], cwd=tmp_path)
    where = _run([py, "-c", "import mok, mok.fast._build as b; print(mok.__file__); print(b.CSRC)"], cwd=tmp_path)
    mok_file, csrc = where.split()
    assert mok_file.startswith(str(venv)), f"imported {mok_file}, not the wheel's copy"
    assert Path(csrc) == Path(mok_file).parent / "_csrc" and Path(csrc, "mok_fast.h").is_file()
    out = _run([mok_cli, "verify", "--no-progress"], cwd=tmp_path)
    assert "0 failed" in out and "passed" in out, out
    out = _run([mok_cli, "golden", "check"], cwd=tmp_path)
    assert f"{len(CASES)} passed, 0 failed" in out, out


def test_a_source_checkout_reads_the_top_level_csrc_and_golden():
    from mok._resources import csrc_dir, golden_dir

    assert csrc_dir() == ROOT / "csrc" and golden_dir() == ROOT / "golden"


def test_layer_works_without_the_harness_extras(tmp_path):
    code = ("import sys\n"
            "for m in ('tqdm', 'safetensors', 'numpy'): sys.modules[m] = None  # as if not installed\n"
            "import torch, mok\n"
            "m = mok.MoE(16, 8, 4, 2, shared_intermediate_size=8)\n"
            "x = torch.randn(5, 16, requires_grad=True)\n"
            "y, rl = m(x, return_router_losses=True)\n"
            "(y.sum() + rl.load_balance).backward()\n"
            "assert x.grad is not None and m.w_gate_up_L2IH.grad is not None\n"
            "print('ok', mok.__version__)\n")
    env = {**_env(), "PYTHONPATH": str(ROOT)}  # this tree's mok, whatever else is installed
    out = _run([sys.executable, "-c", code], cwd=tmp_path, env=env)
    assert out.startswith("ok ")

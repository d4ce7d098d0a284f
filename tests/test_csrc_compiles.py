"""CPU check (no GPU needed): every csrc/ translation unit compiles with nvcc for sm_90a (-c only),
with the same flags the fast path's build uses, so a build break cannot land unnoticed.
Skipped, with the reason, when nvcc or the CUTLASS headers (pip install nvidia-cutlass) are absent."""
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mok.fast import _build


def _toolchain():
    try:
        return _build.find_nvcc(), _build.compile_flags()
    except _build.FastPathUnavailable as e:
        pytest.skip(str(e))


def _compile(nvcc, flags, src, out_dir):
    obj = Path(out_dir) / (Path(src).stem + ".o")
    r = subprocess.run([nvcc, *flags, "-c", src, "-o", str(obj)], capture_output=True, text=True)
    return src, r.returncode, r.stderr[-3000:]


def test_every_translation_unit_compiles_for_sm90a(tmp_path):
    nvcc, flags = _toolchain()
    srcs = _build.sources()
    assert srcs, "no csrc/*.cu found"
    jobs = int(os.environ.get("MOK_COMPILE_JOBS", os.cpu_count() or 2))
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        results = list(ex.map(lambda s: _compile(nvcc, flags, s, tmp_path), srcs))
    failed = [(s, err) for s, rc, err in results if rc != 0]
    assert not failed, "\n\n".join(f"{s}:\n{err}" for s, err in failed)
    assert "-gencode=arch=compute_90a,code=sm_90a" in flags


def test_gather_producer_probe_compiles_for_sm90a(tmp_path):
    """benchmarks/gather_producer_probe.cu (standalone: CUDA runtime only) still compiles for sm_90a."""
    nvcc, _ = _toolchain()
    src = str(Path(__file__).resolve().parents[1] / "benchmarks" / "gather_producer_probe.cu")
    probe_flags = ["-std=c++17", "-O3", *_build.ARCH_FLAGS]  # no CUTLASS, no torch: the library's arch only
    _, rc, err = _compile(nvcc, probe_flags, src, tmp_path)
    assert rc == 0, f"{src}:\n{err}"

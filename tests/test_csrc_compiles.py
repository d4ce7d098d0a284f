"""CPU check (no GPU needed): every csrc/ translation unit compiles with nvcc for sm_90a (-c only),
with the same flags the fast path's build uses, so a build break cannot land unnoticed; ptxas serialises no
kernel's wgmma instructions (a silent loss of most of a GEMM's speed, which the library's build does not fail on), and
no kernel spills registers.
Skipped, with the reason, when nvcc or the CUTLASS headers (pip install nvidia-cutlass) are absent."""
import os
import shutil
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
    return src, r.returncode, r.stderr


def test_every_translation_unit_compiles_for_sm90a(tmp_path):
    nvcc, flags = _toolchain()
    srcs = _build.sources()
    assert srcs, "no csrc/*.cu found"
    jobs = int(os.environ.get("MOK_COMPILE_JOBS", os.cpu_count() or 2))
    warn = ["-Xptxas", "-warn-spills"]  # warnings only: the same code as the library's build
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        results = list(ex.map(lambda s: _compile(nvcc, [*flags, *warn], s, tmp_path), srcs))
    failed = [(s, err[-3000:]) for s, rc, err in results if rc != 0]
    assert not failed, "\n\n".join(f"{s}:\n{err}" for s, err in failed)
    assert "-gencode=arch=compute_90a,code=sm_90a" in flags
    serialized = [(Path(s).name, line) for s, _, err in results for line in _build.serialized_wgmma(err)]
    assert not serialized, "ptxas serialised wgmma instructions:\n" + "\n".join(f"{s}: {l}" for s, l in serialized)
    # A spill (in a mainloop or an epilogue) is a loss of speed that no other CPU test would see. Until run 30 the d_a
    # GEMM's SwiGLU-backward epilogue in the ping-pong tiles was let spill (its own cp.async copies beside the tile's
    # 192 accumulators); the epilogue load warp makes those copies now, and no kernel spills.
    spills = [(Path(s).name, k) for s, _, err in results for k in _build.spilling_kernels(err)]
    assert not spills, "kernels spilling registers:\n" + "\n".join(f"{s}: {k[:300]}" for s, k in spills)


# A wgmma under a branch that depends on the thread: ptxas must serialise it (C7520). The check above relies on
# ptxas saying so on stderr under the library's flags; this kernel shows that it does.
_DIVERGENT_WGMMA_CU = r"""
#include <cstdint>
__global__ void divergent_wgmma(float* out, uint64_t desc_a, uint64_t desc_b, int n) {
  float d0 = 0, d1 = 0, d2 = 0, d3 = 0;
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  for (int i = 0; i < n; ++i) {
    if (i % 3 == int(threadIdx.x)) {
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                   "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
                   : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3) : "l"(desc_a + i), "l"(desc_b));
    }
  }
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  out[threadIdx.x] = d0 + d1 + d2 + d3;
}
"""


def test_serialized_wgmma_is_detected(tmp_path):
    """The check of the library's TUs can fail: a kernel whose wgmma ptxas serialises is reported."""
    nvcc, flags = _toolchain()
    src = tmp_path / "divergent_wgmma.cu"
    src.write_text(_DIVERGENT_WGMMA_CU)
    _, rc, err = _compile(nvcc, flags, str(src), tmp_path)
    assert rc == 0, err[-3000:]
    found = _build.serialized_wgmma(err)
    assert len(found) == 1 and "divergent_wgmma" in found[0], err[-3000:]


def test_gather_producer_probe_compiles_for_sm90a(tmp_path):
    """benchmarks/gather_producer_probe.cu (CUDA runtime and CuTe's wgmma atoms) still compiles for sm_90a with the
    library's flags, its wgmma consumer neither serialised by ptxas nor spilling: either would time a slower
    mainloop than the GEMMs' own."""
    nvcc, flags = _toolchain()
    src = str(Path(__file__).resolve().parents[1] / "benchmarks" / "gather_producer_probe.cu")
    _, rc, err = _compile(nvcc, [*flags, "-Xptxas", "-warn-spills"], src, tmp_path)
    assert rc == 0, f"{src}:\n{err[-3000:]}"
    assert not _build.serialized_wgmma(err) and not _build.spilling_kernels(err), err[-3000:]


def _smem_stages_table(nvcc, flags, csrc, out):
    """benchmarks/smem_stages.cu built against the headers in `csrc` and run (host only): its table's rows as
    {(kind, variant): (tile, stages, bytes a stage, kernel bytes, stages with a second B tile)}."""
    src = Path(__file__).resolve().parents[1] / "benchmarks" / "smem_stages.cu"
    own = ["-I" + str(_build.CSRC)]
    r = subprocess.run([nvcc, *[f for f in flags if f not in own], f"-I{csrc}", str(src), "-o", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {}
    for line in subprocess.run([str(out)], capture_output=True, text=True, check=True).stdout.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 8 and cells[1].isdigit():
            rows[cells[0], int(cells[1])] = (cells[2], int(cells[3]), int(cells[4]), int(cells[6]), int(cells[7]))
    return rows


def test_smem_stages_counts_and_the_stages_probe_builds_with_them(tmp_path):
    """benchmarks/smem_stages.cu reads each row-tiled kind's stages from the CUTLASS types: a stage is one A and one
    B tile of 64-wide K, every kernel fits the SM, and one more B tile a stage leaves fewer stages. The probe library's
    headers (benchmarks/stages_probe.diff, applied as benchmarks/stages_probe.sh does) give exactly those stages."""
    nvcc, flags = _toolchain()
    now = _smem_stages_table(nvcc, flags, _build.CSRC, tmp_path / "now")
    assert len(now) == 16, sorted(now)
    for (kind, v), (tile, stages, stage_bytes, kernel_bytes, paired) in now.items():
        m, n = map(int, tile.split("x"))
        assert stage_bytes == (m + n) * 64 * 2 and kernel_bytes <= 232448, (kind, v)
        assert 2 <= paired < stages, (kind, v, stages, paired)
    root = Path(__file__).resolve().parents[1]
    patched = tmp_path / "tree"  # not a git work tree: git apply patches the files as they are
    shutil.copytree(_build.CSRC, patched / "mok" / "fast" / "csrc")
    r = subprocess.run(["git", "apply", str(root / "benchmarks" / "stages_probe.diff")], cwd=patched,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    probe = _smem_stages_table(nvcc, flags, patched / "mok" / "fast" / "csrc", tmp_path / "probe")
    assert {k: row[1] for k, row in probe.items()} == {k: row[4] for k, row in now.items()}


# 64 loads live at once, compiled with 24 registers a thread: ptxas must spill.
_SPILLING_CU = r"""
__global__ void many_live(const float* in, float* out) {
  float v[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) v[i] = in[threadIdx.x + 128 * i];
  float s = 0;
#pragma unroll
  for (int i = 0; i < 64; ++i) s += v[i] * v[63 - i];
  out[threadIdx.x] = s;
}
"""


def test_spills_are_detected(tmp_path):
    """The spill check of the library's TUs can fail: a kernel that spills is named."""
    nvcc, flags = _toolchain()
    src = tmp_path / "many_live.cu"
    src.write_text(_SPILLING_CU)
    _, rc, err = _compile(nvcc, [*flags, "-maxrregcount=24", "-Xptxas", "-warn-spills"], str(src), tmp_path)
    assert rc == 0, err[-3000:]
    assert _build.spilling_kernels(err) == ["_Z9many_livePKfPf"], err[-3000:]

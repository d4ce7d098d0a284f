"""CPU check (no GPU needed): every csrc/ translation unit compiles with nvcc for sm_90a (-c only),
with the same flags the fast path's build uses, so a build break cannot land unnoticed; ptxas serialises no
kernel's wgmma instructions (a silent loss of most of a GEMM's speed, which the library's build does not fail on), and
no kernel spills registers.
Skipped, with the reason, when nvcc or the CUTLASS headers (pip install nvidia-cutlass) are absent.

Compiling every unit takes minutes on a small machine, so that test is marked `nvcc` and left out of a plain
`pytest` run; CI runs it as its own step (`python -m pytest -q -m nvcc`)."""
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
    return src, r.returncode, r.stderr


@pytest.mark.nvcc
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
    # A spill (in a mainloop or an epilogue) is a loss of speed that no other CPU test would see.
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

"""How the kernels library joins a process: it exports its C entry points and nothing else (the version script
csrc/exports.map with the header's MOK_API, checked on a stand-in library built from the header here, and on the
real library wherever one is at hand: $MOK_FAST_LIB or the first-use build's cache), and the binding opens it
RTLD_LOCAL, so none of its symbols can interpose on another library of the process (no loader of mok asks for
RTLD_GLOBAL). A C++ standard library or CUDA runtime symbol exported by a library loaded RTLD_GLOBAL would be bound
by every library loaded after it, such as the LLVM inside Triton."""
import glob
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

from mok.fast import _build

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "csrc"


def _header_declarations() -> list[tuple[str, str]]:
    """(declaration without MOK_API, name) of every entry point of csrc/mok_fast.h."""
    src = re.sub(r"//[^\n]*", "", (CSRC / "mok_fast.h").read_text())
    return [(" ".join(d.split()), n) for d, n in re.findall(r"\bMOK_API\s+([^;{}]*?\b(mok_\w+)\s*\([^;]*?\))\s*;", src)]


def _entry_points() -> set[str]:
    return {name for _, name in _header_declarations()}


def _exported(lib: Path) -> set[str]:
    """The names of the symbols `lib` defines in its dynamic symbol table (nm -D --defined-only)."""
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


def _stand_in(tmp: Path, leave_out: str = "") -> Path:
    """A library with every entry point of the header (but `leave_out`) as a stub, built as the kernels library is
    linked (hidden visibility, csrc/exports.map), plus what a real one carries: C++ standard library template
    instantiations and a visible function that is no entry point."""
    cxx, nm = shutil.which(os.environ.get("CXX", "c++")), shutil.which("nm")
    if cxx is None or nm is None:
        pytest.skip("needs a C++ compiler and nm (binutils)")
    lines = ['#include <map>', '#include <string>', '#include "mok_fast.h"',
             'MOK_API std::string not_an_entry_point(int n) { std::map<int, std::string> m; m[n] = "x"; return m[n]; }',
             'extern "C" {']
    for decl, name in _header_declarations():
        value = '"stand-in"' if "char" in decl.split(name)[0] else "0"
        if name != leave_out:
            lines.append(f"MOK_API {decl} {{ return {value}; }}")
    lines.append("}")
    src, lib = tmp / "stand_in.cpp", tmp / f"libstand_in{leave_out}.so"
    src.write_text("\n".join(lines) + "\n")
    subprocess.run([cxx, "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden", f"-I{CSRC}", str(src),
                    f"-Wl,--version-script={_build.EXPORTS_MAP}", "-o", str(lib)], check=True, capture_output=True)
    return lib


def test_the_version_script_leaves_only_the_entry_points(tmp_path):
    lib = _stand_in(tmp_path)
    assert _exported(lib) == _entry_points()


def _kernel_libraries() -> list[str]:
    found = [os.environ["MOK_FAST_LIB"]] if os.environ.get("MOK_FAST_LIB") else []
    return found + sorted(glob.glob(str(_build.cache_dir() / _build.NAME / "*" / f"{_build.NAME}*.so")))


@pytest.mark.parametrize("lib", _kernel_libraries() or [pytest.param(None, marks=pytest.mark.skip(
    reason="no kernels library here: set MOK_FAST_LIB or build one on first use"))])
def test_the_kernels_library_exports_only_its_entry_points(lib):
    """What csrc/exports.map promises of the real library (nvcc-built, with the static CUDA runtime inside): every
    dynamic symbol it defines is an entry point of the header, and every entry point is there."""
    if shutil.which("nm") is None:
        pytest.skip("needs nm (binutils)")
    assert _exported(Path(lib)) == _entry_points()


_PROBE = r"""
import ctypes, json, sys
from mok.fast import _build
out = {}
lacking, whole = sys.argv[1], sys.argv[2]
_build.kernels_library = lambda: lacking
try:
    _build.load()
except RuntimeError as e:
    out["lacking"] = str(e)
out["loaded_after_lacking"] = _build.binding().kernels_loaded()
_build.kernels_library = lambda: whole
_build.load()
out["loaded"] = _build.binding().kernels_loaded()
out["global_after_binding"] = hasattr(ctypes.CDLL(None), "mok_schedule")
ctypes.CDLL(sys.argv[3], mode=ctypes.RTLD_GLOBAL)  # the control: a copy loaded the way the old loader did
out["global_after_rtld_global"] = hasattr(ctypes.CDLL(None), "mok_schedule")
print(json.dumps(out))
"""


def test_the_binding_opens_the_library_rtld_local(mok_binding, tmp_path):
    """In a fresh process: a library lacking an entry point is refused, naming it, and nothing is kept; the whole
    one is loaded, and its symbols are not in the process's global scope afterwards (while a copy loaded
    RTLD_GLOBAL, the control, is)."""
    lacking, whole = _stand_in(tmp_path, leave_out="mok_ep_wait"), _stand_in(tmp_path)
    copy = tmp_path / "libcopy.so"
    shutil.copy(whole, copy)
    r = subprocess.run([sys.executable, "-c", _PROBE, str(lacking), str(whole), str(copy)], capture_output=True,
                       text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert "lacks mok_ep_wait" in out["lacking"] and not out["loaded_after_lacking"], out
    assert out["loaded"] and not out["global_after_binding"], out
    assert out["global_after_rtld_global"], "the probe of the global scope sees nothing: it proves nothing"


def _code(path: Path) -> str:
    """The code of a Python or C++ source, its comments (and Python's strings) left out."""
    text = path.read_text()
    if path.suffix == ".py":
        toks = tokenize.generate_tokens(io.StringIO(text).readline)
        return " ".join(t.string for t in toks if t.type not in (tokenize.COMMENT, tokenize.STRING))
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", " ", text, flags=re.S))


def _code_files():
    yield from sorted((ROOT / "mok").rglob("*.py"))
    yield from sorted(p for p in CSRC.rglob("*") if p.suffix in (".cpp", ".cu", ".cuh", ".h"))


def test_no_loader_of_mok_asks_for_rtld_global():
    """No code of mok names RTLD_GLOBAL, and every dlopen in csrc/ asks for RTLD_LOCAL."""
    assert not [p.name for p in _code_files() if "RTLD_GLOBAL" in _code(p)]
    calls = [c for p in _code_files() if p.suffix in (".cpp", ".h") for c in re.findall(r"\bdlopen\(([^;]*)\)", _code(p))]
    assert calls, "the binding's dlopen call was not found: this test proves nothing"
    assert all("RTLD_LOCAL" in c for c in calls), calls


def test_the_first_use_message_only_when_compiling(tmp_path, monkeypatch):
    """The "compiling the CUDA kernels" warning is for a build that will compile: none cached, a rebuild asked for,
    or a kernel source newer than the cached library; a cached, current library loads without it."""
    monkeypatch.setenv("MOK_FAST_CACHE", str(tmp_path))
    monkeypatch.delenv("MOK_FAST_REBUILD", raising=False)
    assert _build.first_use_build_is_stale("2.0.0")  # nothing cached
    lib_dir = tmp_path / _build.NAME / "torch-2.0.0"
    lib_dir.mkdir(parents=True)
    lib = lib_dir / f"{_build.NAME}.so"
    lib.write_bytes(b"")
    newest = max(p.stat().st_mtime for ext in ("cu", "cuh", "h") for p in _build.CSRC.glob(f"*.{ext}"))
    os.utime(lib, (newest + 10, newest + 10))
    assert not _build.first_use_build_is_stale("2.0.0")
    assert _build.first_use_build_is_stale("2.1.0")  # another torch: its own library
    monkeypatch.setenv("MOK_FAST_REBUILD", "1")
    assert _build.first_use_build_is_stale("2.0.0")
    monkeypatch.delenv("MOK_FAST_REBUILD")
    os.utime(lib, (newest - 10, newest - 10))  # a kernel source changed after the build
    assert _build.first_use_build_is_stale("2.0.0")

"""Build and load the fast path's two native pieces (sources in csrc/, package data of the wheel).

The kernels library (csrc/*.cu, sm_90a, a C ABI: csrc/mok_fast.h, exporting its entry points only) is built on
first use with ``torch.utils.cpp_extension.load`` (ninja) into a cache directory (``$MOK_FAST_CACHE`` or
``~/.cache/mok/fast``) and reused afterwards; ``MOK_FAST_LIB=/path/lib.so`` names one built elsewhere instead
(``python -m mok.fast._build OUT.so`` builds one with nvcc alone, e.g. on a machine without a GPU).

The binding (csrc/python_api.cpp, a pybind11 module taking tensors) is built on first use against the torch that
imports it, with the C++ compiler alone, into the same cache, keyed by torch and Python version; it opens the kernels
library itself (RTLD_LOCAL) on its first kernel call. ``MOK_FAST_REBUILD=1`` deletes both cached builds first.
"""
from __future__ import annotations

import glob
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from .._resources import csrc_dir

CSRC = csrc_dir()  # the wheel's copy, or the repository's csrc/ in a source checkout
NAME = "mok_fast_sm90a"
ARCH_FLAGS = ["-gencode=arch=compute_90a,code=sm_90a"]
# -fvisibility=hidden: host symbols stay inside the library unless csrc/mok_fast.h marks them MOK_API (the C entry
# points); the version script csrc/exports.map then keeps the C++ standard library's template instantiations (which
# libstdc++'s headers mark visible) and the static CUDA runtime out of the dynamic symbol table too.
CUDA_FLAGS = ["-std=c++17", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr", "-Xcompiler", "-fvisibility=hidden",
              *ARCH_FLAGS]
EXPORTS_MAP = CSRC / "exports.map"
BINDING_NAME = "mok_fast_binding"
BINDING_SOURCE = CSRC / "python_api.cpp"
BINDING_EXPORTS_MAP = CSRC / "binding_exports.map"  # the binding exports its module init function only


class FastPathUnavailable(RuntimeError):
    """Raised when the fast path cannot run here (no sm_90 GPU, no nvcc, no CUTLASS headers)."""


# ptxas reports, without being asked, when it must serialise a kernel's wgmma instructions (C7510-C7520: a call, a
# wgmma under a runtime branch, accumulators defined differently on two paths). The kernel still gives the same bits
# but loses most of its tensor-core overlap, so a build that would hide the message surfaces it instead.
SERIALIZED_WGMMA = "wgmma.mma_async instructions are serialized"


def serialized_wgmma(stderr: str) -> list[str]:
    """The lines of nvcc's `stderr` (str) in which ptxas says it serialised a kernel's wgmma instructions."""
    return [line.strip() for line in stderr.splitlines() if SERIALIZED_WGMMA in line]


# With -Xptxas -warn-spills, ptxas names each kernel whose registers it spills to local memory.
SPILLS = "Registers are spilled to local memory in function '"


def spilling_kernels(stderr: str) -> list[str]:
    """The (mangled) kernel names nvcc's `stderr` (str, from a compile with -Xptxas -warn-spills) says spill."""
    return [line.split(SPILLS, 1)[1].split("'", 1)[0] for line in stderr.splitlines() if SPILLS in line]


def sources() -> list[str]:
    """Every translation unit of the library, sorted."""
    return sorted(str(p) for p in CSRC.glob("*.cu"))


def cutlass_include_dirs() -> list[str]:
    """CUTLASS/CuTe include dirs: $CUTLASS_DIR, else the `nvidia-cutlass` package's headers."""
    roots = []
    if os.environ.get("CUTLASS_DIR"):
        roots.append(Path(os.environ["CUTLASS_DIR"]))
    try:
        import cutlass_library  # from the PyPI package nvidia-cutlass

        roots.append(Path(cutlass_library.__file__).parent / "source")
    except ImportError:
        pass
    for root in roots:
        if (root / "include" / "cutlass" / "cutlass.h").exists():
            return [str(root / "include"), str(root / "tools" / "util" / "include")]
    raise FastPathUnavailable(
        "CUTLASS headers not found: install the 'nvidia-cutlass' package (pip install nvidia-cutlass) "
        "or set CUTLASS_DIR to a CUTLASS checkout")


def find_nvcc() -> str:
    """Path of nvcc ($CUDA_HOME/bin/nvcc or on PATH); raises FastPathUnavailable if absent."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    cand = [os.path.join(home, "bin", "nvcc")] if home else []
    which = shutil.which("nvcc")
    if which:
        cand.append(which)
    cand.append("/usr/local/cuda/bin/nvcc")
    for c in cand:
        if os.path.exists(c):
            return c
    raise FastPathUnavailable("nvcc not found: set CUDA_HOME or put nvcc on PATH (CUDA >= 12.3 needed for sm_90a)")


def compile_flags() -> list[str]:
    """nvcc flags shared by every build of the library."""
    return [*CUDA_FLAGS, f"-I{CSRC}", *(f"-I{d}" for d in cutlass_include_dirs())]


def first_use_dir(torch_version: str) -> Path:
    """Where `build_with_torch` builds and caches the library for a torch version (it links to that torch)."""
    return cache_dir() / NAME / f"torch-{torch_version}"


def first_use_build_is_stale(torch_version: str) -> bool:
    """Whether `build_with_torch` will compile: no cached library for this torch, MOK_FAST_REBUILD=1, or a kernel
    source or header (csrc/*.cu, *.cuh, *.h) newer than the cached library (what ninja then rebuilds)."""
    libs = sorted(first_use_dir(torch_version).glob(f"{NAME}*.so"))
    if os.environ.get("MOK_FAST_REBUILD") == "1" or not libs:
        return True
    built = libs[0].stat().st_mtime
    return any(p.stat().st_mtime > built for ext in ("cu", "cuh", "h") for p in CSRC.glob(f"*.{ext}"))


def build_with_torch(verbose: bool = False) -> str:
    """Build (or reuse) the library via torch.utils.cpp_extension.load; returns the .so path."""
    from torch.utils import cpp_extension

    find_nvcc()
    import torch

    build_dir = first_use_dir(torch.__version__)
    if os.environ.get("MOK_FAST_REBUILD") == "1" and build_dir.exists():
        shutil.rmtree(build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    old_arch = os.environ.get("TORCH_CUDA_ARCH_LIST")
    os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0a"  # torch then emits -gencode=arch=compute_90a,code=sm_90a only
    try:
        cpp_extension.load(
            name=NAME,
            sources=sources(),
            extra_cuda_cflags=[f for f in CUDA_FLAGS if f not in ARCH_FLAGS],
            extra_include_paths=[str(CSRC), *cutlass_include_dirs()],
            extra_ldflags=[f"-Wl,--version-script={EXPORTS_MAP}"],
            build_directory=str(build_dir),
            is_python_module=False,
            verbose=verbose,
        )
    finally:
        if old_arch is None:
            os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = old_arch
    found = sorted(glob.glob(str(build_dir / f"{NAME}*.so")))
    if not found:
        raise FastPathUnavailable(f"build produced no library in {build_dir}")
    return found[0]


def build_standalone(out: str, jobs: int = 2) -> str:
    """Build the library with nvcc alone (no torch headers) into `out`, reusing object files newer
    than every csrc/ file; returns `out`. Used to build on a CPU machine and carry the library."""
    from concurrent.futures import ThreadPoolExecutor

    nvcc = find_nvcc()
    objdir = Path(out).parent / (Path(out).stem + "_obj")
    objdir.mkdir(parents=True, exist_ok=True)
    newest_src = max(p.stat().st_mtime for p in CSRC.iterdir())
    flags = compile_flags()

    def compile_one(src: str) -> str:
        obj = objdir / (Path(src).stem + ".o")
        if not (obj.exists() and obj.stat().st_mtime > newest_src):
            r = subprocess.run([nvcc, *flags, "-Xcompiler", "-fPIC", "-c", src, "-o", str(obj)],
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"nvcc failed on {src}:\n{r.stderr[-4000:]}")
            for line in serialized_wgmma(r.stderr):
                log.warning("mok.fast: %s: %s", Path(src).name, line)
        return str(obj)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as ex:
        objs = list(ex.map(compile_one, sources()))
    subprocess.check_call([nvcc, *ARCH_FLAGS, "-shared", "-cudart", "static", *objs, "-Xlinker",
                           f"--version-script={EXPORTS_MAP}", "-o", out])
    return out


_KERNELS: str | None = None  # the kernels library's path, once located (built if need be)
_BINDING = None  # the binding module, once built and imported
log = logging.getLogger("mok")


def cache_dir() -> Path:
    """Where the first-use build goes: $MOK_FAST_CACHE or ~/.cache/mok/fast."""
    return Path(os.environ.get("MOK_FAST_CACHE", Path.home() / ".cache" / "mok" / "fast"))


def sm90_problem(device) -> str | None:
    """Why `device` (a CUDA device) cannot run the sm_90a kernels, or None when it is an sm_90 GPU."""
    import torch

    cap = torch.cuda.get_device_capability(device)
    if cap != (9, 0):
        return f"mok.fast needs compute capability 9.0 (sm_90a, H100/H200); {device} has {cap[0]}.{cap[1]}"
    return None


def is_available(device=None) -> tuple[bool, str]:
    """(ok, reason): whether the fast path can run on `device` (default: the current CUDA device),
    without building anything: an sm_90 GPU, a C++ compiler for the binding, and a kernels library to load
    (MOK_FAST_LIB, already loaded) or what building one needs (nvcc and the CUTLASS headers)."""
    import torch

    if not torch.cuda.is_available():
        return False, "no CUDA GPU is visible"
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if dev.type != "cuda":
        return False, f"{dev} is not a CUDA device"
    problem = sm90_problem(dev)
    if problem:
        return False, problem
    if _BINDING is not None and _BINDING.kernels_loaded():
        return True, "sm_90 GPU, library loaded"
    try:
        find_cxx()
        _binding_cuda_headers()
    except FastPathUnavailable as e:
        return False, str(e)
    if os.environ.get("MOK_FAST_LIB"):
        if not Path(os.environ["MOK_FAST_LIB"]).is_file():
            return False, f"MOK_FAST_LIB={os.environ['MOK_FAST_LIB']} is not a file"
        return True, f"sm_90 GPU, library {os.environ['MOK_FAST_LIB']}"
    try:
        find_nvcc()
        cutlass_include_dirs()
    except FastPathUnavailable as e:
        return False, str(e)
    return True, f"sm_90 GPU, nvcc and CUTLASS present (kernels built on first use into {cache_dir()})"


def kernels_library() -> str:
    """The kernels library's path: $MOK_FAST_LIB, or the first-use build (built on the first call, with a message
    saying so); FastPathUnavailable when it cannot be had here. The binding calls this on its first kernel call."""
    global _KERNELS
    if _KERNELS is not None:
        return _KERNELS
    import torch

    if not torch.cuda.is_available():
        raise FastPathUnavailable("mok.fast needs a CUDA GPU of compute capability 9.0 (Hopper); none is visible")
    path = os.environ.get("MOK_FAST_LIB")
    if path:
        if not Path(path).is_file():
            raise FastPathUnavailable(f"MOK_FAST_LIB={path} is not a file")
    else:
        if first_use_build_is_stale(torch.__version__):
            log.warning("mok.fast: compiling the CUDA kernels for sm_90a (first use: about 1 minute on 16 cores, "
                        "several on 2); cached in %s", cache_dir() / NAME)
        path = build_with_torch(verbose=os.environ.get("MOK_FAST_VERBOSE") == "1")
    _KERNELS = path
    return path


def find_cxx() -> str:
    """The C++ compiler torch.utils.cpp_extension uses ($CXX or c++); FastPathUnavailable naming it if absent."""
    cxx = os.environ.get("CXX", "c++")
    found = shutil.which(cxx)
    if found is None:
        raise FastPathUnavailable(f"no C++ compiler: mok.fast builds its binding (csrc/python_api.cpp) on first use "
                                  f"with {cxx!r}; install g++ or set CXX")
    return found


def _torch_release(version: str) -> str:
    """'2.11.0' of a torch version string such as '2.11.0+cu130'."""
    m = re.match(r"\d+\.\d+\.\d+", version)
    return m.group(0) if m else version


def _binding_cuda_headers() -> bool:
    """Whether the binding is compiled with c10's CUDA guard and streams (a CUDA build of torch); they need the CUDA
    toolkit's headers: FastPathUnavailable saying so when torch.utils.cpp_extension finds none."""
    import torch

    if torch.version.cuda is None:
        return False
    from torch.utils import cpp_extension

    if cpp_extension.CUDA_HOME is None:
        raise FastPathUnavailable(f"torch {torch.__version__} is a CUDA build, so mok.fast's binding is compiled with "
                                  f"c10's CUDA guard and streams, which need the CUDA toolkit's headers: set CUDA_HOME")
    return True


def binding_dir() -> Path:
    """Where the binding is built: one directory per torch and Python version (the module links to both)."""
    import torch

    return cache_dir() / BINDING_NAME / f"torch-{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}"


def build_binding(verbose: bool = False):
    """Build (or reuse) and import the binding against this process's torch; returns the module. With a CUDA build
    of torch it is compiled with c10's CUDA guard and streams, which need the CUDA toolkit's headers (CUDA_HOME);
    with a CPU build of torch it is compiled without them and refuses kernel calls (its checks still run)."""
    import torch
    from torch.utils import cpp_extension

    find_cxx()
    cuda = _binding_cuda_headers()
    build_dir = binding_dir()
    if os.environ.get("MOK_FAST_REBUILD") == "1" and build_dir.exists():
        shutil.rmtree(build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    if not glob.glob(str(build_dir / f"{BINDING_NAME}*.so")):
        log.warning("mok.fast: compiling its binding (csrc/python_api.cpp) against torch %s (first use: about "
                    "20 s of one core); cached in %s", torch.__version__, build_dir)
    try:
        module = cpp_extension.load(
            name=BINDING_NAME,
            sources=[str(BINDING_SOURCE)],
            extra_cflags=["-O2", "-fvisibility=hidden", *(["-DMOK_TORCH_CUDA"] if cuda else [])],
            extra_include_paths=[str(CSRC)],
            extra_ldflags=[f"-Wl,--version-script={BINDING_EXPORTS_MAP}"],
            with_cuda=cuda,
            build_directory=str(build_dir),
            verbose=verbose,
        )
    except ImportError as e:
        raise FastPathUnavailable(f"mok.fast's binding in {build_dir} does not load under torch {torch.__version__} "
                                  f"({e}); delete that directory or set MOK_FAST_REBUILD=1 to rebuild it") from e
    if module.TORCH_VERSION != _torch_release(torch.__version__):
        raise FastPathUnavailable(f"mok.fast's binding in {build_dir} was built against torch {module.TORCH_VERSION}, "
                                  f"this is torch {torch.__version__}: delete that directory or set "
                                  f"MOK_FAST_REBUILD=1 to rebuild it")
    return module


def binding():
    """The binding module (csrc/python_api.cpp), built on first call; its kernel calls locate the kernels library
    through `kernels_library` (looked up at each first call, so tests may replace it)."""
    global _BINDING
    if _BINDING is None:
        module = build_binding(verbose=os.environ.get("MOK_FAST_VERBOSE") == "1")
        module.set_kernels_locator(lambda: kernels_library())
        _BINDING = module
    return _BINDING


def load():
    """The binding with the kernels library loaded (both built on first use): what a layer needs before its first
    call; raises FastPathUnavailable when either cannot be had here."""
    module = binding()
    module.load_kernels()
    return module


if __name__ == "__main__":
    print(build_standalone(sys.argv[1], jobs=int(os.environ.get("MOK_FAST_JOBS", "2"))))

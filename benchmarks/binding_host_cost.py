"""Host cost of preparing one grouped GEMM launch, on the CPU: the ctypes binding (mok/fast/_lib.py at --old, read
from git: Python dataclasses, Python checks, ctypes structs) against the typed one (csrc/python_api.cpp: segments and
checks in C++). The launch is the forward's gate/up GEMM of Qwen3-30B-A3B with a shared expert added (E = 128,
H = 2048, I = 768, S = 768, T = 1000: two routed segments and two shared ones).

Timed with timeit (best of --repeat rounds of --number calls, microseconds per launch):
  segments  making the four Segments and their Operands
  checks    the binding's checks of them (old: check_segments in Python; new: in C++)
  structs   old only: the ctypes MokSegment array the launch passed (the new launch fills it in C++, with the
            workspace, guard and stream: that part runs only on a GPU, see host_time.py)
  call      old only, with --kernels LIB (a kernels library, e.g. from `python -m mok.fast._build`): the ctypes call of
            mok_grouped_gemm with its argument conversions, made to return at once (an invalid variant); without the
            device and stream look-ups of the old `_call`, which need a GPU

    python benchmarks/binding_host_cost.py [--old b8a7dcd] [--kernels .build/lib.so]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import timeit
import types
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
E, H, I, S, T, K = 128, 2048, 768, 768, 1000, 8


def old_lib(rev: str):
    """mok/fast/_lib.py at git revision `rev` as a module (its library loader left out: nothing is loaded)."""
    src = subprocess.run(["git", "show", f"{rev}:mok/fast/_lib.py"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    src = src.replace("from ._build import library", "library = None")
    mod = types.ModuleType("mok_old_lib")
    sys.modules[mod.__name__] = mod  # dataclasses look their module up
    exec(compile(src, f"{rev}:mok/fast/_lib.py", "exec"), mod.__dict__)
    return mod


def tensors():
    bf, f32 = torch.bfloat16, torch.float32
    return dict(offsets=torch.zeros(2 * E + 1, dtype=torch.int32), x_RH=torch.zeros(T * K, H, dtype=bf),
                x_TH=torch.zeros(T, H, dtype=bf), w=torch.zeros(E, 2 * I, H, dtype=bf),
                ws=torch.zeros(2 * S, H, dtype=bf),
                gu=torch.zeros(T * K, 2 * I, dtype=f32), gu_s=torch.zeros(T, 2 * S, dtype=f32))


def segments(lib, t):
    """The gate/up launch's segments as mok/fast/_forward.py's gate_up makes them."""
    x_rows = lib.Operand(t["x_RH"], 0, H, H)
    segs = [lib.Segment.expert_rows(t["offsets"], E, I, H, x_rows,
                                    lib.Operand(t["w"], 2 * I * H, 0, H, offset=h * I * H),
                                    lib.Operand(t["gu"], 0, 2 * I, 2 * I, offset=h * I)) for h in (0, 1)]
    segs += [lib.Segment.all_rows(T, S, H, lib.Operand(t["x_TH"], 0, 0, H),
                                  lib.Operand(t["ws"], 0, 0, H, offset=h * S * H),
                                  lib.Operand(t["gu_s"], 0, 0, 2 * S, offset=h * S)) for h in (0, 1)]
    return segs


def old_call(old, path: str, segs):
    """The old launch's ctypes call of mok_grouped_gemm (typed from its SIGNATURES), returning at once."""
    import ctypes

    handle = ctypes.CDLL(path)  # RTLD_LOCAL
    fn = handle.mok_grouped_gemm
    fn.restype, fn.argtypes = old.SIGNATURES["mok_grouped_gemm"]
    arr = (old.MokSegment * len(segs))(*[s.c() for s in segs])
    ws = torch.empty(1024, dtype=torch.uint8)

    def call():
        assert fn(old.GEMM_TN_F32, 99, arr, len(segs), old._p(ws), ws.numel(), 0, ctypes.c_void_p(None)) != 0
    return call


def timed(fn, number: int, repeat: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", default="b8a7dcd", help="git revision of the ctypes binding (default: b8a7dcd)")
    p.add_argument("--kernels", help="a kernels library to time the old ctypes call against")
    p.add_argument("--number", type=int, default=2000)
    p.add_argument("--repeat", type=int, default=7)
    a = p.parse_args()
    from mok.fast import _build, _lib

    _build.binding()
    old, t, dev = old_lib(a.old), tensors(), torch.device("cpu")
    kind = _lib.GEMM_TN_F32
    rows = {}
    for name, lib in (("ctypes (old)", old), ("typed (new)", _lib)):
        segs = segments(lib, t)
        lib.check_segments(kind, segs, dev, 0)  # both accept it
        rows[name] = {"segments": timed(lambda: segments(lib, t), a.number, a.repeat),
                      "checks": timed(lambda: lib.check_segments(kind, segs, dev, 0), a.number, a.repeat)}
        if lib is old:
            rows[name]["structs"] = timed(lambda: (old.MokSegment * len(segs))(*[s.c() for s in segs]), a.number,
                                          a.repeat)
            if a.kernels:
                rows[name]["call"] = timed(old_call(old, a.kernels, segs), a.number, a.repeat)
    print(f"torch {torch.__version__}, one gate/up launch of 4 segments, us per launch (best of {a.repeat} x "
          f"{a.number})")
    for name, r in rows.items():
        print(f"  {name:13s} " + "  ".join(f"{k} {v:6.2f}" for k, v in r.items()) + f"  total {sum(r.values()):6.2f}")


if __name__ == "__main__":
    main()

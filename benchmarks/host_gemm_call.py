"""Host cost of one grouped-GEMM call through the binding (`mok.fast._lib.grouped_gemm`; small shapes, so the GPU
idles), and of the CUDA driver entry-point lookup that CUTLASS makes for each TMA descriptor it encodes
(cudaGetDriverEntryPointByVersion of the CUDA runtime torch loaded, through ctypes). CUDA only.

Usage: python benchmarks/host_gemm_call.py
"""
from __future__ import annotations

import ctypes
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mok.fast import _lib  # noqa: E402


def per_call_us(fn, n: int) -> float:
    """Host microseconds a call of `fn`, over `n` calls."""
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


def main() -> int:
    torch.zeros(1, device="cuda")  # loads the CUDA runtime
    cudart = sorted({p for p in open("/proc/self/maps").read().split() if "libcudart" in p})
    if not cudart:
        raise SystemExit("no libcudart loaded in this process")
    print("loaded cudart:", cudart[0])
    rt = ctypes.CDLL(cudart[0])
    pfn, status, dev = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_int()
    lookup = per_call_us(lambda: rt.cudaGetDriverEntryPointByVersion(b"cuTensorMapEncodeTiled", ctypes.byref(pfn),
                                                                     12000, 0, ctypes.byref(status)), 10000)
    print(f"cudaGetDriverEntryPointByVersion: {lookup:.2f} us a call (status {status.value})")
    print(f"ctypes + cudaGetDevice baseline: {per_call_us(lambda: rt.cudaGetDevice(ctypes.byref(dev)), 10000):.2f} us")
    for T in (64, 1000):
        a = torch.randn(T, 256, device="cuda").to(torch.bfloat16)
        b = torch.randn(512, 256, device="cuda").to(torch.bfloat16)
        d = torch.empty(T, 512, device="cuda")
        seg = [_lib.Segment.all_rows(T, 512, 256, _lib.Operand(a, 0, 0, 256), _lib.Operand(b, 0, 0, 256),
                                     _lib.Operand(d, 0, 0, 512))]
        for v in (0, 3):
            call = lambda: _lib.grouped_gemm(_lib.GEMM_TN_F32, seg, a.device, v)  # noqa: E731
            per_call_us(call, 20)
            torch.cuda.synchronize()
            print(f"grouped_gemm TN_F32 T={T} variant {v}: {per_call_us(call, 200):.1f} us of host a call")
            torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

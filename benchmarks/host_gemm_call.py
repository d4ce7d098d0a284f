"""Host cost of one grouped-GEMM call through the binding (`mok.fast._lib.grouped_gemm`, small shapes so the GPU is
idle), and of the CUDA driver entry-point lookup that CUTLASS's TMA-descriptor encoding makes on every call
(cudaGetDriverEntryPointByVersion, through ctypes). CUDA only.

Usage: python benchmarks/host_gemm_call.py
"""
import ctypes, glob, os, sys, time
import torch
torch.zeros(1, device="cuda")
cands = [p for p in open("/proc/self/maps").read().split() if "libcudart" in p]
print("loaded cudart:", sorted(set(cands))[:3])
lib = ctypes.CDLL(sorted(set(cands))[0]) if cands else None
if lib is None:
    import site
    for d in site.getsitepackages():
        g = glob.glob(os.path.join(d, "nvidia", "*", "lib", "libcudart.so*")) + glob.glob(os.path.join(d, "torch", "lib", "libcudart*"))
        if g:
            lib = ctypes.CDLL(g[0]); print("dlopen", g[0]); break
pfn, st = ctypes.c_void_p(), ctypes.c_int()
f = lib.cudaGetDriverEntryPointByVersion
for n in (100, 10000):
    t = time.perf_counter()
    for _ in range(n):
        r = f(b"cuTensorMapEncodeTiled", ctypes.byref(pfn), 12000, 0, ctypes.byref(st))
    dt = (time.perf_counter() - t) / n * 1e6
    print(f"cudaGetDriverEntryPointByVersion: {dt:.2f} us a call (rc {r}, status {st.value})")
g = lib.cudaGetDevice
d = ctypes.c_int()
t = time.perf_counter()
for _ in range(10000):
    g(ctypes.byref(d))
print(f"ctypes + cudaGetDevice baseline: {(time.perf_counter() - t) / 10000 * 1e6:.2f} us a call")
sys.path.insert(0, os.getcwd())
from mok.fast import _lib
for T in (64, 1000):
    a = torch.randn(T, 256, device="cuda").to(torch.bfloat16); b = torch.randn(512, 256, device="cuda").to(torch.bfloat16)
    d_ = torch.empty(T, 512, device="cuda")
    seg = [_lib.Segment.all_rows(T, 512, 256, _lib.Operand(a, 0, 0, 256), _lib.Operand(b, 0, 0, 256), _lib.Operand(d_, 0, 0, 512))]
    for v in (0, 3):
        for _ in range(20): _lib.grouped_gemm(_lib.GEMM_TN_F32, seg, a.device, v)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(200): _lib.grouped_gemm(_lib.GEMM_TN_F32, seg, a.device, v)
        host = (time.perf_counter() - t) / 200 * 1e6
        torch.cuda.synchronize()
        print(f"grouped_gemm TN_F32 T={T} variant {v}: {host:.1f} us of host a call")

"""Host time per mok.MoE forward+backward step: the CPU time the step's Python and launches take, the device idle
before it (median over --reps steps after --warmup, each step started after a synchronize and timed until backward
returns; the device time of the same steps beside it on CUDA). Only the public API (mok.MoE) and one switch of
mok.nn._op_common are used, so the script measures any checkout of mok on PYTHONPATH: run it once per checkout in
one session to compare two bindings, e.g.

    PYTHONPATH=/path/to/old python benchmarks/host_time.py --device cuda
    PYTHONPATH=/path/to/new python benchmarks/host_time.py --device cuda

--paths eager,op compares the layer's two call paths: the eager autograd.Function (what plain eager calls take)
and the registered custom ops (what torch.compile traces), the same bodies and bits.

Shapes (W = 1): t1000 = Qwen3-30B-A3B's layer at T = 1000; qwen3-30b-a3b = the same at T = 16384
(benchmarks/configs.json); tiny = T 8, H 16, I 8, E 4, K 2, S 8 (for --device cpu with the reference backend:
the Python and dispatch cost alone).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import mok

SHAPES = {"t1000": dict(T=1000, H=2048, I=768, E=128, K=8, S=0),
          "qwen3-30b-a3b": dict(T=16384, H=2048, I=768, E=128, K=8, S=0),
          "tiny": dict(T=8, H=16, I=8, E=4, K=2, S=8)}
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def measure(shape: str, dtype: str, path: str, device: str, backend: str, reps: int, warmup: int):
    """(median host ms, median device ms or None) of one config's steps."""
    from mok.nn import _op_common

    s = SHAPES[shape]
    torch.manual_seed(0)
    model = mok.MoE(s["H"], s["I"], s["E"], s["K"], shared_intermediate_size=s["S"], backend=backend,
                    dtype=DTYPES[dtype], device=device)
    x = torch.randn(s["T"], s["H"], device=device, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(s["T"], s["H"], device=device, dtype=torch.bfloat16)
    cuda = device.startswith("cuda")
    saved = getattr(_op_common, "_EAGER", True)
    _op_common._EAGER = path == "eager"
    host, dev = [], []
    try:
        for i in range(warmup + reps):
            model.zero_grad(set_to_none=True)
            x.grad = None
            if cuda:
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            t0 = time.perf_counter()
            model(x).backward(dy)
            t1 = time.perf_counter()
            if cuda:
                end.record()
                torch.cuda.synchronize()
            if i >= warmup:
                host.append((t1 - t0) * 1e3)
                if cuda:
                    dev.append(start.elapsed_time(end))
    finally:
        _op_common._EAGER = saved
    return statistics.median(host), (statistics.median(dev) if dev else None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--backend", default=None, help="default: fast on CUDA, reference elsewhere")
    p.add_argument("--shapes", default=None, help="comma-separated (default: t1000,qwen3-30b-a3b on CUDA, tiny else)")
    p.add_argument("--dtypes", default="bf16,fp32", help="parameter dtypes, comma-separated")
    p.add_argument("--paths", default="eager", help="eager and/or op, comma-separated")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    a = p.parse_args()
    cuda = a.device.startswith("cuda")
    backend = a.backend or ("fast" if cuda else "reference")
    shapes = (a.shapes or ("t1000,qwen3-30b-a3b" if cuda else "tiny")).split(",")
    where = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"mok {mok.__file__}, torch {torch.__version__}, {where}, backend {backend}, median of {a.reps} steps")
    for shape in shapes:
        for dtype in a.dtypes.split(","):
            for path in a.paths.split(","):
                host, dev = measure(shape, dtype, path, a.device, backend, a.reps, a.warmup)
                print(f"  {shape:14s} {dtype:5s} {path:6s} host {host:8.3f} ms" +
                      (f"  device {dev:8.3f} ms" if dev is not None else ""), flush=True)


if __name__ == "__main__":
    main()

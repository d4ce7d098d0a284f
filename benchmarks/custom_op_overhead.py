"""Host time of one call of a trivial `torch.library.custom_op` on CUDA tensors: one tensor in and out, and 15 in
/ 12 out (about what mok's layer op takes and returns), against creating the 12 outputs in plain Python.
Usage: python benchmarks/custom_op_overhead.py"""
import torch
from host_timing import host_wall_ms
@torch.library.custom_op("scratch::many", mutates_args=())
def many(xs: list[torch.Tensor], n: int) -> list[torch.Tensor]:
    return [torch.empty(4, device=xs[0].device) for _ in range(n)]
@torch.library.custom_op("scratch::few", mutates_args=())
def few(a: torch.Tensor) -> torch.Tensor:
    return torch.empty(4, device=a.device)
xs = [torch.zeros(1 << 20, device="cuda") for _ in range(15)]
for name, fn in (("few", lambda: few(xs[0])), ("many15x12", lambda: many(xs, 12)), ("plain python", lambda: [torch.empty(4, device="cuda") for _ in range(12)])):
    print(f"{name}: {host_wall_ms(fn, reps=200, warmup=10)[0] * 1e3:.1f} us/call", flush=True)

"""Host time of a callable on the GPU, shared by the host-cost scripts (host_autograd_breakdown.py,
host_module_profile.py, custom_op_layer_overhead.py, custom_op_overhead.py, profile_module.py)."""
import time

import torch


def host_wall_ms(fn, reps: int = 30, warmup: int = 5) -> tuple[float, float]:
    """(host ms, wall ms) per call of `fn`: `warmup` calls, a synchronisation, then `reps` calls queued back to
    back; host = until the last call returns (the CPU's time while the GPU queue is not full), wall = until the GPU
    has finished them."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) / reps * 1e3, (t2 - t0) / reps * 1e3

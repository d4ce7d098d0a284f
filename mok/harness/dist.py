"""Run the reference in W real processes joined by a torch.distributed group (gloo on CPU, nccl on GPU).

Processes start from a fork server that has imported torch and mok but run nothing (no thread
pool, no CUDA context), so each launch is a fresh process that costs well under a second.
"""

from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

_PRELOAD = ["torch", "torch.distributed", "mok.harness.runner", "mok.reference"]


def _worker(rank, world_size, init_file, payload_path, out_dir, threads, device):
    torch.set_num_threads(threads)
    from .runner import run_sharded

    inputs = torch.load(payload_path, weights_only=True)
    if device == "cuda":
        torch.cuda.set_device(rank)
        inputs = {k: (v.cuda() if v is not None else None) for k, v in inputs.items()}
    group = None
    if world_size > 1:
        backend = "nccl" if device == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world_size)
        group = dist.group.WORLD
    try:
        out = run_sharded(inputs, rank, world_size, group)
    finally:
        if group is not None:
            dist.destroy_process_group()
    torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))


def run_reference_world(inputs: dict, world_size: int, *, threads: int = 1, device: str = "cpu") -> list:
    """Forward+backward of the reference on global `inputs` (CPU tensors), split over W fresh processes.

    Returns the W per-rank output dicts (CPU tensors), rank order.
    """
    if device == "cuda" and torch.cuda.device_count() < world_size:
        raise ValueError(f"world_size: expected at most {torch.cuda.device_count()} (GPUs present), got {world_size}")
    with tempfile.TemporaryDirectory(prefix="mok-dist-") as tmp:
        payload = os.path.join(tmp, "inputs.pt")
        torch.save({k: (v.cpu() if v is not None else None) for k, v in inputs.items()}, payload)
        mp.set_forkserver_preload(_PRELOAD)  # effective when this process first starts its fork server
        mp.start_processes(_worker, args=(world_size, os.path.join(tmp, "init"), payload, tmp, threads, device),
                           nprocs=world_size, join=True, start_method="forkserver")
        return [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=True) for r in range(world_size)]

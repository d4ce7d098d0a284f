"""Python host time of one mok.fast forward+backward, without a GPU: every C call of the binding is
replaced by a no-op (and the GPU-only input checks by tests/fast_emulator.py's), so what is timed is the
Python side alone (checks, segments, ctypes arguments, allocations on the CPU) at a model's E and K with a
small T. It says nothing about the native side (CUTLASS's host setup, CUDA launches).

Usage: python benchmarks/host_cost.py [--H 2048 --I 768 --E 128 --K 8 --S 0 --T 64] [--steps 50]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def stub_gpu() -> list:
    """Stub the C calls and the CUDA stream API in this process; returns the list the calls are logged to."""
    import fast_emulator

    import mok.fast as fast
    from mok.fast import _checks, _context, _lib

    calls = []
    _lib._call = lambda name, device, *args: calls.append(name)
    _lib.lib = lambda: type("Lib", (), {"mok_gemm_workspace_bytes": staticmethod(lambda *a: 1024),
                                        "mok_schedule_scratch_ints": staticmethod(lambda *a: 1024)})()
    _lib._workspace_bytes.cache_clear()
    for mod in (fast, _checks, _context):
        mod.check_inputs = fast_emulator._check_inputs
    fast_emulator.stub_streams()
    return calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for k, v in dict(T=64, H=2048, I=768, E=128, K=8, S=0).items():
        ap.add_argument(f"--{k}", type=int, default=v)
    ap.add_argument("--steps", type=int, default=50)
    a = ap.parse_args()
    calls = stub_gpu()
    import mok.fast as fast
    from mok.harness.cases import LAYER_ARGS, MoEConfig, make_inputs, with_stacked_gate_up

    inp = with_stacked_gate_up(make_inputs(MoEConfig(T=a.T, H=a.H, I=a.I, E=a.E, K=a.K, S=a.S), 0))

    def step():
        _, ctx = fast.forward(*(inp[k] for k in LAYER_ARGS))
        fast.backward(ctx, inp["dy"], weight_grad_dtype=torch.bfloat16)

    for _ in range(3):
        step()
    calls.clear()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    ms = (time.perf_counter() - t0) / a.steps * 1e3
    print(f"Python host time per fwd+bwd (C calls stubbed): {ms:.3f} ms, {len(calls) // a.steps} C calls per step "
          f"(H={a.H} I={a.I} E={a.E} K={a.K} S={a.S} T={a.T})")


if __name__ == "__main__":
    main()

"""Python host time of one mok.fast forward+backward, without a GPU: every C call of the binding is
replaced by a no-op (and the GPU-only input checks by tests/fast_emulator.py's), so what is timed is the
Python side alone (checks, segments, ctypes arguments, allocations on the CPU) at a model's E and K with a
small T. It says nothing about the native side (CUTLASS's host setup, CUDA launches). `--module` times a whole
mok.MoE training step instead (router, layer, both router losses, backward through autograd; bf16 parameters);
`--profile N` prints a cProfile of the step's N most costly functions (own time).

Usage: python benchmarks/host_cost.py [--H 2048 --I 768 --E 128 --K 8 --S 0 --T 64] [--steps 50] [--module]
       [--profile 30]
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
    from mok.fast import _checks, _context, _lib, _router

    calls = []
    _lib._call = lambda name, device, *args: calls.append(name)
    _lib.lib = lambda: type("Lib", (), {"__getattr__": lambda self, name: (lambda *a: 1024)})()  # sizes: 1024
    _lib._workspace_bytes.cache_clear()
    for mod in (fast, _checks, _context):
        mod.check_inputs = fast_emulator._check_inputs
    _router._on_cuda = lambda name, t: None  # the router's tensors are on the CPU here
    fast_emulator.stub_streams()
    return calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for k, v in dict(T=64, H=2048, I=768, E=128, K=8, S=0).items():
        ap.add_argument(f"--{k}", type=int, default=v)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--module", action="store_true", help="a mok.MoE training step instead of the layer's")
    ap.add_argument("--profile", type=int, default=0, help="print a cProfile of this many functions")
    a = ap.parse_args()
    calls = stub_gpu()
    step = _module_step(a) if a.module else _layer_step(a)

    for _ in range(3):
        step()
    calls.clear()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    ms = (time.perf_counter() - t0) / a.steps * 1e3
    what = "mok.MoE training step" if a.module else "fwd+bwd"
    print(f"Python host time per {what} (C calls stubbed): {ms:.3f} ms, {len(calls) // a.steps} C calls per step "
          f"(H={a.H} I={a.I} E={a.E} K={a.K} S={a.S} T={a.T})")
    if a.profile:
        import cProfile
        import pstats

        pr = cProfile.Profile()
        pr.enable()
        for _ in range(a.steps):
            step()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(a.profile)


def _layer_step(a):
    import mok.fast as fast
    from mok.harness.cases import LAYER_ARGS, MoEConfig, make_inputs, with_stacked_gate_up

    inp = with_stacked_gate_up(make_inputs(MoEConfig(T=a.T, H=a.H, I=a.I, E=a.E, K=a.K, S=a.S), 0))

    def step():
        _, ctx = fast.forward(*(inp[k] for k in LAYER_ARGS))
        fast.backward(ctx, inp["dy"], weight_grad_dtype=torch.bfloat16)
    return step


def _module_step(a):
    """A mok.MoE(backend="fast") step on the CPU with the C calls stubbed (its kernels are never built)."""
    import mok

    torch.manual_seed(0)
    m = mok.MoE(a.H, a.I, a.E, a.K, shared_intermediate_size=a.S, backend="fast", dtype=torch.bfloat16)
    m._fast_ready = True  # nothing to build: the C calls are stubbed
    x = torch.randn(a.T, a.H).bfloat16().requires_grad_()
    dy = torch.randn(a.T, a.H).bfloat16()

    def step():
        m.zero_grad(set_to_none=True)
        x.grad = None
        y, rl = m(x, return_router_losses=True)
        ((y * dy).sum() + 0.01 * rl.load_balance + 0.001 * rl.z).backward()
    return step


if __name__ == "__main__":
    main()

"""Where the host time of a mok.MoE training step goes at a small batch (deepseek-v2-lite's shape, T = 1000), on
the GPU: host ms of the layer op's forward without and with autograd, of its backward alone, of a whole step; the
synchronising calls PyTorch reports in a step (torch.cuda.set_sync_debug_mode); and a torch.profiler table of the
CUDA runtime calls and the operators with the most host time, for the layer op and for the module.
Usage: python benchmarks/host_autograd_breakdown.py [--rows N]"""
import argparse
import time
import warnings

import torch
from host_timing import host_wall_ms

import mok
from mok.nn import ops

ap = argparse.ArgumentParser()
ap.add_argument("--rows", type=int, default=25, help="rows of each profiler table")
ap.add_argument("--quick", action="store_true", help="the host times only (no sync check, profiles)")
args = ap.parse_args()

T, H, I, E, K, S = 1000, 2048, 1408, 64, 6, 2816
m = mok.MoE(H, I, E, K, shared_intermediate_size=S, backend="fast", dtype=torch.bfloat16, device="cuda")
x = torch.randn(T, H, device="cuda").bfloat16().requires_grad_()
dy = torch.randn(T, H, device="cuda").bfloat16()
with torch.no_grad():
    r = m.route(x)
idx, tw = r.topk_idx, r.topk_weight.detach()
w = (m.w_shared_gate_up_2SH, m.w_shared_down_HS, m.w_gate_up_L2IH, m.w_down_LHI)


def layer(weights, inp):
    return ops.moe_gate_up(inp, idx, tw, *weights, backend="fast")


def fwd_no_grad():
    with torch.no_grad():
        layer(w, x)


def fwd_autograd():
    layer(w, x)


def step_layer():
    m.zero_grad(set_to_none=True)
    x.grad = None
    (layer(w, x) * dy).sum().backward()


def step_module():
    m.zero_grad(set_to_none=True)
    x.grad = None
    y, rl = m(x, return_router_losses=True)
    ((y * dy).sum() + 0.01 * rl.load_balance + 0.001 * rl.z).backward()


def timed(name, fn):
    host, wall = host_wall_ms(fn)
    print(f"{name}: host {host:.3f} ms/call, wall {wall:.3f} ms/call", flush=True)


def backward_alone(n=30):
    """Host time of loss.backward() alone, each after a synchronised forward."""
    total = 0.0
    for i in range(n + 5):
        m.zero_grad(set_to_none=True)
        x.grad = None
        loss = (layer(w, x) * dy).sum()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss.backward()
        if i >= 5:
            total += time.perf_counter() - t0
    torch.cuda.synchronize()
    print(f"layer backward alone (GPU idle at its start): host {total / n * 1e3:.3f} ms/call", flush=True)


timed("layer forward, no_grad", fwd_no_grad)
timed("layer forward, autograd recording", fwd_autograd)
backward_alone()
timed("layer step (forward + backward)", step_layer)
timed("module step (router, layer, losses, backward)", step_module)
if args.quick:
    raise SystemExit(0)

for name, fn in (("layer step", step_layer), ("module step", step_module)):
    torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    torch.cuda.set_sync_debug_mode(0)
    print(f"{name}: {len(caught)} synchronising calls reported by PyTorch", flush=True)
    for c in caught[:10]:
        print("   ", str(c.message).splitlines()[0][:200])

acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
for name, fn in (("layer step", step_layer), ("module step", step_module)):
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
    ev = prof.key_averages()
    runtime = sorted((e for e in ev if e.key.startswith("cu")), key=lambda e: -e.self_cpu_time_total)
    print(f"===== {name} x10: CUDA runtime / driver calls by host time")
    for e in runtime[:args.rows]:
        print(f"  {e.key[:60]:60s} count {e.count:6d}  host {e.self_cpu_time_total / 1e3:8.3f} ms")
    print(f"===== {name} x10: operators by self host time")
    print(ev.table(sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=60))

# the native side: host time inside each C function of the binding (CUTLASS's host setup and the launches), per
# layer step, by wrapping mok.fast._lib._call
from mok.fast import _lib  # noqa: E402

native: dict[str, list] = {}
_plain_call = _lib._call


def _timed_call(name, device, *a):
    t0 = time.perf_counter()
    _plain_call(name, device, *a)
    rec = native.setdefault(name, [0, 0.0])
    rec[0] += 1
    rec[1] += time.perf_counter() - t0


_lib._call = _timed_call
for name, fn in (("layer step", step_layer), ("module step", step_module)):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    native.clear()
    n = 20
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t0) / n * 1e3
    torch.cuda.synchronize()
    total = sum(v[1] for v in native.values()) / n * 1e3
    print(f"===== {name}: host {host:.3f} ms/step, of which {total:.3f} ms inside the binding's C calls "
          f"(_lib._call, {sum(v[0] for v in native.values()) // n} a step)")
    for k, (c, s) in sorted(native.items(), key=lambda kv: -kv[1][1]):
        print(f"  {k:28s} {c // n:3d} a step  {s / n * 1e3:7.3f} ms/step  {s / c * 1e6:7.1f} us/call")
_lib._call = _plain_call

import cProfile  # noqa: E402
import pstats  # noqa: E402

for name, fn in (("layer step", step_layer),):
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(20):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    print(f"===== {name} x20: cProfile by cumulative time")
    pstats.Stats(pr).sort_stats("cumulative").print_stats(45)

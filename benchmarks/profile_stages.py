"""Per-kernel time of one mok.fast forward+backward (torch.profiler, CUDA activity), per config of
configs.json (or of suite.json: names from either): what the GEMMs and the separate memory-bound kernels
cost. Gate and up are passed as the halves of one [gate; up] tensor (what mok.MoE with float32 weights and
transformers' gate_up_proj give the layer). Each GEMM line also shows its TFLOP/s; the header line gives the
wall time (queued back to back, and one call at a time) and how long the GPU idles inside one step.
Usage: python benchmarks/profile_stages.py [config,...]"""
import re
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import mok.fast  # noqa: E402
from bench_moe import ARGS, CONFIGS, SUITE, load_configs, make_bench_inputs, timed  # noqa: E402
from mok.testing.cases import with_stacked_gate_up  # noqa: E402


def short(name: str) -> str:
    if "fill_group_args" in name:
        return "fill_group_args"
    if "GemmUniversal" in name or "cutlass" in name:
        return "cutlass grouped GEMM " + ("pingpong" if "Pingpong" in name else "cooperative") + \
            (" SwiGLU-bwd epilogue" if "SwigluBwd" in name else
             " SwiGLU-fwd epilogue, staged" if "SwigluFwdStaged" in name else
             " SwiGLU-fwd epilogue" if "SwigluFwdEpilogue" in name else
             " f32-out" if "LinearCombinationIffvf" in name else " bf16-out")
    if "combine_rows_k<" in name:  # one kernel template: the forward combine (weighted) or the d_x combine
        return "combine_rows_k<true> (combine)" if "<true>" in name else "combine_rows_k<false> (d_x combine)"
    return name.replace("(anonymous namespace)::", "").replace("void ", "").split("(")[0].split("<")[0][:60]


_TILE = re.compile(r"tuple<cute::C<(\d+)>, ?cute::C<(\d+)>, ?cute::C<64> ?>")  # a GEMM's tile shape, K = 64


def tile_of(name: str) -> str:
    """The tile shape ("128x192") in a CUTLASS GEMM kernel's demangled name, or "" when it names none."""
    m = _TILE.search(name)
    return f"{m.group(1)}x{m.group(2)}" if m else ""


def gemm_labels(kernels: list, flops: list) -> list:
    """What each of one step's kernels, (name, ms) in launch order, prints as: its short name, and for a CUTLASS GEMM
    its tile, which GEMM it is and its TFLOP/s. `flops`: (label, FLOPs) of the step's GEMMs in launch order."""
    labels = iter(flops)
    out = []
    for name, ms in kernels:
        text = short(name)
        if text.startswith("cutlass"):
            lab, f = next(labels, ("?", 0))
            text += f" {tile_of(name)}  [{lab}: {f / ms / 1e9:.0f} TFLOP/s]"
        out.append(f"  {ms:8.3f} ms  {text}")
    return out


def step(inp):
    y, ctx = mok.fast.forward(*(inp[a] for a in ARGS))
    return mok.fast.backward(ctx, inp["dy"])


def busy_ms(evs) -> float:
    """Time at least one of `evs` runs (the union of their intervals; side-stream kernels overlap)."""
    total, end = 0.0, None
    for e in sorted(evs, key=lambda e: e.time_range.start):
        a, b = e.time_range.start, e.time_range.end
        if end is None or a > end:
            total, end = total + (b - a), b
        elif b > end:
            total, end = total + (b - end), b
    return total / 1e3


def profiled_steps(step, iters: int = 3) -> tuple[list, list]:
    """`step()` 3 times to warm up, then `iters` times queued back to back under torch.profiler: (every CUDA event,
    the last step's), each in launch order."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step()
        torch.cuda.synchronize()
    evs = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                 key=lambda e: e.time_range.start)
    return evs, evs[-(len(evs) // iters):]


def main():
    names = sys.argv[1].split(",") if len(sys.argv) > 1 else None
    configs = load_configs(CONFIGS)
    configs += [c for c in load_configs(SUITE) if names and c["name"] in names and c not in configs]
    for c in configs:
        if names and c["name"] not in names:
            continue
        inp = with_stacked_gate_up(make_bench_inputs(c, "random"))
        iters = 3
        evs, last = profiled_steps(lambda inp=inp: step(inp), iters)
        s = sum(e.device_time_total for e in last) / 1e3
        span = (max(e.time_range.end for e in last) - min(e.time_range.start for e in last)) / 1e3
        span_all = (max(e.time_range.end for e in evs) - min(e.time_range.start for e in evs)) / 1e3 / iters
        walls = {mode: timed(lambda inp=inp: step(inp), 3, 10, mode) for mode in ("stream", "sync")}
        print(f"\n{c['name']}: wall time of one fwd+bwd {walls['stream']:.2f} ms queued back to back, "
              f"{walls['sync']:.2f} ms one at a time (CUDA events, median of 10); from its first kernel's start "
              f"to its last one's end {span:.2f} ms, of which the GPU runs a kernel {busy_ms(last):.2f} ms; "
              f"{iters} profiled steps queued back to back: {span_all:.2f} ms per step from the first kernel's start "
              f"to the last one's end, the GPU busy {busy_ms(evs) / iters:.2f} ms of it")
        print(f"{c['name']}: kernel time of one fwd+bwd {s:.2f} ms, in launch order:")
        R, T, H, I, S = c["T"] * c["K"], c["T"], c["H"], c["I"], c["S"]
        one, two = 2 * H * (R * I + T * S), 2 * H * (R * 2 * I + T * 2 * S)
        flops = [("gate/up (+ SwiGLU when fused)", two), ("down", one), ("d_a", one), ("d_x", two),
                 ("wgrad gate/up", two), ("wgrad down", one)]  # the GEMM launches in order (run_forward, run_backward)
        print("\n".join(gemm_labels([(e.name, e.device_time_total / 1e3) for e in last], flops)))
        del inp
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

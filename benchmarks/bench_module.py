"""What a user training through the module pays: a training step of mok.MoE against a plain PyTorch MoE module.

    python benchmarks/bench_module.py [--suite] [--configs a,b] [--record]
    python benchmarks/bench_module.py --precisions bf16,fp8 [--suite] [--configs a,b]   # the recipes compared

For each config, one forward+backward of:
  mok.MoE(backend="fast")  router + both router losses + layer, bf16 and fp32 (master) parameters;
  mok.fast layer           `mok.fast.forward` + `backward` on the same routing (the floor);
  plain module             a plain PyTorch MoE: F.linear router, softmax top-k (renormalised), the
                           grouped_mm path, a Switch load-balancing loss; bf16 parameters, autograd.
With --precisions: mok.MoE (bf16 parameters, fast backend) alone, forward (autograd on, as in training) and a
training step, once per recipe (precision="bf16" / "fp8"), queued timing, and the step's peak GiB above what was
resident before the module was made.
Medians of CUDA-event timings in both modes of `bench_moe.timed`: "stream" (reps back to back, one
host sync at the end: a training loop) and "sync" (host waits after each rep: an isolated call, CPU
launch time included). module / layer is the cost of everything around the layer. Peak GiB (bf16 parameters):
the most a step allocated above what was resident before the module was made, so the module's parameters, their
gradients and everything its step keeps count; x and dy (shared by all) do not.
"""
from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mok  # noqa: E402
import mok.fast  # noqa: E402
import results  # noqa: E402
from bench_moe import (CONFIGS, SUITE, bf16_peak_tflops, fp8_peak_tflops, load_configs, named_configs,  # noqa: E402
                       timed)
from peers import grouped_mm_path  # noqa: E402

LAYER_ARGS = ("x", "topk_idx", "topk_weight", "shared_gate", "shared_up", "shared_down", "routed_gate",
              "routed_up", "routed_down")


class PlainMoE(torch.nn.Module):
    """What a user would write instead: F.linear router + softmax top-k + the grouped_mm path + aux loss."""

    def __init__(self, H, I, E, K, S, device):
        super().__init__()
        g = torch.Generator(device=device).manual_seed(0)

        def p(*shape, fan_in):
            return torch.nn.Parameter((torch.randn(*shape, generator=g, device=device) * fan_in**-0.5)
                                      .to(torch.bfloat16))

        self.K = K
        self.router = p(E, H, fan_in=H)
        self.gate, self.up, self.down = p(E, I, H, fan_in=H), p(E, I, H, fan_in=H), p(E, H, I, fan_in=I)
        self.shared = (p(S, H, fan_in=H), p(S, H, fan_in=H), p(H, S, fan_in=S)) if S else (None, None, None)
        if S:
            for i, t in enumerate(self.shared):
                self.register_parameter(f"shared{i}", t)

    def forward(self, x):
        E = self.router.shape[0]
        probs = F.linear(x, self.router).float().softmax(-1)
        w, idx = probs.topk(self.K, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        f = torch.zeros(E, device=x.device).scatter_add_(0, idx.reshape(-1), torch.ones(idx.numel(), device=x.device))
        aux = E * (f / idx.numel() * probs.mean(0)).sum()
        return grouped_mm_path(x, idx, w, *self.shared, self.gate, self.up, self.down), aux


def _module_step(model, x, dy):
    model.zero_grad(set_to_none=True)
    x.grad = None
    y, rl = model(x, return_router_losses=True)
    ((y * dy).sum() + 0.01 * rl.load_balance + 0.001 * rl.z).backward()


def _plain_step(model, x, dy):
    model.zero_grad(set_to_none=True)
    x.grad = None
    y, aux = model(x)
    ((y * dy).sum() + 0.01 * aux).backward()


def step_peak_gib(step, before: int) -> float:
    """GiB: the most one call of `step` allocates above `before` (bytes allocated before its module was made)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**30


def run(configs, timed, peak: float, warmup: int, reps: int) -> list[dict]:
    """Time the three per config; returns rows and prints one line each."""
    rows = []
    for c in configs:
        T, H, I, E, K, S = (c[k] for k in "THIEKS")
        flops = 3 * results.forward_flops(c)
        g = torch.Generator(device="cuda").manual_seed(1)
        x = torch.randn(T, H, generator=g, device="cuda").to(torch.bfloat16).requires_grad_()
        dy = torch.randn(T, H, generator=g, device="cuda").to(torch.bfloat16)
        res = {}
        for dtype in (torch.bfloat16, torch.float32):
            gc.collect()  # nothing left over to be freed inside the step whose peak is read against `before`
            before = torch.cuda.memory_allocated()
            torch.manual_seed(0)
            m = mok.MoE(H, I, E, K, shared_intermediate_size=S, backend="fast", dtype=dtype, device="cuda")
            assert m.backend_in_use == "fast", m.backend_reason
            for mode in ("stream", "sync"):
                res[f"module {str(dtype)[6:]} {mode}"] = timed(lambda m=m: _module_step(m, x, dy), warmup, reps, mode)
            if dtype == torch.bfloat16:
                mem = {"module": step_peak_gib(lambda m=m: _module_step(m, x, dy), before)}
                with torch.no_grad():
                    r = m.route(x)
                inp = {"x": x.detach(), "topk_idx": r.topk_idx, "topk_weight": r.topk_weight,
                       "shared_gate": m.w_shared_gate_SH, "shared_up": m.w_shared_up_SH,  # halves of one tensor
                       "shared_down": m.w_shared_down_HS, "routed_gate": m.w_gate_LIH, "routed_up": m.w_up_LIH,
                       "routed_down": m.w_down_LHI}
                inp = {k: (v.detach() if v is not None else None) for k, v in inp.items()}

                def layer():
                    y, ctx = mok.fast.forward(*(inp[a] for a in LAYER_ARGS))
                    mok.fast.backward(ctx, dy)

                for mode in ("stream", "sync"):
                    res[f"layer {mode}"] = timed(layer, warmup, reps, mode)
            del m
            torch.cuda.empty_cache()
        gc.collect()
        before = torch.cuda.memory_allocated()
        plain = PlainMoE(H, I, E, K, S, "cuda")
        for mode in ("stream", "sync"):
            res[f"plain {mode}"] = timed(lambda plain=plain: _plain_step(plain, x, dy), warmup, reps, mode)
        mem["plain"] = step_peak_gib(lambda plain=plain: _plain_step(plain, x, dy), before)
        del plain
        torch.cuda.empty_cache()
        row = dict(config=c["name"], shape=f"{T},{H},{I},{E},{K},{S}", **{k: v for k, v in res.items()},
                   tflops={k: flops / v / 1e9 for k, v in res.items()}, peak_gib=mem)
        rows.append(row)
        print(f"  {c['name']:16s} " + "  ".join(f"{k} {v:.2f}" for k, v in res.items())
              + f"  peak GiB mok.MoE {mem['module']:.2f} plain {mem['plain']:.2f}", flush=True)
    for mode in ("stream", "sync"):
        print()
        print(f"timing mode: {mode}")
        print(f"| config (T,H,I,E,K,S) | mok.MoE fwd+bwd, bf16 params ms | fp32 params ms | mok.fast layer ms | "
              f"module / layer (bf16 / fp32) | plain PyTorch module ms | mok.MoE speedup vs plain (bf16 / fp32) | "
              f"mok.MoE bf16 % of peak ({peak:.0f}) | peak GiB, mok.MoE bf16 / plain |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            mb, mf = r[f"module bfloat16 {mode}"], r[f"module float32 {mode}"]
            ly, pl = r[f"layer {mode}"], r[f"plain {mode}"]
            print(f"| {r['config']} ({r['shape']}) | {mb:.2f} | {mf:.2f} | {ly:.2f} | {mb / ly:.3f} / {mf / ly:.3f} | "
                  f"{pl:.2f} | {pl / mb:.2f}x / {pl / mf:.2f}x | {100 * r['tflops'][f'module bfloat16 {mode}'] / peak:.0f}% | "
                  f"{r['peak_gib']['module']:.2f} / {r['peak_gib']['plain']:.2f} |")
    return rows


def run_precisions(configs, precisions: list[str], warmup: int, reps: int, header: dict) -> list[dict]:
    """mok.MoE forward and forward+backward per recipe (module docstring); prints one line per config and recipe
    and a table; returns the results file's rows (benchmark "module_precision", method "mok.MoE <recipe>", each
    recipe's row taking its own matmul rate as its peak)."""
    peaks = {"bf16": bf16_peak_tflops(), **({"fp8": fp8_peak_tflops()} if "fp8" in precisions else {})}
    print("matmul peaks measured (8192^3): " + ", ".join(f"{p} {v:.0f} TFLOP/s" for p, v in peaks.items()))
    rows = []
    for c in configs:
        T, H, I, E, K, S = (c[k] for k in "THIEKS")
        flops = results.forward_flops(c)
        g = torch.Generator(device="cuda").manual_seed(1)
        x = torch.randn(T, H, generator=g, device="cuda").to(torch.bfloat16).requires_grad_()
        dy = torch.randn(T, H, generator=g, device="cuda").to(torch.bfloat16)
        for prec in precisions:
            gc.collect()
            before = torch.cuda.memory_allocated()
            torch.manual_seed(0)
            m = mok.MoE(H, I, E, K, shared_intermediate_size=S, backend="fast", dtype=torch.bfloat16, device="cuda",
                        precision=prec)
            assert m.backend_in_use == "fast", m.backend_reason
            t_f = timed(lambda m=m: m(x), warmup, reps, "stream")
            t_fb = timed(lambda m=m: _module_step(m, x, dy), warmup, reps, "stream")
            mem = step_peak_gib(lambda m=m: _module_step(m, x, dy), before)
            tflops = 3 * flops / t_fb / 1e9
            rows.append(dict(header, benchmark="module_precision", shape=c["name"], **{k: c[k] for k in "THIEKS"},
                             routing="router", method=f"mok.MoE {prec}", fwd_ms=t_f, fwd_bwd_ms=t_fb,
                             fwd_bwd_tflops=tflops, peak_tflops=peaks[prec], pct_of_peak=100 * tflops / peaks[prec],
                             peak_gib=mem))
            print(f"  {c['name']:16s} {prec:5s} fwd {t_f:8.2f} ms  fwd+bwd {t_fb:8.2f} ms  peak {mem:.2f} GiB",
                  flush=True)
            del m
            torch.cuda.empty_cache()
    print()
    print("| config | precision | mok.MoE fwd ms | fwd+bwd ms | fwd TFLOP/s | fwd+bwd TFLOP/s | bf16 time / this, "
          "fwd / fwd+bwd | peak GiB |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        base = next((b for b in rows if b["shape"] == r["shape"] and b["method"] == "mok.MoE bf16"), None)
        ratio = f"{base['fwd_ms'] / r['fwd_ms']:.2f} / {base['fwd_bwd_ms'] / r['fwd_bwd_ms']:.2f}" if base else "-"
        fwd_tflops = results.forward_flops(r) / r["fwd_ms"] / 1e9
        print(f"| {r['shape']} | {r['method'].split()[-1]} | {r['fwd_ms']:.2f} | {r['fwd_bwd_ms']:.2f} | "
              f"{fwd_tflops:.0f} | {r['fwd_bwd_tflops']:.0f} | {ratio} | {r['peak_gib']:.2f} |")
    return rows


def result_rows(rows: list[dict], configs: list[dict], header: dict, peak: float) -> list[dict]:
    """The results file's rows of `run`'s output: mok.MoE (bf16 parameters) and the plain module, queued timing."""
    out = []
    for r, c in zip(rows, configs):
        for method, key, mem in (("mok.MoE", "module bfloat16 stream", "module"), ("plain", "plain stream", "plain")):
            tflops = r["tflops"][key]
            out.append(dict(header, benchmark="module", shape=c["name"], **{k: c[k] for k in "THIEKS"},
                            routing="router", method=method, fwd_bwd_ms=r[key], fwd_bwd_tflops=tflops,
                            peak_tflops=peak, pct_of_peak=100 * tflops / peak, peak_gib=r["peak_gib"][mem]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", action="store_true", help="the public model shapes of suite.json")
    ap.add_argument("--configs", default="", help="comma-separated shape names (default: every shape of the file)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps before each timing")
    ap.add_argument("--reps", type=int, default=10, help="timed steps; the median is reported")
    ap.add_argument("--precisions", default="", help="comma-separated recipes (bf16, fp8): time mok.MoE in each "
                    "instead of the comparison with the plain module")
    results.add_record_args(ap)
    a = ap.parse_args()
    files = (SUITE if a.suite else CONFIGS,)
    try:
        configs = named_configs(a.configs, files) if a.configs else load_configs(files[0])
    except ValueError as e:
        ap.error(f"--{e}")
    if a.precisions:
        precisions = a.precisions.split(",")
        bad = [p for p in precisions if p not in ("bf16", "fp8")]
        if bad:
            ap.error(f"--precisions: unknown {bad}; expected bf16, fp8")
        rows = run_precisions(configs, precisions, a.warmup, a.reps, results.run_header())
        if results.record_path(a):
            results.append(rows, results.record_path(a))
        return
    header = results.run_header()
    peak = bf16_peak_tflops()
    print(f"device {header['gpu']}, torch {header['torch']}, commit {header['commit']}, {header['run']}; "
          f"bf16 peak {peak:.0f} TFLOP/s")
    record = results.record_path(a)
    for c in configs:  # shape by shape, so a run cut short keeps what it measured
        rows = run([c], timed, peak, a.warmup, a.reps)
        if record:
            results.append(result_rows(rows, [c], header, peak), record)


if __name__ == "__main__":
    main()

"""The layer against its peers: mok.fast forward and forward+backward beside the grouped_mm path (what a user would
write with `torch._grouped_mm`), SonicMoE (when installed) and a naive per-expert loop, on the same inputs.

For each shape it first checks every method's y and d_x against an fp32 plain implementation, then times forward and
forward+backward with CUDA events (median of --reps after --warmup) and prints ms, TFLOP/s, the fraction of the bf16
matmul peak measured in the same run (8192^3), the time ratio to mok and the peak GPU memory.

    python benchmarks/bench_moe.py --suite --no-shared --record   # the public model shapes of suite.json, appended
                                                                  # to benchmarks/results.csv (docs/results.md)
    python benchmarks/bench_moe.py [--configs a,b] [--methods mok,grouped_mm,sonic,naive] [--routings random,skewed]

The bit-exact reference's speed is `bench_reference.py`'s.

Methods: mok; mok_gu (mok with gate and up as the halves of one [gate; up] tensor, as mok.MoE and transformers pass
them); grouped_mm; sonic (SonicMoE 0.1.2 through peers.py; routed experts only, so shapes with a shared expert skip
it, saying so); naive; mok_fp8 (mok.fast with precision="fp8"); scaled_gmm_fp8 (torch._scaled_grouped_mm with
rowwise FP8 scales, forward only: its rows leave fwd+bwd empty). --suite runs mok, grouped_mm and, when `sonicmoe`
imports, sonic.
"""
from __future__ import annotations

import argparse
import functools
import gc
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import mok.fast  # noqa: E402
import results  # noqa: E402
from peers import (grouped_mm_path, naive_loop, require_sonic, scaled_grouped_mm_fp8, sonic_available,  # noqa: E402
                   sonic_forward, sonic_leaves)
from mok.testing.bits import rel_error  # noqa: E402
from mok.testing.cases import MoEConfig, make_routing, with_stacked_gate_up  # noqa: E402
from mok.testing.plain import moe_plain  # noqa: E402

CONFIGS = ROOT / "benchmarks" / "configs.json"
SUITE = ROOT / "benchmarks" / "suite.json"
ARGS = ("x", "topk_idx", "topk_weight", "shared_gate", "shared_up", "shared_down", "routed_gate", "routed_up",
        "routed_down")
WEIGHTS = ("shared_gate", "shared_up", "shared_down", "routed_gate", "routed_up", "routed_down")


CHECK_REL_ERR = 2e-2  # a method's y and d_x must be this close to the fp32 oracle before it is timed
FP8_CHECK_REL_ERR = 0.15  # the same for the FP8 methods (e4m3 rounding of two operands a product: about 6%)
FP8_METHODS = ("mok_fp8", "scaled_gmm_fp8")  # mok.fast with precision="fp8"; peers.scaled_grouped_mm_fp8 (forward)


def load_configs(path: Path) -> list[dict]:
    return json.loads(Path(path).read_text())["configs"]


def named_configs(names: str, files: tuple[Path, ...] | None = None) -> list[dict]:
    """The configs of `files` (default configs.json and suite.json) named in `names` (comma-separated), in that order;
    ValueError naming any that none of the files holds."""
    files = files or (CONFIGS, SUITE)
    by_name = {c["name"]: c for f in files for c in load_configs(f)}
    unknown = [n for n in names.split(",") if n not in by_name]
    if unknown:
        raise ValueError(f"configs: no config {', '.join(map(repr, unknown))} in {' or '.join(f.name for f in files)}")
    return [by_name[n] for n in names.split(",")]


def bench_routing(cfg: MoEConfig, routing: str, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_idx [T, K], topk_weight [T, K] fp32) on the CPU: as configs.json says (mok.testing.cases.make_routing),
    or "balanced": pair t·K + k picks expert (t·K + k) mod E, so every expert gets T·K / E rows when E divides T·K
    (K <= E consecutive ids: distinct within a token; the weights stay the random routing's)."""
    idx, w = make_routing(cfg, torch.Generator().manual_seed(seed), "random" if routing == "balanced" else routing)
    if routing == "balanced":
        idx = (torch.arange(cfg.T * cfg.K).reshape(cfg.T, cfg.K) % cfg.E).to(idx.dtype)
    return idx, w


def make_bench_inputs(c: dict, routing: str, seed: int = 1, device: str = "cuda") -> dict:
    """Routing from `bench_routing` (on the CPU); the rest drawn on `device` (default the GPU)."""
    cfg = MoEConfig(c["T"], c["H"], c["I"], c["E"], c["K"], c["S"])
    idx, w = bench_routing(cfg, routing, seed)
    g = torch.Generator(device=device).manual_seed(seed)
    T, H, I, E, S = cfg.T, cfg.H, cfg.I, cfg.E, cfg.S

    def rnd(*shape, fan_in=1):
        return (torch.randn(*shape, generator=g, device=device) * fan_in**-0.5).to(torch.bfloat16)

    return {"x": rnd(T, H), "topk_idx": idx.to(device), "topk_weight": w.to(device),
            "shared_gate": rnd(S, H, fan_in=H) if S else None, "shared_up": rnd(S, H, fan_in=H) if S else None,
            "shared_down": rnd(H, S, fan_in=S) if S else None, "routed_gate": rnd(E, I, H, fan_in=H),
            "routed_up": rnd(E, I, H, fan_in=H), "routed_down": rnd(E, H, I, fan_in=I), "dy": rnd(T, H)}


def timed(fn, warmup: int, reps: int, mode: str = "sync") -> float:
    """Median ms of `fn` over `reps` CUDA-event timings after `warmup` calls.

    mode "sync": the host waits for each rep before starting the next, so a rep also pays the CPU
    time its launches take before the GPU gets work (latency of one isolated call).
    mode "stream": reps are queued back to back and the host synchronises once at the end (as
    triton.testing.do_bench does, and as a training loop runs): a rep's time is the GPU's, plus any
    gap where the CPU could not launch fast enough.
    """
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, b in events:
        a.record()
        fn()
        b.record()
        if mode == "sync":
            b.synchronize()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in events)


def bf16_peak_tflops() -> float:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = timed(lambda: a @ b, 3, 10)
    return 2 * 8192**3 / ms / 1e9


def fp8_peak_tflops() -> float:
    """torch._scaled_mm on 8192^3 e4m3 operands (per-tensor scales, bf16 out): the FP8 ceiling."""
    a = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    ms = timed(lambda: torch._scaled_mm(a, b.t(), one, one, out_dtype=torch.bfloat16), 3, 10)
    return 2 * 8192**3 / ms / 1e9


def call_with_args(fn, leaves: dict):
    """fn (a peer of peers.py) called on leaves[a] for a in ARGS (leaves: name -> tensor or None, the
    method's autograd leaves: bf16 [T, H] x, int64 [T, K] ids, fp32 [T, K] weights, bf16 weights)."""
    return fn(*(leaves[a] for a in ARGS))


class Method:
    """fwd() -> y; fwd_bwd() -> (y, d_x) for one implementation on fixed inputs."""

    def __init__(self, name: str, inp: dict, weight_grad_dtype: torch.dtype = torch.float32):
        self.name, self.inp, self.wgrad = name, inp, weight_grad_dtype
        self.kw = {"precision": "fp8"} if name == "mok_fp8" else {}
        if name == "mok_gu":  # gate and up as halves of one [gate; up] tensor (mok.MoE's fp32 casts, HF's gate_up_proj)
            self.inp = with_stacked_gate_up(inp)
        # self.fn closes over the leaves, never over self: a Method in a reference cycle outlives `del` until the
        # garbage collector runs, maybe inside the next method's timed calls, whose peak then loses those bytes
        if name == "sonic":  # SonicMoE's layer on the same inputs, its own weight layout (peers.py)
            self.leaves = sonic_leaves(inp)
            self.fn = functools.partial(sonic_forward, self.leaves)
        elif not name.startswith("mok"):
            self.leaves = {k: (v.detach().clone().requires_grad_(True) if v is not None and v.is_floating_point()
                               else v) for k, v in inp.items() if k in ARGS}
            fn = {"grouped_mm": grouped_mm_path, "scaled_gmm_fp8": scaled_grouped_mm_fp8}.get(name, naive_loop)
            self.fn = functools.partial(call_with_args, fn, self.leaves)

    def inputs(self) -> list:
        """The tensors this method reads: mok's as passed (gate and up as one tensor for mok_gu), the baselines'
        autograd leaves (clones of the inputs; SonicMoE's in its layout), and dy."""
        ts = [self.inp[a] for a in ARGS] if self.name.startswith("mok") else list(self.leaves.values())
        return [t for t in ts if t is not None] + [self.inp["dy"]]

    def input_bytes(self) -> int:
        """Bytes of `inputs()`, each storage once (mok_gu's gate and up share one)."""
        return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in self.inputs()}.values())

    def clear_grads(self) -> None:
        for v in getattr(self, "leaves", {}).values():
            if isinstance(v, torch.Tensor):
                v.grad = None

    def fwd(self):
        if self.name.startswith("mok"):
            return mok.fast.forward(*(self.inp[a] for a in ARGS), **self.kw)[0]
        with torch.no_grad():
            return self.fn()

    def fwd_bwd(self):
        if self.name.startswith("mok"):
            y, ctx = mok.fast.forward(*(self.inp[a] for a in ARGS), **self.kw)
            # release_saved: what mok.MoE's eager training does (the context is read once)
            grads = mok.fast.backward(ctx, self.inp["dy"], weight_grad_dtype=self.wgrad, release_saved=True)
            return y, grads[0]
        for v in self.leaves.values():
            if isinstance(v, torch.Tensor) and v.requires_grad:
                v.grad = None
        y = self.fn()
        if not y.requires_grad:  # a forward-only peer: no backward, no d_x
            return y, None
        y.backward(self.inp["dy"])
        return y, self.leaves["x"].grad


def peak_gib(max_allocated: int, resident: int, input_bytes: int) -> float:
    """A method's peak memory in GiB: its own inputs plus what its calls allocated above everything resident
    before them. So each method is charged one copy of the inputs: not the reference outputs, nor the inputs the
    loop keeps for the other methods (the baselines run on clones, mok_gu on a stacked copy of gate and up)."""
    return (max_allocated - resident + input_bytes) / 2**30


def losses(rows: list[dict]) -> list[str]:
    """Two lines: where a mok method (mok, mok_gu) is slower than a peer (a method not named mok*) of the same config
    and routing, forward or forward+backward, and where its peak memory is higher (peers timed forward+backward
    only); "none" when nowhere."""
    slower, bigger = [], []
    for m in rows:
        if not m["method"].startswith("mok"):
            continue
        for p in rows:
            if p["method"].startswith("mok") or (p["shape"], p["routing"]) != (m["shape"], m["routing"]):
                continue
            lost = [name for name, key in (("fwd", "fwd_ms"), ("fwd+bwd", "fwd_bwd_ms"))
                    if p[key] is not None and m[key] is not None and p[key] < m[key]]
            where = f"{m['shape']} {m['routing']} {m['method']} vs {p['method']}"
            if lost:
                slower.append(f"{where} ({', '.join(lost)})")
            # a forward-only peer's peak is a forward's: not compared
            if p["fwd_bwd_ms"] is not None and p["peak_gib"] < m["peak_gib"]:
                bigger.append(f"{where} ({m['peak_gib']:.2f} against {p['peak_gib']:.2f} GiB)")
    return [f"mok slower than a peer on: {', '.join(slower) or 'none'}",
            f"mok's peak memory above a peer's on: {', '.join(bigger) or 'none'}"]


def _ms(t: float | None) -> str:
    """A time in ms for the printed table, "-" where it was not measured."""
    return "-" if t is None else f"{t:.2f}"


def mok_row(rows: list[dict], r: dict) -> dict | None:
    """The row the ratio column divides by for row `r`: mok's of the same config and routing, or mok_gu's when mok
    was not run; None when neither was."""
    same = [q for q in rows if (q["shape"], q["routing"]) == (r["shape"], r["routing"])]
    return next((q for name in ("mok", "mok_gu") for q in same if q["method"] == name), None)


def oracle(inp: dict):
    """fp32 plain implementation (per-expert matmuls, TF32 off): y and d_x."""
    torch.backends.cuda.matmul.allow_tf32 = False
    leaves = {k: (v.detach().clone().requires_grad_(k == "x") if isinstance(v, torch.Tensor) and v.is_floating_point()
                  else v) for k, v in inp.items() if k in ARGS}
    y = moe_plain(*(leaves[a] for a in ARGS), dtype=torch.float32)
    y.backward(inp["dy"].float())
    return y.detach(), leaves["x"].grad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="", help="comma-separated shape names (default: every shape of the file)")
    ap.add_argument("--routings", default="random,skewed", help="random, skewed (half of the tokens pick expert 0), "
                    "balanced; --suite: random")
    ap.add_argument("--skewed-configs", default="qwen3-30b-a3b", help="configs also run with skewed routing")
    ap.add_argument("--methods", default="", help="mok_fp8: mok.fast with precision='fp8'; scaled_gmm_fp8: "
                    "torch._scaled_grouped_mm rowwise FP8 (forward only); default: mok,grouped_mm,naive; with --suite "
                    "mok,grouped_mm and "
                    "sonic when sonicmoe imports")
    ap.add_argument("--warmup", type=int, default=3, help="untimed calls before each timing")
    ap.add_argument("--reps", type=int, default=10, help="timed calls; the median is reported")
    ap.add_argument("--timing", choices=["sync", "stream"], default="sync",
                    help="sync: the host waits for each rep (one isolated call, host latency included; default); "
                         "stream: reps queued back to back, one wait at the end (as a training loop and "
                         "triton.testing.do_bench run)")
    ap.add_argument("--suite", action="store_true",
                    help="the public model shapes of suite.json (Mixtral, Qwen3, OLMoE, DeepSeek, Phi-3.5-MoE, Granite, "
                         "GLM-4.5-Air, Llama 4, DBRX, gpt-oss, Grok-1)")
    ap.add_argument("--no-shared", action="store_true",
                    help="drop every shape's shared expert (S = 0): the routed experts alone, which SonicMoE's layer is")
    ap.add_argument("--weight-grads", choices=["fp32", "bf16"], default="",
                    help="dtype of mok's weight gradients (default fp32; bf16 with --suite, like grouped_mm's "
                         "gradients of bf16 weights and like mok.MoE with bf16 parameters)")
    results.add_record_args(ap)
    a = ap.parse_args()
    wgrad = {"fp32": torch.float32, "bf16": torch.bfloat16}[a.weight_grads or ("bf16" if a.suite else "fp32")]
    if a.suite and a.routings == ap.get_default("routings"):
        a.routings = "random"
    if not a.methods:
        a.methods = ("mok,grouped_mm" + (",sonic" if sonic_available() else "")) if a.suite else "mok,grouped_mm,naive"
    configs = load_configs(SUITE if a.suite else CONFIGS)
    if a.configs:  # in the order given; a name the file does not hold is refused, not skipped
        try:
            configs = named_configs(a.configs, (SUITE if a.suite else CONFIGS,))
        except ValueError as e:
            ap.error(f"--{e}")
    if a.no_shared:
        configs = [dict(c, S=0) for c in configs]
    methods = a.methods.split(",")
    unknown = [m for m in methods if m not in ("mok", "mok_gu", "grouped_mm", "sonic", "naive", *FP8_METHODS)]
    if unknown:
        ap.error(f"--methods: unknown {unknown}; expected mok, mok_gu, grouped_mm, sonic, naive, mok_fp8, "
                 f"scaled_gmm_fp8")
    if "sonic" in methods:
        require_sonic("--methods sonic")
    record = results.record_path(a)
    header = results.run_header()
    peak = bf16_peak_tflops()
    print(f"device {header['gpu']}, torch {header['torch']}, CUDA {header['cuda']}, commit {header['commit']}, "
          f"{header['run']}")
    print(f"bf16 peak (8192^3 matmul, median of 10): {peak:.0f} TFLOP/s")
    fp8_peak = fp8_peak_tflops() if any(m in FP8_METHODS for m in methods) else None
    bench_name = "layer_fp8" if fp8_peak else "layer"  # the results page's FP8 section, beside the bf16 suite
    if fp8_peak:
        print(f"fp8 peak (torch._scaled_mm 8192^3 e4m3, median of 10): {fp8_peak:.0f} TFLOP/s; an FP8 method's "
              f"row takes it as its peak")
    print(f"mok weight gradients: {str(wgrad).removeprefix('torch.')} (grouped_mm: the weights' dtype, bf16)")
    print(f"timing: {a.timing} (" + ("the host waits for each rep" if a.timing == "sync" else
                                     "reps queued back to back, one wait at the end") + ")")
    rows = []
    for c in configs:
        for routing in a.routings.split(","):
            if routing == "skewed" and c["name"] not in a.skewed_configs.split(","):
                continue
            inp = make_bench_inputs(c, routing)
            fwd_flops = results.forward_flops(c)
            y_ref, dx_ref = oracle(inp)
            torch.cuda.empty_cache()
            for m in methods:
                if m == "sonic" and c["S"]:
                    print(f"  {c['name']:16s} {routing:7s} sonic      skipped: SonicMoE's layer has no shared expert "
                          f"(S = {c['S']}; --no-shared runs the routed experts alone)")
                    continue
                meth = Method(m, inp, wgrad)
                try:
                    y, dx = meth.fwd_bwd()
                except (RuntimeError, TypeError, ValueError) as e:  # a peer PyTorch lacks here
                    print(f"  {c['name']:16s} {routing:7s} {m:10s} skipped: {str(e).splitlines()[0][:200]}")
                    continue
                forward_only = dx is None
                ey, edx = rel_error(y, y_ref), (rel_error(dx, dx_ref) if dx is not None else 0.0)
                limit = FP8_CHECK_REL_ERR if m in FP8_METHODS else CHECK_REL_ERR
                ok = ey < limit and edx < limit
                del y, dx
                if not ok:
                    print(f"CHECK FAILED {c['name']} {routing} {m}: y err {ey:.2e}, d_x err {edx:.2e}")
                    continue
                meth.clear_grads()
                gc.collect()  # nothing of an earlier method left to be freed inside this one's timed calls
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                resident = torch.cuda.memory_allocated()  # this method's inputs, and what the others share
                t_f = timed(meth.fwd, a.warmup, a.reps, a.timing)
                # a forward-only peer (no autograd: scaled_gmm_fp8) has no fwd+bwd time: its row leaves it empty
                t_fb = None if forward_only else timed(meth.fwd_bwd, a.warmup, a.reps, a.timing)
                mem = peak_gib(torch.cuda.max_memory_allocated(), resident, meth.input_bytes())
                tflops = None if t_fb is None else 3 * fwd_flops / t_fb / 1e9
                ceiling = fp8_peak if m in FP8_METHODS else peak
                rows.append(dict(header, benchmark=bench_name, shape=c["name"], **{k: c[k] for k in "THIEKS"},
                                 routing=routing, method=m, fwd_ms=t_f, fwd_bwd_ms=t_fb, fwd_bwd_tflops=tflops,
                                 peak_tflops=ceiling, pct_of_peak=None if tflops is None else 100 * tflops / ceiling,
                                 peak_gib=mem))
                if record:  # row by row, so a run cut short keeps what it measured
                    results.append(rows[-1:], record)
                print(f"  {c['name']:16s} {routing:7s} {m:10s} fwd {t_f:8.2f} ms  fwd+bwd {_ms(t_fb):>8s} ms  "
                      f"y err {ey:.1e} dx err {edx:.1e}  peak {mem:.2f} GiB", flush=True)
                del meth
                torch.cuda.empty_cache()
            del inp
            torch.cuda.empty_cache()
    print()
    peaks = f"bf16 {peak:.0f}" + (f", FP8 methods {fp8_peak:.0f}" if fp8_peak else "")
    print(f"| shape | routing | method | fwd ms | fwd+bwd ms | fwd+bwd TFLOP/s | % of peak ({peaks}) "
          f"| time ratio mok/this (fwd / fwd+bwd) | peak GiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        mk = mok_row(rows, r)
        fb = (f"{mk['fwd_bwd_ms'] / r['fwd_bwd_ms']:.2f}" if mk and r["fwd_bwd_ms"] and mk["fwd_bwd_ms"] else "-")
        sp = f"{mk['fwd_ms'] / r['fwd_ms']:.2f} / {fb}" if mk else "-"
        tf = "-" if r["fwd_bwd_tflops"] is None else f"{r['fwd_bwd_tflops']:.0f}"
        pct = "-" if r["pct_of_peak"] is None else f"{r['pct_of_peak']:.0f}%"
        print(f"| {r['shape']} | {r['routing']} | {r['method']} | {r['fwd_ms']:.2f} | {_ms(r['fwd_bwd_ms'])} | "
              f"{tf} | {pct} | {sp} | {r['peak_gib']:.2f} |")
    print()
    print("\n".join(losses(rows)))
    if record:
        print(f"appended {len(rows)} rows to {record}")


if __name__ == "__main__":
    main()

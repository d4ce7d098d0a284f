"""The benchmarks' one results file (benchmarks/results.csv) and the page made from it (docs/results.md, docs/results.png).

`bench_moe.py --record` and `bench_module.py --record` append one row per (shape, method) of a run; each run's rows
share a `run` id (its UTC start time) and say where they were measured (commit, GPU, torch, CUDA). The page shows the
latest run of each benchmark on each GPU and is regenerated from the file alone:

    python benchmarks/results.py            # rewrite docs/results.md and docs/results.png from benchmarks/results.csv
"""
from __future__ import annotations

import csv
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results.csv"
PAGE = ROOT / "docs" / "results.md"
CHART = ROOT / "docs" / "results.png"
FIELDS = ("run", "commit", "gpu", "torch", "cuda", "benchmark", "shape", "T", "H", "I", "E", "K", "S", "routing",
          "method", "fwd_ms", "fwd_bwd_ms", "fwd_bwd_tflops", "peak_tflops", "pct_of_peak", "peak_gib", "command")
PEER_NAMES = {"mok": "mok", "grouped_mm": "grouped_mm path", "sonic": "SonicMoE", "naive": "naive loop",
              "mok.MoE": "mok.MoE", "plain": "plain PyTorch module", "mok_fp8": "mok fp8",
              "scaled_gmm_fp8": "torch._scaled_grouped_mm FP8"}


def forward_flops(shape: dict) -> float:
    """The layer's forward FLOPs for a shape {T, H, I, K, S: numbers}: three GEMMs of 2·T·H·(K·I + S) each (the
    routed experts' T·K rows of I columns and the shared expert's T rows of S); forward+backward is three times it."""
    return 6 * shape["H"] * (shape["T"] * shape["K"] * shape["I"] + shape["T"] * shape["S"])


def git_commit() -> str:
    """Short commit of the tree (MOK_COMMIT wins, for copies without .git), with '+dirty' if mok/ or csrc/ differ."""
    import os

    if os.environ.get("MOK_COMMIT"):
        return os.environ["MOK_COMMIT"]
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "mok", "csrc"], cwd=ROOT, capture_output=True,
                               text=True).stdout.strip()
    except OSError:
        return "unknown"
    return (rev.stdout.strip() or "unknown") + ("+dirty" if dirty else "")


def run_header() -> dict:
    """The columns every row of this run shares: run id, commit, GPU, torch and CUDA versions, the command."""
    import torch

    return {"run": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": git_commit(),
            "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda or "",
            "command": " ".join(["python", *sys.argv])}


def add_record_args(ap) -> None:
    """The --record / --results options every benchmark script takes (an argparse parser)."""
    ap.add_argument("--record", action="store_true", help="append the rows to benchmarks/results.csv")
    ap.add_argument("--results", default="", help="append the rows to this CSV instead (implies --record)")


def record_path(args) -> Path | None:
    """Where the rows of a run go, from `add_record_args`' options; None when they are not recorded."""
    return Path(args.results) if args.results else (RESULTS if args.record else None)


def append(rows: list[dict], path: Path = RESULTS) -> None:
    """Append `rows` (dicts with FIELDS keys; missing ones left empty) to the CSV at `path`, writing the header if new."""
    path = Path(path)
    unknown = sorted({k for r in rows for k in r} - set(FIELDS))
    if unknown:
        raise ValueError(f"rows: unknown columns {unknown}; the results file's columns are {list(FIELDS)}")
    new = not path.exists() or path.stat().st_size == 0
    with path.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        if new:
            w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in r.items()})


def read(path: Path = RESULTS) -> list[dict]:
    with Path(path).open(newline="") as f:
        return list(csv.DictReader(f))


def latest_runs(rows: list[dict]) -> dict[tuple[str, str], list[dict]]:
    """{(benchmark, gpu): rows of the latest run of that benchmark on that GPU}."""
    runs = defaultdict(lambda: defaultdict(list))
    for r in rows:
        runs[r["benchmark"], r["gpu"]][r["run"]].append(r)
    return {key: by_run[max(by_run)] for key, by_run in sorted(runs.items())}


def _num(r: dict | None, key: str) -> float | None:
    return float(r[key]) if r and r.get(key) not in (None, "") else None


def _ms(v: float | None) -> str:
    return f"{v:.2f}" if v is not None else "-"


def _ratio(peer: float | None, mine: float | None) -> str:
    return f"{peer / mine:.2f}x" if peer and mine else "-"


def _by_shape(rows: list[dict]) -> dict[str, dict[str, dict]]:
    out = defaultdict(dict)
    for r in rows:
        out[r["shape"]][r["method"]] = r
    return out


def _about(rows: list[dict]) -> str:
    r = next((r for r in rows if r["method"] not in ("mok_fp8", "scaled_gmm_fp8", "mok.MoE fp8")), rows[0])
    return (f"{r['gpu']}, torch {r['torch']}, CUDA {r['cuda']}, commit {r['commit']}, {r['run']}; "
            f"bf16 matmul peak measured in the run: {float(r['peak_tflops']):.0f} TFLOP/s.\n"
            f"Command: `{r['command']}`")


def layer_table(rows: list[dict]) -> list[str]:
    """Markdown lines: each shape's mok time, each peer's, peer time / mok time (above 1: mok faster), peak GiB."""
    peers = [m for m in ("grouped_mm", "sonic", "naive") if any(r["method"] == m for r in rows)]
    head = ["shape (T,H,I,E,K,S)", "mok fwd / fwd+bwd ms", "mok % of peak"]
    for p in peers:
        head += [f"{PEER_NAMES[p]} fwd / fwd+bwd ms", f"{PEER_NAMES[p]} / mok, fwd+bwd"]
    head += ["peak GiB, mok / " + " / ".join(PEER_NAMES[p] for p in peers)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for shape, by in _by_shape(rows).items():
        mk = by.get("mok")
        any_r = next(iter(by.values()))
        dims = ",".join(any_r[k] for k in "THIEKS")
        cells = [f"{shape} ({dims})", f"{_ms(_num(mk, 'fwd_ms'))} / {_ms(_num(mk, 'fwd_bwd_ms'))}",
                 f"{_num(mk, 'pct_of_peak'):.0f}%" if _num(mk, "pct_of_peak") is not None else "-"]
        for p in peers:
            pr = by.get(p)
            cells += [f"{_ms(_num(pr, 'fwd_ms'))} / {_ms(_num(pr, 'fwd_bwd_ms'))}" if pr else "not run",
                      _ratio(_num(pr, "fwd_bwd_ms"), _num(mk, "fwd_bwd_ms"))]
        cells.append(" / ".join(_ms(_num(by.get(m), "peak_gib")) for m in ["mok", *peers]))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _fwd_tflops(r: dict | None) -> float | None:
    """A row's forward rate in TFLOP/s (`forward_flops` over its forward time)."""
    if not r or _num(r, "fwd_ms") is None:
        return None
    return forward_flops({k: float(r[k]) for k in "THIKS"}) / _num(r, "fwd_ms") / 1e9


def fp8_table(rows: list[dict]) -> list[str]:
    """Markdown lines for a layer run with mok fp8 rows: mok bf16 and fp8 times, fp8's speedup, its forward rate as a
    share of the FP8 matmul rate measured in the run, PyTorch's scaled grouped GEMM (forward only), peak GiB."""
    head = ["shape (T,H,I,E,K,S)", "mok bf16 fwd / fwd+bwd ms", "mok fp8 fwd / fwd+bwd ms",
            "bf16 / fp8, fwd / fwd+bwd", "fp8 fwd, % of FP8 peak", "torch._scaled_grouped_mm FP8 fwd ms",
            "scaled_grouped_mm / mok fp8, fwd", "peak GiB, bf16 / fp8"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for shape, by in _by_shape(rows).items():
        bf, f8, sg = by.get("mok"), by.get("mok_fp8"), by.get("scaled_gmm_fp8")
        if not f8:
            continue
        dims = ",".join(f8[k] for k in "THIEKS")
        rate, ceiling = _fwd_tflops(f8), _num(f8, "peak_tflops")
        lines.append("| " + " | ".join([
            f"{shape} ({dims})", f"{_ms(_num(bf, 'fwd_ms'))} / {_ms(_num(bf, 'fwd_bwd_ms'))}",
            f"{_ms(_num(f8, 'fwd_ms'))} / {_ms(_num(f8, 'fwd_bwd_ms'))}",
            f"{_ratio(_num(bf, 'fwd_ms'), _num(f8, 'fwd_ms'))} / {_ratio(_num(bf, 'fwd_bwd_ms'), _num(f8, 'fwd_bwd_ms'))}",
            f"{100 * rate / ceiling:.0f}%" if rate and ceiling else "-",
            _ms(_num(sg, "fwd_ms")) if sg else "not run", _ratio(_num(sg, "fwd_ms"), _num(f8, "fwd_ms")),
            f"{_ms(_num(bf, 'peak_gib'))} / {_ms(_num(f8, 'peak_gib'))}"]) + " |")
    return lines


def precision_table(rows: list[dict]) -> list[str]:
    """Markdown lines: mok.MoE's forward and training step per recipe, and bf16's time over each recipe's."""
    lines = ["| shape (T,H,I,E,K,S) | recipe | mok.MoE fwd ms | fwd+bwd ms | bf16 / this, fwd / fwd+bwd | peak GiB |",
             "|---|---|---|---|---|---|"]
    for shape, by in _by_shape(rows).items():
        base = by.get("mok.MoE bf16")
        for method, r in by.items():
            dims = ",".join(r[k] for k in "THIEKS")
            lines.append(f"| {shape} ({dims}) | {method.split()[-1]} | {_ms(_num(r, 'fwd_ms'))} | "
                         f"{_ms(_num(r, 'fwd_bwd_ms'))} | {_ratio(_num(base, 'fwd_ms'), _num(r, 'fwd_ms'))} / "
                         f"{_ratio(_num(base, 'fwd_bwd_ms'), _num(r, 'fwd_bwd_ms'))} | {_ms(_num(r, 'peak_gib'))} |")
    return lines


def module_table(rows: list[dict]) -> list[str]:
    """Markdown lines: mok.MoE's training step against a plain PyTorch module, per shape."""
    lines = ["| shape (T,H,I,E,K,S) | mok.MoE fwd+bwd ms | plain module fwd+bwd ms | plain / mok.MoE | "
             "peak GiB, mok.MoE / plain |", "|---|---|---|---|---|"]
    for shape, by in _by_shape(rows).items():
        mk, pl = by.get("mok.MoE"), by.get("plain")
        dims = ",".join(next(iter(by.values()))[k] for k in "THIEKS")
        lines.append(f"| {shape} ({dims}) | {_ms(_num(mk, 'fwd_bwd_ms'))} | {_ms(_num(pl, 'fwd_bwd_ms'))} | "
                     f"{_ratio(_num(pl, 'fwd_bwd_ms'), _num(mk, 'fwd_bwd_ms'))} | "
                     f"{_ms(_num(mk, 'peak_gib'))} / {_ms(_num(pl, 'peak_gib'))} |")
    return lines


def chart(latest: dict, path: Path = CHART) -> bool:
    """Bars of peer fwd+bwd time / mok's (above 1: mok faster) per shape, for each GPU's latest layer run; False
    when there is no layer run to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layer = [(gpu, rows) for (bench, gpu), rows in latest.items() if bench == "layer"]
    if not layer:
        return False
    fig, axes = plt.subplots(len(layer), 1, figsize=(12, 4.5 * len(layer)), squeeze=False)
    for ax, (gpu, rows) in zip(axes[:, 0], layer):
        by = _by_shape(rows)
        shapes = list(by)
        peers = [m for m in ("grouped_mm", "sonic") if any(r["method"] == m for r in rows)]
        width = 0.8 / max(1, len(peers))
        for i, p in enumerate(peers):
            vals = [(_num(by[s].get(p), "fwd_bwd_ms") or 0) / (_num(by[s].get("mok"), "fwd_bwd_ms") or float("inf"))
                    for s in shapes]
            ax.bar([j + (i - (len(peers) - 1) / 2) * width for j in range(len(shapes))], vals, width,
                   label=f"{PEER_NAMES[p]} time / mok time")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(shapes)), shapes, rotation=60, ha="right", fontsize=8)
        ax.set_ylabel("forward+backward time ratio")
        ax.set_title(f"mok against its peers, {gpu} ({rows[0]['run']}, commit {rows[0]['commit']}): above 1, mok is faster")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def page(rows: list[dict], chart_drawn: bool) -> str:
    """docs/results.md's text for the rows of the results file."""
    latest = latest_runs(rows)
    out = ["# Results", "",
           "Generated by `python benchmarks/results.py` from [benchmarks/results.csv](../benchmarks/results.csv), one row",
           "per shape and method of every recorded run; this page shows the latest run of each benchmark on each GPU.",
           "How each benchmark measures: [benchmarks/README.md](../benchmarks/README.md).", ""]
    if chart_drawn:
        out += ["![mok against its peers](results.png)", ""]
    for (bench, gpu), rs in latest.items():
        if bench == "layer":
            missing = [PEER_NAMES[p] for p in ("grouped_mm", "sonic") if not any(r["method"] == p for r in rs)]
            out += [f"## The layer, forward and forward+backward: {gpu}", "", _about(rs), "",
                    "Routed experts, bf16, random routing; mok's weight gradients in bf16 like its peers'. "
                    "Ratios are a peer's time over mok's: above 1, mok is faster."
                    + (f" Not measured in this run: {', '.join(missing)}." if missing else ""), "", *layer_table(rs), ""]
        elif bench == "layer_fp8":
            out += [f"## The layer in FP8 (`precision=\"fp8\"`): {gpu}", "", _about(rs), "",
                    "mok's FP8 recipe (docs/numerics.md) against its bf16 layer and PyTorch's own FP8 grouped GEMM "
                    "(`torch._scaled_grouped_mm`, rowwise scales; it has no backward, so forward only). The FP8 "
                    "peak is `torch._scaled_mm` on 8192^3 e4m3 operands, measured in the run"
                    + "".join(f" ({float(r['peak_tflops']):.0f} TFLOP/s)." for r in [r for r in rs if r["method"] in ("mok_fp8", "scaled_gmm_fp8")][:1]),
                    "", *fp8_table(rs), ""]
            if any(r["method"] in ("grouped_mm", "sonic", "naive") for r in rs):
                out += ["The bf16 peers of the same run (routed experts, bf16, random routing):", "",
                        *layer_table(rs), ""]
        elif bench == "module":
            out += [f"## A training step through `mok.MoE`: {gpu}", "", _about(rs), "",
                    "Router, router losses and layer, bf16 parameters, forward+backward queued as a training loop "
                    "runs them, against a plain PyTorch MoE module (F.linear router, softmax top-k, the grouped_mm "
                    "path, a load-balancing loss).", "", *module_table(rs), ""]
        elif bench == "module_precision":
            out += [f"## A training step through `mok.MoE` per recipe: {gpu}", "", _about(rs), "",
                    "`mok.MoE(..., precision=...)` with bf16 parameters on the fast backend, forward (autograd on) "
                    "and forward+backward queued as a training loop runs them.", "", *precision_table(rs), ""]
    return "\n".join(out).rstrip() + "\n"


def main() -> None:
    rows = read(RESULTS)
    drawn = chart(latest_runs(rows))
    PAGE.write_text(page(rows, drawn))
    print(f"wrote {PAGE}" + (f" and {CHART}" if drawn else "") + f" from {len(rows)} rows of {RESULTS}")


if __name__ == "__main__":
    main()

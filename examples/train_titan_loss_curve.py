"""Train torchtitan's DeepSeek-V3 debug model with torchtitan's routed experts and with mok's, and plot both losses.

The model is torchtitan's `deepseek_v3` "debugmodel" flavor (its first --layers layers), parallelized by torchtitan
(FSDP2) in one process, trained with torchtitan's AdamW and load-balancing hook on bytes of the Python standard
library's source (`mok.testing.titan`). The two runs start from the same weights and see the same tokens; only the
routed experts differ (torchtitan's GroupedExperts, bf16 grouped GEMMs; mok's layer through `mok.titan`, the
bit-exact reference on the CPU, backend "auto" elsewhere).

    python examples/train_titan_loss_curve.py --steps 30 --out docs/torchtitan_loss.png
    python examples/train_titan_loss_curve.py --steps 3 --out /tmp/loss.png            # smoke run

Prints one line per step (both losses, their difference) and a summary; --log writes the losses as JSON.
Needs torchtitan (and matplotlib for the plot).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--layers", type=int, default=2, help="the debug model's first layers (1 dense, then MoE)")
    p.add_argument("--batch", type=int, default=2, help="sequences per step")
    p.add_argument("--seq", type=int, default=64, help="tokens per sequence")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--backend", default="auto", help="mok's backend: auto, reference or fast")
    p.add_argument("--out", default="docs/torchtitan_loss.png", help="the plot (PNG); '' for none")
    p.add_argument("--log", help="write the losses and the summary here (JSON)")
    args = p.parse_args(argv)
    for k in ("steps", "layers", "batch", "seq"):
        if getattr(args, k) < 1:
            p.error(f"--{k}: expected an int >= 1, got {getattr(args, k)}")
    return args


def plot(losses: dict, path: str, title: str) -> None:
    """Both loss curves, and their difference, into the PNG `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5.5), sharex=True, height_ratios=(3, 1))
    steps = range(1, len(losses["titan"]) + 1)
    top.plot(steps, losses["titan"], label="torchtitan's GroupedExperts (bf16 grouped GEMMs)", lw=2.5, alpha=0.6)
    top.plot(steps, losses["mok"], label="mok (mok.titan)", lw=1.2, ls="--", color="black")
    top.set_ylabel("training loss")
    top.set_title(title, fontsize=10)
    top.legend()
    diff = [m - t for m, t in zip(losses["mok"], losses["titan"])]
    bottom.plot(steps, diff, color="tab:red", lw=1)
    bottom.axhline(0, color="gray", lw=0.5)
    bottom.set_ylabel("mok − torchtitan")
    bottom.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> dict:
    args = parse_args(argv)
    import torch.distributed as dist

    from mok.testing import titan

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tmp = tempfile.mkdtemp(prefix="mok-titan-example-")
    dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"file://{tmp}/init", rank=0,
                            world_size=1)
    if device == "cpu":
        titan.use_cpu_meshes()
    base = titan.Setup(n_layers=args.layers, steps=args.steps, batch=args.batch, seq_len=args.seq, lr=args.lr)
    losses, seconds = {}, {}
    for name, experts in (("titan", "titan"), ("mok", args.backend)):
        t0 = time.perf_counter()
        run = titan.train(titan.Setup(**{**base.__dict__, "experts": experts}), 0, 1, device)
        seconds[name] = time.perf_counter() - t0
        losses[name] = run["losses"].tolist()
    for step, (t, m) in enumerate(zip(losses["titan"], losses["mok"]), 1):
        print(f"step {step:3d}  torchtitan {t:.5f}  mok {m:.5f}  difference {m - t:+.2e}")
    worst = max(abs(m - t) / abs(t) for t, m in zip(losses["titan"], losses["mok"]))
    summary = {"steps": args.steps, "device": device, "first_loss": losses["mok"][0], "last_loss": losses["mok"][-1],
               "max_relative_difference": worst, "seconds": seconds, "losses": losses}
    print(f"loss {summary['first_loss']:.4f} -> {summary['last_loss']:.4f}; largest relative difference from "
          f"torchtitan's experts {worst:.2e}; seconds: torchtitan {seconds['titan']:.1f}, mok {seconds['mok']:.1f}")
    if args.out:
        title = (f"torchtitan deepseek_v3 debugmodel ({args.layers} layers), {args.batch}x{args.seq} tokens/step, "
                 f"{device}")
        plot(losses, args.out, title)
        print(f"wrote {args.out}")
    if args.log:
        with open(args.log, "w") as f:
            json.dump(summary, f, indent=1)
    dist.destroy_process_group()
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
    os._exit(0)  # torchtitan's device meshes keep gloo sub-groups whose teardown at exit can abort the process

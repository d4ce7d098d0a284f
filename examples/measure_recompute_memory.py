"""Measure the activation memory that `recompute=True` saves in one mok.MoE layer.

For each setting it runs forward + backward and reports:
- saved: bytes autograd keeps between forward and backward (saved-tensor hooks; parameters excluded;
  each storage counted once), on any device;
- on CUDA also: memory allocated after forward minus before (the activations held), and the peak
  during forward + backward.
It also checks that both settings give bitwise identical gradients.

    python examples/measure_recompute_memory.py                       # CPU, T=2048 H=256 I=128 E=8 K=2 S=128
    python examples/measure_recompute_memory.py --device cuda --tokens 8192 --hidden 1024 --inter 512
"""

from __future__ import annotations

import argparse
import time

import torch

import mok
from mok.testing.bits import assert_bitwise_equal
from mok.testing.memory import saved_activation_bytes


def measure(args, recompute: bool) -> dict:
    torch.manual_seed(0)
    dev = torch.device(args.device)
    m = mok.MoE(args.hidden, args.inter, args.experts, args.top_k, shared_intermediate_size=args.shared,
                recompute=recompute, backend=args.backend).to(dev)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.tokens, args.hidden, generator=g).to(torch.bfloat16).to(dev).requires_grad_()
    dy = torch.randn(args.tokens, args.hidden, generator=g).to(torch.bfloat16).to(dev)
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    t0 = time.time()
    saved, y = saved_activation_bytes(m, x)
    held = torch.cuda.memory_allocated() - before if cuda else None
    y.backward(dy)
    if cuda:
        torch.cuda.synchronize()
    out = {"saved": saved, "held": held, "peak": torch.cuda.max_memory_allocated() - before if cuda else None,
           "seconds": time.time() - t0, "grads": [x.grad] + [p.grad for p in m.parameters()]}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--inter", type=int, default=128)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--shared", type=int, default=128)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--backend", default="reference")
    args = ap.parse_args(argv)
    print(f"T={args.tokens} H={args.hidden} I={args.inter} E={args.experts} K={args.top_k} S={args.shared} "
          f"device={args.device} backend={args.backend}")
    res = {r: measure(args, r) for r in (False, True)}
    for a, b in zip(res[False]["grads"], res[True]["grads"]):
        assert_bitwise_equal(b, a, "gradient with recompute")
    mib = 2.0**-20
    for r, v in res.items():
        line = f"recompute={r!s:5}  saved for backward {v['saved'] * mib:9.2f} MiB"
        if v["held"] is not None:
            line += f"  held after forward {v['held'] * mib:9.2f} MiB  peak fwd+bwd {v['peak'] * mib:9.2f} MiB"
        print(line + f"  fwd+bwd {v['seconds']:.2f} s")
    d = res[False]["saved"] - res[True]["saved"]
    print(f"recompute saves {d * mib:.2f} MiB of saved activations "
          f"({100 * d / res[False]['saved']:.1f}%); gradients bitwise identical")


if __name__ == "__main__":
    main()

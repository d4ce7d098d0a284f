"""The GEMM floor of a layer's training step: its six products (forward gate/up and down; backward d_a, d_x and
the two weight gradients) as dense cuBLAS matmuls of all R = T·K routed rows at once (and of the T shared rows),
bf16 in and out, with no routing, no grouping and no memory-bound kernels. The same FLOPs as the layer's step
(configs.json's count), none of its other work: what a layer whose GEMMs ran at cuBLAS's dense rate would take
at best. `python benchmarks/energy_probe.py dense:<config>` times it.
"""
from __future__ import annotations

import torch


def dense_products(c: dict, device: str = "cuda") -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(out, a, b) with out = a @ b for each product of one fwd+bwd step of layer config `c` (keys T, H, I, K, S):
    random bf16 operands (views, transposed where the step reads them so), outputs allocated once."""
    g = torch.Generator(device=device).manual_seed(1)
    products = []

    def rnd(*shape, fan_in=1):
        return (torch.randn(*shape, generator=g, device=device) * fan_in**-0.5).to(torch.bfloat16)

    def add_expert(rows: int, H: int, I: int) -> None:
        x_RH, go_RH, a_RI, dgu_R2I = rnd(rows, H), rnd(rows, H), rnd(rows, I), rnd(rows, 2 * I)
        w_gu_2IH, w_down_HI = rnd(2 * I, H, fan_in=H), rnd(H, I, fan_in=I)
        for a, b in ((x_RH, w_gu_2IH.t()),      # forward gate/up [R, 2I]
                     (a_RI, w_down_HI.t()),     # forward down [R, H]
                     (go_RH, w_down_HI),        # d_a [R, I]
                     (dgu_R2I, w_gu_2IH),       # d_x [R, H]
                     (dgu_R2I.t(), x_RH),       # gate/up weight gradient [2I, H]
                     (go_RH.t(), a_RI)):        # down weight gradient [H, I]
            products.append((torch.empty(a.shape[0], b.shape[1], device=device, dtype=torch.bfloat16), a, b))

    add_expert(c["T"] * c["K"], c["H"], c["I"])
    if c["S"]:
        add_expert(c["T"], c["H"], c["S"])
    return products


def dense_step(products: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]):
    """A callable running `products` (`dense_products`) in order: one step's GEMMs."""
    def fn():
        for out, a, b in products:
            torch.mm(a, b, out=out)
    return fn


def main() -> None:
    """Each product of each config's step timed alone, then the whole step, as a burst (bench_moe's `timed`)."""
    import argparse
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_moe import CONFIGS, SUITE, bf16_peak_tflops, load_configs, timed
    from energy_probe import parse_workload

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("configs", nargs="+", help="config names of configs.json / suite.json, '@S0' to drop the shared expert")
    a = ap.parse_args()
    configs = {x["name"]: x for x in load_configs(CONFIGS) + load_configs(SUITE)}
    specs = [parse_workload("dense:" + name, configs)[1] for name in a.configs]
    print(f"bf16 peak (8192^3 matmul, median of 10): {bf16_peak_tflops():.0f} TFLOP/s")
    names = ["gate/up", "down", "d_a", "d_x", "wgrad gate/up", "wgrad down"]
    for name, c in zip(a.configs, specs):
        products = dense_products(c)
        print(f"{name}: ms (TFLOP/s) of each product alone, 3 warm-ups + median of 10 queued")
        for i, (out, x, w) in enumerate(products):
            ms = timed(lambda: torch.mm(x, w, out=out), 3, 10, "stream")
            who = ("shared " if i >= 6 else "") + names[i % 6]
            print(f"  {who:20s} [{x.shape[0]}, {x.shape[1]}] x [{w.shape[0]}, {w.shape[1]}]  {ms:7.3f} ms "
                  f"({2 * x.shape[0] * x.shape[1] * w.shape[1] / ms / 1e9:.0f})")
        ms = timed(dense_step(products), 3, 10, "stream")
        print(f"  whole step {ms:.3f} ms")
        del products
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

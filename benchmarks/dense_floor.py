"""The GEMM floor of a layer's training step: its six products (forward gate/up and down; backward d_a, d_x and
the two weight gradients) as dense cuBLAS matmuls of all R = T·K routed rows at once (and of the T shared rows),
bf16 in and out, with no routing, no grouping and no memory-bound kernels. The same FLOPs as the layer's step
(configs.json's count), none of its other work: what a layer whose GEMMs ran at cuBLAS's dense rate would take
at best. `python benchmarks/energy_probe.py dense:<config>` times it.
"""
from __future__ import annotations

import torch


def dense_products(c: dict, device: str = "cuda") -> list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(name, out, a, b) with out = a @ b for each product of one fwd+bwd step of layer config `c` (keys T, H, I, K,
    S): random bf16 operands (views, transposed where the step reads them so), outputs allocated once."""
    g = torch.Generator(device=device).manual_seed(1)
    products = []

    def rnd(*shape, fan_in=1):
        return (torch.randn(*shape, generator=g, device=device) * fan_in**-0.5).to(torch.bfloat16)

    def add_expert(prefix: str, rows: int, H: int, I: int) -> None:
        x_RH, go_RH, a_RI, dgu_R2I = rnd(rows, H), rnd(rows, H), rnd(rows, I), rnd(rows, 2 * I)
        w_gu_2IH, w_down_HI = rnd(2 * I, H, fan_in=H), rnd(H, I, fan_in=I)
        for name, a, b in (("gate/up", x_RH, w_gu_2IH.t()),            # forward [R, 2I]
                           ("down", a_RI, w_down_HI.t()),              # forward [R, H]
                           ("d_a", go_RH, w_down_HI),                  # [R, I]
                           ("d_x", dgu_R2I, w_gu_2IH),                 # [R, H]
                           ("wgrad gate/up", dgu_R2I.t(), x_RH),       # [2I, H]
                           ("wgrad down", go_RH.t(), a_RI)):           # [H, I]
            out = torch.empty(a.shape[0], b.shape[1], device=device, dtype=torch.bfloat16)
            products.append((prefix + name, out, a, b))

    add_expert("", c["T"] * c["K"], c["H"], c["I"])
    if c["S"]:
        add_expert("shared ", c["T"], c["H"], c["S"])
    return products


def dense_step(products: list[tuple[str, torch.Tensor, torch.Tensor, torch.Tensor]]):
    """A callable running `products` (`dense_products`) in order: one step's GEMMs."""
    def fn():
        for _, out, a, b in products:
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
    ap.add_argument("configs", nargs="+",
                    help="config names of configs.json / suite.json, '@S0' to drop the shared expert")
    a = ap.parse_args()
    configs = {x["name"]: x for x in load_configs(CONFIGS) + load_configs(SUITE)}
    specs = [parse_workload("dense:" + name, configs)[1] for name in a.configs]
    print(f"bf16 peak (8192^3 matmul, median of 10): {bf16_peak_tflops():.0f} TFLOP/s")
    for name, c in zip(a.configs, specs):
        products = dense_products(c)
        print(f"{name}: ms (TFLOP/s) of each product alone, 3 warm-ups + median of 10 queued")
        for who, out, x, w in products:
            ms = timed(lambda: torch.mm(x, w, out=out), 3, 10, "stream")
            print(f"  {who:20s} [{x.shape[0]}, {x.shape[1]}] x [{w.shape[0]}, {w.shape[1]}]  {ms:7.3f} ms "
                  f"({2 * x.shape[0] * x.shape[1] * w.shape[1] / ms / 1e9:.0f})")
        ms = timed(dense_step(products), 3, 10, "stream")
        print(f"  whole step {ms:.3f} ms")
        del products
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

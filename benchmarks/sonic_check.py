"""SonicMoE's first call on each shape (its kernels compile and autotune then), and its y and d_x against the fp32
oracle: so a side-by-side timing (`energy_probe.py --preset issue13-sonic`) later times a checked layer, from the
compile cache. Configs run without their shared expert (SonicMoE's layer has none).

Usage: python benchmarks/sonic_check.py qwen3-30b-a3b,mid-64e,dsv3-ep8-slice,mixtral-8x7b
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_moe import CHECK_REL_ERR, Method, make_bench_inputs, named_configs, oracle  # noqa: E402
from mok.harness.bits import rel_error  # noqa: E402
from sonic_peer import require_sonic  # noqa: E402


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    try:
        configs = named_configs(sys.argv[1])
    except ValueError as e:
        sys.exit(str(e))
    require_sonic("sonic_check.py")
    t_start = time.time()
    for c in configs:
        name = c["name"]
        # a line before each first call, so a run cut off by a time limit shows which shape it was in, and since when
        print(f"{name}: first call at {time.time() - t_start:.0f} s", flush=True)
        inp = make_bench_inputs(dict(c, S=0), "random")
        y_ref, dx_ref = oracle(inp)
        meth = Method("sonic", inp)
        t0 = time.time()
        y, dx = meth.fwd_bwd()
        torch.cuda.synchronize()
        first_s = time.time() - t0
        ey, edx = rel_error(y, y_ref), rel_error(dx, dx_ref)
        verdict = "ok" if ey < CHECK_REL_ERR and edx < CHECK_REL_ERR else "CHECK FAILED"
        print(f"{name}: first call {first_s:.0f} s (compile, autotune), y err {ey:.1e}, d_x err {edx:.1e}: {verdict}",
              flush=True)
        del inp, y_ref, dx_ref, meth, y, dx
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

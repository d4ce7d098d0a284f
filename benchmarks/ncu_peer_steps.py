"""One forward+backward of a method (bench_moe.py's mok_gu or sonic) on a config without its shared expert, inside
cudaProfilerStart/Stop after warm-up steps, for Nsight Compute to read the GEMM launches of both side by side (ncu
--profile-from-start off: the warm-ups, SonicMoE's first-call compile and autotune, are not profiled). mok runs gate
and up as one tensor with bf16 weight gradients, as energy_probe.py's mok: workloads.
Usage: ncu --profile-from-start off --clock-control none -k regex:'GemmUniversal|quackgemm' \\
         python benchmarks/ncu_peer_steps.py dsv3-ep8-slice mok_gu [warm-up steps, default 3]"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_moe import Method, make_bench_inputs, named_configs  # noqa: E402

METHODS = ("mok_gu", "sonic")


def main():
    if len(sys.argv) not in (3, 4) or sys.argv[2] not in METHODS:
        raise SystemExit(f"usage: ncu_peer_steps.py CONFIG {{{','.join(METHODS)}}} [WARMUPS]")
    try:
        cfg = named_configs(sys.argv[1])[0]
    except ValueError as e:
        raise SystemExit(f"ncu_peer_steps.py: {e}") from None
    warmups = sys.argv[3] if len(sys.argv) == 4 else "3"
    if not warmups.isdigit():
        raise SystemExit(f"ncu_peer_steps.py: WARMUPS: expected a whole number of steps, got {warmups!r}")
    warmups = int(warmups)
    meth = Method(sys.argv[2], make_bench_inputs(dict(cfg, S=0), "random"), torch.bfloat16)
    for _ in range(warmups):
        meth.fwd_bwd()
        meth.clear_grads()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    meth.fwd_bwd()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"{cfg['name']} {sys.argv[2]}: one profiled step after {warmups} warm-ups")


if __name__ == "__main__":
    main()

"""Expert-parallel layer per rank: mok.fast with a group against all_to_all_single + the grouped_mm path.

Each of W ranks holds T tokens (--tokens-per-rank, default the config's T / W, so the W ranks together
run the config's batch) and E / W experts. Per rank it prints: forward and forward+backward times
(medians of CUDA-event timings, all ranks started together), the bytes the dispatch pulls and the
combine pushes (rows x H x 2; "remote" = rows of other ranks' tokens), and the GB/s of mok's dispatch
(`ep_gather_k`) and combine (`ep_scatter_k`) kernels from a torch.profiler trace of one forward.
The baseline (all_to_all_single of the routed rows, torch._grouped_mm on the local experts,
all_to_all_single back, fp32 weighted combine; autograd backward) needs one GPU per rank (nccl).

With W ranks sharing one GPU (the test bed) the numbers are a smoke test, not a speed claim: the ranks
are time-sliced and every wait can cost a slice.

Usage: python benchmarks/bench_ep.py --world-size 2 [--config qwen3-30b-a3b] [--tokens-per-rank T]
       torchrun --nproc-per-node 8 benchmarks/bench_ep.py [--config ...]     (one GPU per rank)
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

CONFIGS = ROOT / "benchmarks" / "configs.json"


def traffic(topk_idx_all: torch.Tensor, W: int, rank: int, H: int, E: int) -> dict:
    """Bytes this rank's dispatch pulls and combine pushes, from every rank's ids [W*T, K] (CPU int64,
    E experts, E / W per rank): one bf16 row of H per (token, k) pair routed to this rank's experts;
    "remote" counts the pairs of other ranks' tokens."""
    N, K = topk_idx_all.shape
    T = N // W
    owner = topk_idx_all // (E // W)
    mine = owner == rank
    token_rank = torch.arange(N).unsqueeze(1).expand(N, K) // T
    rows = int(mine.sum())
    remote = int((mine & (token_rank != rank)).sum())
    return {"rows": rows, "remote_rows": remote, "bytes": rows * H * 2, "remote_bytes": remote * H * 2}


def _timed(fn, warmup: int, reps: int, barrier) -> float:
    """bench_moe.timed ("stream" mode), all ranks starting the timed reps together."""
    from bench_moe import timed

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    barrier()
    return timed(fn, 0, reps, mode="stream")


def _kernel_ms(fn, names: tuple) -> dict:
    """GPU time (ms) of the kernels whose name contains each of `names`, over one call of fn."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    out = {n: 0.0 for n in names}
    for e in prof.events():
        for n in names:
            if n in e.name and e.device_type.name == "CUDA":
                out[n] += e.device_time_total / 1e3
    return out


def _baseline_step(x, idx, w, weights, group, W, L, backward: bool, dy=None):
    """all_to_all_single dispatch -> the grouped_mm path (peers.py) on the local experts, one row per
    received pair -> all_to_all_single back -> fp32 weighted combine."""
    import torch.distributed.nn.functional as dnf
    from peers import grouped_mm_path

    rg, ru, rd = weights
    T, H = x.shape
    K = idx.shape[1]
    flat = idx.reshape(-1)
    order = torch.argsort(flat, stable=True)          # by expert, so by owner rank
    dest = flat[order] // L
    send_counts = torch.bincount(dest, minlength=W)
    recv_counts = torch.empty_like(send_counts)
    torch.distributed.all_to_all_single(recv_counts, send_counts, group=group)
    sc, rc = send_counts.tolist(), recv_counts.tolist()  # host sync, as users of this pattern have
    rows = x[order // K]
    got = dnf.all_to_all_single(torch.empty(sum(rc), H, dtype=x.dtype, device=x.device), rows, rc, sc, group=group)
    ids = torch.empty(sum(rc), dtype=flat.dtype, device=x.device)
    torch.distributed.all_to_all_single(ids, flat[order].contiguous(), rc, sc, group=group)
    ones = torch.ones(ids.shape[0], 1, dtype=torch.float32, device=x.device)
    o = grouped_mm_path(got, (ids % L).unsqueeze(1), ones, None, None, None, rg, ru, rd)  # weight 1: o itself
    back = dnf.all_to_all_single(torch.empty(sum(sc), H, dtype=x.dtype, device=x.device), o, sc, rc, group=group)
    contrib = back.float() * w.reshape(-1)[order].unsqueeze(1)
    y = torch.zeros(T, H, dtype=torch.float32, device=x.device).index_add(0, order // K, contrib).to(torch.bfloat16)
    if backward:
        y.backward(dy)
    return y


def run_rank(rank: int, W: int, group, cfg: dict, T: int, warmup: int, reps: int) -> dict:
    import torch.distributed as dist

    import mok.fast
    from mok.testing.cases import MoEConfig, make_inputs
    from mok.testing.runner import shard_inputs

    E, H = cfg["E"], cfg["H"]
    inputs = make_inputs(MoEConfig(T * W, H, cfg["I"], E, cfg["K"], cfg.get("S", 0)), seed=1)
    local = {k: (v.cuda() if v is not None else None) for k, v in shard_inputs(inputs, rank, W).items()}
    args = [local[a] for a in ("x", "topk_idx", "topk_weight", "shared_gate", "shared_up", "shared_down",
                               "routed_gate", "routed_up", "routed_down")]

    def barrier():
        dist.barrier(group=group)

    def fwd():
        return mok.fast.forward(*args, group=group)[0]

    def fwd_bwd():
        y, ctx = mok.fast.forward(*args, group=group)
        mok.fast.backward(ctx, local["dy"], weight_grad_dtype=torch.bfloat16)

    out = {"rank": rank, "W": W, "T": T, "mok_fwd_ms": _timed(fwd, warmup, reps, barrier),
           "mok_fwd_bwd_ms": _timed(fwd_bwd, warmup, reps, barrier)}
    out.update(traffic(inputs["topk_idx"], W, rank, H, E))
    k = _kernel_ms(fwd, ("ep_gather_k", "ep_scatter_k"))
    out["dispatch_ms"], out["combine_ms"] = k["ep_gather_k"], k["ep_scatter_k"]
    out["dispatch_GBps"] = out["bytes"] / max(out["dispatch_ms"], 1e-9) / 1e6
    out["combine_GBps"] = out["bytes"] / max(out["combine_ms"], 1e-9) / 1e6
    if dist.get_backend(group) == "nccl":
        L = E // W
        leaves = [a.detach().clone().requires_grad_(True) for a in args[6:9]]
        xb = local["x"].detach().clone().requires_grad_(True)
        step = (lambda bwd: _baseline_step(xb, local["topk_idx"], local["topk_weight"], leaves, group, W, L, bwd,
                                           local["dy"]))
        out["a2a_grouped_mm_fwd_ms"] = _timed(lambda: step(False), warmup, reps, barrier)
        out["a2a_grouped_mm_fwd_bwd_ms"] = _timed(lambda: step(True), warmup, reps, barrier)
    return out


def _print(rows: list) -> None:
    for r in rows:
        base = (f"  a2a+grouped_mm fwd {r['a2a_grouped_mm_fwd_ms']:.2f} ms fwd+bwd {r['a2a_grouped_mm_fwd_bwd_ms']:.2f} ms"
                if "a2a_grouped_mm_fwd_ms" in r else "  a2a+grouped_mm: needs one GPU per rank (nccl)")
        print(f"rank {r['rank']}/{r['W']} T={r['T']}: mok fwd {r['mok_fwd_ms']:.2f} ms fwd+bwd {r['mok_fwd_bwd_ms']:.2f} ms; "
              f"rows {r['rows']} ({r['remote_rows']} remote), {r['bytes'] / 1e6:.1f} MB each way; dispatch "
              f"{r['dispatch_ms']:.3f} ms ({r['dispatch_GBps']:.0f} GB/s), combine {r['combine_ms']:.3f} ms "
              f"({r['combine_GBps']:.0f} GB/s);{base}", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="qwen3-30b-a3b", help="a name in benchmarks/configs.json")
    ap.add_argument("--world-size", type=int, default=0, help="ranks to start here (not under torchrun)")
    ap.add_argument("--tokens-per-rank", type=int, default=0, help="default: the config's T / W")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", default="")
    a = ap.parse_args(argv)
    cfgs = {c["name"]: c for c in json.loads(CONFIGS.read_text())["configs"]}
    if a.config not in cfgs:
        ap.error(f"--config: expected one of {sorted(cfgs)}, got {a.config!r}")
    cfg = cfgs[a.config]
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    W = int(os.environ["WORLD_SIZE"]) if torchrun else a.world_size
    if W < 2:
        ap.error(f"--world-size: expected >= 2 ranks (or run under torchrun), got {W}")
    if cfg["E"] % W:
        ap.error(f"--world-size: expected a divisor of E = {cfg['E']}, got {W}")
    T = a.tokens_per_rank or cfg["T"] // W
    if T < 1:
        ap.error(f"--tokens-per-rank: expected >= 1, got {T}")
    if torchrun:
        import torch.distributed as dist

        rank = int(os.environ["RANK"])
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
        backend = "nccl" if torch.cuda.device_count() >= W else "gloo"
        dist.init_process_group(backend)
        rows = [None] * W
        dist.all_gather_object(rows, run_rank(rank, W, dist.group.WORLD, cfg, T, a.warmup, a.reps))
        if rank == 0:
            _print(rows)
        dist.destroy_process_group()
    else:
        from bench_ep import run_rank as worker  # by module name, so the worker processes can import it
        from mok.testing.dist import launch

        rows = launch(worker, (cfg, T, a.warmup, a.reps), W, device="cuda")
        _print(rows)
    if a.json and (not torchrun or int(os.environ["RANK"]) == 0):
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

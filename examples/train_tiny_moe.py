"""Train a tiny decoder-only byte-level transformer with mok MoE layers, and prove it is deterministic.

The text is the Python standard library's own source files (as bytes), so nothing is downloaded.
Each step takes a global batch of M micro-batches; every dense part (embeddings, attention, norms,
router gates, LM head) runs per micro-batch with the same shapes in every setting, and its
per-micro-batch gradients are summed with `mok.reference.tree_sum` in micro-batch order.
The MoE layer sees the micro-batches concatenated in order: in one process as one call; with expert
parallelism (W gloo processes) each rank passes its own micro-batches with `group=`, and the
reference sums every expert gradient over the same rows in the same order. So:

    two runs give bitwise identical loss curves and final weights, and
    a run over W = 2 processes gives the same bits as the single-process run.

Usage:
    python examples/train_tiny_moe.py                      # 300 steps on the CPU, one process
    python examples/train_tiny_moe.py --world-size 2       # expert parallelism over 2 gloo processes
    python examples/train_tiny_moe.py --prove              # W=1 twice + W=2; assert identical bits
    python examples/train_tiny_moe.py --device cuda --prove  # GPU (fast path when built): reruns identical
    python examples/train_tiny_moe.py --compare-precisions  # bf16 then fp8: fp8 loss within 1% at every step

Writes to --out: loss_curve.png, losses_w{W}[_run{i}|_fp8|_bf16].pt (fp32 per step), weights_w{W}[...].safetensors.
Needs matplotlib (plot) and tqdm (progress bar).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass, replace

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

import mok
from mok.nn import ops
from mok.reference import all_gather_cat, check_same_across_ranks, tree_sum

ROUTED = ("w_gate_up_L2IH", "w_down_LHI")  # this rank's L experts
EXPERT_PARAMS = ROUTED + ("w_shared_gate_up_2SH", "w_shared_down_HS")  # shared: replicated


@dataclass
class Config:
    steps: int = 300
    seq: int = 64            # tokens per sequence
    micro_batch: int = 2     # sequences per micro-batch
    n_micro: int = 4         # micro-batches per step (M); divisible by the world size
    layers: int = 2
    hidden: int = 64         # H
    heads: int = 4
    experts: int = 8         # E; divisible by the world size
    top_k: int = 2           # K
    expert_hidden: int = 64  # I
    shared_hidden: int = 64  # S
    lr: float = 3e-3
    warmup: int = 20
    aux_coef: float = 0.01   # load-balancing loss weight
    z_coef: float = 1e-4     # router z-loss weight
    seed: int = 0
    threads: int = 1         # CPU threads per process (BLAS bits can depend on it)
    device: str = "cpu"
    corpus_bytes: int = 2_000_000
    precision: str = "bf16"  # the MoE layers' recipe: "bf16" or "fp8" (docs/numerics.md)


# ---------------------------------------------------------------- data


def load_corpus(max_bytes: int) -> torch.Tensor:
    """The standard library's top-level *.py files, sorted by name, concatenated: uint8 [N]."""
    root = sysconfig.get_paths()["stdlib"]
    out, n = [], 0
    for name in sorted(os.listdir(root)):
        if name.endswith(".py") and n < max_bytes:
            with open(os.path.join(root, name), "rb") as f:
                data = f.read()
            out.append(data)
            n += len(data)
    return torch.frombuffer(bytearray(b"".join(out)[:max_bytes]), dtype=torch.uint8)


def step_batch(corpus: torch.Tensor, cfg: Config, step: int) -> torch.Tensor:
    """All M micro-batches of one step: int64 [M, micro_batch, seq + 1] (same on every rank)."""
    g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
    n = cfg.n_micro * cfg.micro_batch
    starts = torch.randint(0, corpus.numel() - cfg.seq - 1, (n,), generator=g)
    rows = torch.stack([corpus[s : s + cfg.seq + 1] for s in starts.tolist()]).long()
    return rows.view(cfg.n_micro, cfg.micro_batch, cfg.seq + 1)


# ---------------------------------------------------------------- model


class TinyMoELM(nn.Module):
    """Byte-level decoder: embeddings + learned positions, L x (attention, mok.MoE), RMSNorm, LM head.
    Parameters fp32; the MoE layers round to bf16 inside and return fp32 weight gradients."""

    def __init__(self, cfg: Config, group=None):
        super().__init__()
        H = cfg.hidden
        self.cfg = cfg
        self.embed = nn.Parameter(torch.randn(256, H) * 0.02)
        self.pos = nn.Parameter(torch.randn(cfg.seq, H) * 0.02)
        self.blocks = nn.ModuleList()
        for _ in range(cfg.layers):
            b = nn.Module()
            b.attn_norm = nn.Parameter(torch.ones(H))
            b.qkv = nn.Parameter(torch.randn(3 * H, H) * H**-0.5)
            b.proj = nn.Parameter(torch.randn(H, H) * (H * 2 * cfg.layers) ** -0.5)
            b.moe_norm = nn.Parameter(torch.ones(H))
            b.moe = mok.MoE(H, cfg.expert_hidden, cfg.experts, cfg.top_k, shared_intermediate_size=cfg.shared_hidden,
                            group=group, backend="auto", precision=cfg.precision)
            self.blocks.append(b)
        self.norm = nn.Parameter(torch.ones(H))
        self.head = nn.Parameter(torch.randn(256, H) * H**-0.5)

    def split_params(self):
        """(dense {name: p}, experts {name: p}): dense ones run per micro-batch, experts once per step."""
        dense, experts = {}, {}
        for name, p in self.named_parameters():
            (experts if name.rsplit(".", 1)[-1] in EXPERT_PARAMS else dense)[name] = p
        return dense, experts

    def losses(self, tokens_MBS: torch.Tensor, dense_by_micro: list) -> list:
        """Per-micro-batch losses (CE + router losses), [] fp32 each. tokens_MBS: int64 [m, b, seq + 1]
        (this rank's micro-batches); dense_by_micro[j]: {name: alias of the dense parameter} for micro-batch j."""
        cfg = self.cfg
        m, b, s = tokens_MBS.shape[0], tokens_MBS.shape[1], cfg.seq
        inp, tgt = tokens_MBS[:, :, :-1], tokens_MBS[:, :, 1:]
        P = dense_by_micro
        h = [F.embedding(inp[j], P[j]["embed"]) + P[j]["pos"] for j in range(m)]
        aux = [0.0] * m
        for i, blk in enumerate(self.blocks):
            pre = f"blocks.{i}."
            h = [h[j] + _attention(_rms(h[j], P[j][pre + "attn_norm"]), P[j][pre + "qkv"], P[j][pre + "proj"], cfg.heads)
                 for j in range(m)]
            x = [_rms(h[j], P[j][pre + "moe_norm"]).reshape(b * s, -1) for j in range(m)]
            be = blk.moe.backend_in_use  # the fast router and losses on the fast backend
            routes = [ops.router(x[j], P[j][pre + "moe.w_router_EH"], cfg.top_k, backend=be) for j in range(m)]
            for j, (idx, _, scores, logits) in enumerate(routes):
                lb, z = ops.router_losses(scores, logits, idx, backend=be)
                aux[j] = aux[j] + cfg.aux_coef * lb + cfg.z_coef * z
            y = blk.moe.compute_experts(torch.cat(x), torch.cat([r[0] for r in routes]), torch.cat([r[1] for r in routes]))
            h = [h[j] + y_j.float().view(b, s, -1) for j, y_j in enumerate(y.split(b * s))]
        out = []
        for j in range(m):
            logits = F.linear(_rms(h[j], P[j]["norm"]), P[j]["head"])
            out.append(F.cross_entropy(logits.reshape(b * s, 256), tgt[j].reshape(-1)) + aux[j])
        return out


def _rms(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _attention(x_BSH, w_qkv, w_o, heads):
    B, S, H = x_BSH.shape
    q, k, v = F.linear(x_BSH, w_qkv).view(B, S, 3, heads, H // heads).permute(2, 0, 3, 1, 4)
    att = (q @ k.transpose(-1, -2)) * (H // heads) ** -0.5
    causal = torch.ones(S, S, dtype=torch.bool, device=x_BSH.device).tril()
    att = att.masked_fill(~causal, float("-inf")).softmax(-1)
    return F.linear((att @ v).transpose(1, 2).reshape(B, S, H), w_o)


# ---------------------------------------------------------------- optimiser (elementwise, position-independent)


class AdamW:
    """AdamW from separate elementwise ops (no fused/FMA kernels), so an expert's slice on one rank is
    updated with exactly the bits of the same slice of the whole tensor in one process."""

    def __init__(self, params: dict, lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1):
        self.params, self.lr, self.betas, self.eps, self.wd = params, lr, betas, eps, weight_decay
        self.m = {n: torch.zeros_like(p) for n, p in params.items()}
        self.v = {n: torch.zeros_like(p) for n, p in params.items()}
        self.t = 0

    @torch.no_grad()
    def step(self, grads: dict, lr: float):
        self.t += 1
        b1, b2 = self.betas
        bc1, bc2 = 1 - b1**self.t, 1 - b2**self.t
        for n, p in self.params.items():
            g, m, v = grads[n], self.m[n], self.v[n]
            m.mul_(b1).add_(g * (1 - b1))
            v.mul_(b2).add_((g * g) * (1 - b2))
            if p.dim() >= 2 and self.wd:
                p.mul_(1 - lr * self.wd)
            p.sub_(((m / bc1) / ((v / bc2).sqrt() + self.eps)) * lr)


def lr_at(cfg: Config, step: int) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)))


# ---------------------------------------------------------------- training


def config_digest(cfg: Config) -> int:
    """63-bit digest of every setting, to compare across ranks."""
    import hashlib

    return int.from_bytes(hashlib.sha256(repr(sorted(asdict(cfg).items())).encode()).digest()[:8], "little") >> 1


def train(cfg: Config, group=None, progress: bool = True):
    """Train; returns (losses fp32 [steps], global weights {name: tensor} on the CPU), same on every rank."""
    W, rank = (1, 0) if group is None else (dist.get_world_size(group), dist.get_rank(group))
    if cfg.n_micro % W or cfg.experts % W:
        raise ValueError(f"world_size: expected a divisor of n_micro = {cfg.n_micro} and experts = {cfg.experts}, got {W}")
    if group is not None:  # pre-flight: one small collective before any other, so a differing rank fails every rank
        check_same_across_ranks(config_digest(cfg), "cfg (a digest of the whole Config)", group)
    torch.set_num_threads(cfg.threads)
    device = torch.device(cfg.device)
    if device.type == "cuda":  # deterministic cuBLAS workspaces and kernels for the dense parts
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    corpus = load_corpus(cfg.corpus_bytes)
    torch.manual_seed(cfg.seed)
    model = TinyMoELM(cfg, group).to(device)
    dense, experts = model.split_params()
    opt = AdamW({**dense, **experts}, cfg.lr)
    mine = slice(rank * cfg.n_micro // W, (rank + 1) * cfg.n_micro // W)
    n_mine = mine.stop - mine.start
    scale = torch.tensor(1.0 / cfg.n_micro, device=device)
    losses = []
    if rank == 0 and progress:
        print(f"mok backend: {model.blocks[0].moe.backend_in_use} ({model.blocks[0].moe.backend_reason})", flush=True)
    bar = tqdm(range(cfg.steps), disable=not (progress and rank == 0), desc=f"W={W}", file=sys.stdout)
    for step in bar:
        tokens = step_batch(corpus, cfg, step)[mine].to(device)
        aliases = [{n: p.view_as(p) for n, p in dense.items()} for _ in range(n_mine)]
        micro_losses = model.losses(tokens, aliases)
        inputs = [a[n] for a in aliases for n in dense] + list(experts.values())
        grads = torch.autograd.grad(micro_losses, inputs, grad_outputs=[scale] * n_mine)
        nd = len(dense)
        g = {}
        for i, n in enumerate(dense):  # [m, ...] per micro-batch -> all M in order -> one ordered tree
            g[n] = tree_sum(all_gather_cat(torch.stack([grads[j * nd + i] for j in range(n_mine)]), group), dim=0)
        g.update(zip(experts, grads[nd * n_mine :]))  # the reference already reduced them over the group
        opt.step(g, lr_at(cfg, step))
        step_losses = all_gather_cat(torch.stack(micro_losses).detach(), group)
        losses.append(tree_sum(step_losses, dim=0) / cfg.n_micro)
        bar.set_postfix(loss=f"{losses[-1].item():.4f}")
    weights = {n: p.detach() for n, p in dense.items()}
    weights.update({n: all_gather_cat(p.detach(), group) if n.rsplit(".", 1)[-1] in ROUTED else p.detach()
                    for n, p in experts.items()})
    return torch.stack(losses).cpu(), {n: w.cpu().contiguous() for n, w in weights.items()}


def _rank(rank, world_size, group, cfg, progress):
    """One expert-parallel process (started by mok.testing.dist.launch): rank 0 returns the result."""
    result = train(cfg, group, progress)
    return result if rank == 0 else None


def check_config(cfg: Config, world_size: int) -> None:
    """Raise ValueError naming the first bad setting, before any process starts."""
    for name in ("steps", "seq", "micro_batch", "n_micro", "layers", "hidden", "heads", "experts", "top_k",
                 "expert_hidden", "threads"):
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: expected an int >= 1, got {v!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size: expected an int >= 1, got {world_size!r}")
    if cfg.n_micro % world_size or cfg.experts % world_size:
        raise ValueError(f"world_size: expected a divisor of n_micro = {cfg.n_micro} and experts = {cfg.experts}, "
                         f"got {world_size}")
    if world_size > 1 and cfg.device != "cpu":
        raise ValueError(f"world_size: W > 1 runs use gloo on the CPU here, got device {cfg.device!r}")
    if cfg.top_k > cfg.experts:
        raise ValueError(f"top_k: expected at most experts = {cfg.experts}, got {cfg.top_k}")
    if cfg.precision not in ("bf16", "fp8"):
        raise ValueError(f"precision: expected 'bf16' or 'fp8', got {cfg.precision!r}")
    if cfg.hidden % cfg.heads:
        raise ValueError(f"heads: expected a divisor of hidden = {cfg.hidden}, got {cfg.heads}")


def run(cfg: Config, world_size: int = 1, progress: bool = True):
    """train() in this process (W = 1) or in W fresh gloo processes (CPU). Returns (losses, weights).

    W > 1 uses mok.testing.dist.launch: settings are checked before any process starts, a failing
    process stops all of them with its message, and Ctrl-C or SIGTERM stops them all (docs/reliability.md).
    """
    check_config(cfg, world_size)
    if world_size == 1:
        return train(cfg, None, progress)
    from mok.testing.dist import launch

    return launch(_rank, (cfg, progress), world_size, threads=cfg.threads)[0]


def save(out_dir: str, tag: str, losses, weights) -> None:
    from safetensors.torch import save_file

    torch.save(losses, os.path.join(out_dir, f"losses_{tag}.pt"))
    save_file(weights, os.path.join(out_dir, f"weights_{tag}.safetensors"))


def plot(curves: dict, path: str, title: str) -> bool:
    """Write the loss curves to `path` (PNG); False (and a message) when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no loss-curve PNG (pip install matplotlib)")
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (label, losses) in enumerate(curves.items()):
        ax.plot(losses.numpy(), label=label, linewidth=2.5 - 0.7 * i, linestyle=("-", "--", ":")[i % 3])
    ax.set_xlabel("step")
    ax.set_ylabel("loss (CE + router losses, nats/byte)")
    ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def first_difference(a: dict, b: dict) -> str | None:
    """None when every tensor is bitwise equal, else a message naming the first difference."""
    from mok.testing.bits import bit_diff

    for name in a:
        d = bit_diff(b[name], a[name])
        if not d.equal:
            return f"{name}: {d.n_diff} elements differ"
    return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=Config.steps)
    ap.add_argument("--world-size", type=int, default=1, help="expert-parallel processes (gloo, CPU)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=Config.threads)
    ap.add_argument("--seed", type=int, default=Config.seed)
    ap.add_argument("--precision", default=Config.precision, choices=("bf16", "fp8"),
                    help="the MoE layers' recipe (docs/numerics.md)")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--prove", action="store_true",
                      help="run W=1 twice, and W=2 on the CPU; assert bitwise identical curves and weights")
    mode.add_argument("--compare-precisions", action="store_true",
                      help="train in bf16, then in fp8, from the same seed and batches; assert the fp8 loss within "
                           "--max-rel-diff of the bf16 loss at every step")
    ap.add_argument("--max-rel-diff", type=float, default=0.01,
                    help="--compare-precisions: largest allowed |fp8 - bf16| / |bf16| of any logged loss (default 0.01)")
    ap.add_argument("--log-every", type=int, default=10,
                    help="--compare-precisions: steps per logged loss, the mean over those steps as the transformers "
                         "Trainer logs it (default 10; 1 compares every step)")
    ap.add_argument("--out", default="train_tiny_moe_out")
    args = ap.parse_args(argv)
    if not (args.max_rel_diff >= 0 and math.isfinite(args.max_rel_diff)):
        ap.error(f"--max-rel-diff: expected a finite number >= 0, got {args.max_rel_diff}")
    if args.compare_precisions and (args.log_every < 1 or args.steps % args.log_every):
        ap.error(f"--log-every: expected a divisor of --steps = {args.steps}, got {args.log_every}")
    cfg = Config(steps=args.steps, device=args.device, threads=args.threads, seed=args.seed, precision=args.precision)
    W = args.world_size
    if args.prove:
        plan = [(1, "w1_run1", cfg), (1, "w1_run2", cfg)] + ([(2, "w2", cfg)] if cfg.device == "cpu" else [])
    elif args.compare_precisions:
        plan = [(W, f"w{W}_{p}", replace(cfg, precision=p)) for p in ("bf16", "fp8")]
    else:
        plan = [(W, f"w{W}" + ("" if cfg.precision == "bf16" else f"_{cfg.precision}"), cfg)]
    for W, _, c in plan:  # every setting is checked before anything runs: exit 2 naming the argument
        try:
            check_config(c, W)
        except ValueError as e:
            ap.error(str(e).replace("world_size:", "--world-size:", 1))
    try:
        return _main(args, plan)
    except KeyboardInterrupt:  # the launcher has stopped every process and removed its files
        print("interrupted", file=sys.stderr)
        return 130


def logged(losses: torch.Tensor, every: int) -> torch.Tensor:
    """The logged losses, fp32 [steps / every]: the mean of each `every` consecutive steps. losses: fp32 [steps]."""
    return losses.float().view(-1, every).mean(1)


def precision_gap(losses_bf16: torch.Tensor, losses_fp8: torch.Tensor) -> torch.Tensor:
    """|fp8 - bf16| / |bf16| elementwise, fp32: the FP8 run's relative loss error against the bf16 run's.
    losses_bf16, losses_fp8: fp32 [n], the same steps (or logged intervals) of each run."""
    return (losses_fp8.float() - losses_bf16.float()).abs() / losses_bf16.float().abs()


def _main(args, plan: list) -> int:
    os.makedirs(args.out, exist_ok=True)
    curves, results = {}, {}
    for W, tag, cfg in plan:
        print(f"{tag} config: {asdict(cfg)}")
        t0 = time.time()
        results[tag] = run(cfg, W)
        print(f"{tag}: final loss {results[tag][0][-1].item():.4f}, {time.time() - t0:.1f} s")
        save(args.out, tag, *results[tag])
        curves[f"{tag.replace('_', ' ')} ({cfg.device})"] = results[tag][0]
    cfg = plan[0][2]
    title = f"tiny MoE LM on stdlib bytes, {cfg.steps} steps"
    ok = True
    if args.prove:
        base_l, base_w = results[plan[0][1]]
        for _, tag, _ in plan[1:]:
            l, w = results[tag]
            diff = first_difference({"losses": base_l}, {"losses": l}) or first_difference(base_w, w)
            print(f"{plan[0][1]} vs {tag}: {'bitwise identical loss curve and final weights' if diff is None else 'DIFFER: ' + diff}")
            ok &= diff is None
        title += ": " + ("all runs bitwise identical" if ok else "runs DIFFER")
    if args.compare_precisions:
        bf16, fp8 = results[plan[0][1]][0], results[plan[1][1]][0]
        step_gap = precision_gap(bf16, fp8)
        print(f"fp8 vs bf16 loss of single steps, relative: max {step_gap.max().item():.3%} at step "
              f"{int(step_gap.argmax())}, mean {step_gap.mean().item():.3%}")
        gap = precision_gap(logged(bf16, args.log_every), logged(fp8, args.log_every))
        ok = bool((gap <= args.max_rel_diff).all())  # a NaN gap fails too
        n = args.log_every
        print(f"fp8 vs bf16 logged loss (mean of every {n} steps), relative: max {gap.max().item():.3%} at steps "
              f"{int(gap.argmax()) * n}-{int(gap.argmax()) * n + n - 1}, final {gap[-1].item():.3%} "
              f"({'within' if ok else 'NOT within'} {args.max_rel_diff:.2%} at every logged step)")
        title += f": fp8 logged loss within {gap.max().item():.2%} of bf16"
    path = os.path.join(args.out, "loss_curve.png")
    if plot(curves, path, title):
        print(f"loss curve: {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

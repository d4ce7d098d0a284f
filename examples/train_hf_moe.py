"""Train a Qwen3-MoE-shaped transformers model with mok as its experts implementation.

The model is an unmodified `Qwen3MoeForCausalLM` built from a config with random weights; only
`experts_implementation` changes ("mok": mok's layer, the CUDA fast path on H100/H200; "grouped_mm":
transformers' default). The text is the Python standard library's own source, as bytes (vocabulary
256), so nothing is downloaded. Each step: forward with the router aux loss, backward, AdamW.

    python examples/train_hf_moe.py --device cuda --steps 50 --experts-implementation mok --prove
    python examples/train_hf_moe.py --device cuda --steps 50 --experts-implementation grouped_mm
    python examples/train_hf_moe.py --preset tiny --steps 3 --prove          # CPU smoke run

--prove trains twice from the same seed and exits 1 unless the two loss curves and the final weights
are bitwise identical. Prints one line per step (loss, seconds) and a summary; --log writes it as JSON.
On CUDA the dense parts are made deterministic (eager attention, deterministic algorithms, fixed cuBLAS
workspace); the median step time leaves out step 0 (which builds mok's kernels on first use).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import sysconfig
import time

import torch

# per preset: model sizes (Qwen3MoeConfig fields) and batch; "qwen3-30b-a3b" is that model's layer shape
PRESETS = {
    "tiny": dict(hidden_size=64, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, layers=2, batch=2, seq=32),
    "qwen3-30b-a3b": dict(hidden_size=2048, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                          num_attention_heads=32, num_key_value_heads=4, head_dim=128, layers=4, batch=4, seq=1024),
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--experts-implementation", default="mok",
                   help='"mok" (mok.hf), "grouped_mm" (transformers\' default), "eager", ...')
    p.add_argument("--prove", action="store_true", help="train twice; exit 1 unless the bits are identical")
    p.add_argument("--preset", choices=sorted(PRESETS), default="qwen3-30b-a3b")
    p.add_argument("--layers", type=int, help="decoder layers (default: the preset's)")
    p.add_argument("--batch", type=int, help="sequences per step (default: the preset's)")
    p.add_argument("--seq", type=int, help="tokens per sequence (default: the preset's)")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16", help="parameter dtype")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-deterministic", dest="deterministic", action="store_false",
                   help="leave PyTorch's nondeterministic CUDA kernels allowed (timing only; --prove may fail)")
    p.add_argument("--log", help="write the per-step losses and times and the summary here (JSON)")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error(f"--steps: expected an int >= 1, got {args.steps}")
    for k in ("layers", "batch", "seq"):
        if getattr(args, k) is None:
            setattr(args, k, PRESETS[args.preset][k])
    return args


def corpus(n_bytes: int) -> torch.Tensor:
    """The standard library's top-level *.py files, sorted by name, concatenated: uint8 [n_bytes]."""
    root, out, n = sysconfig.get_paths()["stdlib"], [], 0
    for name in sorted(os.listdir(root)):
        if name.endswith(".py") and n < n_bytes:
            with open(os.path.join(root, name), "rb") as f:
                out.append(f.read())
            n += len(out[-1])
    data = b"".join(out)
    if len(data) < n_bytes:
        data = data * (n_bytes // max(1, len(data)) + 1)
    return torch.frombuffer(bytearray(data[:n_bytes]), dtype=torch.uint8)


def batch(text: torch.Tensor, args, step: int) -> torch.Tensor:
    """Step `step`'s token ids: int64 [batch, seq] (windows at seeded random offsets)."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
    starts = torch.randint(0, text.numel() - args.seq, (args.batch,), generator=g).tolist()
    return torch.stack([text[s : s + args.seq] for s in starts]).long()


def make_model(args):
    """A random-weight Qwen3MoeForCausalLM on args.device (weights drawn there, from args.seed)."""
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    sizes = {k: v for k, v in PRESETS[args.preset].items() if k not in ("layers", "batch", "seq")}
    cfg = Qwen3MoeConfig(vocab_size=256, num_hidden_layers=args.layers, max_position_embeddings=args.seq,
                         intermediate_size=4 * sizes["hidden_size"], norm_topk_prob=True, output_router_logits=True,
                         bos_token_id=0, eos_token_id=0, pad_token_id=0, tie_word_embeddings=False, **sizes)
    torch.manual_seed(args.seed)
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, args.dtype), attn_implementation="eager",
                                                 experts_implementation=args.experts_implementation)
    return model


def deterministic(device: str) -> None:
    """Deterministic dense kernels on CUDA (cuBLAS workspace, torch's deterministic algorithms)."""
    if device.startswith("cuda"):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)


def digest(model) -> str:
    """sha256 of every parameter's bytes, in order."""
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def train(args, text: torch.Tensor, run: int = 0) -> dict:
    """One training run: {"losses": fp32 [steps], "seconds": per step, "digest": final weights}."""
    model = make_model(args)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    losses, seconds = [], []
    for step in range(args.steps):
        ids = batch(text, args, step).to(args.device)
        sync()
        t0 = time.perf_counter()
        out = model(ids, labels=ids)  # loss includes router_aux_loss_coef * aux loss
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        seconds.append(time.perf_counter() - t0)
        losses.append(out.loss.detach().float().cpu())
        print(f"run {run} step {step:3d} loss {losses[-1].item():.6f} aux {out.aux_loss.item():.6f} "
              f"{seconds[-1]:.3f} s", flush=True)
    return {"losses": torch.stack(losses), "seconds": seconds, "digest": digest(model)}


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.experts_implementation.startswith("mok"):
        import mok.hf  # noqa: F401  (registers "mok" in transformers' experts implementations)
    if args.deterministic:
        deterministic(args.device)
    text = corpus(max(1 << 20, args.batch * args.seq * 4))
    runs = [train(args, text, run) for run in range(2 if args.prove else 1)]
    first = runs[0]
    summary = {
        "experts_implementation": args.experts_implementation, "device": args.device, "preset": args.preset,
        "layers": args.layers, "batch": args.batch, "seq": args.seq, "dtype": args.dtype, "steps": args.steps,
        "deterministic": args.deterministic,
        "first_loss": first["losses"][0].item(), "last_loss": first["losses"][-1].item(),
        "median_step_s": statistics.median(first["seconds"][1:] or first["seconds"]),
    }
    if args.prove:
        summary["identical_losses"] = bool(torch.equal(runs[1]["losses"].view(torch.int32),
                                                       first["losses"].view(torch.int32)))
        summary["identical_weights"] = runs[1]["digest"] == first["digest"]
    print(json.dumps(summary), flush=True)
    if args.log:
        with open(args.log, "w") as f:
            json.dump({**summary, "runs": [{"losses": r["losses"].tolist(), "seconds": r["seconds"],
                                            "digest": r["digest"]} for r in runs]}, f, indent=1)
    return {**summary, "runs": runs}


if __name__ == "__main__":
    result = main()
    if "identical_losses" in result and not (result["identical_losses"] and result["identical_weights"]):
        print("NOT bitwise identical", file=sys.stderr)
        sys.exit(1)

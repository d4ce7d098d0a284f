"""The `mok` command: `mok verify`, `mok golden regen|check`, `mok diff-grads`."""

from __future__ import annotations

import argparse
import sys
import time


def _verify(args) -> int:
    from .verify import cpu_checks, cuda_checks, format_verdicts, run_checks

    t0 = time.perf_counter()
    checks = cuda_checks() if args.device == "cuda" else cpu_checks()
    results = run_checks(checks, progress=not args.no_progress)
    print(format_verdicts(results))
    print(f"mok verify --device {args.device}: {time.perf_counter() - t0:.1f} s")
    return 0 if all(r.ok for r in results) else 1


def _golden(args) -> int:
    from .golden import CASES, GOLDEN_DIR, check_case, load_manifest, regen_case, write_manifest

    golden_dir = args.dir or GOLDEN_DIR
    if args.action == "check":
        names = list(load_manifest(golden_dir)["cases"])
        bad = 0
        for name in names:
            r = check_case(name, golden_dir, device=args.device)
            print(f"{name}: {'ok' if r.ok else 'MISMATCH'}")
            for k, p in r.problems:
                print(f"  {k}: {p}")
            bad += not r.ok
        print(f"{len(names) - bad} passed, {bad} failed")
        return 1 if bad else 0
    try:
        entries = load_manifest(golden_dir)["cases"]
    except FileNotFoundError:
        entries = {}
    refused = 0
    for case in CASES:
        report, entry, written = regen_case(case, golden_dir, force=args.force)
        if report.ok:
            print(f"{case.name}: {'written' if written else 'unchanged'}")
            entries[case.name] = entry
        else:
            print(f"{case.name}: {'OVERWRITTEN' if written else 'differs, NOT overwritten (use --force)'}")
            for k, p in report.problems:
                print(f"  {k}: {p}")
            if written:
                entries[case.name] = entry
            else:
                refused += 1
    write_manifest(entries, golden_dir)
    return 1 if refused else 0


def _diff_grads(args) -> int:
    from .cases import NAMED, MoEConfig
    from .diffgrads import diff_grads, format_table

    cfg = MoEConfig.parse(args.shape) if args.shape else NAMED[args.config]
    verdicts = diff_grads(cfg, args.seeds, args.world_sizes, routing=args.routing, reruns=args.reruns,
                          device=args.device, threads=args.threads, progress=not args.no_progress)
    print(f"config T,H,I,E,K,S = {cfg.T},{cfg.H},{cfg.I},{cfg.E},{cfg.K},{cfg.S}; seeds {args.seeds}; "
          f"world sizes {args.world_sizes}; reruns {args.reruns}; device {args.device}")
    print(format_table(verdicts))
    ok = all(v.ok for v in verdicts)
    print("verdict:", "all bit-identical where they must be" if ok else "MISMATCH")
    return 0 if ok else 1


def build_parser() -> argparse.ArgumentParser:
    from .cases import NAMED, ROUTINGS

    p = argparse.ArgumentParser(prog="mok", description="Deterministic MoE layer: verification tools")
    sub = p.add_subparsers(dest="command", required=True)
    v = sub.add_parser("verify", help="run the determinism suite on the embedded default config")
    v.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    v.add_argument("--no-progress", action="store_true")
    v.set_defaults(func=_verify)
    g = sub.add_parser("golden", help="regenerate or check golden/")
    g.add_argument("action", choices=("regen", "check"))
    g.add_argument("--force", action="store_true", help="overwrite golden files whose bits changed")
    g.add_argument("--dir", default=None, help="golden directory (default: the repo's golden/)")
    g.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    g.set_defaults(func=_golden)
    d = sub.add_parser("diff-grads", help="compare y and all gradients across seeds, world sizes and reruns")
    d.add_argument("--config", choices=sorted(NAMED), default="default")
    d.add_argument("--shape", help="T,H,I,E,K[,S] (T = global tokens, divisible by every W)")
    d.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    d.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2, 4])
    d.add_argument("--reruns", type=int, default=2)
    d.add_argument("--routing", choices=ROUTINGS, default="random")
    d.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    d.add_argument("--threads", type=int, default=1)
    d.add_argument("--no-progress", action="store_true")
    d.set_defaults(func=_diff_grads)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

"""Quick check of mok.fast on one GPU: per-tensor error against the reference next to the plain bf16
implementation's, then a rerun bit check. Usage: python benchmarks/smoke_fast.py [T,H,I,E,K,S] [routing]"""
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import mok.fast  # noqa: E402
from mok.harness.cases import MoEConfig, make_inputs  # noqa: E402
from mok.harness.fast_checks import error_table, plain_outputs  # noqa: E402
from mok.harness.runner import run_layer  # noqa: E402

cfg = MoEConfig.parse(sys.argv[1]) if len(sys.argv) > 1 else MoEConfig(T=200, H=256, I=136, E=8, K=3, S=64)
routing = sys.argv[2] if len(sys.argv) > 2 else "random"
inp = make_inputs(cfg, seed=1, routing=routing, device="cuda")
t0 = time.time()
got = run_layer(inp, impl=mok.fast)
torch.cuda.synchronize()
print(f"{cfg} {routing}: first mok.fast call {time.time() - t0:.1f} s (includes build/load)")
ref = run_layer(inp)
plain = plain_outputs(inp)
ok_all = True
for name, ef, ep, ok in error_table(got, ref, plain):
    ok_all &= ok
    print(f"  {name:16s} fast {ef:.3e}  plain bf16 {ep:.3e}  {'ok' if ok else 'FAIL'}")
again = run_layer(inp, impl=mok.fast)
same = all(got[k] is None or torch.equal(got[k], again[k]) or (torch.isnan(got[k]).all()) for k in got)
print(f"  rerun bitwise equal: {same}")
print("SMOKE", "PASS" if ok_all and same else "FAIL")

"""compute-sanitizer memcheck and racecheck over a small forward+backward of mok.fast (under each GEMM tile
variant, with gate and up apart and as the halves of one tensor: the fused gate/up + SwiGLU launch, with the SwiGLU
backward fused into the d_a GEMM) and its router, and over an expert-parallel forward+backward at W = 2 (two processes sharing the
GPU, IPC peer buffers)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sanitizer_log import summary_problem  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.sm90]

SCRIPT = """
import os, torch, mok.fast
from mok.testing.cases import MoEConfig, make_inputs, with_stacked_gate_up
from mok.testing.runner import run_layer
for variant in [*map(str, range(mok.fast._lib.NUM_GEMM_VARIANTS)), ""]:  # every tile variant forced, then the rule
    os.environ["MOK_FAST_GEMM_VARIANT"] = variant
    for cfg, routing in [(MoEConfig(T=37, H=64, I=32, E=4, K=2, S=16), "random"),
                         (MoEConfig(T=20, H=64, I=32, E=6, K=2, S=0), "empty_expert")]:
        out = run_layer(make_inputs(cfg, seed=1, routing=routing, device="cuda"), impl=mok.fast)
    # gate/up halves of one tensor: the fused gate/up + SwiGLU launch (ping-pong halves of 96, cooperative of 128;
    # I = 40, S = 24: one tile, its halves past I and S), and the d_a GEMM with the SwiGLU backward in its epilogue
    # (the rule's choice, forced here all the same; in the ping-pong variants the epilogue load warp copies
    # [p | q] into shared memory, its sub-tiles handed over by mbarriers)
    os.environ["MOK_FAST_FUSE_SWIGLU_BWD"] = "1"
    for cfg in (MoEConfig(T=37, H=64, I=96, E=4, K=2, S=96), MoEConfig(T=29, H=64, I=128, E=6, K=2, S=0),
                MoEConfig(T=29, H=64, I=40, E=6, K=2, S=24)):
        out = run_layer(with_stacked_gate_up(make_inputs(cfg, seed=1, routing="empty_expert", device="cuda")),
                        impl=mok.fast)
    del os.environ["MOK_FAST_FUSE_SWIGLU_BWD"]
bad = make_inputs(MoEConfig(T=16, H=64, I=32, E=4, K=2, S=16), seed=2, device="cuda")
bad["topk_idx"][3, 0] = 99
run_layer(bad, impl=mok.fast)
x = torch.randn(37, 64, device="cuda").bfloat16()
w = torch.randn(60, 64, device="cuda").bfloat16()  # E = 60: padded to 64 inside the router
tw, idx, p, l = mok.fast.router_forward(x, w, 4, "softmax", True)
mok.fast.router_backward(x, w, p, idx, torch.randn_like(tw), torch.randn_like(p), None, "softmax", True)
torch.cuda.synchronize()
print("SANITIZER_SCRIPT_DONE")
"""


EP_SCRIPT = """
from mok.testing.cases import MoEConfig, make_inputs
from mok.testing.dist import run_world
for cfg in (MoEConfig(T=32, H=64, I=32, E=4, K=2, S=16), MoEConfig(T=18, H=64, I=32, E=4, K=3, S=0)):
    run_world(make_inputs(cfg, seed=3), 2, impl="fast", device="cuda")
print("SANITIZER_SCRIPT_DONE")
"""


@pytest.mark.parametrize("script", [
    SCRIPT,     # W = 1 layer, bad ids, router
    EP_SCRIPT,  # expert parallel W = 2: peer gathers and scatters, flags
], ids=["w1", "ep_w2"])
@pytest.mark.parametrize("tool", ["memcheck", "racecheck"])  # out-of-bounds accesses; shared-memory races
def test_compute_sanitizer_clean(tool, script):
    exe = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not os.path.exists(exe):
        pytest.skip("compute-sanitizer not installed")
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [exe, "--tool", tool, "--error-exitcode", "17", "--target-processes", "all"]
    if tool == "memcheck":
        cmd += ["--leak-check", "no"]
    r = subprocess.run(cmd + [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=900)
    log = r.stdout + r.stderr
    assert "SANITIZER_SCRIPT_DONE" in log, log[-4000:]
    assert r.returncode == 0, log[-4000:]
    problem = summary_problem(log, tool)  # every process's summary, not any one of them
    assert problem is None, problem + "\n" + log[-4000:]

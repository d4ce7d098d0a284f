"""Host (CPU) time of one mok.MoE training step on the GPU, at deepseek-v2-lite's shape with T = 1000 (where the
GPU work is short, so the host sets the pace): host and wall ms per call of the module (router losses included),
the layer through `mok.nn.ops.moe_gate_up`, and the router alone, then a cProfile of the layer op and of the
module sorted by each function's own time. Usage: python benchmarks/host_module_profile.py"""
import cProfile, pstats, sys
sys.path.insert(0, "."); sys.path.insert(0, "benchmarks")
import torch, mok
from mok.nn import ops
from host_timing import host_wall_ms
T, H, I, E, K, S = 1000, 2048, 1408, 64, 6, 2816
m = mok.MoE(H, I, E, K, shared_intermediate_size=S, backend="fast", dtype=torch.bfloat16, device="cuda")
x = torch.randn(T, H, device="cuda").bfloat16().requires_grad_()
dy = torch.randn(T, H, device="cuda").bfloat16()
def module():
    m.zero_grad(set_to_none=True); x.grad = None
    y, rl = m(x, return_router_losses=True)
    ((y * dy).sum() + 0.01 * rl.load_balance + 0.001 * rl.z).backward()
with torch.no_grad():
    r = m.route(x)
idx, tw = r.topk_idx, r.topk_weight.detach()
def layer_op():
    m.zero_grad(set_to_none=True); x.grad = None
    y = ops.moe_gate_up(x, idx, tw, m.w_shared_gate_up_2SH, m.w_shared_down_HS, m.w_gate_up_L2IH, m.w_down_LHI, backend="fast")
    (y * dy).sum().backward()
def router():
    m.zero_grad(set_to_none=True); x.grad = None
    rr = m.route(x)
    ((rr.scores * 1e-3).sum() + (rr.topk_weight * 1e-3).sum()).backward()
for name, fn in (("module", module), ("layer_op", layer_op), ("router", router)):
    host, wall = host_wall_ms(fn, reps=20)
    print(f"{name}: host {host:.3f} ms/call, wall {wall:.3f} ms/call", flush=True)
for name, fn in (("layer_op", layer_op), ("module", module)):
    torch.cuda.synchronize()
    pr = cProfile.Profile(); pr.enable()
    for _ in range(20): fn()
    pr.disable(); torch.cuda.synchronize()
    print(f"===== {name}: tottime"); pstats.Stats(pr).sort_stats("tottime").print_stats(30)

"""Host time of the layer's custom ops `mok::moe_fwd` and `mok::moe_bwd` against their Python bodies called
directly, and of the aliasing check `torch.library` runs on each call's outputs, at deepseek-v2-lite's shape with
T = 1000 (fast backend, no autograd).
Usage: python benchmarks/custom_op_layer_overhead.py"""
import torch
from host_timing import host_wall_ms

import mok
from mok.nn import ops

T, H, I, E, K, S = 1000, 2048, 1408, 64, 6, 2816
m = mok.MoE(H, I, E, K, shared_intermediate_size=S, backend="fast", dtype=torch.bfloat16, device="cuda")
x = torch.randn(T, H, device="cuda").bfloat16()
with torch.no_grad():
    r = m.route(x)
    args = (x, r.topk_idx, r.topk_weight, m.w_shared_gate_up_2SH.detach(), None, m.w_shared_down_HS.detach(),
            m.w_gate_up_L2IH.detach(), None, m.w_down_LHI.detach(), None, "fast", False)
    body = ops.moe_fwd._init_fn
    out = body(*args)
    check = torch._C._any_output_is_alias_to_input_or_output
    dy = torch.randn(T, H, device="cuda").bfloat16()
    sg, su = ops._halves(args[3], None)  # what the autograd backward passes: the halves of each stacked weight
    rg, ru = ops._halves(args[6], None)
    bargs = (dy, x, r.topk_idx, r.topk_weight, sg, su, args[5], rg, ru, args[8], out[1:], None, "fast", False, True,
             True, True)
    bbody = ops.moe_bwd._init_fn
    bout = bbody(*bargs)
    for name, fn in (("moe_fwd body called directly", lambda: body(*args)),
                     ("moe_fwd custom op", lambda: ops.moe_fwd(*args)),
                     ("aliasing check alone (fwd)", lambda: check(args, {}, (out,))),
                     ("moe_bwd body called directly", lambda: bbody(*bargs)),
                     ("moe_bwd custom op", lambda: ops.moe_bwd(*bargs)),
                     ("aliasing check alone (bwd)", lambda: check(bargs, {}, (bout,)))):
        host, wall = host_wall_ms(fn, reps=50)
        print(f"{name}: host {host:.3f} ms/call, wall {wall:.3f}", flush=True)

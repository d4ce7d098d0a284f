"""Where `mok.MoE`'s forward+backward spends its time beyond the layer's: wall time of the pieces
(router alone, layer through the custom op, layer direct, module without and with router losses),
then a torch.profiler table of one module step (GPU kernel time by kernel, CPU time by op) and the
GPU idle time inside the step. Usage: python benchmarks/profile_module.py [config]"""
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import mok  # noqa: E402
import mok.fast  # noqa: E402
from bench_moe import CONFIGS, load_configs, timed  # noqa: E402
from host_timing import host_wall_ms  # noqa: E402
from mok.nn import ops  # noqa: E402


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "qwen3-30b-a3b"
    c = next(c for c in load_configs(CONFIGS) if c["name"] == name)
    T, H, I, E, K, S = (c[k] for k in "THIEKS")
    torch.manual_seed(0)
    m = mok.MoE(H, I, E, K, shared_intermediate_size=S, backend="fast", dtype=torch.bfloat16, device="cuda")
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(T, H, generator=g, device="cuda").to(torch.bfloat16).requires_grad_()
    dy = torch.randn(T, H, generator=g, device="cuda").to(torch.bfloat16)
    with torch.no_grad():
        r = m.route(x)
    idx, tw = r.topk_idx, r.topk_weight.detach()
    ws = [m.w_shared_gate_SH, m.w_shared_up_SH, m.w_shared_down_HS, m.w_gate_LIH, m.w_up_LIH, m.w_down_LHI]

    def reset():
        m.zero_grad(set_to_none=True)
        x.grad = None

    def router():
        reset()
        rr = m.route(x)
        ((rr.scores * 1e-3).sum() + (rr.topk_weight * 1e-3).sum()).backward()

    def layer_op():
        reset()
        y = ops.moe(x, idx, tw, *ws, backend="fast")
        (y * dy).sum().backward()

    def layer_direct():
        y, ctx = mok.fast.forward(x.detach(), idx, tw, *(w.detach() if w is not None else None for w in ws))
        mok.fast.backward(ctx, dy)

    def module(losses):
        def step():
            reset()
            y, rl = m(x, return_router_losses=True)
            loss = (y * dy).sum()
            if losses:
                loss = loss + 0.01 * rl.load_balance + 0.001 * rl.z
            loss.backward()
        return step

    pieces = [("router fwd+bwd (op)", router), ("layer direct (mok.fast)", layer_direct),
              ("layer through mok.nn.ops.moe", layer_op), ("module, no router losses", module(False)),
              ("module + router losses", module(True))]
    print(f"{name} T={T} H={H} I={I} E={E} K={K} S={S}")
    print(f"  {'piece':32s} {'stream ms':>10s} {'sync ms':>10s} {'host ms/call':>12s}")
    for label, fn in pieces:
        st, sy = timed(fn, 3, 10, "stream"), timed(fn, 3, 10, "sync")
        host, _ = host_wall_ms(fn, reps=10, warmup=0)  # CPU time per call while the GPU queue is not full
        print(f"  {label:32s} {st:10.3f} {sy:10.3f} {host:12.3f}", flush=True)
    from mok.fast import _lib
    a = torch.randn(256, 256, device="cuda").bfloat16()
    d = torch.empty(256, 256, device="cuda")
    seg = [_lib.Segment.all_rows(256, 256, 256, _lib.Operand(a, 0, 0, 256), _lib.Operand(a, 0, 0, 256),
                                 _lib.Operand(d, 0, 0, 256))]
    tiny = torch.zeros(4, 16, device="cuda").bfloat16().requires_grad_()
    wt = torch.zeros(8, 16, device="cuda").bfloat16().requires_grad_()
    for label, fn in (("grouped_gemm call (tiny)", lambda: _lib.grouped_gemm(_lib.GEMM_TN_F32, seg, a.device)),
                      ("router_fwd op call (tiny, grad)", lambda: ops.router_fwd(tiny, wt, 2, "softmax", True, "fast"))):
        host, _ = host_wall_ms(fn, reps=100)
        print(f"  host time per {label}: {host * 1e3:.1f} us", flush=True)
    step = module(True)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
    kernels = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                     if e.device_type == torch.autograd.DeviceType.CUDA)
    busy, end0 = 0.0, None
    for s, e in kernels:
        if end0 is None or s > end0:
            busy += e - s
            end0 = e
        elif e > end0:
            busy += e - end0
            end0 = e
    span = kernels[-1][1] - kernels[0][0]
    print(f"GPU busy {busy / 1e3:.3f} ms of a {span / 1e3:.3f} ms span (first to last kernel): "
          f"{(span - busy) / 1e3:.3f} ms idle")


if __name__ == "__main__":
    main()

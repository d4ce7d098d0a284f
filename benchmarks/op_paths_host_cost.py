"""Host cost of the layer's two call paths in mok.nn (mok/nn/_op_common.py): the eager torch.autograd.Function that
plain eager calls take, and the registered custom ops (mok::moe_fwd / moe_bwd, what torch.compile traces), with the
backend replaced by a stand-in that computes nothing, so what is timed is mok.nn's own Python and the autograd
machinery of each path: the median microseconds of one `mok.nn.ops.moe` forward+backward (T 8, H 16, I 8, E 4, K 2,
S 8, bf16), --rounds rounds of each path, interleaved.

    python benchmarks/op_paths_host_cost.py [--rounds 3] [--steps 2000]
"""
from __future__ import annotations

import argparse
import statistics
import time
import types

import torch

from mok.nn import _op_common, ops

T, H, I, E, K, S = 8, 16, 8, 4, 2, 8


def stand_in():
    """A backend whose forward, save_context, load_context and backward return preallocated tensors."""
    bf, i32 = torch.bfloat16, torch.int32
    saved = [torch.empty(2 * E + 1, dtype=i32), torch.empty(T * K, dtype=i32), torch.empty(1, dtype=i32),
             torch.empty(T * K, H, dtype=bf), torch.empty(T * K, 2 * I), torch.empty(T * K, I, dtype=bf),
             torch.empty(T * K, H, dtype=bf), torch.empty(T, 2 * S), torch.empty(T, S, dtype=bf)]
    grads = [torch.zeros(T, H, dtype=bf), torch.zeros(T, K), torch.zeros(E, I, H), torch.zeros(E, I, H),
             torch.zeros(E, H, I), torch.zeros(S, H), torch.zeros(S, H), torch.zeros(H, S)]
    return types.SimpleNamespace(forward=lambda x, *a, group=None: (torch.empty_like(x), None),
                                 save_context=lambda ctx: saved, load_context=lambda *a: None,
                                 backward=lambda ctx, dy, **k: list(grads))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=2000)
    a = p.parse_args()
    backend = stand_in()
    ops._impl = lambda name: backend
    bf = torch.bfloat16
    x = torch.randn(T, H, dtype=bf, requires_grad=True)
    idx, w = torch.zeros(T, K, dtype=torch.long), torch.rand(T, K, requires_grad=True)
    weights = [torch.randn(*shape, dtype=bf, requires_grad=True)
               for shape in ((S, H), (S, H), (H, S), (E, I, H), (E, I, H), (E, H, I))]
    dy = torch.randn(T, H, dtype=bf)
    times = {True: [], False: []}
    for _ in range(a.rounds):
        for eager in (True, False):
            _op_common._EAGER = eager
            for _ in range(a.steps // 10):  # warm-up
                ops.moe(x, idx, w, *weights).backward(dy)
            step = []
            for _ in range(a.steps):
                t0 = time.perf_counter()
                ops.moe(x, idx, w, *weights).backward(dy)
                step.append(time.perf_counter() - t0)
            times[eager].append(statistics.median(step) * 1e6)
    print(f"torch {torch.__version__}, us per forward+backward, {a.rounds} rounds")
    for eager, name in ((True, "eager autograd.Function"), (False, "registered custom ops")):
        print(f"  {name:24s}" + "".join(f"{t:8.1f}" for t in times[eager]))


if __name__ == "__main__":
    main()

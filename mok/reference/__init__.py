"""Bit-exact pure-PyTorch reference MoE layer: the contract (docs/layer.md, docs/numerics.md).

Public API (everything else in this package is private):
- the layer: `forward`, `backward`, `moe` (autograd), `save_context` / `load_context`;
- the router: `router_forward` / `router_backward` (`gate_logits`, `router_scores`, `route` and their
  backward passes `route_backward`, `gate_backward`);
- the FP8 recipe's quantiser: `quantize_rows_1x128`, `quantize_blocks_128x128`, their dequantisers
  `dequantize_rows_1x128`, `dequantize_blocks_128x128`, and `fp8_rows_1x128`, `fp8_blocks_128x128`
  (the bf16 values the recipe computes with); `PRECISIONS`, `check_precision`;
- the bit-defining primitives other parts of mok build on: `tree_sum`, `matmul_exact`,
  `rows_outer_sum`, `rowwise_dot`, `exp_exact`, `sigmoid_exact`, `silu_exact`, `dsilu_exact`,
  `log_exact_ge1`, `bf16`, `split_hi_lo`;
- argument checks: `Dims`, `check_layer_args`, `check_expert_ids`, `check_grad_out`, `check_ep_split`,
  `check_devices`, `check_route_args`, `check_score`, `check_context_args`; in-place edits between a
  functional forward and its backward: `record_versions`, `check_versions`;
- bit-preserving collectives: `world`, `all_gather_cat`, `all_gather_varlen`, `check_same_across_ranks`;
  the pre-flight every rank runs before an expert-parallel call: `preflight`, `forward_facts`, `backend_fact`.
"""

from ._autograd import MoEFunction, moe
from ._comm import all_gather_cat, all_gather_varlen, check_same_across_ranks, preflight, world
from ._context import check_context_args, load_context, save_context, saved_fake
from ._exact import (CONTRACT_VERSION, bf16, dsilu_exact, exp_exact, log_exact_ge1, matmul_exact, rows_outer_sum,
                     rowwise_dot, sigmoid_exact, silu_exact, tree_sum)
from ._fp8 import (dequantize_blocks_128x128, dequantize_rows_1x128, fp8_blocks_128x128, fp8_rows_1x128,
                   quantize_blocks_128x128, quantize_rows_1x128)
from ._layer import Ctx, backend_fact, backward, forward, forward_facts
from ._router import (SCORES, check_route_args, check_score, gate_backward, gate_logits, route, route_backward,
                      router_backward, router_forward, router_scores, split_hi_lo)
from ._validate import (PRECISIONS, Dims, check_devices, check_ep_split, check_expert_ids, check_grad_out,
                        check_layer_args, check_precision)
from ._versions import check_versions, record_versions

__all__ = [
    "forward", "backward", "moe", "MoEFunction", "Ctx", "save_context", "load_context", "saved_fake",
    "gate_logits", "gate_backward", "router_scores", "route", "route_backward", "router_forward", "router_backward",
    "split_hi_lo", "SCORES",
    "tree_sum", "matmul_exact", "rows_outer_sum", "rowwise_dot", "exp_exact", "sigmoid_exact", "silu_exact",
    "dsilu_exact", "log_exact_ge1", "bf16", "CONTRACT_VERSION",
    "quantize_rows_1x128", "quantize_blocks_128x128", "dequantize_rows_1x128", "dequantize_blocks_128x128",
    "fp8_rows_1x128", "fp8_blocks_128x128", "PRECISIONS", "check_precision",
    "Dims", "check_layer_args", "check_expert_ids", "check_grad_out", "check_ep_split", "check_devices",
    "check_route_args", "check_score", "check_context_args", "record_versions", "check_versions",
    "world", "all_gather_cat", "all_gather_varlen", "check_same_across_ranks", "preflight", "forward_facts",
    "backend_fact",
]

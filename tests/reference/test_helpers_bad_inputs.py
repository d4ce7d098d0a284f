"""docs/bad_input.md for mok.reference's router and primitives: every bad argument raises TypeError or
ValueError whose message starts with the argument's name; nothing is broadcast, converted or read out of range.
(The layer's own arguments are in tests/reference/test_layer_bad_inputs.py, expert parallelism in tests/reference/test_ep_mismatch.py.)"""

import pytest
import torch

from mok import reference

T, H, E, K = 5, 8, 4, 2
_g = torch.Generator().manual_seed(0)
X = torch.randn(T, H, generator=_g).bfloat16()
W = torch.randn(E, H, generator=_g).bfloat16()
LOGITS = torch.randn(T, E, generator=_g)
P = reference.router_scores(LOGITS, "softmax")
IDX = torch.tensor([[0, 1], [1, 2], [2, 3], [3, 0], [1, 3]])
DW = torch.randn(T, K, generator=_g)
DS = torch.randn(T, E, generator=_g)
B16 = torch.bfloat16


def assert_raises(exc, fn, name, *parts):
    """fn() raises exactly `exc` (not a subclass such as IndexError) whose message starts with `name: ` and
    contains every string in `parts`."""
    with pytest.raises(exc) as info:
        fn()
    assert type(info.value) is exc, f"raised {type(info.value).__name__}, expected {exc.__name__}"
    msg = str(info.value)
    assert msg.startswith(f"{name}: "), f"message {msg!r} does not start with the argument name {name!r}"
    for p in parts:
        assert p in msg, f"message {msg!r} does not mention {p!r}"


# ---------------------------------------------------------------- router

@pytest.mark.parametrize("call, exc, name, parts", [
    # router_scores: an unknown score name used to give sigmoid scores
    (lambda: reference.router_scores(LOGITS, "relu"), ValueError, "score", ("softmax", "'relu'")),
    # router_scores: the names are case-sensitive ("Softmax" also gave sigmoid scores)
    (lambda: reference.router_scores(LOGITS, "Softmax"), ValueError, "score", ("'Softmax'",)),
    # router_scores: bf16 logits (route widens them; router_scores is documented fp32)
    (lambda: reference.router_scores(LOGITS.bfloat16(), "softmax"), TypeError, "logits_TE", ("torch.float32",)),
    # router_scores: 1-D logits
    (lambda: reference.router_scores(LOGITS[0], "sigmoid"), ValueError, "logits_TE", ("2 dimensions",)),
    # router_forward: fp32 tokens are not rounded to bf16 here, so their logits are not the contract's
    (lambda: reference.router_forward(X.float(), W, K, "softmax", True), TypeError, "x_TH",
     ("torch.bfloat16", "torch.float32")),
    # router_forward: fp16 tokens
    (lambda: reference.router_forward(X.half(), W, K, "softmax", True), TypeError, "x_TH", ("torch.float16",)),
    # router_forward: integer tokens
    (lambda: reference.router_forward(X.long(), W, K, "softmax", True), TypeError, "x_TH", ("torch.int64",)),
    # router_forward: an fp32 gate weight
    (lambda: reference.router_forward(X, W.float(), K, "softmax", True), TypeError, "w_EH", ("torch.float32",)),
    # router_forward: hidden sizes differ (was a raw broadcast RuntimeError)
    (lambda: reference.router_forward(X, W[:, :4], K, "softmax", True), ValueError, "w_EH", ("(4, 8)", "(4, 4)")),
    # router_forward: 1-D tokens (was an unpack ValueError)
    (lambda: reference.router_forward(X[0], W, K, "softmax", True), ValueError, "x_TH", ("2 dimensions", "(8,)")),
    # router_forward: no weight (was an AttributeError)
    (lambda: reference.router_forward(X, None, K, "softmax", True), TypeError, "w_EH", ("torch.Tensor", "NoneType")),
    # router_forward: no tokens
    (lambda: reference.router_forward(None, W, K, "softmax", True), TypeError, "x_TH", ("NoneType",)),
    # gate_logits: fp32 operands, documented bf16
    (lambda: reference.gate_logits(X.float(), W.float()), TypeError, "x_TH", ("torch.bfloat16",)),
    # gate_logits: hidden sizes differ
    (lambda: reference.gate_logits(X, W[:, :1]), ValueError, "w_EH", ("(4, 8)",)),
    # gate_backward: a (1, E) logit gradient is not broadcast over the tokens
    (lambda: reference.gate_backward(X, W, DS[:1]), ValueError, "d_logits_TE", ("(5, 4)", "(1, 4)")),
    # route_backward: a repeated id in a row (the scatter's result was undefined)
    (lambda: reference.route_backward(P, torch.zeros_like(IDX), DW, DS, "softmax", True), ValueError, "topk_idx_TK",
     ("distinct", "row 0")),
    # route_backward: an id past E (was a raw scatter RuntimeError)
    (lambda: reference.route_backward(P, IDX + E, DW, DS, "softmax", True), ValueError, "topk_idx_TK",
     ("[0, 4)", "got 4")),
    # route_backward: a negative id
    (lambda: reference.route_backward(P, IDX - 1, DW, DS, "sigmoid", False), ValueError, "topk_idx_TK", ("got -1",)),
    # route_backward: float ids
    (lambda: reference.route_backward(P, IDX.float(), DW, DS, "softmax", True), TypeError, "topk_idx_TK",
     ("torch.int64",)),
    # route_backward: more ids per row than experts
    (lambda: reference.route_backward(P, torch.arange(5).repeat(T, 1), torch.ones(T, 5), DS, "softmax", True),
     ValueError, "topk_idx_TK", ("K <= E = 4", "K = 5")),
    # route_backward: a (1, E) score gradient is not broadcast over the tokens
    (lambda: reference.route_backward(P, IDX, DW, DS[:1], "softmax", True), ValueError, "d_scores_TE", ("(1, 4)",)),
    # route_backward: a (T, 1) weight gradient is not broadcast over the k picked
    (lambda: reference.route_backward(P, IDX, DW[:, :1], DS, "softmax", True), ValueError, "d_topk_weight_TK",
     ("(5, 2)", "(5, 1)")),
    # route_backward: bf16 scores
    (lambda: reference.route_backward(P.bfloat16(), IDX, DW, DS, "softmax", True), TypeError, "scores_TE",
     ("torch.float32",)),
    # route_backward: ids for other tokens than the scores' (T differs)
    (lambda: reference.route_backward(P, IDX[:3], DW, DS, "softmax", True), ValueError, "topk_idx_TK", ("(5, 2)",)),
    # router_backward: fp32 tokens
    (lambda: reference.router_backward(X.float(), W, P, IDX, DW, None, None, "softmax", True), TypeError, "x_TH",
     ("torch.float32",)),
    # router_backward: a (1, E) logit gradient
    (lambda: reference.router_backward(X, W, P, IDX, None, None, DS[:1], "softmax", True), ValueError,
     "d_logits_TE", ("(1, 4)",)),
    # router_backward: scores of another T
    (lambda: reference.router_backward(X, W, P[:2], IDX, None, None, None, "softmax", True), ValueError, "scores_TE",
     ("(5, 4)",)),
    # router_backward: ids given as a list
    (lambda: reference.router_backward(X, W, P, IDX.tolist(), None, None, None, "softmax", True), TypeError,
     "topk_idx_TK", ("torch.Tensor",)),
])
def test_router_bad_args(call, exc, name, parts):
    assert_raises(exc, call, name, *parts)


def test_router_good_args_still_work():
    """The checks refuse nothing the router's own outputs feed back: forward, then backward from them."""
    tw, idx, p, logits = reference.router_forward(X, W, K, "softmax", True)
    assert torch.equal(logits, reference.gate_logits(X, W))
    d_x, d_w = reference.router_backward(X, W, p, idx, DW, DS, DS, "softmax", True)
    assert d_x.dtype == B16 and d_w.shape == (E, H)
    empty = reference.router_forward(X[:0], W, K, "sigmoid", False)  # T = 0 stays accepted
    assert empty[0].shape == (0, K)


# ---------------------------------------------------------------- primitives

A23 = torch.ones(2, 3, dtype=B16)


@pytest.mark.parametrize("call, exc, name, parts", [
    # tree_sum: a dim past the last one (returned the input's sum over dim 5 % 1 = 0)
    (lambda: reference.tree_sum(torch.ones(3), 5), ValueError, "dim", ("[-1, 1)", "got 5")),
    # tree_sum: a negative dim below -p.dim() (summed dim -7 % 2 = 1)
    (lambda: reference.tree_sum(torch.ones(2, 3), -7), ValueError, "dim", ("[-2, 2)", "(2, 3)", "got -7")),
    # tree_sum: a 0-d tensor (was a ZeroDivisionError)
    (lambda: reference.tree_sum(torch.tensor(1.0), 0), ValueError, "p", ("0-d",)),
    # tree_sum: a float dim
    (lambda: reference.tree_sum(torch.ones(3), 0.0), TypeError, "dim", ("an int", "0.0")),
    # tree_sum: a bool dim is not an axis
    (lambda: reference.tree_sum(torch.ones(3), False), TypeError, "dim", ("False",)),
    # tree_sum: not a tensor
    (lambda: reference.tree_sum([1.0, 2.0], 0), TypeError, "p", ("torch.Tensor", "list")),
    # matmul_exact: b's D of 1 was broadcast against a's 3
    (lambda: reference.matmul_exact(A23, torch.ones(4, 1, dtype=B16)), ValueError, "b_ND", ("(N, 3)", "(4, 1)")),
    # matmul_exact: fp32 a, documented bf16 (its products would not be exact)
    (lambda: reference.matmul_exact(A23.float(), torch.ones(4, 3, dtype=B16)), TypeError, "a_MD",
     ("torch.bfloat16", "torch.float32")),
    # matmul_exact: fp32 b
    (lambda: reference.matmul_exact(A23, torch.ones(4, 3)), TypeError, "b_ND", ("torch.float32",)),
    # matmul_exact: a 1-D a
    (lambda: reference.matmul_exact(A23[0], A23), ValueError, "a_MD", ("2 dimensions",)),
    # matmul_exact: b on another device than a (meta stands in for a GPU)
    (lambda: reference.matmul_exact(A23, A23.to("meta")), ValueError, "b_ND", ("device cpu", "the device of a_MD")),
    # rows_outer_sum: R of 1 against 2 was broadcast
    (lambda: reference.rows_outer_sum(A23, torch.ones(1, 5, dtype=B16)), ValueError, "b_RN", ("(2, N)", "(1, 5)")),
    # rows_outer_sum: fp32 a
    (lambda: reference.rows_outer_sum(A23.float(), A23), TypeError, "a_RM", ("torch.bfloat16",)),
    # rowwise_dot: H of 1 against 3 was broadcast
    (lambda: reference.rowwise_dot(A23, torch.ones(2, 4, 1, dtype=B16)), ValueError, "b_TKH",
     ("(2, K, 3)", "(2, 4, 1)")),
    # rowwise_dot: T differs
    (lambda: reference.rowwise_dot(A23, torch.ones(1, 4, 3, dtype=B16)), ValueError, "b_TKH", ("(1, 4, 3)",)),
    # rowwise_dot: a 2-D b
    (lambda: reference.rowwise_dot(A23, A23), ValueError, "b_TKH", ("3 dimensions",)),
    # rowwise_dot: fp32 b
    (lambda: reference.rowwise_dot(A23, torch.ones(2, 4, 3)), TypeError, "b_TKH", ("torch.float32",)),
    # log_exact_ge1: fp64 input (its bits were read as twice as many fp32 values)
    (lambda: reference.log_exact_ge1(torch.tensor([2.0], dtype=torch.float64)), TypeError, "x", ("torch.float64",)),
    # log_exact_ge1: bf16 input
    (lambda: reference.log_exact_ge1(torch.tensor([2.0], dtype=B16)), TypeError, "x", ("torch.bfloat16",)),
    # log_exact_ge1: not a tensor
    (lambda: reference.log_exact_ge1(2.0), TypeError, "x", ("torch.Tensor", "float")),
    # exp_exact: fp64 input (mixed fp64/fp32 arithmetic, not the contract's bits)
    (lambda: reference.exp_exact(torch.zeros(3, dtype=torch.float64)), TypeError, "x", ("torch.float64",)),
    # exp_exact: integer input
    (lambda: reference.exp_exact(torch.arange(3)), TypeError, "x", ("torch.int64",)),
    # sigmoid_exact: bf16 input
    (lambda: reference.sigmoid_exact(torch.zeros(3, dtype=B16)), TypeError, "x", ("torch.bfloat16",)),
    # silu_exact: bf16 input, named by its own argument
    (lambda: reference.silu_exact(torch.zeros(3, dtype=B16)), TypeError, "g", ("torch.bfloat16",)),
    # dsilu_exact: fp16 input
    (lambda: reference.dsilu_exact(torch.zeros(3, dtype=torch.float16)), TypeError, "g", ("torch.float16",)),
])
def test_primitive_bad_args(call, exc, name, parts):
    assert_raises(exc, call, name, *parts)


# ---------------------------------------------------------------- argument checks

@pytest.mark.parametrize("call, exc, name, parts", [
    # check_ep_split: no experts (returned L = 0)
    (lambda: reference.check_ep_split(0, 1), ValueError, "num_experts", ("E >= 1", "E = 0")),
    # check_ep_split: a negative E divisible by W (returned L = -2)
    (lambda: reference.check_ep_split(-4, 2), ValueError, "num_experts", ("E = -4",)),
    # check_ep_split: a float E (returned L = 2.0)
    (lambda: reference.check_ep_split(4.0, 2), TypeError, "num_experts", ("an int", "4.0")),
    # check_ep_split: the caller's name for E is used
    (lambda: reference.check_ep_split(4.0, 2, "routed_gate"), TypeError, "routed_gate", ("4.0",)),
    # check_ep_split: W None
    (lambda: reference.check_ep_split(4, None), TypeError, "world_size", ("None",)),
    # check_ep_split: a float W
    (lambda: reference.check_ep_split(4, 2.0), TypeError, "world_size", ("2.0",)),
    # check_expert_ids: float ids (0.5 passed as in range)
    (lambda: reference.check_expert_ids(torch.tensor([[0.5, 1.5]]), 4), TypeError, "topk_idx", ("torch.int64",)),
    # check_expert_ids: 1-D ids (was an IndexError)
    (lambda: reference.check_expert_ids(torch.tensor([0, 0]), 4), ValueError, "topk_idx", ("2 dimensions",)),
    # check_expert_ids: the caller's name for the ids is used
    (lambda: reference.check_expert_ids(torch.tensor([0, 1]), 4, name="ids"), ValueError, "ids", ("2 dimensions",)),
    # check_expert_ids: no experts
    (lambda: reference.check_expert_ids(IDX, 0), ValueError, "num_experts", ("E = 0",)),
    # check_expert_ids: a float expert count
    (lambda: reference.check_expert_ids(IDX, 4.0), TypeError, "num_experts", ("4.0",)),
])
def test_check_helpers_bad_args(call, exc, name, parts):
    assert_raises(exc, call, name, *parts)


def test_check_helpers_good_args():
    assert reference.check_ep_split(8, 2) == 4
    reference.check_expert_ids(IDX, E)
    reference.check_expert_ids(IDX[:0], E)  # no tokens: nothing to read


# ---------------------------------------------------------------- load_context

def _layer():
    from mok.testing.cases import LAYER_ARGS, MoEConfig, make_inputs

    inp = make_inputs(MoEConfig(T=6, H=8, I=4, E=4, K=2, S=4), seed=0)
    y, ctx = reference.forward(*(inp[a] for a in LAYER_ARGS))
    shared = tuple(inp[a] for a in LAYER_ARGS[3:6])
    routed = tuple(inp[a] for a in LAYER_ARGS[6:])
    return inp, reference.save_context(ctx), shared, routed


@pytest.mark.parametrize("case, exc, name, parts", [
    ("saved None", TypeError, "saved", ("NoneType",)),                     # not a list
    ("saved short", ValueError, "saved", ("9 tensors", "got 5")),          # a list cut short
    ("shared pair", ValueError, "shared", ("3 tensors",)),                 # shared as (gate, up)
    ("routed None", ValueError, "routed", ("3 tensors", "None")),          # routed missing
    ("other T", ValueError, "saved", ("(T, K, H) = (3, 2, 8)", "(6, 2, 8)")),  # the context of another batch
    ("rows per expert", ValueError, "saved", ("rows per expert [13, 0, 0, 0]",)),  # counts not the saved rows'
])
def test_load_context_bad_args(case, exc, name, parts):
    inp, saved, shared, routed = _layer()
    x, idx, tw = inp["x"], inp["topk_idx"], inp["topk_weight"]
    args = {
        "saved None": (None, x, idx, tw, shared, routed),
        "saved short": (saved[:5], x, idx, tw, shared, routed),
        "shared pair": (saved, x, idx, tw, shared[:2], routed),
        "routed None": (saved, x, idx, tw, shared, None),
        "other T": (saved, x[:3], idx[:3], tw[:3], shared, routed),
        "rows per expert": (saved[:5] + [torch.tensor([13, 0, 0, 0])] + saved[6:], x, idx, tw, shared, routed),
    }[case]
    assert_raises(exc, lambda: reference.load_context(*args), name, *parts)

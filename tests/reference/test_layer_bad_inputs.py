"""docs/bad_input.md: every bad input raises, naming the argument, the expected and the actual value."""

import pytest
import torch

from mok import reference
from mok.testing.cases import LAYER_ARGS, MoEConfig, make_inputs
from mok.reference import check_ep_split
from mok.testing.runner import shard_inputs

CFG = MoEConfig(T=6, H=8, I=4, E=4, K=2, S=4)


@pytest.fixture
def inputs():
    return make_inputs(CFG, seed=0)


def forward(inputs):
    return reference.forward(*(inputs[a] for a in LAYER_ARGS))


def assert_raises(exc, fn, *parts):
    """fn() raises `exc` whose message contains every string in `parts` (argument, expected, actual)."""
    with pytest.raises(exc) as info:
        fn()
    msg = str(info.value)
    for p in parts:
        assert p in msg, f"message {msg!r} does not mention {p!r}"


# ---------------------------------------------------------------- dtypes

@pytest.mark.parametrize("name, bad", [
    ("x", torch.float32),            # activations in fp32 instead of bf16
    ("x", torch.float16),            # the other 16-bit float
    ("topk_idx", torch.int32),       # ids as int32
    ("topk_weight", torch.bfloat16), # weights in bf16 instead of fp32
    ("topk_weight", torch.float64),  # weights in fp64
    ("shared_gate", torch.float32),  # each of the six weights named on its own: shared gate in fp32
    ("shared_up", torch.float32),    # shared up in fp32
    ("shared_down", torch.float32),  # shared down in fp32
    ("routed_gate", torch.float32),  # routed gate in fp32
    ("routed_up", torch.float16),    # routed up in fp16: the wrong 16-bit float
    ("routed_down", torch.float32),  # routed down in fp32
])
def test_wrong_dtype(inputs, name, bad):
    good = inputs[name].dtype
    inputs[name] = inputs[name].to(bad)
    assert_raises(TypeError, lambda: forward(inputs), name, str(good), str(bad))


@pytest.mark.parametrize("name", ["x", "topk_idx", "topk_weight", "routed_gate", "shared_down"])  # each kind of argument
def test_not_a_tensor(inputs, name):
    inputs[name] = inputs[name].tolist()
    assert_raises(TypeError, lambda: forward(inputs), name, "torch.Tensor", "list")


# ---------------------------------------------------------------- shapes

@pytest.mark.parametrize("name, make_bad, expected, actual", [
    # x with a batch dimension
    ("x", lambda t: t[None], "2 dimensions", "(1, 6, 8)"),
    # topk_idx for a different T
    ("topk_idx", lambda t: t[:5], "(6, 2)", "(5, 2)"),
    # topk_weight with a different K than topk_idx
    ("topk_weight", lambda t: torch.cat([t, t[:, :1]], 1), "(6, 2)", "(6, 3)"),
    # topk_idx 1-D
    ("topk_idx", lambda t: t[:, 0], "2 dimensions", "(6,)"),
    # routed_gate with the wrong H
    ("routed_gate", lambda t: t[:, :, :7], "(L, I, 8)", "(4, 4, 7)"),
    # routed_up with a different I than routed_gate
    ("routed_up", lambda t: t[:, :3], "(4, 4, 8)", "(4, 3, 8)"),
    # routed_up with fewer experts than routed_gate
    ("routed_up", lambda t: t[:3], "(4, 4, 8)", "(3, 4, 8)"),
    # routed_down given as [L, I, H] (transposed)
    ("routed_down", lambda t: t.transpose(1, 2), "(4, 8, 4)", "(4, 4, 8)"),
    # routed_gate 2-D (one expert without its L axis)
    ("routed_gate", lambda t: t[0], "3 dimensions", "(4, 8)"),
    # no experts at all: L = 0
    ("routed_gate", lambda t: t[:0], "L >= 1", "(0, 4, 8)"),
    # I = 0
    ("routed_gate", lambda t: t[:, :0], "I >= 1", "(4, 0, 8)"),
    # shared_gate with the wrong H
    ("shared_gate", lambda t: t[:, :7], "(4, 8)", "(4, 7)"),
    # shared_up with a different S than shared_gate
    ("shared_up", lambda t: t[:3], "(4, 8)", "(3, 8)"),
    # shared_down given as [S, H] (transposed)
    ("shared_down", lambda t: t.t(), "(8, 4)", "(4, 8)"),
])
def test_wrong_shape(inputs, name, make_bad, expected, actual):
    inputs[name] = make_bad(inputs[name])
    assert_raises(ValueError, lambda: forward(inputs), name, expected, actual)


def test_shared_down_transposed_square_is_not_an_error():
    """Control for the row above: shapes are all the check can see (S = H is legal)."""
    inp = make_inputs(MoEConfig(T=3, H=4, I=2, E=2, K=1, S=4), seed=0)
    forward(inp)  # does not raise


@pytest.mark.parametrize("K, E, actual", [
    (0, 4, "K = 0"),  # no expert per token
    (3, 2, "K = 3"),  # more experts per token than exist
])
def test_k_out_of_range(K, E, actual):
    inp = make_inputs(MoEConfig(T=4, H=8, I=4, E=E, K=min(max(K, 1), E)), seed=0)
    idx = torch.arange(K).repeat(4, 1) % E
    inp["topk_idx"], inp["topk_weight"] = idx, torch.full((4, K), 0.5)
    assert_raises(ValueError, lambda: forward(inp), "topk_idx", f"K <= E = {E}", actual)


def test_x_with_no_features():
    inp = make_inputs(MoEConfig(T=3, H=1, I=2, E=2, K=1), seed=0)
    inp["x"] = inp["x"][:, :0]
    inp["routed_gate"], inp["routed_up"] = inp["routed_gate"][..., :0], inp["routed_up"][..., :0]
    inp["routed_down"] = inp["routed_down"][:, :0]
    assert_raises(ValueError, lambda: forward(inp), "x", "H >= 1", "(3, 0)")


# ---------------------------------------------------------------- devices

def _meta_ok():
    try:
        torch.empty(1, device="meta")
        return True
    except Exception:
        return False


@pytest.mark.skipif(not _meta_ok(), reason="no meta device to stand in for a second device")
@pytest.mark.parametrize("name", [
    "topk_idx", "topk_weight",                       # routing on another device than x
    "routed_gate", "routed_up", "routed_down",       # an expert weight elsewhere
    "shared_gate", "shared_up", "shared_down",       # a shared weight elsewhere
])
def test_mismatched_device(inputs, name):
    inputs[name] = inputs[name].to("meta")
    assert_raises(ValueError, lambda: forward(inputs), name, "expected device cpu", "got meta")


def test_meta_tensors_are_a_clear_error():
    """The reference reads expert ids: meta tensors (no data) are refused up front, naming x."""
    inp = make_inputs(CFG, seed=0, device="meta")
    assert_raises(ValueError, lambda: forward(inp), "x", "tensor with data", "got device meta", "mok.nn.ops.moe")


def test_ops_moe_gives_shapes_on_meta():
    """The alternative the message names: the custom op's fake implementation gives shapes only."""
    from mok.nn import ops

    inp = make_inputs(CFG, seed=0, device="meta")
    y = ops.moe(*(inp[a] for a in LAYER_ARGS))
    assert y.device.type == "meta" and y.shape == (CFG.T, CFG.H) and y.dtype == torch.bfloat16


# ---------------------------------------------------------------- expert ids

@pytest.mark.parametrize("value, expected, actual", [
    (4, "[0, 4)", "got 4 at index (2, 1)"),     # id = E, one past the end
    (99, "[0, 4)", "got 99 at index (2, 1)"),   # far out of range
    (-1, "[0, 4)", "got -1 at index (2, 1)"),   # negative id
])
def test_expert_id_out_of_range(inputs, value, expected, actual):
    inputs["topk_idx"][2, 1] = value
    assert_raises(ValueError, lambda: forward(inputs), "topk_idx", expected, actual)


def test_duplicate_ids_in_a_row(inputs):
    inputs["topk_idx"][3] = torch.tensor([1, 1])
    assert_raises(ValueError, lambda: forward(inputs), "topk_idx", "distinct", "[1, 1] in row 3")


def test_duplicate_ids_unsorted_row():
    """Duplicates that are not adjacent in the row are found too."""
    inp = make_inputs(MoEConfig(T=4, H=8, I=4, E=4, K=3), seed=0)
    inp["topk_idx"][1] = torch.tensor([2, 0, 2])
    assert_raises(ValueError, lambda: forward(inp), "topk_idx", "distinct", "[2, 0, 2] in row 1")


# ---------------------------------------------------------------- shared expert given in part

@pytest.mark.parametrize("missing, named", [
    (("shared_up", "shared_down"), "shared_up"),    # only shared_gate
    (("shared_gate",), "shared_gate"),              # gate missing
    (("shared_down",), "shared_down"),              # down missing
    (("shared_gate", "shared_up"), "shared_gate"),  # only shared_down
])
def test_shared_expert_given_in_part(inputs, missing, named):
    for m in missing:
        inputs[m] = None
    assert_raises(ValueError, lambda: forward(inputs), named, "expected a tensor", "got None")


# ---------------------------------------------------------------- backward's dy

@pytest.mark.parametrize("make_bad, exc, parts", [
    (lambda dy: dy.float(), TypeError, ("dy", "torch.bfloat16", "torch.float32")),  # fp32 gradient
    (lambda dy: dy[:5], ValueError, ("dy", "(6, 8)", "(5, 8)")),                    # fewer tokens
    (lambda dy: dy[:, :7], ValueError, ("dy", "(6, 8)", "(6, 7)")),                 # wrong H
    (lambda dy: dy[None], ValueError, ("dy", "2 dimensions", "(1, 6, 8)")),          # extra dimension
    (lambda dy: dy.to("meta"), ValueError, ("dy", "expected device cpu", "meta")),  # another device
])
def test_bad_dy(inputs, make_bad, exc, parts):
    _, ctx = forward(inputs)
    assert_raises(exc, lambda: reference.backward(ctx, make_bad(inputs["dy"])), *parts)


@pytest.mark.parametrize("ctx", [
    None,    # no ctx at all
    "ctx",   # a str, not the Ctx object
    (1, 2),  # a tuple, like forward's (y, ctx) passed whole
])
def test_backward_without_a_ctx(inputs, ctx):
    assert_raises(TypeError, lambda: reference.backward(ctx, inputs["dy"]), "ctx", "Ctx returned by",
                  type(ctx).__name__)


# ---------------------------------------------------------------- group

@pytest.mark.parametrize("group, actual", [
    ("abc", "str 'abc'"),          # a group name instead of the group
    (object(), "object"),          # anything else
    (2, "int 2"),                  # a world size
])
def test_group_not_a_process_group(inputs, group, actual):
    assert_raises(TypeError, lambda: reference.forward(*(inputs[a] for a in LAYER_ARGS), group=group),
                  "group", "ProcessGroup or None", actual)
    assert_raises(TypeError, lambda: reference.moe(*(inputs[a] for a in LAYER_ARGS), group=group),
                  "group", "ProcessGroup or None", actual)


# ---------------------------------------------------------------- route

LOGITS = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("kwargs, exc, parts", [
    (dict(k=0), ValueError, ("k", "[1, E = 4]", "0")),                      # k below 1
    (dict(k=5), ValueError, ("k", "[1, E = 4]", "5")),                      # k above E
    (dict(k=2.0), TypeError, ("k", "an int", "2.0")),                       # float k: a wrong type
    (dict(k=True), TypeError, ("k", "an int", "True")),                     # bool is not an int here
    (dict(k=2, score="relu"), ValueError, ("score", "softmax", "'relu'")),  # unknown score
    (dict(logits=LOGITS.double(), k=2), TypeError, ("logits", "torch.float32", "torch.float64")),  # fp64 logits
    (dict(logits=LOGITS.long(), k=2), TypeError, ("logits", "torch.float32", "torch.int64")),      # integer logits
    (dict(logits=LOGITS[0], k=2), ValueError, ("logits", "2 dimensions", "(4,)")),                 # 1-D logits
    (dict(logits=LOGITS.tolist(), k=2), TypeError, ("logits", "torch.Tensor", "list")),            # not a tensor
    (dict(k=2, normalize="no"), TypeError, ("normalize", "a bool", "'no'")),  # a truthy string
    (dict(k=2, normalize=1), TypeError, ("normalize", "a bool", "1")),        # an int
])
def test_route_bad_args(kwargs, exc, parts):
    kwargs = {"logits": LOGITS, **kwargs}
    assert_raises(exc, lambda: reference.route(**kwargs), *parts)


@pytest.mark.parametrize("k, score, normalize, exc, parts", [
    (2, "softmax", "no", TypeError, ("normalize", "a bool", "'no'")),  # a truthy string for normalize
    (2, "sigmoid", None, TypeError, ("normalize", "a bool", "None")),  # None for normalize, with sigmoid scores
    (2, "relu", True, ValueError, ("score", "softmax", "'relu'")),     # unknown score
    (0, "softmax", True, ValueError, ("k", "[1, E = 4]", "0")),        # k below 1: router_forward only
])
def test_router_forward_and_backward_flags(k, score, normalize, exc, parts):
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(5, 8, generator=g).bfloat16(), torch.randn(4, 8, generator=g).bfloat16()
    assert_raises(exc, lambda: reference.router_forward(x, w, k, score, normalize), *parts)
    if k >= 1:
        p = torch.rand(5, 4, generator=g)
        idx = torch.arange(2).repeat(5, 1)
        assert_raises(exc, lambda: reference.route_backward(p, idx, torch.ones(5, 2), torch.zeros(5, 4), score,
                                                            normalize), *parts)


# ---------------------------------------------------------------- expert parallelism

@pytest.mark.parametrize("E, W", [
    (8, 3),  # 8 experts over 3 ranks
    (4, 8),  # more ranks than experts
])
def test_experts_not_divisible_by_world(E, W):
    inp = make_inputs(MoEConfig(T=24, H=8, I=4, E=E, K=1), seed=0)
    assert_raises(ValueError, lambda: shard_inputs(inp, 0, W), "num_experts", f"W = {W}", f"E = {E}")
    assert_raises(ValueError, lambda: check_ep_split(E, W, "routed_gate"), "routed_gate", f"W = {W}", f"E = {E}")


def test_world_size_below_one():
    assert_raises(ValueError, lambda: check_ep_split(4, 0), "world size >= 1", "got 0")


def test_tokens_not_divisible_by_world():
    inp = make_inputs(MoEConfig(T=6, H=8, I=4, E=4, K=1), seed=0)
    assert_raises(ValueError, lambda: shard_inputs(inp, 0, 4), "x", "divisible by W = 4", "got 6")

"""The integrations' shared dtype rule for a router's outputs (mok.nn.routing_inputs): what widens exactly passes,
everything else raises TypeError naming the argument."""
import pytest
import torch

from mok.nn.routing_inputs import ACTIVATION_DTYPES, ID_DTYPES, WEIGHT_DTYPES, check_routing_dtypes


def _args(x_dtype=torch.bfloat16, ids_dtype=torch.int64, w_dtype=torch.float32):
    return (("x", torch.zeros(2, 4, dtype=x_dtype)), ("ids", torch.zeros(2, 2, dtype=ids_dtype)),
            ("w", torch.zeros(2, 2, dtype=w_dtype)))


def test_every_exact_dtype_passes():
    for d in ACTIVATION_DTYPES:
        check_routing_dtypes(*_args(x_dtype=d))
    for d in ID_DTYPES:
        check_routing_dtypes(*_args(ids_dtype=d))
    for d in WEIGHT_DTYPES:
        check_routing_dtypes(*_args(w_dtype=d))


@pytest.mark.parametrize("change, starts", [
    (dict(x_dtype=torch.float64), "x: expected dtype torch.float32 or torch.bfloat16"),
    (dict(x_dtype=torch.float16), "x: expected dtype torch.float32 or torch.bfloat16"),
    (dict(ids_dtype=torch.float32), "ids: expected integer expert ids"),
    (dict(ids_dtype=torch.bool), "ids: expected integer expert ids"),
    (dict(ids_dtype=torch.uint64), "ids: expected integer expert ids"),
    (dict(w_dtype=torch.float64), "w: expected floating routing weights"),
    (dict(w_dtype=torch.int64), "w: expected floating routing weights"),
])
def test_inexact_dtypes_raise_naming_the_argument(change, starts):
    with pytest.raises(TypeError, match="^" + starts):
        check_routing_dtypes(*_args(**change))


def test_a_non_tensor_raises_naming_the_argument():
    x, ids, w = _args()
    with pytest.raises(TypeError, match="^ids: expected a torch.Tensor, got list"):
        check_routing_dtypes(x, ("ids", [[0, 1]]), w)

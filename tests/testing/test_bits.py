"""mok.testing.bits, the comparator every determinism test and tool relies on: what counts as a difference (raw bits,
NaN equal to NaN, +0 unequal to -0), the first mismatch it reports, and its ULP distance."""
import pytest
import torch

from mok.testing.bits import assert_bitwise_equal, bit_diff

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("dtype", [
    torch.float8_e4m3fn,  # the FP8 recipe's quantised values (inf converts to 448 on the CPU: still a difference)
    torch.bfloat16,  # the layer's outputs
    torch.float32,  # weight gradients, fp32 scratch
    torch.float64,  # the 64-bit path of the ULP order
])
@pytest.mark.parametrize("a, b, n_diff, first", [
    ([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], 0, None),  # identical
    ([1.0, NAN, 3.0], [1.0, NAN, 3.0], 0, None),  # NaN matches NaN
    ([1.0, 2.0, 0.0], [1.0, 2.0, -0.0], 1, (2,)),  # +0 against -0: equal as numbers, not as bits
    ([1.0, NAN, 3.0], [1.0, 2.0, 3.0], 1, (1,)),  # NaN against a number
    ([INF, 1.0, 3.0], [-INF, 1.0, 3.0], 1, (0,)),  # inf against -inf
    ([1.0, 5.0, 7.0], [1.0, 2.0, 3.0], 2, (1,)),  # two differ: the first is reported
])
def test_bit_diff_counts_raw_bit_mismatches(dtype, a, b, n_diff, first):
    d = bit_diff(torch.tensor(a, dtype=dtype), torch.tensor(b, dtype=dtype))
    assert (d.n_diff, d.first_index) == (n_diff, first), d


def test_first_index_is_the_row_major_first_of_a_2d_tensor():
    want = torch.zeros(3, 4)
    got = want.clone()
    got[2, 1] = 1.0
    got[1, 3] = -1.0  # earlier in row-major order than [2, 1]
    d = bit_diff(got, want)
    assert (d.n_diff, d.first_index, d.first_values) == (2, (1, 3), (-1.0, 0.0)), d


@pytest.mark.parametrize("dtype, ulps", [
    (torch.float8_e4m3fn, 3),  # 8-bit order
    (torch.bfloat16, 3),  # 16-bit order
    (torch.float32, 3),  # 32-bit order
    (torch.float64, 3),  # 64-bit order
])
def test_max_ulp_counts_representable_steps_across_zero(dtype, ulps):
    info = torch.finfo(dtype)
    tiny = torch.tensor(info.smallest_normal, dtype=torch.float64) * info.eps  # the smallest subnormal
    want = torch.tensor([-tiny], dtype=dtype)  # one step below -0
    got = torch.tensor([2 * tiny], dtype=dtype)  # two steps above +0 (+0 and -0 sit at the same place)
    assert bit_diff(got, want).max_ulp == ulps


@pytest.mark.parametrize("got, want", [
    (torch.zeros(3), torch.zeros(4)),  # shape
    (torch.zeros(3), torch.zeros(3, dtype=torch.float64)),  # dtype
])
def test_shape_or_dtype_mismatch_is_a_difference(got, want):
    assert bit_diff(got, want).n_diff == -1
    with pytest.raises(AssertionError, match="^out: dtype/shape differ"):
        assert_bitwise_equal(got, want, "out")


def test_assert_bitwise_equal_reports_count_and_first_mismatch():
    want = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.bfloat16)
    got = want.clone()
    got[2] = NAN
    got[3] = 5.0
    with pytest.raises(AssertionError, match=r"^y: 2 of 4 elements differ .*first at index \(2,\): nan vs 3\.0$"):
        assert_bitwise_equal(got, want, "y")
    assert_bitwise_equal(want.clone(), want, "y")  # equal: no exception


def test_integer_tensors_compare_as_they_are():
    idx = torch.tensor([[0, 3], [2, 1]])
    assert bit_diff(idx.clone(), idx).n_diff == 0
    other = idx.clone()
    other[1, 0] = 7
    d = bit_diff(other, idx)
    assert (d.n_diff, d.first_index) == (1, (1, 0)), d

"""The finiteness checks every fit runs (numerics.checks)."""

from __future__ import annotations

import pytest
import torch

from xrfm_torch.numerics.checks import all_finite, check_all_finite


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_all_finite_agrees_with_isfinite(dtype):
    g = torch.Generator().manual_seed(0)
    big = torch.finfo(dtype).max
    for bad in [None, float("inf"), -float("inf"), float("nan")]:
        for at in [0, 7, 63]:
            x = torch.randn(8, 8, generator=g).to(dtype)
            x[1, 1] = big  # the largest finite value: x - x is still 0
            x[2, 2] = torch.finfo(dtype).tiny / 4  # a subnormal
            if bad is not None:
                x.view(-1)[at] = bad
            assert bool(all_finite(x)) is bool(x.isfinite().all()) is (bad is None)
    assert bool(all_finite(torch.empty(0, 3, dtype=dtype)))


def test_integer_and_bool_tensors_are_finite():
    assert bool(all_finite(torch.tensor([[1, -(2**62)], [0, 3]])))
    assert bool(all_finite(torch.tensor([True, False])))
    z = torch.tensor([1 + 2j, complex(float("inf"), 0)])
    assert bool(all_finite(z[:1])) and not bool(all_finite(z))


def test_check_all_finite_names_the_first_offending_tensor_and_entry():
    a, b, c = torch.zeros(3, 2), torch.zeros(4, 2), torch.zeros(5)
    b[2, 1] = float("inf")
    c[1] = float("nan")
    with pytest.raises(
        ValueError, match=r"^b contains 1 non-finite value\(s\), first at index \(2, 1\)"
    ):
        check_all_finite([(a, "a", False), (b, "b", False), (c, "c", False)])
    b[2, 1] = float("nan")  # a NaN where NaN is allowed (a missing cell) passes
    with pytest.raises(
        ValueError, match=r"^c contains 1 non-finite value\(s\), first at index \(1,\)"
    ):
        check_all_finite([(a, "a", False), (b, "b", True), (c, "c", False)])
    check_all_finite([(a, "a", False), (b, "b", True)])

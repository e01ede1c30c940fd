"""The order-preserving key (keys.py) on CPU, through its torch twin, and the packed-sort reference."""
import math

import pytest
import torch

from tilefly.ops.topk.keys import order_key_torch, reference_topk, threshold_value_torch

ORDERED = [-math.inf, -3.0e38, -1.5, -1.0, -1e-40, -0.0, 0.0, 1e-40, 1.0, 1.5, 3.0e38, math.inf]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_keys_follow_float_order_and_zeros_tie(dtype):
    x = torch.tensor(ORDERED, dtype=torch.float32).to(dtype)
    finite_order = torch.argsort(x.float(), stable=True)
    assert torch.equal(finite_order, torch.arange(len(ORDERED)))  # the list really is ascending
    key = order_key_torch(x, largest=True)
    diffs = key[1:] - key[:-1]
    tie = [i for i, d in enumerate(diffs.tolist()) if d == 0]
    # -0.0 and +0.0 tie; in 16-bit types the tiny and huge values also round onto their neighbours
    assert all(d >= 0 for d in diffs.tolist())
    assert ORDERED.index(-0.0) in tie
    assert all(x[i] == x[i + 1] for i in tie), "only equal values may share a key"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_smallest_keys_reverse_the_order(dtype):
    x = torch.tensor(ORDERED, dtype=torch.float32).to(dtype)
    assert torch.equal(order_key_torch(x, largest=False), ~order_key_torch(x, largest=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_every_nan_is_the_largest_value_in_both_directions(dtype):
    bits = {torch.float32: [0x7FC00000, 0xFFC00000, 0x7F800001], torch.float16: [0x7E00, 0xFE00, 0x7C01],
            torch.bfloat16: [0x7FC0, 0xFFC0, 0x7F81]}[dtype]
    same_width = torch.int32 if dtype == torch.float32 else torch.int16
    nans = torch.tensor(bits, dtype=torch.int64).to(same_width).view(dtype)  # the cast wraps, keeping the bits
    assert torch.isnan(nans).all()
    others = torch.tensor([-math.inf, 0.0, math.inf], dtype=dtype)
    big = order_key_torch(nans, largest=True)
    assert (big == big[0]).all() and big[0] > order_key_torch(others, largest=True).max()
    small = order_key_torch(nans, largest=False)
    assert (small == small[0]).all() and small[0] < order_key_torch(others, largest=False).min()
    assert small[0] > -(2**31), "NaN must stay above the padding key INT32_MIN"


def test_keys_of_random_values_sort_like_the_values():
    x = torch.randn(5000, generator=torch.Generator().manual_seed(1)) * 100
    assert torch.equal(torch.argsort(order_key_torch(x), stable=True), torch.argsort(x, stable=True))


@pytest.mark.parametrize("largest", [True, False])
def test_reference_agrees_with_torch_topk_on_cpu(largest):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 300, generator=g)
    x[:, ::17] = float("nan")
    values, indices = reference_topk(x, 20, largest)
    aten = torch.topk(x, 20, largest=largest)
    assert torch.allclose(values, aten.values, equal_nan=True, rtol=0, atol=0)
    assert torch.equal(x.gather(1, indices).view(torch.int32), values.view(torch.int32))


def test_reference_breaks_ties_by_smaller_index():
    x = torch.tensor([[1.0, 3.0, 1.0, 3.0, 2.0, 3.0]])
    values, indices = reference_topk(x, 4)
    assert indices.tolist() == [[1, 3, 5, 4]]
    values, indices = reference_topk(x, 3, largest=False)
    assert indices.tolist() == [[0, 2, 4]]


@pytest.mark.parametrize("largest", [True, False])
def test_threshold_value_turns_a_key_test_into_one_float_compare(largest):
    # the sieve and bitmask kernels test "key(x) >= tau" as ~(x < t) (largest) or x <= t; exact for
    # every non-NaN x, a superset (+Inf and NaN) for the NaN key with largest, and for the NaN key
    # without largest every non-NaN x (the kernels then check that at least k passed)
    g = torch.Generator().manual_seed(3)
    x = torch.cat([torch.tensor(ORDERED + [math.nan, 5e-45, -5e-45]), torch.randn(300, generator=g) * 10])
    keys = order_key_torch(x, largest)
    for tau in keys.unique().tolist():
        t = threshold_value_torch(tau, largest)
        hit = ~(x < t) if largest else x <= t
        want = keys >= tau
        nan = torch.isnan(x)
        if tau == int(order_key_torch(torch.tensor([math.nan]), largest)):
            assert (hit | ~want).all() if largest else torch.equal(hit, ~nan)
        else:
            assert torch.equal(hit[~nan], want[~nan]), (tau, t)
            assert torch.equal(hit[nan], want[nan])

"""Order-preserving integer keys for top-k, as Triton helpers and their torch twin.

Every top-k kernel compares integers, never floats: a value ``x`` becomes a
signed 32-bit *key* whose integer order is the order top-k selects by, and a
key plus the element's column becomes one distinct signed 64-bit *packed* word:

    key    = bits(x) ^ (sign & magnitude_mask) - sign      sign = bits(x) >> 31 (0 or -1)
    key    = ~key                                           when largest=False
    key    = NAN_KEY                                        when x is NaN
    packed = key << 32 | (0x7FFFFFFF - column)

- Non-negative floats keep their bit pattern; negative ones get their magnitude
  bits flipped, so integer order is float order. The ``- sign`` lifts negatives
  by one, which makes -0.0 and +0.0 the same key: they tie and fall back to the
  column order, as ATen's CPU kernel and ``==`` treat them.
- NaN sorts above +Inf for ``largest=True`` (ATen counts NaN as the largest
  value) and, as the largest value, last for ``largest=False``. Every NaN gets
  the same key, so NaNs tie and the smaller column wins; the value written out
  is re-read from the input, so NaN payloads survive.
- 16-bit floats are sign-extended to 32 bits first; the same formula with a
  15-bit magnitude mask keeps them in [-31745, 31744].
- ``PAD_KEY`` (INT32_MIN) is below every real key, including NaN for
  ``largest=False`` (INT32_MIN + 1): masked-off lanes never win.
- The packed low word decreases with the column, so the larger packed word is
  the larger key and, among equal keys, the smaller column. Packed words are
  all distinct, which is what makes every kernel deterministic: whatever order
  candidates arrive in, sorting packed words gives one answer.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

PAD_KEY: tl.constexpr = tl.constexpr(-(2**31))
NAN_KEY_LARGEST: tl.constexpr = tl.constexpr(2**31 - 1)
NAN_KEY_SMALLEST: tl.constexpr = tl.constexpr(-(2**31) + 1)
MIN_PACKED: tl.constexpr = tl.constexpr(-(2**63))


@triton.jit
def order_key(x, LARGEST: tl.constexpr):
    """int32 key of each float in ``x`` (fp32, fp16 or bf16); see the module docstring."""
    if x.dtype.primitive_bitwidth == 16:
        bits = x.to(tl.int16, bitcast=True).to(tl.int32)
        magnitude = 0x7FFF
    else:
        bits = x.to(tl.int32, bitcast=True)
        magnitude = 0x7FFFFFFF
    sign = bits >> 31
    key = (bits ^ (sign & magnitude)) - sign
    if LARGEST:
        key = tl.where(x != x, NAN_KEY_LARGEST, key)
    else:
        key = tl.where(x != x, NAN_KEY_SMALLEST, ~key)
    return key


@triton.jit
def threshold_value(key, LARGEST: tl.constexpr):
    """The float32 ``t`` that turns "order_key(x) >= key" into one float compare, for fp32 keys:
    with LARGEST, ``~(x < t)`` (unordered >=, so NaN passes); without, ``x <= t`` (NaN fails).
    Exact for every non-NaN x (-0.0 and +0.0 compare equal, as their keys do). The NaN key gives
    +inf: with LARGEST the test then keeps +Inf and NaN (a superset of the NaNs, enough); without,
    it keeps every non-NaN x, all of which beat NaN: callers check that at least k passed."""
    if LARGEST:
        raw = key
        nan_key = NAN_KEY_LARGEST
    else:
        raw = ~key
        nan_key = NAN_KEY_SMALLEST
    bits = tl.where(raw >= 0, raw, (raw - 1) ^ 0x7FFFFFFF)  # order_key inverted on each sign
    return tl.where(key == nan_key, float("inf"), bits.to(tl.float32, bitcast=True))


@triton.jit
def pack(key, column):
    """Distinct int64 word: larger key first, then smaller column."""
    return (key.to(tl.int64) << 32) | (0x7FFFFFFF - column).to(tl.int64)


@triton.jit
def packed_column(packed):
    """The column a packed word came from, as int64."""
    return (0x7FFFFFFF - packed.to(tl.int32)).to(tl.int64)


@triton.jit
def write_packed(best, x_row, values_row, indices_row, k, K2: tl.constexpr):
    """Store the first ``k`` of ``best`` ([K2] packed words, sorted): indices and the input's values."""
    j = tl.arange(0, K2)
    keep = j < k
    column = packed_column(best)
    tl.store(indices_row + j, column, mask=keep)
    tl.store(values_row + j, tl.load(x_row + column, mask=keep), mask=keep)


# ---- torch twin, for tests and for reading the mapping on CPU ---------------------------------

_NAN_KEY = {True: 2**31 - 1, False: -(2**31) + 1}


def order_key_torch(x: torch.Tensor, largest: bool = True) -> torch.Tensor:
    """The same keys as ``order_key``, computed with torch ops (int64 tensor)."""
    if x.dtype == torch.float32:
        bits, magnitude = x.view(torch.int32).to(torch.int64), 0x7FFFFFFF
    elif x.dtype in (torch.float16, torch.bfloat16):
        bits, magnitude = x.view(torch.int16).to(torch.int64), 0x7FFF
    else:
        raise TypeError(f"order_key_torch: float32/float16/bfloat16 only, got {x.dtype}")
    sign = -(bits < 0).to(torch.int64)
    key = (bits ^ (sign & magnitude)) - sign
    if not largest:
        key = ~key
    return torch.where(torch.isnan(x), torch.full_like(key, _NAN_KEY[largest]), key)


def threshold_value_torch(key: int, largest: bool = True) -> float:
    """The float threshold_value gives for one fp32 key (CPU twin, for tests)."""
    nan_key = _NAN_KEY[largest]
    if key == nan_key:
        return float("inf")
    raw = key if largest else ~key
    bits = raw if raw >= 0 else ((raw - 1) ^ 0x7FFFFFFF) - 2**32
    return torch.tensor([bits], dtype=torch.int64).to(torch.int32).view(torch.float32).item()


def reference_topk(x: torch.Tensor, k: int, largest: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """What every kernel returns, by a sort of packed words: (values, int64 indices) of the last dim,
    best first, ties by smaller index, NaN largest. For tests; any device."""
    key = order_key_torch(x, largest)
    column = torch.arange(x.shape[-1], device=x.device, dtype=torch.int64)
    packed = (key << 32) | (2**31 - 1 - column)
    indices = torch.sort(packed, dim=-1, descending=True).indices[..., :k]
    return x.gather(-1, indices), indices

"""Exact building blocks shared by the sieve and bitmask-radix kernels (kernels_sieve.py,
kernels_bitmask.py): selection by counting instead of sorting, and the exact per-row fallback.

Layout: whatever Triton picks for 1-D and small 2-D tiles; nothing here holds a row in registers.
- ``kth_largest_key``: [n, n] int32 compare tile, one sum per row of it; for n <= 64.
- ``rank_and_store``: [CAP, CAP] int64 compare tile over packed words (keys.py); each candidate's
  rank is its output slot, so no sort and no second compaction. For CAP <= 64.
- ``columns_to_words``: turns the exact path's columns into the packed words the fast paths store.
- ``exact_columns``: loops over the row in BLOCK-element steps (BLOCK / threads keys per thread,
  re-read from L1/L2): a few registers, many passes, only for rows the fast paths cannot take.
All keys are order_key of the value widened to fp32 (exact for fp16/bf16, same order), so a key
computed here compares with a threshold found from fp32 values elsewhere.
"""
from __future__ import annotations

import triton
import triton.language as tl

from tilefly.ops.topk.keys import MIN_PACKED, PAD_KEY, order_key, pack, packed_column


@triton.jit
def kth_largest_key(key, k):
    """The k-th largest entry of a small 1-D int32 tensor (k <= its size), by counting: the k-th
    largest is the largest value with at least k entries at or above it."""
    at_least = tl.sum((key[None, :] >= key[:, None]).to(tl.int32), axis=1)
    return tl.max(tl.where(at_least >= k, key, PAD_KEY), axis=0)


@triton.jit
def rank_and_store(words_ptr, n, x_row, values_row, indices_row, k, CAP: tl.constexpr):
    """Write the best k of the n (k <= n <= CAP) distinct packed words in words_ptr[0:n] to the
    outputs, sorted: each word's rank among them is the slot it goes to."""
    s = tl.arange(0, CAP)
    valid = s < n
    word = tl.load(words_ptr + s, mask=valid, other=MIN_PACKED)
    rank = tl.sum((word[None, :] > word[:, None]).to(tl.int32), axis=1)
    keep = valid & (rank < k)
    col = packed_column(word)
    tl.store(indices_row + rank, col, mask=keep)
    tl.store(values_row + rank, tl.load(x_row + col, mask=keep), mask=keep)


@triton.jit
def columns_to_words(x_row, slots_ptr, k, LARGEST: tl.constexpr, SIZE: tl.constexpr):
    """Replace the k int32 columns exact_columns wrote at the start of slots_ptr (int64 slots) by
    their packed words (SIZE >= k, a power of two)."""
    s = tl.arange(0, SIZE)
    cols_ptr = slots_ptr.to(tl.pointer_type(tl.int32))
    col = tl.load(cols_ptr + s, mask=s < k, other=0)
    xv = tl.load(x_row + col, mask=s < k, other=0.0).to(tl.float32)
    tl.debug_barrier()  # every column is read before its slot is overwritten by a word
    tl.store(slots_ptr + s, pack(order_key(xv, LARGEST), col), mask=s < k)


@triton.jit
def _block_keys(x_row, start, N, LARGEST: tl.constexpr, BLOCK: tl.constexpr):
    column = start + tl.arange(0, BLOCK)
    inside = column < N
    x = tl.load(x_row + column, mask=inside, other=0.0).to(tl.float32)
    return tl.where(inside, order_key(x, LARGEST), PAD_KEY)


@triton.jit
def _count_at_least(x_row, N, t, LARGEST: tl.constexpr, BLOCK: tl.constexpr):
    seen = tl.zeros([], tl.int32)
    start = tl.zeros([], tl.int32)
    while start < N:  # not range(0, N, BLOCK): the interpreter cannot index a runtime bound
        seen += tl.sum((_block_keys(x_row, start, N, LARGEST, BLOCK) >= t).to(tl.int32), axis=0)
        start += BLOCK
    return seen


@triton.jit
def exact_columns(x_row, out_ptr, N, k, lo, LARGEST: tl.constexpr, BLOCK: tl.constexpr):
    """Write the columns of the row's top k (any order) to out_ptr[0:k], exactly, ties by smaller
    column. ``lo`` is a key with at least k row keys >= it (a valid start for the search)."""
    # the k-th largest key by bisection from lo; its first probe is lo + 1, so when ties at lo are
    # what overflowed the fast path (few distinct values), one pass settles it
    lo = lo.to(tl.int64)
    hi = tl.full([], 2**31 - 1, tl.int64)
    step = tl.zeros([], tl.int32)
    done = tl.zeros([], tl.int32)
    while (lo < hi) & (done == 0):
        mid = tl.where(step == 0, lo + 1, lo + ((hi - lo + 1) >> 1))
        seen = _count_at_least(x_row, N, mid.to(tl.int32), LARGEST, BLOCK)
        enough = seen >= k
        lo = tl.where(enough, mid, lo)
        hi = tl.where(enough, hi, mid - 1)
        done = (seen == k).to(tl.int32)  # exactly k at or above mid: they are the answer
        step += 1
    kth = lo.to(tl.int32)
    above = tl.zeros([], tl.int32)
    start = tl.zeros([], tl.int32)
    while start < N:
        above += tl.sum((_block_keys(x_row, start, N, LARGEST, BLOCK) > kth).to(tl.int32), axis=0)
        start += BLOCK
    # keys above kth all go in; ties at kth by column order, as many as are still wanted
    ties_wanted = k - above
    n_above = tl.zeros([], tl.int32)
    n_ties = tl.zeros([], tl.int32)
    start = tl.zeros([], tl.int32)
    while start < N:
        column = start + tl.arange(0, BLOCK)
        key = _block_keys(x_row, start, N, LARGEST, BLOCK)
        gt = (key > kth).to(tl.int32)
        eq = (key == kth).to(tl.int32)
        tie_rank = n_ties + tl.cumsum(eq, axis=0) - 1
        slot = tl.where(gt != 0, n_above + tl.cumsum(gt, axis=0) - 1, above + tie_rank)
        tl.store(out_ptr + slot, column, mask=(gt != 0) | ((eq != 0) & (tie_rank < ties_wanted)))
        n_above += tl.sum(gt, axis=0)
        n_ties += tl.sum(eq, axis=0)
        start += BLOCK

"""Legacy large-k / long-row top-k (k up to 1024, rows of any length): sample, filter, select.

Replaced by kernels_bitmask.py (bitmask filter, counting select); kept for configs.legacy_plan
so the sweep times old against new on one GPU run.

Three launches per batch of rows, each a plain Triton kernel:

1. ``threshold_kernel`` (one program per row, S samples in registers): reads S
   keys of the row (S/8 runs of 8 consecutive elements, one 32-byte sector
   each, spread evenly; or the whole row when it is short) and finds a key
   ``tau`` with between r and r_max sample keys >= tau, by bisection over the
   key range (each step one compare and one block sum over S keys; it stops
   when the count lands in the window). configs.py picks r and r_max so that,
   unless a 1e-9 event, at least k and at most C row elements are >= tau.
   Also zeroes the row's candidate counter.
2. ``filter_kernel`` (one program per CHUNK of a row, many per row, so a few
   long rows still fill 132 SMs): reads its chunk once in 16-byte vectors, keeps
   the keys >= tau, claims a slice of the row's candidate list with one atomic
   add, and writes packed words (keys.py) at ``base + cumsum`` positions. The
   candidate list of a row holds C int64 words: ~1.5k of them are written, the
   input is read exactly once overall.
3. ``select_kernel`` (one program per row): a bitonic top-k (``tl.topk``) of the
   C packed candidates, the k largest written out sorted. Candidates arrive in
   any order from the atomics, but packed words are distinct, so the output is
   the same every run (deterministic, smaller column first among ties).
   When the count is outside [k, C] (heavy ties at tau, adversarial data) the
   row is redone exactly in this program: a binary search for the k-th key over
   the row (32 passes from L2), then the keys above it and the first ties by
   column, then the same sort. Slow, exact, and rare for ordinary data.

Registers: S/threads int32 keys in (1), CHUNK/threads keys in (2), C/threads
int64 words plus bitonic temporaries in (3); no explicit shared memory beyond
Triton's reductions, scans and layout conversions.
"""
from __future__ import annotations

import triton
import triton.language as tl

from tilefly.ops.topk.keys import MIN_PACKED, PAD_KEY, order_key, pack, write_packed


@triton.jit
def _key_at_rank(key, r, r_max):
    """A t with r <= count(key >= t) <= r_max, by bisection over the int32 key range: stops as soon
    as the count lands in the window (~12 steps on ordinary data instead of 32); when ties keep it
    out of the window, the exact r-th largest key (count >= r)."""
    lo = tl.full([], -(2**31), tl.int64)  # invariant: count(key >= lo) >= r
    hi = tl.full([], 2**31 - 1, tl.int64)  # the r-th largest key is <= hi
    done = tl.zeros([], tl.int32)
    while (lo < hi) & (done == 0):
        mid = lo + ((hi - lo + 1) >> 1)
        count = tl.sum((key >= mid.to(tl.int32)).to(tl.int32))
        enough = count >= r
        lo = tl.where(enough, mid, lo)
        hi = tl.where(enough, hi, mid - 1)
        done = (enough & (count <= r_max)).to(tl.int32)
    return lo.to(tl.int32)


@triton.jit
def threshold_kernel(x_ptr, tau_ptr, count_ptr, N, x_row_stride, r, r_max, sample_stride,
                     LARGEST: tl.constexpr, S: tl.constexpr, WHOLE_ROW: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row.to(tl.int64) * x_row_stride
    j = tl.arange(0, S)
    if WHOLE_ROW:
        column = j
    else:
        column = (j // 8) * sample_stride + (j % 8)
    inside = column < N
    key = tl.where(inside, order_key(tl.load(x_row + column, mask=inside, other=0.0), LARGEST), PAD_KEY)
    tl.store(tau_ptr + row, _key_at_rank(key, r, r_max))
    tl.store(count_ptr + row, 0)


@triton.jit
def filter_kernel(x_ptr, tau_ptr, count_ptr, cand_ptr, N, x_row_stride, chunks_per_row,
                  LARGEST: tl.constexpr, CHUNK: tl.constexpr, C: tl.constexpr):
    pid = tl.program_id(0)
    row = pid // chunks_per_row
    column = (pid % chunks_per_row) * CHUNK + tl.arange(0, CHUNK)
    inside = column < N
    x = tl.load(x_ptr + row.to(tl.int64) * x_row_stride + column, mask=inside, other=0.0)
    key = tl.where(inside, order_key(x, LARGEST), PAD_KEY)
    hit = key >= tl.load(tau_ptr + row)
    hits = hit.to(tl.int32)
    total = tl.sum(hits, axis=0)
    if total > 0:
        base = tl.atomic_add(count_ptr + row, total)
        slot = base + tl.cumsum(hits, axis=0) - 1
        tl.store(cand_ptr + row.to(tl.int64) * C + slot, pack(key, column), mask=hit & (slot < C))


@triton.jit
def _block_keys(x_row, start, N, LARGEST: tl.constexpr, BLOCK: tl.constexpr):
    column = start + tl.arange(0, BLOCK)
    inside = column < N
    return tl.where(inside, order_key(tl.load(x_row + column, mask=inside, other=0.0), LARGEST), PAD_KEY)


@triton.jit
def _exact_candidates(x_row, cand_row, N, k, LARGEST: tl.constexpr, BLOCK: tl.constexpr):
    """Write the row's top k as packed words to cand_row[0:k] (any order), exactly, ties by column."""
    # bisection for the k-th largest key; a key with exactly k at or above it also serves
    lo = tl.full([], -(2**31), tl.int64)
    hi = tl.full([], 2**31 - 1, tl.int64)
    done = tl.zeros([], tl.int32)
    while (lo < hi) & (done == 0):  # not range(0, N, BLOCK) below: the interpreter cannot index a runtime bound
        mid = (lo + ((hi - lo + 1) >> 1)).to(tl.int32)
        seen = tl.zeros([], tl.int32)
        start = tl.zeros([], tl.int32)
        while start < N:
            key = _block_keys(x_row, start, N, LARGEST, BLOCK)
            seen += tl.sum((key >= mid).to(tl.int32), axis=0)
            start += BLOCK
        lo = tl.where(seen >= k, mid.to(tl.int64), lo)
        hi = tl.where(seen >= k, hi, mid.to(tl.int64) - 1)
        done = (seen == k).to(tl.int32)
    kth = lo.to(tl.int32)
    above = tl.zeros([], tl.int32)
    start = tl.zeros([], tl.int32)
    while start < N:
        key = _block_keys(x_row, start, N, LARGEST, BLOCK)
        above += tl.sum((key > kth).to(tl.int32), axis=0)
        start += BLOCK
    ties_wanted = k - above
    n_above = tl.zeros([], tl.int32)
    n_ties = tl.zeros([], tl.int32)
    start = tl.zeros([], tl.int32)
    while start < N:
        column = start + tl.arange(0, BLOCK)
        key = _block_keys(x_row, start, N, LARGEST, BLOCK)
        gt = (key > kth).to(tl.int32)
        eq = (key == kth).to(tl.int32)
        slot_gt = n_above + tl.cumsum(gt, axis=0) - 1
        tie_rank = n_ties + tl.cumsum(eq, axis=0) - 1
        slot = tl.where(gt != 0, slot_gt, above + tie_rank)
        take = (gt != 0) | ((eq != 0) & (tie_rank < ties_wanted))
        tl.store(cand_row + slot, pack(key, column), mask=take)
        n_above += tl.sum(gt, axis=0)
        n_ties += tl.sum(eq, axis=0)
        start += BLOCK


@triton.jit
def select_kernel(x_ptr, count_ptr, cand_ptr, values_ptr, indices_ptr, N, x_row_stride, k,
                  LARGEST: tl.constexpr, C: tl.constexpr, K2: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    cand_row = cand_ptr + row * C
    count = tl.load(count_ptr + row)
    redo = (count < k) | (count > C)
    if redo:
        _exact_candidates(x_row, cand_row, N, k, LARGEST, BLOCK)
        tl.debug_barrier()
    j = tl.arange(0, C)
    cand = tl.load(cand_row + j, mask=j < tl.where(redo, k, count), other=MIN_PACKED)
    best = tl.topk(cand, K2)
    write_packed(best, x_row, values_ptr + row * k, indices_ptr + row * k, k, K2)

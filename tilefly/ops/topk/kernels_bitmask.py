"""Large-k top-k (k up to 1024, long rows): sample, bitmask filter, counting select.

Three launches per batch of rows (configs.BitmaskPlan sizes them), plain Triton:

1. ``sample_threshold_kernel`` (one program per row, S sample keys in registers):
   the key ``tau`` with between r and r_max sample keys at or above it (keys of
   values widened to fp32, so tau turns into a float threshold,
   keys.threshold_value). Zeroes the row's candidate count.
2. ``bitmask_filter_kernel`` (one program per chunk of E*G elements, many per
   row): the chunk is one [G, E] register tile laid out as in kernels_sieve.py
   (G = 128 * warps columns, lane g loads element g of each 128-byte run, 4
   columns per thread, E <= 32 rows per column inside a thread). Per element
   one float compare and a select into the column's int32 hit mask; per chunk
   a popcount per column, one atomic add claiming the chunk's slots in the
   row's candidate list, an exclusive scan, and one round per bit of the
   fullest column writing packed words (keys.py; the value re-read from L1).
   1-3% of elements are hits, so the per-element work is the compare (~4.8
   instructions with the load); per chunk ~300 per thread plus ~110 a round
   (sm_90a SASS: 597 + 111 per extra round for 64 elements per thread,
   against ~100 per element for the atomic filter this kernel replaced).
3. ``counting_select_kernel`` (one program per row): the C candidate words in
   registers ([C], C / threads per thread). Bisection on their 32-bit keys for
   a t with k <= count(key >= t) <= SORT (SORT = plan's sort size >= k; it
   stops as soon as the count lands in that window, a few steps when SORT is
   well above k), compaction of those words (scan, stores into the row's own
   list, a CTA barrier), and one bitonic sort of SORT words (tl.sort), of which
   the first k are written. No sort ever touches the C candidates.
   Rows the fast path cannot take (candidate count outside [k, C], or more than
   SORT ties at the k-th key) are redone exactly (kernels_exact.exact_columns,
   starting from tau when it is valid, so heavy ties cost two row passes).
Candidates arrive in any order; packed words are distinct, so every run gives
the same output, smaller column first among ties.
"""
from __future__ import annotations

import triton
import triton.language as tl

from tilefly.ops.topk.kernels_exact import columns_to_words, exact_columns
from tilefly.ops.topk.kernels_sieve import hit_masks, popcount, row_tile, store_hit_words
from tilefly.ops.topk.keys import MIN_PACKED, PAD_KEY, order_key, write_packed


@triton.jit
def window_threshold(key, k, k_max, lo, hi):
    """A key t with k <= count(key >= t) <= k_max, bisecting [lo, hi] (count(key >= lo) >= k): it
    stops as soon as the count lands in the window (a few steps for a wide window); when ties keep
    it out, it ends at the exact k-th largest key."""
    lo = lo.to(tl.int64)
    hi = hi.to(tl.int64)
    done = tl.zeros([], tl.int32)
    while (lo < hi) & (done == 0):
        mid = lo + ((hi - lo + 1) >> 1)
        count = tl.sum((key >= mid.to(tl.int32)).to(tl.int32), axis=0)
        enough = count >= k
        lo = tl.where(enough, mid, lo)
        hi = tl.where(enough, hi, mid - 1)
        done = (enough & (count <= k_max)).to(tl.int32)
    return lo.to(tl.int32)


@triton.jit
def sample_threshold_kernel(x_ptr, tau_ptr, count_ptr, N, x_row_stride, r, r_max, sample_stride,
                            LARGEST: tl.constexpr, S: tl.constexpr, WHOLE_ROW: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row.to(tl.int64) * x_row_stride
    j = tl.arange(0, S)
    if WHOLE_ROW:
        column = j
    else:
        column = (j // 8) * sample_stride + (j % 8)  # S/8 runs of 8: one 32-byte sector each
    inside = column < N
    x = tl.load(x_row + column, mask=inside, other=0.0).to(tl.float32)
    key = tl.where(inside, order_key(x, LARGEST), PAD_KEY)
    lo = tl.full([], -(2**31), tl.int32)
    tl.store(tau_ptr + row, window_threshold(key, r, r_max, lo, tl.full([], 2**31 - 1, tl.int32)))
    tl.store(count_ptr + row, 0)


@triton.jit
def bitmask_filter_kernel(x_ptr, tau_ptr, count_ptr, cand_ptr, N, x_row_stride, chunks_per_row,
                          LARGEST: tl.constexpr, E: tl.constexpr, G: tl.constexpr, C: tl.constexpr,
                          EVEN: tl.constexpr):
    # EVEN: every chunk is full (N is a multiple of E * G): no masks on the hot path
    pid = tl.program_id(0)
    row = pid // chunks_per_row
    start = (pid % chunks_per_row) * (E * G)
    x_row = x_ptr + row.to(tl.int64) * x_row_stride
    x, inside = row_tile(x_row, start, N, G, E, LARGEST, EVEN)
    masks = hit_masks(x, tl.load(tau_ptr + row), inside, LARGEST, EVEN)
    counts = popcount(masks)
    total = tl.sum(counts, axis=0)
    if total > 0:
        slot = tl.atomic_add(count_ptr + row, total) + tl.cumsum(counts, 0) - counts
        store_hit_words(masks, slot, x_row, start, cand_ptr + row.to(tl.int64) * C, C, LARGEST, G)


@triton.jit
def counting_select_kernel(x_ptr, tau_ptr, count_ptr, cand_ptr, values_ptr, indices_ptr, N, x_row_stride, k,
                           LARGEST: tl.constexpr, C: tl.constexpr, SORT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    cand_row = cand_ptr + row * C
    count = tl.load(count_ptr + row)
    j = tl.arange(0, C)
    valid = j < count
    word = tl.load(cand_row + j, mask=valid, other=MIN_PACKED)
    key = tl.where(valid, (word >> 32).to(tl.int32), PAD_KEY)
    fast = (count >= k) & (count <= C)
    n = tl.zeros([], tl.int32)
    if fast:
        lo = tl.min(tl.where(valid, key, 2**31 - 1), axis=0)
        t = window_threshold(key, k, SORT, lo, tl.max(key, axis=0))
        win = (key >= t).to(tl.int32)
        n = tl.sum(win, axis=0)
        fast = n <= SORT  # else more than SORT ties at the k-th key: the exact path below
        if fast:
            tl.debug_barrier()  # every thread holds its words before any slot is overwritten
            tl.store(cand_row + tl.cumsum(win, 0) - 1, word, mask=win != 0)
    if not fast:
        # tau is a valid start when at least k row keys passed the filter
        lo = tl.where(count >= k, tl.load(tau_ptr + row), -(2**31) + 1)
        exact_columns(x_row, cand_row.to(tl.pointer_type(tl.int32)), N, k, lo, LARGEST, BLOCK)
        tl.debug_barrier()
        columns_to_words(x_row, cand_row, k, LARGEST, SORT)
        n = k
    tl.debug_barrier()  # the compacted words are read by every thread
    s = tl.arange(0, SORT)
    best = tl.sort(tl.load(cand_row + s, mask=s < n, other=MIN_PACKED), descending=True)
    write_packed(best, x_row, values_ptr + row * k, indices_ptr + row * k, k, SORT)

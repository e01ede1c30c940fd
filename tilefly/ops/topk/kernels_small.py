"""Whole-row top-k kernels: ``topk_full_kernel`` (default for short rows and k > 16 up to 2048)
and the legacy register filter ``topk_filter_kernel`` (k <= 16, rows up to 8192; replaced by
kernels_sieve.py, kept for configs.legacy_plan so the sweep can time old against new).

Layout plan (plain Triton: the compiler picks the blocked layout, we pick shapes
and warps; configs.py chooses E, G and num_warps per (N, k))
- ``topk_filter_kernel``: one program per row. The row is loaded once as an
  [E, G] tile (element ``e*G + g``; G is the contiguous axis, so loads are
  16-byte vectors along G: sizePerThread [1, 4] for fp32). Column g of the tile
  is *group* g: E elements strided G apart. Each thread holds its groups' keys
  as int32 in registers. With one warp and G = 32 * 4, reductions over E stay
  inside a thread; with more warps Triton splits E across warps and each
  reduction crosses them once through shared memory. No explicit shared
  memory, no pipelining: rows are short, and many programs per SM (1-warp
  programs up to 32 per SM) keep enough loads in flight.
- ``topk_full_kernel``: ROWS rows per program as a [ROWS, NP] tile (NP = N
  rounded up to a power of two), a bitonic ``tl.topk`` of packed words per row.
  For rows up to 256 (any k), and up to 2048 for k > 16.

Algorithm of the filter kernel, and why it is exact
1. key = order_key(x) (keys.py). gmax[g] = the largest key of group g.
2. tau = the k-th largest of the G group maxima (a 32-bit bitonic top-k over G
   values, not N). At least k groups reach tau, so at least k elements are
   >= tau: the top k are among the *hits* (key >= tau).
3. Per group: number of hits, first and last hit position (one 3-way
   ``tl.reduce``). For random data the hits are ~k elements spread over ~k
   groups; when no group has more than two, the candidates are exactly (first,
   last) of each group: 2G packed words (their values re-read by position, an
   L1 hit), and a bitonic top-k of 2G words gives the answer.
4. Otherwise (a group with 3+ hits: heavy ties, periodic data, or ~1-3% of
   random rows, see configs._filter_slow_rate) the program sorts the whole row's
   packed words instead: slower, same answer.
Per element: a key transform, a max, a compare and a 3-way reduction, about a
dozen integer instructions, so a row streams at near memory speed; the two
small sorts are the per-row overhead that configs.py's cost model keeps low.
Ties and determinism come from the packed words (keys.py): the smaller column
wins, in both branches, every run.
"""
from __future__ import annotations

import triton
import triton.language as tl

from tilefly.ops.topk.keys import MIN_PACKED, PAD_KEY, order_key, pack, packed_column, write_packed


@triton.jit
def _count_first_last(count_a, first_a, last_a, count_b, first_b, last_b):
    return count_a + count_b, tl.minimum(first_a, first_b), tl.maximum(last_a, last_b)


@triton.jit
def _kth_largest(keys, k, K2: tl.constexpr):
    """The k-th largest of ``keys`` (1-D int32, at least K2 >= k entries)."""
    top = tl.topk(keys, K2)
    return tl.sum(tl.where(tl.arange(0, K2) == k - 1, top, 0), axis=0)


@triton.jit
def topk_filter_kernel(x_ptr, values_ptr, indices_ptr, N, x_row_stride, k,
                       LARGEST: tl.constexpr, E: tl.constexpr, G: tl.constexpr, K2: tl.constexpr):
    # Requires G <= N (every group non-empty) and K2 <= G; configs.py guarantees both.
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    e = tl.arange(0, E)[:, None]
    g = tl.arange(0, G)[None, :]
    column = e * G + g
    inside = column < N
    key = tl.where(inside, order_key(tl.load(x_row + column, mask=inside, other=0.0), LARGEST), PAD_KEY)

    tau = _kth_largest(tl.max(key, axis=0), k, K2)
    hit = key >= tau
    e_full = e + 0 * g
    count, first, last = tl.reduce((hit.to(tl.int32), tl.where(hit, e_full, E), tl.where(hit, e_full, -1)),
                                   0, _count_first_last)
    if tl.max(count, axis=0) <= 2:
        gs = tl.arange(0, G)
        has1 = count >= 1
        has2 = count >= 2
        col1 = first * G + gs
        col2 = last * G + gs
        key1 = order_key(tl.load(x_row + col1, mask=has1, other=0.0), LARGEST)
        key2 = order_key(tl.load(x_row + col2, mask=has2, other=0.0), LARGEST)
        cand1 = tl.where(has1, pack(key1, col1), MIN_PACKED)
        cand2 = tl.where(has2, pack(key2, col2), MIN_PACKED)
        best = tl.topk(tl.reshape(tl.join(cand1, cand2), [2 * G], can_reorder=True), K2)
    else:
        best = tl.topk(tl.reshape(pack(key, column), [E * G], can_reorder=True), K2)
    write_packed(best, x_row, values_ptr + row * k, indices_ptr + row * k, k, K2)


@triton.jit
def topk_full_kernel(x_ptr, values_ptr, indices_ptr, rows, N, x_row_stride, k,
                     LARGEST: tl.constexpr, ROWS: tl.constexpr, NP: tl.constexpr, K2: tl.constexpr):
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]
    column = tl.arange(0, NP)[None, :]
    inside = (column < N) & (row < rows)
    x = tl.load(x_ptr + row * x_row_stride + column, mask=inside, other=0.0)
    key = tl.where(inside, order_key(x, LARGEST), PAD_KEY)
    best = tl.topk(pack(key, column), K2)            # [ROWS, K2], sorted per row
    j = tl.arange(0, K2)[None, :]
    keep = (j < k) & (row < rows)
    src = packed_column(best)
    tl.store(indices_ptr + row * k + j, src, mask=keep)
    tl.store(values_ptr + row * k + j, tl.load(x_ptr + row * x_row_stride + src, mask=keep), mask=keep)

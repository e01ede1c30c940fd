"""Small-k top-k by sieving (k <= 16, rows of 257..16384): one read, no sort of the row.

Layout plan (plain Triton; configs.SievePlan picks E, G, TEAMS, CAP, num_warps)
- One program per row. The row is one [G, E] fp32 register tile (element
  ``e*G + g``), G = 128 * num_warps columns: blocked layout sizePerThread
  [1, 1], threadsPerWarp [32, 1], warpsPerCTA [W, 1], so lane g of a warp
  loads element g of each 128-byte run (4-byte loads, fully coalesced) and a
  thread owns G / (32 W) = 4 columns, all E <= 32 rows of each. ``row_tile``
  gets this layout with a contiguity hint of 1; with Triton's default (4
  neighbouring columns per thread, 16-byte loads) every [G] vector reduced
  from the tile would need shared-memory layout conversions in each
  extraction round (measured on the bitmask filter: 171 instead of 111
  instructions a round).
- Every reduction over E stays inside a thread; a column's hits fit one int32
  mask. No explicit shared memory: Triton's reductions, scan and the two small
  all-pairs tiles ([TEAMS, TEAMS] int32, [CAP, CAP] int64) use its own
  scratch. One global scratch row of CAP int64 words per row carries the
  compacted candidates across threads (stores, one CTA barrier, loads).

Algorithm, and why it is exact
1. best[g] = the best element of column g (float max that propagates NaN, so
   NaN counts as largest; min for largest=False). team[t] = best over TEAMS
   contiguous column groups. tau = the k-th largest team key, by counting
   (each team key against all others), not by sorting: TEAMS real elements
   have keys >= their team's key, so at least k row elements are >= tau.
2. One float compare per element (keys.threshold_value turns tau into a float
   t with "x >= t" equivalent to "key >= tau", NaN included) sets bit e of
   column g's hit mask. For i.i.d. data ~1.1k elements hit (configs.py sizes
   CAP from the simulated tail); a handful of columns hold them.
3. Compaction: popcount per column, an exclusive scan over the G columns gives
   each column its slots; a loop over the largest column count (1-2 rounds)
   peels one set bit per column per round (lowest bit via the float exponent
   of ``m & -m``), re-reads that element (an L1 hit) and stores its packed
   word (keys.py: key, then smaller column).
4. The <= CAP words are ranked by counting: rank r goes straight to output slot
   r. Packed words are distinct, so the result is the same every run, smaller
   index first among ties, sorted.
5. Rows whose hit count is outside [k, CAP] (heavy ties at tau, many NaNs,
   adversarial data) run ``exact_columns`` (kernels_exact.py) in the same
   program: slower, same answer; it starts from tau, so heavy ties cost two
   passes over the row, not a bisection.
Cost (sm_90a SASS, fp32, fast path): per element a load, a float max, a
compare, a select and half a 3-input add into the mask, ~4.5 instructions;
per row ~500-700 instructions per thread (the two counting tiles, the scan,
the rounds, the ranking), e.g. 952 per thread at N=8192, k=16, 4 warps
(15 per element) against ~50 per element for the register filter kernel it replaced.
"""
from __future__ import annotations

import triton
import triton.language as tl

from tilefly.ops.topk.kernels_exact import columns_to_words, exact_columns, kth_largest_key, rank_and_store
from tilefly.ops.topk.keys import order_key, pack, threshold_value


@triton.jit
def _or(a, b):
    return a | b


@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _min_nan(a, b):
    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def popcount(m):
    """Set bits of each int32 (SWAR; the interpreter has no libdevice)."""
    v = m.to(tl.uint32, bitcast=True)
    v = v - ((v >> 1) & 0x55555555)
    v = (v & 0x33333333) + ((v >> 2) & 0x33333333)
    v = (v + (v >> 4)) & 0x0F0F0F0F
    return ((v * 0x01010101) >> 24).to(tl.int32)


@triton.jit
def lowest_bit_index(m):
    """Index of the lowest set bit of each nonzero int32: the exponent of float(m & -m), exact for
    powers of two (a conversion and two integer ops, no libdevice)."""
    low = (m & -m).to(tl.uint32, bitcast=True).to(tl.float32)
    return ((low.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127


@triton.jit
def row_tile(x_row, start, N, G: tl.constexpr, E: tl.constexpr, LARGEST: tl.constexpr, EVEN: tl.constexpr):
    """Elements start + e*G + g of a row as a [G, E] fp32 tile, and which of them are inside the row.
    Lane g of a warp loads element g (4-byte loads, a warp reads 128 contiguous bytes); the
    contiguity hint of 1 keeps Triton from giving a thread 4 neighbouring columns, so every [G]
    vector reduced from the tile has the one-column-per-thread layout that gathers and scatters
    of [G] vectors use too: no layout conversion in the extraction rounds. Outside the row: the
    worst non-NaN value (and ``inside`` False)."""
    g = tl.max_contiguous(tl.arange(0, G), 1)
    column = start + g[:, None] + tl.arange(0, E)[None, :] * G
    inside = column < N
    if EVEN:
        x = tl.load(x_row + column)
    elif LARGEST:
        x = tl.load(x_row + column, mask=inside, other=float("-inf"))
    else:
        x = tl.load(x_row + column, mask=inside, other=float("inf"))
    return x.to(tl.float32), inside


@triton.jit
def hit_masks(x, tau_key, inside, LARGEST: tl.constexpr, EVEN: tl.constexpr):
    """Per column of x [G, E] (axis 0), the int32 mask of the rows e whose key is >= tau_key."""
    t = threshold_value(tau_key, LARGEST)
    if LARGEST:
        hit = ~(x < t)      # unordered >=: NaN always hits (its key is the largest)
    else:
        hit = x <= t        # ordered: NaN never hits unless t lets every non-NaN hit (keys.py)
    if not EVEN:
        hit = hit & inside
    bit = 1 << tl.arange(0, x.shape[1])[None, :]
    return tl.reduce(tl.where(hit, bit, 0), 1, _or)


@triton.jit
def store_hit_words(masks, slot, x_row, start, out_ptr, limit, LARGEST: tl.constexpr, G: tl.constexpr):
    """For every set bit e of column g (element start + e*G + g), the packed word (keys.py) at
    out_ptr[slot[g] + j], j counting the bits of column g from the lowest, slots >= limit dropped;
    one round per bit of the fullest column. Values are re-read: an L1 hit, the tile was just loaded."""
    g = tl.max_contiguous(tl.arange(0, G), 1)  # the layout of masks (row_tile)
    rounds = tl.max(popcount(masks), axis=0)
    j = 0
    while j < rounds:
        col = start + lowest_bit_index(masks) * G + g
        hit = masks != 0
        xv = tl.load(x_row + col, mask=hit, other=0.0).to(tl.float32)
        tl.store(out_ptr + slot, pack(order_key(xv, LARGEST), col), mask=hit & (slot < limit))
        masks = masks & (masks - 1)
        slot += 1
        j += 1


@triton.jit
def sieve_kernel(x_ptr, values_ptr, indices_ptr, scratch_ptr, N, x_row_stride, k,
                 LARGEST: tl.constexpr, E: tl.constexpr, G: tl.constexpr, TEAMS: tl.constexpr,
                 CAP: tl.constexpr, EVEN: tl.constexpr, BLOCK: tl.constexpr):
    # configs.py guarantees: E <= 32, TEAMS divides G, k <= TEAMS, k <= CAP, E * G >= N
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    x, inside = row_tile(x_row, 0, N, G, E, LARGEST, EVEN)
    if LARGEST:
        team = tl.reduce(tl.reshape(tl.reduce(x, 1, _max_nan), [TEAMS, G // TEAMS]), 1, _max_nan)
    else:
        team = tl.reduce(tl.reshape(tl.reduce(x, 1, _min_nan), [TEAMS, G // TEAMS]), 1, _min_nan)
    tau = kth_largest_key(order_key(team, LARGEST), k)

    masks = hit_masks(x, tau, inside, LARGEST, EVEN)
    counts = popcount(masks)
    total = tl.sum(counts, axis=0)
    words_row = scratch_ptr + row * CAP
    if (total >= k) & (total <= CAP):
        store_hit_words(masks, tl.cumsum(counts, 0) - counts, x_row, 0, words_row, CAP, LARGEST, G)
        n = total
    else:
        exact_columns(x_row, words_row.to(tl.pointer_type(tl.int32)), N, k, tau, LARGEST, BLOCK)
        tl.debug_barrier()
        columns_to_words(x_row, words_row, k, LARGEST, CAP)
        n = k
    tl.debug_barrier()  # the candidate words, written by any thread, are read by all
    rank_and_store(words_row, n, x_row, values_ptr + row * k, indices_ptr + row * k, k, CAP)

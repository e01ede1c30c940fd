"""Whole-row top-k: ``topk_full_kernel``, the plan for short rows (up to 256, any k) and for k > 16 on
rows up to 2048 (configs.FullPlan).

Layout plan (plain Triton: the compiler picks the blocked layout, we pick shapes and warps;
configs.py chooses ROWS and num_warps per (N, k)): ROWS rows per program as one [ROWS, NP] register
tile (NP = N rounded up to a power of two, padding keys below every real key), NP contiguous so
loads are vectors along the row. Each element becomes a packed word (order key above its column,
keys.py) and a bitonic ``tl.topk`` keeps the K2 largest words per row; values are re-read by
column (an L1 hit). Ties and determinism come from the packed words: the smaller column wins,
every run.
"""
from __future__ import annotations

import triton
import triton.language as tl

from tilefly.ops.topk.keys import PAD_KEY, order_key, pack, packed_column


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

"""Epilogue pieces: what happens to an FP32 accumulator tile after the mainloop.

- ``add_bias``: adds a bias vector broadcast along rows (addmm's 1-D bias) or,
  for a swapped problem (C^T = B^T A^T), along columns; loaded one element per
  thread, then moved into a slice of the accumulator's layout so each thread
  holds just the entries of its own columns (rows). A full 2-D bias is not
  served: per-element addresses for a 128x256 tile would not fit in registers.
- ``store_tma``: casts, writes the tile into an NVMMA-swizzled shared buffer and
  lets one TMA store copy it out; the copy clips at the tensor's edge. Waiting
  for the previous store is deferred until the buffer is needed again, so a
  persistent kernel's store overlaps the next tile's mainloop.
- ``store_masked``: casts and stores through pointers with a bounds mask, for
  outputs a TMA descriptor cannot describe (any strides, any alignment);
  ``store_layout`` is the blocked layout whose threads own contiguous runs
  along the output's unit-stride dimension.
- ``splitk_reduce``: split-K without a second kernel. Each program writes its
  FP32 partial tile to a workspace, then takes a ticket (an acq_rel atomic on a
  per-tile counter). The program that draws the last ticket sums every partial
  in split order (bit-for-bit deterministic whatever the arrival order), resets
  the counter to zero for the next launch and runs the epilogue. Partials are
  read with ``.cg`` so they come from L2, never from a stale L1 line.
- ``finish_splitk``: the whole epilogue of a split-K program (the dense and MX
  GEMMs): into ``store_layout``, reduce when split, then bias and masked store by
  the program that finishes the tile.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, tma


@gluon.jit
def tile_rows_cols(off_m, off_n, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, layout: gl.constexpr):
    rows = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
    cols = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
    return rows, cols


@gluon.constexpr_function
def vector_layout(length, num_warps):
    """About one element per thread (short vectors are replicated): few address
    registers, unlike a load straight into the MMA slice (64 addresses a thread)."""
    return gl.BlockedLayout([max(1, length // (32 * num_warps))], [32], [num_warps], [0])


@gluon.jit
def add_bias(acc, bias_ptr, stride_bias, off_m, off_n, M, N,
             BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BIAS: gl.constexpr, num_warps: gl.constexpr):
    """BIAS == 1: bias[n] added to every row; BIAS == 2: bias[m] added to every column.
    The vector is loaded compactly, then moved (through shared memory) into the
    accumulator's slice layout, where each thread holds only the entries of the
    columns (rows) it owns."""
    layout: gl.constexpr = acc.type.layout
    if BIAS == 1:
        cols = off_n + gl.arange(0, BLOCK_N, layout=vector_layout(BLOCK_N, num_warps))
        bias = gl.load(bias_ptr + cols.to(gl.int64) * stride_bias, mask=cols < N, other=0.0)
        bias = gl.convert_layout(bias, gl.SliceLayout(0, layout))
        acc = acc + bias.to(gl.float32)[None, :]
    elif BIAS == 2:
        rows = off_m + gl.arange(0, BLOCK_M, layout=vector_layout(BLOCK_M, num_warps))
        bias = gl.load(bias_ptr + rows.to(gl.int64) * stride_bias, mask=rows < M, other=0.0)
        bias = gl.convert_layout(bias, gl.SliceLayout(1, layout))
        acc = acc + bias.to(gl.float32)[:, None]
    return acc


@gluon.jit
def store_tma(acc, c_desc, c_smem, off_m, off_n):
    tma.store_wait(pendings=0)
    c_smem.store(acc.to(c_desc.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(c_desc, [off_m, off_n], c_smem)


@gluon.constexpr_function
def store_layout(block_m, block_n, num_warps, rows_contiguous):
    """A blocked layout whose threads own 8-element runs along the unit-stride dim."""
    if rows_contiguous:
        vec = min(8, block_m)
        lanes_m = min(32, block_m // vec)
        return gl.BlockedLayout([vec, 1], [lanes_m, 32 // lanes_m], [1, num_warps], [0, 1])
    vec = min(8, block_n)
    lanes_n = min(32, block_n // vec)
    return gl.BlockedLayout([1, vec], [32 // lanes_n, lanes_n], [num_warps, 1], [1, 0])


@gluon.jit
def store_masked(val, c_ptr, stride_cm, stride_cn, off_m, off_n, M, N,
                 BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """Cast and store a tile held in any layout (``store_layout`` gives coalesced runs)."""
    layout: gl.constexpr = val.type.layout
    rows, cols = tile_rows_cols(off_m, off_n, BLOCK_M, BLOCK_N, layout)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    offs = rows.to(gl.int64)[:, None] * stride_cm + cols.to(gl.int64)[None, :] * stride_cn
    gl.store(c_ptr + offs, val.to(c_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def splitk_reduce(acc, ws_ptr, ticket_ptr, tile, split, num_splits,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, ROWS_CONTIGUOUS: gl.constexpr):
    """Returns (sum of all splits' partials, whether this program holds the last ticket).
    Only the returned sum of the last-ticket program is meaningful. ``acc`` should be in
    ``store_layout(..., ROWS_CONTIGUOUS)``: partials are then laid out so that each
    thread's run of 8 values is contiguous in the workspace (vector stores and loads)."""
    layout: gl.constexpr = acc.type.layout
    rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
    if ROWS_CONTIGUOUS:
        offs = rows[:, None] + cols[None, :] * BLOCK_M
    else:
        offs = rows[:, None] * BLOCK_N + cols[None, :]
    tile_base = ws_ptr + tile.to(gl.int64) * num_splits * (BLOCK_M * BLOCK_N)
    gl.store(tile_base + split * (BLOCK_M * BLOCK_N) + offs, acc)
    # Every thread's partial must be issued before the ticket releases it.
    gl.thread_barrier()
    ticket = gl.atomic_add(ticket_ptr + tile, 1, sem="acq_rel", scope="gpu")
    is_last = ticket == num_splits - 1
    total = gl.zeros_like(acc)
    if is_last:
        for s in range(num_splits):
            total += gl.load(tile_base + s * (BLOCK_M * BLOCK_N) + offs, cache_modifier=".cg")
        gl.atomic_xchg(ticket_ptr + tile, 0, sem="relaxed", scope="gpu")
    return total, is_last


@gluon.jit
def finish_splitk(acc, ws_ptr, ticket_ptr, tile, split, num_splits, bias_ptr, stride_bias,
                  c_ptr, stride_cm, stride_cn, off_m, off_n, M, N,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BIAS: gl.constexpr,
                  C_ROWS_CONTIGUOUS: gl.constexpr, num_warps: gl.constexpr):
    """One move into the store layout serves the partials, the bias and the final store."""
    acc = gl.convert_layout(acc, store_layout(BLOCK_M, BLOCK_N, num_warps, C_ROWS_CONTIGUOUS))
    is_last = num_splits == 1
    if num_splits > 1:
        acc, is_last = splitk_reduce(acc, ws_ptr, ticket_ptr, tile, split, num_splits, BLOCK_M, BLOCK_N,
                                     C_ROWS_CONTIGUOUS)
    if is_last:
        acc = add_bias(acc, bias_ptr, stride_bias, off_m, off_n, M, N, BLOCK_M, BLOCK_N, BIAS, num_warps)
        store_masked(acc, c_ptr, stride_cm, stride_cn, off_m, off_n, M, N, BLOCK_M, BLOCK_N)

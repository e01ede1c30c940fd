"""Grouped (MoE) GEMM for Hopper in Gluon: out[rows of g] = A[rows of g] @ B[g], FP32 accumulate.

A is (sum M) x K row-major; ``offs[g]`` (int32, on the device) is the end row of
group g, group g's rows are offs[g-1] .. offs[g] (offs[-1] = 0). B is G x K x N,
read through one 2-D TMA descriptor: a [G*N, K] view when each group is
column-major (K-major operand, group g's rows start at g*N) or a [G*K, N] view
when row-major (MN-major, its K rows start at g*K). Layout plan:

    tiles           BLOCK_M x BLOCK_N output tiles, BLOCK_M 128 (8 or 4 warps)
                    or 64 (4 warps, many experts with few rows each)
    shared memory   STAGES x (A tile [BM, BK] + B tile [BN, BK] or [BK, BN]),
                    NVMMA 128-byte swizzle, the dense GEMM's ring
                    (tilefly.gluon.tma_ring) and async-wgmma mainloop
                    (tilefly.gluon.wgmma); plus the compiler's scratch for one
                    layout conversion of the output tile
    barriers        one ``ready`` mbarrier per slot (expect-tx of both tiles)
    registers       the FP32 accumulator in the wgmma layout (BM*BN/(32*warps)
                    values per thread, at most 128); the group table below
    group table     each program loads ``offs`` once into registers (GROUPS_PAD
                    entries over all threads, GROUPS_PAD >= 32*num_warps so no
                    entry is replicated), turns it into per-group tile counts
                    (cdiv(rows, BM) * cdiv(N, BN)) and an inclusive scan of them:
                    no host synchronisation, no setup kernel
    schedule        persistent: one program per SM walks the flat tile space
                    p, p+P, ...; tile t belongs to the group g = #(tile ends <= t)
                    (one reduction over the table), and inside the group tiles
                    go in the dense kernels' L2-grouped order
                    (tilefly.gluon.scheduler.grouped_tile). The next tile's first
                    STAGES-1 loads are issued before this tile's epilogue.
    tails           A is one descriptor over all rows: a group's last row tile may
                    read the next group's rows (computed, never stored); rows past A
                    and K past its end arrive as zeros from TMA. B's N tail reads the
                    next group's rows of the [G*N, K] view (columns never stored).
                    The [G*K, N] view needs K % BLOCK_K == 0 (the launcher checks),
                    else group g's last K-step would read group g+1's weights.
    epilogue        cast to the output dtype, one conversion into a blocked layout
                    whose threads own 8 contiguous columns, masked 16-byte stores
                    clipped to the group's rows and N (tilefly.gluon.epilogue); a
                    32-bit output is stored straight from the wgmma layout instead
                    (its conversion scratch would not fit next to the ring).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from tilefly.gluon.epilogue import store_layout, store_masked, vector_layout
from tilefly.gluon.layouts import wgmma_layout
from tilefly.gluon.scheduler import grouped_tile, persistent_tile_count, persistent_tile_id
from tilefly.gluon.tma_ring import alloc_ring
from tilefly.gluon.wgmma import mainloop, prefetch

# Sizes stay unspecialized (one binary for every M, K and group count); N and the output
# row stride keep Triton's % 16 specialization, which lets the masked store vectorize.
_UNSPECIALIZED = ["M", "K", "num_groups"]


@gluon.jit
def _add(x, y):
    return x + y


@gluon.jit
def _group_table(offs_ptr, num_groups, M, N,
                 BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUPS_PAD: gl.constexpr, num_warps: gl.constexpr):
    """Per group (padded to GROUPS_PAD with empty groups): first row, end row, output
    tiles, and the inclusive running total of tiles. Rows are clamped to A's M."""
    idx = gl.arange(0, GROUPS_PAD, layout=vector_layout(GROUPS_PAD, num_warps))
    valid = idx < num_groups
    ends = gl.minimum(gl.load(offs_ptr + idx, mask=valid, other=0), M)
    starts = gl.minimum(gl.load(offs_ptr + idx - 1, mask=valid & (idx > 0), other=0), M)
    ends = gl.maximum(ends, starts)
    tiles = gl.cdiv(ends - starts, BLOCK_M) * gl.cdiv(N, BLOCK_N)
    tiles_end = gl.associative_scan(tiles, 0, _add)
    return idx, starts, ends, tiles, tiles_end


@gluon.jit
def _locate(t, idx, starts, ends, tiles, tiles_end, num_pid_n,
            BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr):
    """(group, first output row, first column, group end row) of flat tile t."""
    g = gl.sum((tiles_end <= t).to(gl.int32), axis=0)
    mine = idx == g
    first_tile = gl.sum(gl.where(mine, tiles_end - tiles, 0), axis=0)
    row_start = gl.sum(gl.where(mine, starts, 0), axis=0)
    row_end = gl.sum(gl.where(mine, ends, 0), axis=0)
    pid_m, pid_n = grouped_tile(t - first_tile, gl.cdiv(row_end - row_start, BLOCK_M), num_pid_n, GROUP_M)
    return g, row_start + pid_m * BLOCK_M, pid_n * BLOCK_N, row_end


@gluon.jit
def _rhs_coords(g, off_n, N, K, B_KMAJOR: gl.constexpr):
    """(row coordinate of the RHS tile, shift of its K coordinate) in B's 2-D view."""
    if B_KMAJOR:
        return g * N + off_n, 0
    return off_n, g * K


@gluon.jit(do_not_specialize=_UNSPECIALIZED)
def grouped_gemm_kernel(a_desc, b_desc, c_ptr, offs_ptr, M, N, K, num_groups, stride_cm,
                        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                        B_KMAJOR: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
                        GROUPS_PAD: gl.constexpr, OUT_CONVERT: gl.constexpr, num_warps: gl.constexpr):
    acc_layout: gl.constexpr = wgmma_layout(BLOCK_M, BLOCK_N, num_warps)
    a_bufs, b_bufs, bars = alloc_ring(a_desc, b_desc, STAGES)

    idx, starts, ends, tiles, tiles_end = _group_table(offs_ptr, num_groups, M, N, BLOCK_M, BLOCK_N,
                                                       GROUPS_PAD, num_warps)
    total = gl.sum(tiles, axis=0)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    k_iters = gl.cdiv(K, BLOCK_K)
    my_tiles = persistent_tile_count(total)

    # Asking for a tile past the last one stays in range (clamped); its loads are predicated off.
    t = gl.minimum(persistent_tile_id(0), total - 1)
    g, off_m, off_n, row_end = _locate(t, idx, starts, ends, tiles, tiles_end, num_pid_n, BLOCK_M, BLOCK_N, GROUP_M)
    b_row, b_k = _rhs_coords(g, off_n, N, K, B_KMAJOR)
    prefetch(a_desc, b_desc, a_bufs, b_bufs, bars, 0, off_m, b_row, 0, k_iters * (my_tiles > 0).to(gl.int32),
             True, B_KMAJOR, STAGES, BLOCK_K, b_k)
    for i in range(my_tiles):
        acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
        acc = mainloop(a_desc, b_desc, a_bufs, b_bufs, bars, i * k_iters, off_m, b_row, 0, k_iters, acc,
                       True, B_KMAJOR, STAGES, BLOCK_K, b_k)
        tile_m, tile_n, tile_end = off_m, off_n, row_end

        # The ring is idle now: start the next tile's loads, then run this epilogue.
        t = gl.minimum(persistent_tile_id(i + 1), total - 1)
        g, off_m, off_n, row_end = _locate(t, idx, starts, ends, tiles, tiles_end, num_pid_n,
                                           BLOCK_M, BLOCK_N, GROUP_M)
        b_row, b_k = _rhs_coords(g, off_n, N, K, B_KMAJOR)
        prefetch(a_desc, b_desc, a_bufs, b_bufs, bars, (i + 1) * k_iters, off_m, b_row, 0,
                 k_iters * (i + 1 < my_tiles).to(gl.int32), True, B_KMAJOR, STAGES, BLOCK_K, b_k)

        out = acc.to(c_ptr.dtype.element_ty)
        if OUT_CONVERT:
            out = gl.convert_layout(out, store_layout(BLOCK_M, BLOCK_N, num_warps, False))
        store_masked(out, c_ptr, stride_cm, 1, tile_m, tile_n, tile_end, N, BLOCK_M, BLOCK_N)

"""Dense GEMM kernels for Hopper in Gluon: C = A @ B (+ bias), FP16/BF16 in and out, FP32 accumulate.

Both kernels compute an output tile [BLOCK_M, BLOCK_N] with async wgmma fed by a
STAGES-deep TMA ring (tilefly.gluon.tma_ring):

    shared memory   STAGES x (A tile + B tile), NVMMA 128-byte swizzle (64 16-bit
                    elements per swizzled row); A tile [BM, BK] when A is K-major
                    (row-major A), [BK, BM] otherwise; B tile [BN, BK] when B is
                    K-major (column-major B), [BK, BN] otherwise. wgmma reads
                    either orientation, so NN/NT/TN/TT are descriptors, not copies.
    barriers        one ``ready`` mbarrier per slot (expect-tx of both tiles'
                    bytes); warp-specialized variant adds one ``empty`` per slot
    registers       the FP32 accumulator in the wgmma layout: each warpgroup
                    (4 warps) owns 64-row slabs; BM*BN/(32*num_warps) values per
                    thread, at most 128 (128x256 over 8 warps)
    tails           TMA zero-fills out-of-bounds rows, columns and K; stores clip

``gemm_persistent_kernel`` (large tiles): one program per SM walks tiles in
grouped order (tilefly.gluon.scheduler), starts the next tile's first STAGES-1
loads before the current tile's epilogue, and stores through a [BM, BN] shared
buffer with one TMA store that overlaps the next tile's mainloop. The
``_ws`` variant moves the loads to a 1-warp producer partition.

``gemm_splitk_kernel`` (skinny shapes): one program per (tile, K-split). After
the mainloop the accumulator moves once (through shared memory) into a blocked
layout whose threads own 8 contiguous elements along the output's unit-stride
dimension; FP32 partials go to a workspace laid out the same way (16-byte
stores and loads), a per-tile int32 ticket picks the last program, which sums
the partials in split order, adds the bias and stores with a bounds mask, so
the output may have any strides (tilefly.gluon.epilogue). The launcher puts
the large dimension in the wgmma M slot (C^T = B^T A^T when M is the small
one): a decode GEMM streams the weight matrix through 64/128-row tiles while
the few tokens ride in the wgmma N slot (8..256).

Sizes are not specialized in the persistent kernels (one binary serves every
shape); the split-K kernel keeps M, N and the output strides specialized (on
== 1 and % 16), which is what makes its stores vector stores. The launcher
(tilefly.ops.gemm.launch) builds descriptors and grids.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import tma

from tilefly.gluon.epilogue import add_bias, finish_splitk, store_tma
from tilefly.gluon.layouts import wgmma_layout
from tilefly.gluon.scheduler import grouped_tile, persistent_tile_count, persistent_tile_id, splitk_tile
from tilefly.gluon.tma_ring import alloc_barriers, alloc_ring, issue_load, wait_empty
from tilefly.gluon.wgmma import mainloop, mainloop_consumer, prefetch

_PERSISTENT_INTS = ["M", "N", "K", "stride_bias"]
# M, N, the output strides and pointer stay specialized (== 1, % 16, 16-byte aligned): the
# masked store only becomes a 16-byte vector store when the unit stride is known and the
# bounds mask is known constant over 8 elements.
_SPLITK_INTS = ["K", "stride_bias", "iters_per_split"]


@gluon.jit
def _tile_of(i, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):
    # Clamped so asking for the tile after the last one stays in range.
    tile = gl.minimum(persistent_tile_id(i), num_pid_m * num_pid_n - 1)
    return grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)


@gluon.jit(do_not_specialize=_PERSISTENT_INTS, do_not_specialize_on_alignment=["bias_ptr"])
def gemm_persistent_kernel(a_desc, b_desc, c_desc, bias_ptr, M, N, K, stride_bias,
                           BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                           A_KMAJOR: gl.constexpr, B_KMAJOR: gl.constexpr, BIAS: gl.constexpr,
                           STAGES: gl.constexpr, GROUP_M: gl.constexpr, num_warps: gl.constexpr):
    acc_layout: gl.constexpr = wgmma_layout(BLOCK_M, BLOCK_N, num_warps)
    a_bufs, b_bufs, bars = alloc_ring(a_desc, b_desc, STAGES)
    c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)

    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    k_iters = gl.cdiv(K, BLOCK_K)
    my_tiles = persistent_tile_count(num_pid_m * num_pid_n)

    pid_m, pid_n = _tile_of(0, num_pid_m, num_pid_n, GROUP_M)
    prefetch(a_desc, b_desc, a_bufs, b_bufs, bars, 0, pid_m * BLOCK_M, pid_n * BLOCK_N, 0, k_iters,
             A_KMAJOR, B_KMAJOR, STAGES, BLOCK_K)
    for i in range(my_tiles):
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
        acc = mainloop(a_desc, b_desc, a_bufs, b_bufs, bars, i * k_iters, off_m, off_n, 0, k_iters, acc,
                       A_KMAJOR, B_KMAJOR, STAGES, BLOCK_K)
        # The ring is idle now: start the next tile's loads, then run this epilogue.
        pid_m, pid_n = _tile_of(i + 1, num_pid_m, num_pid_n, GROUP_M)
        next_iters = k_iters * (i + 1 < my_tiles).to(gl.int32)
        prefetch(a_desc, b_desc, a_bufs, b_bufs, bars, (i + 1) * k_iters, pid_m * BLOCK_M, pid_n * BLOCK_N, 0,
                 next_iters, A_KMAJOR, B_KMAJOR, STAGES, BLOCK_K)
        acc = add_bias(acc, bias_ptr, stride_bias, off_m, off_n, M, N, BLOCK_M, BLOCK_N, BIAS, num_warps)
        store_tma(acc, c_desc, c_smem, off_m, off_n)
    tma.store_wait(pendings=0)


@gluon.jit
def _ws_loads(a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
              A_KMAJOR: gl.constexpr, B_KMAJOR: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr):
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    k_iters = gl.cdiv(K, BLOCK_K)
    for i in range(persistent_tile_count(num_pid_m * num_pid_n)):
        pid_m, pid_n = _tile_of(i, num_pid_m, num_pid_n, GROUP_M)
        for k in range(k_iters):
            item = i * k_iters + k
            wait_empty(empty, item, STAGES)
            issue_load(a_desc, b_desc, a_bufs, b_bufs, ready, item, pid_m * BLOCK_M, pid_n * BLOCK_N, k * BLOCK_K,
                       A_KMAJOR, B_KMAJOR, STAGES)


@gluon.jit
def _ws_compute(a_bufs, b_bufs, ready, empty, c_desc, c_smem, bias_ptr, M, N, K, stride_bias,
                BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                A_KMAJOR: gl.constexpr, B_KMAJOR: gl.constexpr, BIAS: gl.constexpr,
                STAGES: gl.constexpr, GROUP_M: gl.constexpr, num_warps: gl.constexpr):
    # triton 3.6: the default partition must not return tensors, so the epilogue lives here.
    acc_layout: gl.constexpr = wgmma_layout(BLOCK_M, BLOCK_N, num_warps)
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    k_iters = gl.cdiv(K, BLOCK_K)
    for i in range(persistent_tile_count(num_pid_m * num_pid_n)):
        pid_m, pid_n = _tile_of(i, num_pid_m, num_pid_n, GROUP_M)
        acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
        acc = mainloop_consumer(a_bufs, b_bufs, ready, empty, i * k_iters, k_iters, acc, A_KMAJOR, B_KMAJOR, STAGES)
        acc = add_bias(acc, bias_ptr, stride_bias, pid_m * BLOCK_M, pid_n * BLOCK_N, M, N,
                       BLOCK_M, BLOCK_N, BIAS, num_warps)
        store_tma(acc, c_desc, c_smem, pid_m * BLOCK_M, pid_n * BLOCK_N)
    tma.store_wait(pendings=0)


@gluon.jit(do_not_specialize=_PERSISTENT_INTS, do_not_specialize_on_alignment=["bias_ptr"])
def gemm_persistent_ws_kernel(a_desc, b_desc, c_desc, bias_ptr, M, N, K, stride_bias,
                              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                              A_KMAJOR: gl.constexpr, B_KMAJOR: gl.constexpr, BIAS: gl.constexpr,
                              STAGES: gl.constexpr, GROUP_M: gl.constexpr, num_warps: gl.constexpr):
    a_bufs, b_bufs, ready = alloc_ring(a_desc, b_desc, STAGES)
    empty = alloc_barriers(STAGES)
    c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
    gl.warp_specialize([
        (_ws_compute, (a_bufs, b_bufs, ready, empty, c_desc, c_smem, bias_ptr, M, N, K, stride_bias,
                       BLOCK_M, BLOCK_N, BLOCK_K, A_KMAJOR, B_KMAJOR, BIAS, STAGES, GROUP_M, num_warps)),
        (_ws_loads, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K,
                     BLOCK_M, BLOCK_N, BLOCK_K, A_KMAJOR, B_KMAJOR, STAGES, GROUP_M)),
    ], [1], [24])


@gluon.jit(do_not_specialize=_SPLITK_INTS, do_not_specialize_on_alignment=["bias_ptr"])
def gemm_splitk_kernel(a_desc, b_desc, c_ptr, bias_ptr, ws_ptr, ticket_ptr,
                       M, N, K, stride_cm, stride_cn, stride_bias, iters_per_split,
                       BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                       A_KMAJOR: gl.constexpr, B_KMAJOR: gl.constexpr, BIAS: gl.constexpr,
                       C_ROWS_CONTIGUOUS: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
    acc_layout: gl.constexpr = wgmma_layout(BLOCK_M, BLOCK_N, num_warps)
    tile, off_m, off_n, split, num_splits = splitk_tile(N, BLOCK_M, BLOCK_N)
    k_first = split * iters_per_split
    k_iters = gl.minimum(iters_per_split, gl.cdiv(K, BLOCK_K) - k_first)

    a_bufs, b_bufs, bars = alloc_ring(a_desc, b_desc, STAGES)
    prefetch(a_desc, b_desc, a_bufs, b_bufs, bars, 0, off_m, off_n, k_first, k_iters,
             A_KMAJOR, B_KMAJOR, STAGES, BLOCK_K)
    acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
    acc = mainloop(a_desc, b_desc, a_bufs, b_bufs, bars, 0, off_m, off_n, k_first, k_iters, acc,
                   A_KMAJOR, B_KMAJOR, STAGES, BLOCK_K)

    finish_splitk(acc, ws_ptr, ticket_ptr, tile, split, num_splits, bias_ptr, stride_bias, c_ptr, stride_cm,
                  stride_cn, off_m, off_n, M, N, BLOCK_M, BLOCK_N, BIAS, C_ROWS_CONTIGUOUS, num_warps)

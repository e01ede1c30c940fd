"""Flash-attention forward for Hopper in Gluon, warp-specialized with two consumer warpgroups in
ping-pong: while one warpgroup runs the softmax of its key tile, the other's wgmmas keep the
tensor cores busy. Same math, masks, outputs and epilogue as kernels_fwd (whose helpers it
uses); configs ``m128n<BLOCK_N>w`` (configs.FwdConfig.pingpong).

Layout plan (128 query rows per program, BLOCK_N keys per step, head dim HEAD_DIM = D):

    grid            as kernels_fwd: (cdiv(Sq, 128), B * Hq), causal row tiles last to first.
    partitions      default: consumer warpgroup 0, 4 warps, query rows off_m .. off_m + 63;
                    worker 0: the loader, 1 warp at 24 registers (TMA issue only);
                    worker 1: consumer warpgroup 1, 4 warps, rows off_m + 64 .. off_m + 127.
                    A consumer's accumulators are kernels_fwd's at BLOCK_M = 64 over 4 warps.
    shared memory   Q [2, 64, D]: one box per consumer, later its O staging for the TMA store;
                    K and V rings of STAGES tiles [BLOCK_N, D]; NVMMA swizzled as in kernels_fwd.
    barriers        q_ready[2] (expect-tx); k_ready[s], v_ready[s] (expect-tx, one tile each);
                    k_empty[s], v_empty[s] with count 2: both consumers arrive once the wgmmas
                    reading the slot retired, then the loader refills it (its first pass over
                    the ring waits on the phase before, which is complete); turn[2], count 1:
                    the ping-pong token, turn[0] armed at start so warpgroup 0 goes first.
    schedule        consumer w, for key tile j = 0 .. n_tiles - 1 and one last step:
                      wait turn[w] -> issue S_j = Q K_j^T and O += P_{j-1} V_{j-1} (async)
                      -> arrive turn[1 - w] -> retire both -> release K_j and V_{j-1}
                      -> softmax of S_j and O rescale, while warpgroup 1 - w's wgmmas run.
                    The last step only adds P_last V_last. The tokens alternate strictly
                    (a consumer's step t needs the other's step t - 1 issued), so neither runs
                    more than one phase ahead and each turn wait sees phase t & 1. Both
                    consumers take the program's n_tiles: in causal tiles past warpgroup 0's
                    rows its scores are all masked, so P = 0 and alpha = 1 there (every row saw
                    key 0 in tile 0, so its running max is finite).
    registers       per consumer thread: S and P of its rows (64 * BLOCK_N / 128 FP32), O
                    (64 * D / 128 FP32), m and l; the consumers ask 240 registers (setmaxnreg),
                    the loader gives its share back.
    epilogue        kernels_fwd.store_outputs per warpgroup, its 64 rows.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from tilefly.gluon.layouts import wgmma_layout
from tilefly.gluon.tma_ring import alloc_barriers
from tilefly.gluon.wgmma import as_a_operand
from tilefly.ops.attention.kernels_fwd import _INTS, _rescale, _softmax, _tile, key_tiles, query_tile, store_outputs

WG_ROWS = gl.constexpr(64)             # query rows per consumer warpgroup
CONSUMER_WARPS = gl.constexpr(4)
LOADER_REGS = gl.constexpr(24)
CONSUMER_REGS = gl.constexpr(240)


@gluon.jit
def _loader(q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, k_ready, v_ready, k_empty, v_empty,
            b, h, hk, off_m, n_tiles, ROWS: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    for w in gl.static_range(2):
        mbarrier.expect(q_ready.index(w), q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [b, h, off_m + w * ROWS, 0], q_ready.index(w), q_bufs.index(w))
    for j in range(n_tiles):
        slot = j % STAGES
        free = ((j // STAGES) & 1) ^ 1
        mbarrier.wait(k_empty.index(slot), free)
        mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [b, hk, j * BLOCK_N, 0], k_ready.index(slot), k_bufs.index(slot))
        mbarrier.wait(v_empty.index(slot), free)
        mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [b, hk, j * BLOCK_N, 0], v_ready.index(slot), v_bufs.index(slot))


@gluon.jit
def _consumer(q_bufs, k_bufs, v_bufs, q_ready, k_ready, v_ready, k_empty, v_empty, turn, o_desc, lse_ptr,
              qk_scale, bh, b, h, off_m, Sq, Sk, n_full, n_tiles, W: gl.constexpr, ROWS: gl.constexpr,
              WARPS: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
              CAUSAL: gl.constexpr, STORE_LSE: gl.constexpr):
    o_layout: gl.constexpr = wgmma_layout(ROWS, HEAD_DIM, WARPS)
    s_layout: gl.constexpr = wgmma_layout(ROWS, BLOCK_N, WARPS)
    dtype: gl.constexpr = o_desc.dtype
    rows_m = off_m + W * ROWS
    q_smem = q_bufs.index(W)
    q_tile = q_smem.reshape([ROWS, HEAD_DIM])
    s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, s_layout)
    o = gl.zeros([ROWS, HEAD_DIM], gl.float32, o_layout)
    m_i = gl.full([ROWS], -float("inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([ROWS], gl.float32, gl.SliceLayout(1, s_layout))
    mbarrier.wait(q_ready.index(W), 0)

    # step 0: S_0 only
    mbarrier.wait(turn.index(W), 0)
    s = warpgroup_mma(q_tile, _tile(k_bufs, k_ready, 0, BLOCK_N, HEAD_DIM, STAGES).permute((1, 0)), s_zero,
                      use_acc=False, is_async=True)
    mbarrier.arrive(turn.index(1 - W), count=1)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    mbarrier.arrive(k_empty.index(0), count=1)
    p, alpha, m_i, l_i = _softmax(s, m_i, l_i, n_full == 0, 0, rows_m, Sk, qk_scale, ROWS, BLOCK_N, CAUSAL)
    p = as_a_operand(p, o_layout, dtype)
    for j in range(1, n_tiles):
        mbarrier.wait(turn.index(W), j & 1)
        s = warpgroup_mma(q_tile, _tile(k_bufs, k_ready, j, BLOCK_N, HEAD_DIM, STAGES).permute((1, 0)), s_zero,
                          use_acc=False, is_async=True)
        o = warpgroup_mma(p, _tile(v_bufs, v_ready, j - 1, BLOCK_N, HEAD_DIM, STAGES), o, is_async=True)
        mbarrier.arrive(turn.index(1 - W), count=1)
        s, o = warpgroup_mma_wait(num_outstanding=0, deps=(s, o))
        mbarrier.arrive(k_empty.index(j % STAGES), count=1)
        mbarrier.arrive(v_empty.index((j - 1) % STAGES), count=1)
        p, alpha, m_i, l_i = _softmax(s, m_i, l_i, j >= n_full, j, rows_m, Sk, qk_scale, ROWS, BLOCK_N, CAUSAL)
        o = _rescale(o, alpha)
        p = as_a_operand(p, o_layout, dtype)
    # last step: P_last V_last
    last = n_tiles - 1
    mbarrier.wait(turn.index(W), n_tiles & 1)
    o = warpgroup_mma(p, _tile(v_bufs, v_ready, last, BLOCK_N, HEAD_DIM, STAGES), o, is_async=True)
    mbarrier.arrive(turn.index(1 - W), count=1)
    o = warpgroup_mma_wait(num_outstanding=0, deps=(o,))
    mbarrier.arrive(v_empty.index(last % STAGES), count=1)

    store_outputs(o, m_i, l_i, q_smem, o_desc, lse_ptr, bh, b, h, rows_m, Sq, ROWS, HEAD_DIM, STORE_LSE)


@gluon.jit(do_not_specialize=_INTS)
def attention_fwd_ws_kernel(q_desc, k_desc, v_desc, o_desc, lse_ptr, qk_scale, Sq, Sk, Hq, GROUP,
                            BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                            STAGES: gl.constexpr, CAUSAL: gl.constexpr, STORE_LSE: gl.constexpr,
                            num_warps: gl.constexpr):
    gl.static_assert(BLOCK_M == 2 * WG_ROWS, "two consumer warpgroups of 64 rows")
    gl.static_assert(num_warps == CONSUMER_WARPS, "the default partition is consumer warpgroup 0")
    bh, b, h, hk, off_m = query_tile(Hq, GROUP, BLOCK_M, CAUSAL)
    n_full, n_tiles = key_tiles(Sk, off_m, BLOCK_M, BLOCK_N, CAUSAL)

    q_bufs = gl.allocate_shared_memory(q_desc.dtype, [2] + q_desc.block_type.shape, q_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_ready = alloc_barriers(2)
    k_ready = alloc_barriers(STAGES)
    v_ready = alloc_barriers(STAGES)
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(k_empty.index(i), count=2)
        mbarrier.init(v_empty.index(i), count=2)
    turn = alloc_barriers(2)
    mbarrier.arrive(turn.index(0), count=1)   # warpgroup 0 takes the first turn

    # Each partition's arguments spelled out: a tuple assembled by concatenation turns its
    # constexprs into runtime values.
    gl.warp_specialize([
        (_consumer, (q_bufs, k_bufs, v_bufs, q_ready, k_ready, v_ready, k_empty, v_empty, turn, o_desc, lse_ptr,
                     qk_scale, bh, b, h, off_m, Sq, Sk, n_full, n_tiles, 0, WG_ROWS, CONSUMER_WARPS, BLOCK_N,
                     HEAD_DIM, STAGES, CAUSAL, STORE_LSE)),
        (_loader, (q_desc, k_desc, v_desc, q_bufs, k_bufs, v_bufs, q_ready, k_ready, v_ready, k_empty, v_empty,
                   b, h, hk, off_m, n_tiles, WG_ROWS, BLOCK_N, STAGES)),
        (_consumer, (q_bufs, k_bufs, v_bufs, q_ready, k_ready, v_ready, k_empty, v_empty, turn, o_desc, lse_ptr,
                     qk_scale, bh, b, h, off_m, Sq, Sk, n_full, n_tiles, 1, WG_ROWS, CONSUMER_WARPS, BLOCK_N,
                     HEAD_DIM, STAGES, CAUSAL, STORE_LSE)),
    ], [1, CONSUMER_WARPS], [LOADER_REGS, CONSUMER_REGS])

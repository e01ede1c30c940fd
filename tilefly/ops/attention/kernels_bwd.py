"""Flash-attention backward for Hopper: dQ, dK, dV from dO, Q, K, V, the forward's output O and its
log-sum-exp. FP16/BF16 in and out, FP32 scores, P, dP, dS and accumulation. Three launches:

    delta           delta_i = rowsum(dO_i * O_i) in FP32, B x Hq x Sq (plain Triton: a memory-bound
                    row reduction; one program per BLOCK_S rows of one (batch, head); rows unit-stride,
                    16-byte aligned, as TMA wants them too).
    dK/dV           one program per (BLOCK_N key tile [x column chunk], batch * kv head); K_j and V_j land once by TMA
                    and stay; the program walks every Q tile of every q head of its group (GQA), so
                    dK_j and dV_j sum in registers, no atomics. Per Q tile (serial wgmma):
                        S^T  = K_j Q_i^T                 (K from shared memory, Q^T a permuted view)
                        P^T  = exp2(S^T * scale * log2e - lse_i * log2e), causal-masked
                        dV  += P^T dO_i                  (P^T from registers)
                        dP^T = V_j dO_i^T
                        dS^T = P^T * (dP^T - delta_i)
                        dK  += dS^T Q_i                  (dS^T from registers)
                    then dK * scale and dV go through K's and V's shared tiles to TMA stores.
    dQ              one program per (BLOCK_M query tile, batch * q head), the forward's walk over key
                    tiles: S = Q K^T and dP = dO V^T again, dS = P * (dP - delta), dQ += dS K.

Why a separate dQ pass rather than FP32 atomics from the dK/dV program: it recomputes two of the
five products (Q K^T and dO V^T), but needs no FP32 workspace, no zeroing and no cast pass, is
deterministic, and keeps the dK/dV program's registers for dK and dV alone (dK + dV + S^T + dP^T is
already ~200 per thread at head dim 128; a dQ partial on top would spill).

Layout plan (both Gluon kernels, head dim HEAD_DIM = D, a power of two; 96 and 192 run the 128 and
256 kernels, TMA zero-filling the padding columns and clipping them on store):

    accumulator rows  the dK/dV program's BLOCK_N key rows and the dQ program's BLOCK_M query rows,
                    16 per warp (num_warps = rows / 16, one warpgroup per 64). Every accumulator
                    (S^T, dP^T, dK, dV; S, dP, dQ) keeps warps along M only, so P^T / dS^T (dS) move
                    from an accumulator into the A operand of the next product inside registers.
    streamed tile   BLOCK_M query rows per step (dK/dV) or BLOCK_N keys per step (dQ).
    column chunks   a dK/dV program sums at most CHUNK = 128 columns of dK and dV (2 x 64 x 128 FP32
                    fill a warpgroup's registers): at D = 256, NCHUNK = 2 programs per key tile each
                    own one chunk (program id 0 = key tile * NCHUNK + chunk); both compute the full
                    S^T and dP^T, summing the chunks' products. The dQ program holds all D columns.
    TMA             4-D descriptors over [B, H, S, D] with the tensors' own strides, boxes
                    [1, 1, rows, CHUNK] (dK/dV) or [1, 1, rows, D] (dQ), as in the forward. Rows past
                    S and columns past D arrive as zeros; stores clip there.
    shared memory   dK/dV: K_j and V_j as NCHUNK [BLOCK_N, CHUNK] tiles (the owned chunk is reused to
                    stage dK and dV for the stores), a ring of STAGES (Q_i, dO_i) pairs, NCHUNK
                    [BLOCK_M, CHUNK] tiles each. dQ: Q_i and dO_i [BLOCK_M, D] (Q's tile stages dQ),
                    K and V rings of STAGES [BLOCK_N, D]. NVMMA swizzle as wide as the rows allow.
    barriers        dK/dV: kv_bar for K_j and V_j; ready[s] per ring slot, expect-tx on Q's and dO's
                    bytes together. Item t of the walk (q head t // n_m of the group, Q tile t % n_m)
                    sits in slot t % STAGES at phase (t // STAGES) & 1, refilled with item t + STAGES
                    after its last wgmma retired (Triton's CTA barrier comes before the copy). dQ: the
                    forward's k_ready / v_ready rings.
    registers       dK/dV per thread: dK, dV (2 * BLOCK_N*CHUNK/(32*warps) FP32), S^T/P^T and dP^T/dS^T
                    (2 * BLOCK_N*BLOCK_M/(32*warps)), lse and delta of the step's query columns: up
                    to 247 of 255 at D = 128 and 254 at 256 (causal). That is why S^T waits alone:
                    issuing S^T with dP^T, then dV with dK, spilled at D = 256 causal.
                    dQ: dQ (BLOCK_M*D/(32*warps)), S/P and dP/dS, lse and delta of its rows.
    masking         causal top-left (query row r sees keys 0..r, also when Sq != Sk): dK/dV skips Q tiles
                    wholly above the key tile and masks only those starting before its end; dQ masks
                    only key tiles from n_full on
                    (crossing Sk or the diagonal). Query rows past Sq read lse = +inf (P = 0) and
                    delta = 0; keys past Sk are zero rows of K and V, so their dK/dV rows (clipped on
                    store) and their dQ terms vanish, and dQ masks them anyway.
"""
from __future__ import annotations

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

from tilefly.gluon.layouts import wgmma_layout
from tilefly.gluon.tma_ring import alloc_barriers
from tilefly.gluon.wgmma import as_a_operand
from tilefly.ops.attention.kernels_fwd import _load, _tile, key_tiles, prefetch_kv, query_tile

LOG2E = gl.constexpr(1.4426950408889634)
# Sizes vary per call; unspecialized, one binary per (config, dtype, D, causal).
_INTS = ["Sq", "Sk", "Hq", "GROUP"]


# ---- delta = rowsum(dO * O) ---------------------------------------------------------------------

@triton.jit(do_not_specialize=["Sq", "H"])
def attention_bwd_delta_kernel(o_ptr, do_ptr, delta_ptr, Sq, H, HEAD_DIM, o_sb, o_sh, o_ss, do_sb, do_sh, do_ss,
                               BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """O and dO have unit-stride rows; strides divisible by 16 (Triton specializes them) give vector loads."""
    bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    rows = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    cols = tl.arange(0, BLOCK_D)
    mask = (rows < Sq)[:, None] & (cols < HEAD_DIM)[None, :]
    o_rows = o_ptr + b * o_sb + h * o_sh + rows.to(tl.int64) * o_ss
    do_rows = do_ptr + b * do_sb + h * do_sh + rows.to(tl.int64) * do_ss
    o = tl.load(o_rows[:, None] + cols[None, :], mask=mask, other=0.0)
    do = tl.load(do_rows[:, None] + cols[None, :], mask=mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(delta_ptr + bh.to(tl.int64) * Sq + rows, delta, mask=rows < Sq)


# ---- shared pieces ----------------------------------------------------------------------------

@gluon.jit
def _row_stats(lse_ptr, delta_ptr, bhq, idx, Sq):
    """lse * log2(e) and delta of query rows ``idx`` (in idx's layout); rows past Sq get +inf
    (so P = 0) and 0."""
    base = bhq.to(gl.int64) * Sq
    inside = idx < Sq
    lse2 = gl.load(lse_ptr + base + idx, mask=inside, other=float("inf")) * LOG2E
    delta = gl.load(delta_ptr + base + idx, mask=inside, other=0.0)
    return lse2, delta


# ---- dK, dV ----------------------------------------------------------------------------------

@gluon.jit
def _load_q_do(q_desc, do_desc, q_bufs, do_bufs, ready, t, total, per_head, m_first, b, hk, GROUP,
               BLOCK_M: gl.constexpr, NCHUNK: gl.constexpr, STAGES: gl.constexpr):
    """Start the TMA copies of walk item t (Q and dO of one tile of one q head, NCHUNK column chunks
    each) into its slot."""
    CHUNK: gl.constexpr = q_desc.block_type.shape[3]
    slot = t % STAGES
    pred = t < total
    h = hk * GROUP + t // per_head
    off_m = (m_first + t % per_head) * BLOCK_M
    bar = ready.index(slot)
    mbarrier.expect(bar, NCHUNK * (q_desc.block_type.nbytes + do_desc.block_type.nbytes), pred=pred)
    for c in gl.static_range(NCHUNK):
        tma.async_copy_global_to_shared(q_desc, [b, h, off_m, c * CHUNK], bar, q_bufs.index(slot * NCHUNK + c), pred)
        tma.async_copy_global_to_shared(do_desc, [b, h, off_m, c * CHUNK], bar, do_bufs.index(slot * NCHUNK + c),
                                        pred)


@gluon.jit
def _chunk(bufs, i, ROWS: gl.constexpr, CHUNK: gl.constexpr):
    """Buffer i of a chunked allocation as a [ROWS, CHUNK] operand."""
    return bufs.index(i).reshape([ROWS, CHUNK])


@gluon.jit(do_not_specialize=_INTS)
def attention_bwd_dkdv_kernel(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, lse_ptr, delta_ptr,
                              qk_scale, scale, Sq, Sk, Hq, GROUP,
                              BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr,
                              STAGES: gl.constexpr, CAUSAL: gl.constexpr, num_warps: gl.constexpr):
    gl.static_assert(BLOCK_N == 16 * num_warps, "one 16-row slab of keys per warp")
    # The descriptors' boxes are CHUNK columns wide; HEAD_DIM = NCHUNK chunks (1, or 2 at 256).
    CHUNK: gl.constexpr = k_desc.block_type.shape[3]
    NCHUNK: gl.constexpr = HEAD_DIM // CHUNK
    kv_layout: gl.constexpr = wgmma_layout(BLOCK_N, CHUNK, num_warps)
    st_layout: gl.constexpr = wgmma_layout(BLOCK_N, BLOCK_M, num_warps)
    dtype: gl.constexpr = k_desc.dtype

    off_n = (gl.program_id(0) // NCHUNK) * BLOCK_N
    own = gl.program_id(0) % NCHUNK          # the column chunk of dK and dV this program sums
    bhk = gl.program_id(1)
    hk_count = Hq // GROUP
    b = bhk // hk_count
    hk = bhk % hk_count

    k_smem = gl.allocate_shared_memory(dtype, [NCHUNK] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [NCHUNK] + v_desc.block_type.shape, v_desc.layout)
    q_bufs = gl.allocate_shared_memory(dtype, [STAGES * NCHUNK] + q_desc.block_type.shape, q_desc.layout)
    do_bufs = gl.allocate_shared_memory(dtype, [STAGES * NCHUNK] + do_desc.block_type.shape, do_desc.layout)
    kv_bar = alloc_barriers(1)
    ready = alloc_barriers(STAGES)

    # Q tiles with rows that see these keys: all, or (causal) those from row off_n on.
    n_m_all = gl.cdiv(Sq, BLOCK_M)
    m_first = 0
    if CAUSAL:
        m_first = gl.minimum(off_n // BLOCK_M, n_m_all)
    per_head = n_m_all - m_first
    total = GROUP * per_head
    per_head = gl.maximum(per_head, 1)   # a divisor, also when there is nothing to walk

    mbarrier.expect(kv_bar.index(0), NCHUNK * (k_desc.block_type.nbytes + v_desc.block_type.nbytes))
    for c in gl.static_range(NCHUNK):
        tma.async_copy_global_to_shared(k_desc, [b, hk, off_n, c * CHUNK], kv_bar.index(0), k_smem.index(c))
        tma.async_copy_global_to_shared(v_desc, [b, hk, off_n, c * CHUNK], kv_bar.index(0), v_smem.index(c))
    for i in gl.static_range(STAGES):
        _load_q_do(q_desc, do_desc, q_bufs, do_bufs, ready, i, total, per_head, m_first, b, hk, GROUP,
                   BLOCK_M, NCHUNK, STAGES)

    dk = gl.zeros([BLOCK_N, CHUNK], gl.float32, kv_layout)
    dv = gl.zeros([BLOCK_N, CHUNK], gl.float32, kv_layout)
    keys = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, st_layout))
    mbarrier.wait(kv_bar.index(0), 0)
    for t in range(total):
        slot = t % STAGES
        base = slot * NCHUNK
        h = hk * GROUP + t // per_head
        off_m = (m_first + t % per_head) * BLOCK_M
        cols = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))
        lse2, delta = _row_stats(lse_ptr, delta_ptr, b * Hq + h, cols, Sq)

        mbarrier.wait(ready.index(slot), (t // STAGES) & 1)
        st = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, st_layout)
        for c in gl.static_range(NCHUNK):
            st = warpgroup_mma(_chunk(k_smem, c, BLOCK_N, CHUNK),
                               _chunk(q_bufs, base + c, BLOCK_M, CHUNK).permute((1, 0)), st, use_acc=c > 0,
                               is_async=True)
        st = warpgroup_mma_wait(num_outstanding=0, deps=(st,))
        pt = gl.exp2(st * qk_scale - lse2[None, :])
        if CAUSAL:
            if off_m < off_n + BLOCK_N:   # the tile reaches above the diagonal (uniform branch)
                pt = gl.where(keys[:, None] <= cols[None, :], pt, 0.0)

        dv = warpgroup_mma(as_a_operand(pt, kv_layout, dtype), _chunk(do_bufs, base + own, BLOCK_M, CHUNK), dv,
                           is_async=True)
        dpt = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, st_layout)
        for c in gl.static_range(NCHUNK):
            dpt = warpgroup_mma(_chunk(v_smem, c, BLOCK_N, CHUNK),
                                _chunk(do_bufs, base + c, BLOCK_M, CHUNK).permute((1, 0)), dpt, use_acc=c > 0,
                                is_async=True)
        dv, dpt = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dpt))
        dst = pt * (dpt - delta[None, :])
        dk = warpgroup_mma(as_a_operand(dst, kv_layout, dtype), _chunk(q_bufs, base + own, BLOCK_M, CHUNK), dk,
                           is_async=True)
        dk = warpgroup_mma_wait(num_outstanding=0, deps=(dk,))
        # Every wgmma reading slot t retired: it may take item t + STAGES.
        _load_q_do(q_desc, do_desc, q_bufs, do_bufs, ready, t + STAGES, total, per_head, m_first, b, hk, GROUP,
                   BLOCK_M, NCHUNK, STAGES)

    # K's and V's chunks `own` are free once the last wgmma retired: they stage dK and dV.
    _chunk(k_smem, own, BLOCK_N, CHUNK).store((dk * scale).to(dtype))
    _chunk(v_smem, own, BLOCK_N, CHUNK).store(dv.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(dk_desc, [b, hk, off_n, own * CHUNK], k_smem.index(own))
    tma.async_copy_shared_to_global(dv_desc, [b, hk, off_n, own * CHUNK], v_smem.index(own))
    tma.store_wait(pendings=0)


# ---- dQ --------------------------------------------------------------------------------------

@gluon.jit(do_not_specialize=_INTS)
def attention_bwd_dq_kernel(q_desc, k_desc, v_desc, do_desc, dq_desc, lse_ptr, delta_ptr,
                            qk_scale, scale, Sq, Sk, Hq, GROUP,
                            BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                            STAGES: gl.constexpr, CAUSAL: gl.constexpr, num_warps: gl.constexpr):
    gl.static_assert(BLOCK_M == 16 * num_warps, "one 16-row slab of queries per warp")
    dq_layout: gl.constexpr = wgmma_layout(BLOCK_M, HEAD_DIM, num_warps)
    s_layout: gl.constexpr = wgmma_layout(BLOCK_M, BLOCK_N, num_warps)
    dtype: gl.constexpr = q_desc.dtype

    bh, b, h, hk, off_m = query_tile(Hq, GROUP, BLOCK_M, CAUSAL)

    q_smem = gl.allocate_shared_memory(dtype, q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, do_desc.block_type.shape, do_desc.layout)
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bar = alloc_barriers(1)
    k_ready = alloc_barriers(STAGES)
    v_ready = alloc_barriers(STAGES)

    n_full, n_tiles = key_tiles(Sk, off_m, BLOCK_M, BLOCK_N, CAUSAL)
    mbarrier.expect(q_bar.index(0), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [b, h, off_m, 0], q_bar.index(0), q_smem)
    tma.async_copy_global_to_shared(do_desc, [b, h, off_m, 0], q_bar.index(0), do_smem)
    prefetch_kv(k_desc, v_desc, k_bufs, v_bufs, k_ready, v_ready, n_tiles, b, hk, BLOCK_N, STAGES)

    rows = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
    lse2, delta = _row_stats(lse_ptr, delta_ptr, bh, rows, Sq)
    dq = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, dq_layout)
    q_tile = q_smem.reshape([BLOCK_M, HEAD_DIM])
    do_tile = do_smem.reshape([BLOCK_M, HEAD_DIM])
    mbarrier.wait(q_bar.index(0), 0)
    for j in range(n_tiles):
        k_tile = _tile(k_bufs, k_ready, j, BLOCK_N, HEAD_DIM, STAGES)
        s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        s = warpgroup_mma(q_tile, k_tile.permute((1, 0)), s, use_acc=False, is_async=True)
        v_tile = _tile(v_bufs, v_ready, j, BLOCK_N, HEAD_DIM, STAGES)
        dp = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
        dp = warpgroup_mma(do_tile, v_tile.permute((1, 0)), dp, use_acc=False, is_async=True)
        s, dp = warpgroup_mma_wait(num_outstanding=0, deps=(s, dp))
        p = gl.exp2(s * qk_scale - lse2[:, None])
        if j >= n_full:   # crosses Sk or the diagonal (uniform branch)
            cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            keep = (cols < Sk)[None, :]
            if CAUSAL:
                keep = keep & (cols[None, :] <= rows[:, None])
            p = gl.where(keep, p, 0.0)
        ds = p * (dp - delta[:, None])
        dq = warpgroup_mma(as_a_operand(ds, dq_layout, dtype), k_tile, dq, is_async=True)
        dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq,))
        _load(k_desc, k_bufs, k_ready, j + STAGES, n_tiles, b, hk, BLOCK_N, STAGES)
        _load(v_desc, v_bufs, v_ready, j + STAGES, n_tiles, b, hk, BLOCK_N, STAGES)

    # Q's tile is free once the last wgmma retired: it stages dQ for the TMA store.
    q_tile.store((dq * scale).to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(dq_desc, [b, h, off_m, 0], q_smem)
    tma.store_wait(pendings=0)

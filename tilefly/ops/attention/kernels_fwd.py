"""Flash-attention forward for Hopper in Gluon: O = softmax(scale * Q K^T [causal mask]) V, and the
log-sum-exp of every row. FP16/BF16 in and out, FP32 scores, softmax and accumulation.

Layout plan (BLOCK_M query rows x BLOCK_N keys per step, head dim HEAD_DIM = D):

    grid            (cdiv(Sq, BLOCK_M), B * Hq); causal programs take their row tiles last to
                    first, so the longest (most keys) start first. q head h reads kv head
                    h // GROUP (grouped-query attention).
    warps           BLOCK_M / 16: each warp owns a 16-row slab of the tile (one warpgroup per
                    64 rows). All wgmma accumulators keep warps along M only, which is what
                    lets P go from the S accumulator into the A operand of P V in registers.
    TMA             4-D descriptors over [B, H, S, D] with the tensors' own strides (a
                    transposed B x S x H x D projection needs no copy); boxes [1, 1, rows, D].
                    Rows past S in a (batch, head) arrive as zeros and stores clip there.
    shared memory   Q tile [BLOCK_M, D] loaded once (later reused to stage O for its TMA
                    store); K and V rings of STAGES tiles [BLOCK_N, D]; all NVMMA swizzled
                    (128 B for D*2 bytes a multiple of 128, else 64 or 32 B).
    barriers        q_bar; k_ready[s] and v_ready[s] per ring slot, expect-tx on one tile's
                    bytes, so S = Q K^T starts while V is still landing. Tile j sits in slot
                    j % STAGES at phase (j // STAGES) & 1; a key (value) slot is refilled with
                    tile j + STAGES once the wgmma reading it retired, after the CTA barrier
                    Triton puts before the copy (the other warpgroup may still be reading).
    registers       per thread: S and P for its rows (BLOCK_M*BLOCK_N/(32*warps) FP32), the O
                    accumulator (BLOCK_M*D/(32*warps) FP32), row max m and row sum l (the
                    quad of threads sharing a row holds copies).
    softmax         exp2 domain: scores scaled by scale*log2(e); O and l rescaled by
                    exp2(m_old - m_new) when a row's max grows. Only key tiles from n_full on
                    (crossing Sk or the diagonal; causal is top-left: row i sees keys 0..i)
                    are masked.
    schedules       serial (OVERLAP=False): per key tile, Q K^T, softmax, P V, each wgmma
                    retired before the next step; the unmasked and masked tiles run as two
                    loops. Overlapped (OVERLAP=True, configs named ...p): Q K_{j+1}^T is in
                    flight during the softmax of tile j, which holds two S tiles in
                    registers. Warp specialization with two consumer warpgroups in ping-pong:
                    kernels_fwd_ws.py (configs ...w).
    epilogue        O / l cast to the input dtype into Q's shared tile, one TMA store;
                    lse = (m + log2 l) * ln 2 (natural log, FP32) with a row-masked store.

NaN in a query row makes that row's scores NaN, hence its output and lse, as in PyTorch;
other rows are untouched. Every row sees key 0, so no row is ever fully masked.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

from tilefly.gluon.layouts import wgmma_layout
from tilefly.gluon.tma_ring import alloc_barriers
from tilefly.gluon.wgmma import as_a_operand

LN2 = gl.constexpr(0.6931471805599453)
# Sizes vary per call; keeping them unspecialized means one binary per (config, dtype, D, causal).
_INTS = ["Sq", "Sk", "Hq", "GROUP"]


@gluon.jit
def _load(desc, bufs, ready, j, n_tiles, b, hk, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """Start the TMA copy of key (or value) tile j into its slot (nothing past the last tile)."""
    slot = j % STAGES
    pred = j < n_tiles
    mbarrier.expect(ready.index(slot), desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(desc, [b, hk, j * BLOCK_N, 0], ready.index(slot), bufs.index(slot), pred)


@gluon.jit
def query_tile(Hq, GROUP, BLOCK_M: gl.constexpr, CAUSAL: gl.constexpr):
    """(bh, b, h, hk, off_m) of this program: grid (query tiles, B * Hq), q head h reading kv head
    hk = h // GROUP. Causal programs take their row tiles last to first, so the longest (most
    keys) start first."""
    num_m = gl.num_programs(0)
    pid_m = gl.program_id(0)
    if CAUSAL:
        pid_m = num_m - 1 - pid_m
    bh = gl.program_id(1)
    b = bh // Hq
    h = bh % Hq
    hk = h // GROUP
    off_m = pid_m * BLOCK_M
    return bh, b, h, hk, off_m


@gluon.jit
def key_tiles(Sk, off_m, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """(n_full, n_tiles): the key tiles a row tile starting at off_m needs, of which the first
    n_full need no mask (top-left causal: row i sees keys 0..i)."""
    n_tiles = gl.cdiv(Sk, BLOCK_N)
    n_full = Sk // BLOCK_N
    if CAUSAL:
        n_tiles = gl.minimum(n_tiles, gl.cdiv(off_m + BLOCK_M, BLOCK_N))
        n_full = gl.minimum(n_full, (off_m + 1) // BLOCK_N)
    return n_full, n_tiles


@gluon.jit
def prefetch_kv(k_desc, v_desc, k_bufs, v_bufs, k_ready, v_ready, n_tiles, b, hk, BLOCK_N: gl.constexpr,
                STAGES: gl.constexpr):
    """Fill the key and value rings: tiles 0 .. STAGES-1 (those that exist)."""
    for i in gl.static_range(STAGES):
        _load(k_desc, k_bufs, k_ready, i, n_tiles, b, hk, BLOCK_N, STAGES)
        _load(v_desc, v_bufs, v_ready, i, n_tiles, b, hk, BLOCK_N, STAGES)


@gluon.jit
def _tile(bufs, ready, j, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr):
    """Key (value) tile j as a [BLOCK_N, HEAD_DIM] operand, once it has landed."""
    slot = j % STAGES
    mbarrier.wait(ready.index(slot), (j // STAGES) & 1)
    # Dropping the descriptor's two unit dims leaves the 2-D NVMMA layout wgmma reads.
    return bufs.index(slot).reshape([BLOCK_N, HEAD_DIM])


@gluon.jit
def _issue_qk(q_tile, k_bufs, k_ready, j, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
              STAGES: gl.constexpr, num_warps: gl.constexpr):
    """Start S_j = Q K_j^T (async); returns its accumulator token."""
    k_tile = _tile(k_bufs, k_ready, j, BLOCK_N, HEAD_DIM, STAGES)
    s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, wgmma_layout(BLOCK_M, BLOCK_N, num_warps))
    return warpgroup_mma(q_tile, k_tile.permute((1, 0)), s, use_acc=False, is_async=True)


@gluon.jit
def _softmax(s, m_i, l_i, masked, j, off_m, Sk, qk_scale, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
             CAUSAL: gl.constexpr):
    """Online softmax of score tile j: (P unnormalized, alpha rescaling the old O and l, m, l).
    ``masked`` (constexpr or runtime) applies the Sk bound and the causal mask."""
    s_layout: gl.constexpr = s.type.layout
    s = s * qk_scale
    if masked:
        rows = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        keep = (cols < Sk)[None, :]
        if CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None])
        s = gl.where(keep, s, -float("inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1))
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_i


@gluon.jit
def _rescale(o, alpha):
    return o * gl.convert_layout(alpha, gl.SliceLayout(1, o.type.layout))[:, None]


@gluon.jit
def _attend(q_tile, k_desc, v_desc, k_bufs, v_bufs, k_ready, v_ready, o, m_i, l_i, lo, hi, n_tiles,
            b, hk, off_m, Sk, qk_scale,
            BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
            MASKED: gl.constexpr, CAUSAL: gl.constexpr, num_warps: gl.constexpr):
    """Serial schedule: key tiles lo..hi-1 into the running (o, m_i, l_i), each wgmma retired
    before the next step; MASKED applies the Sk and causal masks."""
    o_layout: gl.constexpr = o.type.layout
    for j in range(lo, hi):
        s = _issue_qk(q_tile, k_bufs, k_ready, j, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, num_warps)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
        p, alpha, m_i, l_i = _softmax(s, m_i, l_i, MASKED, j, off_m, Sk, qk_scale, BLOCK_M, BLOCK_N, CAUSAL)
        o = _rescale(o, alpha)
        v_tile = _tile(v_bufs, v_ready, j, BLOCK_N, HEAD_DIM, STAGES)
        o = warpgroup_mma(as_a_operand(p, o_layout, k_desc.dtype), v_tile, o, is_async=True)
        o = warpgroup_mma_wait(num_outstanding=0, deps=(o,))
        # Both wgmmas reading slot j have retired (in every warpgroup, after the CTA barrier
        # Triton places before the refill): it may take tile j + STAGES.
        _load(k_desc, k_bufs, k_ready, j + STAGES, n_tiles, b, hk, BLOCK_N, STAGES)
        _load(v_desc, v_bufs, v_ready, j + STAGES, n_tiles, b, hk, BLOCK_N, STAGES)
    return o, m_i, l_i


@gluon.jit
def _attend_overlapped(q_tile, k_desc, v_desc, k_bufs, v_bufs, k_ready, v_ready, o, m_i, l_i, n_full, n_tiles,
                       b, hk, off_m, Sk, qk_scale,
                       BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                       STAGES: gl.constexpr, CAUSAL: gl.constexpr, num_warps: gl.constexpr):
    """Overlapped schedule: S_{j+1} = Q K_{j+1}^T runs on the tensor cores while the warps run
    the softmax of S_j; P_j V_j then retires together with it. Every wgmma has retired at the
    end of a step, so no accumulator is in flight across the loop's back edge (ptxas would
    serialize all wgmmas otherwise: its C7514 warning). Costs one more live S tile of registers."""
    o_layout: gl.constexpr = o.type.layout
    s = _issue_qk(q_tile, k_bufs, k_ready, 0, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, num_warps)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    _load(k_desc, k_bufs, k_ready, STAGES, n_tiles, b, hk, BLOCK_N, STAGES)
    for j in range(n_tiles):
        # Key tiles may be masked from n_full on: a uniform runtime branch in the softmax.
        nxt = gl.minimum(j + 1, n_tiles - 1)    # the last step re-reads its own tile; discarded
        s_next = _issue_qk(q_tile, k_bufs, k_ready, nxt, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, num_warps)
        p, alpha, m_i, l_i = _softmax(s, m_i, l_i, j >= n_full, j, off_m, Sk, qk_scale, BLOCK_M, BLOCK_N, CAUSAL)
        p = as_a_operand(p, o_layout, k_desc.dtype)
        o = _rescale(o, alpha)
        v_tile = _tile(v_bufs, v_ready, j, BLOCK_N, HEAD_DIM, STAGES)
        o = warpgroup_mma(p, v_tile, o, is_async=True)
        s, o = warpgroup_mma_wait(num_outstanding=0, deps=(s_next, o))
        # Key tile j+1 and value tile j are read: their slots take the tiles STAGES ahead.
        _load(k_desc, k_bufs, k_ready, j + 1 + STAGES, n_tiles, b, hk, BLOCK_N, STAGES)
        _load(v_desc, v_bufs, v_ready, j + STAGES, n_tiles, b, hk, BLOCK_N, STAGES)
    return o, m_i, l_i


@gluon.jit(do_not_specialize=_INTS)
def attention_fwd_kernel(q_desc, k_desc, v_desc, o_desc, lse_ptr, qk_scale, Sq, Sk, Hq, GROUP,
                         BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                         STAGES: gl.constexpr, CAUSAL: gl.constexpr, STORE_LSE: gl.constexpr,
                         OVERLAP: gl.constexpr, num_warps: gl.constexpr):
    gl.static_assert(BLOCK_M == 16 * num_warps, "one 16-row slab per warp")
    o_layout: gl.constexpr = wgmma_layout(BLOCK_M, HEAD_DIM, num_warps)
    s_layout: gl.constexpr = wgmma_layout(BLOCK_M, BLOCK_N, num_warps)

    bh, b, h, hk, off_m = query_tile(Hq, GROUP, BLOCK_M, CAUSAL)

    q_smem = gl.allocate_shared_memory(q_desc.dtype, q_desc.block_type.shape, q_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bar = alloc_barriers(1)
    k_ready = alloc_barriers(STAGES)
    v_ready = alloc_barriers(STAGES)

    n_full, n_tiles = key_tiles(Sk, off_m, BLOCK_M, BLOCK_N, CAUSAL)
    mbarrier.expect(q_bar.index(0), q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [b, h, off_m, 0], q_bar.index(0), q_smem)
    prefetch_kv(k_desc, v_desc, k_bufs, v_bufs, k_ready, v_ready, n_tiles, b, hk, BLOCK_N, STAGES)

    o = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
    m_i = gl.full([BLOCK_M], -float("inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, s_layout))
    q_tile = q_smem.reshape([BLOCK_M, HEAD_DIM])
    mbarrier.wait(q_bar.index(0), 0)
    if OVERLAP:
        o, m_i, l_i = _attend_overlapped(q_tile, k_desc, v_desc, k_bufs, v_bufs, k_ready, v_ready, o, m_i, l_i,
                                         n_full, n_tiles, b, hk, off_m, Sk, qk_scale, BLOCK_M, BLOCK_N, HEAD_DIM,
                                         STAGES, CAUSAL, num_warps)
    else:
        o, m_i, l_i = _attend(q_tile, k_desc, v_desc, k_bufs, v_bufs, k_ready, v_ready, o, m_i, l_i, 0, n_full,
                              n_tiles, b, hk, off_m, Sk, qk_scale, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES,
                              False, CAUSAL, num_warps)
        o, m_i, l_i = _attend(q_tile, k_desc, v_desc, k_bufs, v_bufs, k_ready, v_ready, o, m_i, l_i, n_full,
                              n_tiles, n_tiles, b, hk, off_m, Sk, qk_scale, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES,
                              True, CAUSAL, num_warps)

    store_outputs(o, m_i, l_i, q_smem, o_desc, lse_ptr, bh, b, h, off_m, Sq, BLOCK_M, HEAD_DIM, STORE_LSE)


@gluon.jit
def store_outputs(o, m_i, l_i, q_smem, o_desc, lse_ptr, bh, b, h, off_m, Sq, BLOCK_M: gl.constexpr,
                    HEAD_DIM: gl.constexpr, STORE_LSE: gl.constexpr):
    """The forward's epilogue, shared by the kernels here and in kernels_fwd512: O / l staged in Q's
    shared tile (free once the last wgmma retired) for one TMA store clipped at Sq, and the
    natural-log lse = (m + log2 l) * ln 2 with a row-masked store."""
    o = o / gl.convert_layout(l_i, gl.SliceLayout(1, o.type.layout))[:, None]
    if STORE_LSE:
        rows = off_m + gl.arange(0, BLOCK_M, layout=m_i.type.layout)
        lse = (m_i + gl.log2(l_i)) * LN2
        gl.store(lse_ptr + bh.to(gl.int64) * Sq + rows, lse, mask=rows < Sq)
    q_smem.reshape([BLOCK_M, HEAD_DIM]).store(o.to(o_desc.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [b, h, off_m, 0], q_smem)
    tma.store_wait(pendings=0)

"""The scores kernel of the all-Gluon head-dim-512 backward (kernels_bwd512g, config ``bwd512g``):
per tile of one group's (batch, kv head) keys x rows, S^T = K Q^T and dP^T = V dO^T on the tensor
cores, then P^T, dS^T and dS in the input dtype written for the grouped GEMMs that follow. FP32
S and dP never leave registers (kernels_bwd512 writes and reads them: 16 of its 26 B/score).

    P  = exp2(S * scale * log2e - lse * log2e), 0 where causal-masked (query row i sees keys 0..i)
    dS = P * (dP - delta) * scale

Layout plan (BLOCK_N = 128 keys x BLOCK_M = 128 rows per program, 8 warps, D = 512):

    grid            (key tiles, row tiles, groups of the chunk). A group's rows are its G q heads'
                    query rows back to back (R = G * Sq; row r is query r % Sq).
    orientation     the accumulators are the transposed scores, [keys, rows]: P^T and dS^T (the A
                    operands of dV = P^T dO and dK = dS^T Q) then leave through a plain
                    shared-memory store; dS (A of dQ = dS K) leaves through the permuted view of
                    a [rows, keys] tile, the one transposed store. Lse and delta are per column.
    registers       S^T and dP^T in the wgmma layout warps_per_cta [8, 1], instr 16 x 128: warp w
                    owns keys 16w..16w+15, a thread 2 keys x 32 rows (16 pairs of adjacent
                    columns), 64 FP32 each; P^T and dS^T overwrite them. Lse and delta: 32 values
                    a thread (its columns), loaded after the mainloop. ptxas (sm_90a, triton 3.6):
                    195 registers, 242 causal, no spills, no serialized wgmmas.
    head dim        streamed in CHUNKS = 8 chunks of 64 columns (128 bytes). The stream has two
                    items per chunk c: item 2c = (K_c, Q_c), item 2c+1 = (V_c, dO_c), so one
                    ring of [128, 64] tile pairs (tilefly.gluon.tma_ring: A side K or V, B side Q
                    or dO, K-major both) serves both products; item 2c feeds S^T, 2c+1 dP^T,
                    each an async m64n128k16 wgmma chain per warpgroup (tilefly.gluon.wgmma's
                    mma_step: at most one group in flight, whose retirement frees the previous
                    item's slot for the item STAGES - 1 ahead, as in the GEMM mainloop).
    shared memory   STAGES = 6 slots x (16 + 16 KB) = 192 KB, 128-byte NVMMA swizzle (a 64-column
                    BF16 row is one 128-byte swizzle row). After the mainloop the ring is idle
                    and its A side (6 x 16 KB) is reinterpreted as three [128, 128] staging tiles
                    (128-byte swizzle, TMA splits each store into two 64-column boxes): P^T, dS^T
                    and dS. One CTA per SM either way (the accumulators alone take 128 registers
                    of 256 threads).
    barriers        one ``ready`` mbarrier per slot, expect-tx on both tiles' bytes (tma_ring).
    TMA             loads through 2-D descriptors over the chunk's [groups * rows, 512] Q, dO and
                    [groups * Sk, 512] K, V (a tail tile reads the next group's rows: computed,
                    never stored). Stores through 3-D descriptors over the workspace's
                    [groups, Sk, rows] (P^T, dS^T) and [groups, rows, Sk] (dS), which clip each
                    tile at its own group's Sk and rows.
    causal          per program, from the query indices of its rows: a tile wholly above the
                    diagonal issues no loads or wgmmas and stores zeros (the grouped GEMMs read
                    every tile); one the diagonal crosses masks element by element; others none.

NaN in q, k or v flows into the entries it touches; P is an exact zero where masked (as in
kernels_bwd512), so its products stay finite there.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, tma, warpgroup_mma_wait

from tilefly.gluon.epilogue import vector_layout
from tilefly.gluon.layouts import wgmma_layout
from tilefly.gluon.tma_ring import alloc_ring, issue_load, wait_ready
from tilefly.gluon.wgmma import mma_step

HEAD_DIM = 512
BLOCK_M = 128        # rows (queries) per program: the columns of S^T
BLOCK_N = 128        # keys per program: the rows of S^T
CHUNK = 64           # head-dim columns per stream item (128 bytes of FP16/BF16)
STAGES = 6           # ring slots, one item (a pair of [128, 64] tiles) each
NUM_WARPS = 8
DTYPES = ("bf16", "fp16")
LOG2E = gl.constexpr(1.4426950408889634)
_D = gl.constexpr(HEAD_DIM)      # as the JIT reads module globals
_INTS = ["rows", "Sk", "Sq", "group0", "row0", "group_rows"]


@gluon.jit
def _load_chunk_item(k_desc, q_desc, v_desc, do_desc, a_bufs, b_bufs, bars, item, key_row, q_row,
                     CHUNKS: gl.constexpr, STAGES: gl.constexpr, ODD: gl.constexpr):
    """Stream item ``item``: (K, Q) of chunk item // 2 when even, (V, dO) when odd (``ODD``, known
    at compile time because STAGES is even); nothing past the last chunk."""
    chunk = item // 2
    off_k = chunk * (_D // CHUNKS)
    if ODD:
        issue_load(v_desc, do_desc, a_bufs, b_bufs, bars, item, key_row, q_row, off_k, True, True, STAGES,
                   pred=chunk < CHUNKS)
    else:
        issue_load(k_desc, q_desc, a_bufs, b_bufs, bars, item, key_row, q_row, off_k, True, True, STAGES,
                   pred=chunk < CHUNKS)


@gluon.jit
def _transposed_scores(k_desc, q_desc, v_desc, do_desc, a_bufs, b_bufs, bars, key_row, q_row,
                       BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
                       st_layout: gl.constexpr):
    """(S^T, dP^T), every wgmma retired and every slot consumed."""
    CHUNKS: gl.constexpr = _D // k_desc.block_type.shape[1]
    gl.static_assert(STAGES % 2 == 0, "odd items are (V, dO): parity is static only with an even ring")
    for i in gl.static_range(STAGES - 1):
        _load_chunk_item(k_desc, q_desc, v_desc, do_desc, a_bufs, b_bufs, bars, i, key_row, q_row, CHUNKS, STAGES,
                         i % 2 == 1)
    st = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, st_layout)
    dpt = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, st_layout)
    for c in range(CHUNKS):
        item = 2 * c
        wait_ready(bars, item, STAGES)
        st = mma_step(a_bufs, b_bufs, item % STAGES, st, True, True)
        # Item - 1 (the previous dP^T step) retired: its slot takes item - 1 + STAGES.
        _load_chunk_item(k_desc, q_desc, v_desc, do_desc, a_bufs, b_bufs, bars, item - 1 + STAGES, key_row, q_row,
                         CHUNKS, STAGES, True)
        wait_ready(bars, item + 1, STAGES)
        dpt = mma_step(a_bufs, b_bufs, (item + 1) % STAGES, dpt, True, True)
        _load_chunk_item(k_desc, q_desc, v_desc, do_desc, a_bufs, b_bufs, bars, item + STAGES, key_row, q_row,
                         CHUNKS, STAGES, False)
    st, dpt = warpgroup_mma_wait(num_outstanding=0, deps=(st, dpt))
    return st, dpt


@gluon.jit
def _query_span(off_row, rows, row0, Sq, BLOCK_M: gl.constexpr, num_warps: gl.constexpr):
    """(lowest, highest) query index among this tile's rows inside the chunk (a tile may span two
    q heads of the group, so not simply its first and last row)."""
    r = off_row + gl.arange(0, BLOCK_M, layout=vector_layout(BLOCK_M, num_warps))
    query = (row0 + r) % Sq
    inside = r < rows
    return gl.min(gl.where(inside, query, 2147483647), axis=0), gl.max(gl.where(inside, query, -1), axis=0)


@gluon.jit(do_not_specialize=_INTS)
def attention_bwd512_scores_kernel(k_desc, q_desc, v_desc, do_desc, pt_desc, dst_desc, ds_desc, lse_ptr,
                                   delta_ptr, rows, Sk, Sq, group0, row0, group_rows, qk_scale, scale,
                                   BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                                   CAUSAL: gl.constexpr, num_warps: gl.constexpr):
    """Loads: K, V [groups * Sk, 512] and Q, dO [groups * rows, 512] of the chunk (boxes [128, 64]);
    stores: P^T, dS^T [groups, Sk, rows] and dS [groups, rows, Sk] (boxes [1, 128, 128]). lse and
    delta: [B * Hk, group_rows] FP32; the chunk starts at group ``group0``, row ``row0``."""
    gl.static_assert(BLOCK_M == BLOCK_N, "the three staging tiles share one shape")
    gl.static_assert(BLOCK_N == 16 * num_warps, "one 16-key slab per warp")
    st_layout: gl.constexpr = wgmma_layout(BLOCK_N, BLOCK_M, num_warps)
    dtype: gl.constexpr = k_desc.dtype
    off_key = gl.program_id(0) * BLOCK_N
    off_row = gl.program_id(1) * BLOCK_M
    g = gl.program_id(2)

    a_bufs, b_bufs, bars = alloc_ring(k_desc, q_desc, STAGES)
    # Once the ring is idle (after the mainloop, or unused) its A side holds the three output tiles.
    stage = a_bufs._reinterpret(dtype, [3] + pt_desc.block_type.shape, pt_desc.layout)

    skip = False
    crosses = False
    if CAUSAL:
        lowest, highest = _query_span(off_row, rows, row0, Sq, BLOCK_M, num_warps)
        skip = off_key > highest
        crosses = off_key + BLOCK_N - 1 > lowest
    if skip:
        pt = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, st_layout)
        dst = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, st_layout)
    else:
        st, dpt = _transposed_scores(k_desc, q_desc, v_desc, do_desc, a_bufs, b_bufs, bars, g * Sk + off_key,
                                     g * rows + off_row, BLOCK_N, BLOCK_M, STAGES, st_layout)
        cols = off_row + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))
        stats = (group0 + g).to(gl.int64) * group_rows + row0 + cols
        lse2 = gl.load(lse_ptr + stats, mask=cols < rows, other=float("inf")) * LOG2E
        delta = gl.load(delta_ptr + stats, mask=cols < rows, other=0.0)
        pt = gl.exp2(st * qk_scale - lse2[None, :])
        if crosses:
            keys = off_key + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, st_layout))
            pt = gl.where(keys[:, None] <= ((row0 + cols) % Sq)[None, :], pt, 0.0)
        dst = pt * (dpt - delta[None, :]) * scale
    stage.index(0).reshape([BLOCK_N, BLOCK_M]).store(pt.to(dtype))
    stage.index(1).reshape([BLOCK_N, BLOCK_M]).store(dst.to(dtype))
    stage.index(2).reshape([BLOCK_M, BLOCK_N]).permute((1, 0)).store(dst.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(pt_desc, [g, off_key, off_row], stage.index(0))
    tma.async_copy_shared_to_global(dst_desc, [g, off_key, off_row], stage.index(1))
    tma.async_copy_shared_to_global(ds_desc, [g, off_row, off_key], stage.index(2))
    tma.store_wait(pendings=0)


# ---- compile specs -----------------------------------------------------------------------------

def kernel_signature(dtype: str, causal: bool) -> tuple[dict, dict]:
    """Signature strings and constexprs of the kernel as kernels_bwd512g launches it."""
    element = {"bf16": gl.bfloat16, "fp16": gl.float16}[dtype]

    def desc(block: list[int]) -> str:
        layout = gl.NVMMASharedLayout.get_default_for(block, element)
        return f"tensordesc<{dtype}[{', '.join(map(str, block))}],{layout!r}>"

    load_k, load_q, store = desc([BLOCK_N, CHUNK]), desc([BLOCK_M, CHUNK]), desc([1, BLOCK_N, BLOCK_M])
    sig = {"k_desc": load_k, "q_desc": load_q, "v_desc": load_k, "do_desc": load_q, "pt_desc": store,
           "dst_desc": store, "ds_desc": desc([1, BLOCK_M, BLOCK_N]), "lse_ptr": "*fp32", "delta_ptr": "*fp32",
           **{name: "i32" for name in _INTS}, "qk_scale": "fp32", "scale": "fp32"}
    constexprs = dict(BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, STAGES=STAGES, CAUSAL=causal, num_warps=NUM_WARPS)
    sig.update({name: "constexpr" for name in constexprs})
    return sig, constexprs


def _kernel():
    return attention_bwd512_scores_kernel


def compile_specs():
    """The scores kernel per dtype x causal: the only binaries kernels_bwd512g launches."""
    from tilefly.compile_check import KernelSpec

    specs = []
    for dtype in DTYPES:
        for causal in (False, True):
            sig, constexprs = kernel_signature(dtype, causal)
            specs.append(KernelSpec(name=f"attention.bwd512g_scores[{dtype},{'causal' if causal else 'full'}]",
                                    kernel=_kernel, signature=sig, constexprs=constexprs, num_warps=NUM_WARPS,
                                    gluon=True, sass_must_contain=("HGMMA", "UTMASTG")))
    return specs

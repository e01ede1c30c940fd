"""MX GEMM kernel v3 for Hopper in Gluon: both operands upcast to BF16 inside the CTA, then one BF16
wgmma chain a slot, with no per-K-block work on the accumulator.

Same problem and contract as v1 and v2 (kernels.py explains the math): C = X @ Y^T, X [ROWS, K] and
Y [COLS, K] K-major MXFP8 bytes or MXFP4 nibble pairs, one E8M0 scale per row per 32 K.

Why: v2 multiplies FP8 tiles per 32-K block and scales every partial into the accumulator: at 64
tokens that is two partial elements per weight byte. Here the scale goes into the operand instead:
x * 2^(e - e_ref) is exact in BF16 (8 exponent bits) for every E4M3 or E2M1 value x, so a K-block's
scale is one BF16 multiply per element and the wgmmas of a slot accumulate back to back. Measured on
the H200 (BENCHMARKS.md, session 21): 23.4-25.1 us at 64 x 4096 x 4096 against v2's 28.6-32.9, so
the eager path runs it at 33-64 tokens; at 32 tokens it ties v2 (both ~20 us, 0.9 TB/s of weights:
Nsight Compute puts v2's stalls on its scale-word loads and CTA barriers; this kernel prefetches the
words two slots ahead and is no faster, so the bound is elsewhere) and at 8 tokens it loses (16.6 against 13.9 us).

Layout plan (one program per (output tile, K-split); num_warps 4 = one warpgroup, or 8 = two stacked
along M for BLOCK_M = 128):

    ring            v2's: STAGES slots of BLOCK_K = 128 K elements, X tile [BLOCK_M, 128] and Y tile
                    [BLOCK_N, 128] FP8 bytes (MXFP4: [*, 64] packed bytes), one TMA box per operand per
                    slot behind one ``ready`` mbarrier (tilefly.gluon.tma_ring), all slots issued up
                    front; slot s is refilled with slot s + STAGES as soon as every warp has read it
                    (a CTA barrier), before its wgmmas run.
    row reference   e_ref per X row and per Y row: the largest non-NaN scale byte of the row within
                    this program's K-range (``scale_row_max``, one pass over the scale bytes). Every
                    factor 2^(e - e_ref) is then <= 1, so upcast values stay <= 448 and none overflows;
                    a value underflows only where a row's scales span more than 2^117 (the BF16
                    route's limit, upcast.py). The epilogue multiplies row r and column c by
                    2^(e_ref - 127) each (scales.add_scaled: halves crossed, exact, one rounding).
    upcast          per K-block j of a slot, for X then Y: each thread loads 16 bytes of one row from
                    the ring slot (``block_layout``: 16 rows a warp, two threads a 32-element block;
                    MXFP4: 8 packed bytes, unpacked to E4M3 with v2's PRMT table), converts 4 values
                    at a time (``_UPCAST_ASM``: E4M3 -> F16 -> F32 -> BF16, exact, NaN kept) and
                    multiplies them by the row's BF16 factor (NaN for scale byte 255), and stores the
                    32 bytes into the BF16 block buffer [rows, 32] (64-byte NVMMA swizzle, two 16-byte
                    stores). 2.5 instructions a value plus the load and stores. Tiles with fewer
                    rows than the layout covers (Y of 8-32 tokens) are replicated: duplicate threads
                    store the same bytes.
    MMA             the slot's four K-blocks: four async BF16 wgmmas (K = 32, two instructions each)
                    from the block buffers, chained on one FP32 accumulator of
                    BLOCK_M * BLOCK_N / (32 * num_warps) values a thread. Slots go in pairs: with
                    SETS = 2 (two sets of block buffers, each buffer its own allocation so the
                    barrier pass does not serialize their stores) the second slot is upcast while the
                    first slot's wgmmas run; with SETS = 1 the first slot's wgmmas retire before the
                    second slot overwrites the set. Each pair drains before the loop's back edge
                    (a wgmma in flight there makes ptxas serialize all of them, C7514); an odd last
                    slot runs after the loop. Shared memory: STAGES ring slots plus SETS x 4 x
                    (BLOCK_M + BLOCK_N) x 64 bytes of BF16 buffers (the shipped 64x64 build, two slots and
                    two sets: 97 KB for MXFP8, 81 KB for MXFP4).
    scales          one 32-bit word (the 4 bytes of a slot's K-blocks) per thread row, v2's
                    ``slot_scale_words``, loaded two slots ahead so their latency hides behind two
                    slots of upcasts and MMAs (v2 loads one ahead and stalls on them).
    barriers        ``ready`` per ring slot; a CTA barrier after each slot's upcast (every warp has
                    read the ring slot and fenced its BF16 stores before any wgmma reads them).
    epilogue        the row and column rescale, then tilefly.gluon.epilogue.finish_splitk.
    tails           TMA zero-fills rows past ROWS/COLS and K past the end; their scale bytes read as
                    127 (2^0), so they contribute zeros.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from tilefly.gluon.epilogue import finish_splitk
from tilefly.gluon.layouts import wgmma_layout
from tilefly.gluon.scheduler import splitk_tile
from tilefly.gluon.tma_ring import alloc_ring, issue_load, wait_ready
from tilefly.ops.mx_gemm.fp4_unpack import _UNPACK_ASM, BLOCK_K, PACKED_BLOCK
from tilefly.ops.mx_gemm.scales import (BLOCKS_PER_SLOT, E8M0_NAN, SCALE_BLOCK, SCAN_K, add_scaled, scale_offsets,
                                        scan_layout, slot_scale_words, word_byte)

BF16_NAN = gl.constexpr(0x7FC0)
_INTS = ["K", "stride_sxr", "stride_sxc", "stride_syr", "stride_syc", "stride_bias", "slots_per_split"]

# Four E4M3 bytes ($2) and four BF16 factors ($3, $4: two a register) -> four BF16 values ($0, $1), byte
# i into element i. cvt.rn.f16x2.e4m3x2 is exact (every E4M3 value, NaN included, is an F16), the F32
# and BF16 conversions are exact (E4M3 has 3 mantissa bits), and the multiply by a power of two is
# exact until it underflows.
_UPCAST_ASM = gl.constexpr("""{
.reg .b16 q0, q1, h0, h1, h2, h3;
.reg .b32 p0, p1;
.reg .f32 f0, f1, f2, f3;
mov.b32 {q0, q1}, $2;
cvt.rn.f16x2.e4m3x2 p0, q0;
cvt.rn.f16x2.e4m3x2 p1, q1;
mov.b32 {h0, h1}, p0;
mov.b32 {h2, h3}, p1;
cvt.f32.f16 f0, h0;
cvt.f32.f16 f1, h1;
cvt.f32.f16 f2, h2;
cvt.f32.f16 f3, h3;
cvt.rn.bf16x2.f32 p0, f1, f0;
cvt.rn.bf16x2.f32 p1, f3, f2;
mul.rn.bf16x2 $0, p0, $3;
mul.rn.bf16x2 $1, p1, $4;
}""")


@gluon.constexpr_function
def block_layout(fp4, rows, num_warps):
    """Registers of one K-block [rows, 32] as loaded from the ring slot: a thread holds 16 values of
    one row (8 when the tile is too small to give every thread 16), the threads of a row side by
    side, warps stacked along the rows. MXFP4 threads hold the packed bytes of those values."""
    values = max(8, min(16, rows // num_warps))
    per_row = 32 // values
    # Lanes go down the rows first (order [0, 1]): a quarter-warp's 16-byte accesses then land on eight rows,
    # i.e. eight different 16-byte bank groups under the 128-byte swizzle; row-first lanes put four rows of
    # two chunks there, two ways on each group (Nsight Compute at 7a9fab4: 7.7 wavefronts a shared load).
    # Timed level with the row-first order on the wide builds (BENCHMARKS.md session 47).
    return gl.BlockedLayout([1, values // 2 if fp4 else values], [32 // per_row, per_row], [num_warps, 1], [0, 1])


@gluon.constexpr_function
def bf16_block_layout(rows):
    return gl.NVMMASharedLayout.get_default_for([rows, 32], gl.bfloat16)


@gluon.jit
def alloc_block_buffers(ROWS: gl.constexpr, SETS: gl.constexpr):
    """SETS x 4 BF16 K-block buffers [ROWS, 32], each its own allocation: stores into one then
    another need no CTA barrier between them (the barrier pass tells allocations apart, not the
    slices of one)."""
    layout: gl.constexpr = bf16_block_layout(ROWS)
    bufs = (gl.allocate_shared_memory(gl.bfloat16, [ROWS, SCALE_BLOCK], layout),
            gl.allocate_shared_memory(gl.bfloat16, [ROWS, SCALE_BLOCK], layout),
            gl.allocate_shared_memory(gl.bfloat16, [ROWS, SCALE_BLOCK], layout),
            gl.allocate_shared_memory(gl.bfloat16, [ROWS, SCALE_BLOCK], layout))
    if SETS == 2:
        bufs = bufs + (gl.allocate_shared_memory(gl.bfloat16, [ROWS, SCALE_BLOCK], layout),
                       gl.allocate_shared_memory(gl.bfloat16, [ROWS, SCALE_BLOCK], layout),
                       gl.allocate_shared_memory(gl.bfloat16, [ROWS, SCALE_BLOCK], layout),
                       gl.allocate_shared_memory(gl.bfloat16, [ROWS, SCALE_BLOCK], layout))
    return bufs


@gluon.jit
def scale_row_max(s_ptr, off, n_idx, kb_first, n_kb, k_blocks, stride_r, stride_c,
                  SWIZZLED: gl.constexpr, BLOCK: gl.constexpr, num_warps: gl.constexpr):
    """Per row of [off, off + BLOCK): the largest scale byte other than NaN (255) among K-blocks
    [kb_first, kb_first + n_kb), as int32; 127 for rows past ``n_idx`` or with no such byte."""
    layout: gl.constexpr = scan_layout(num_warps)
    idx = off + gl.arange(0, BLOCK, layout=gl.SliceLayout(1, layout))
    best = gl.full([BLOCK, SCAN_K], -1, gl.int32, layout)
    for k0 in range(0, n_kb, SCAN_K):
        kb = kb_first + k0 + gl.arange(0, SCAN_K, layout=gl.SliceLayout(0, layout))
        mask = (idx < n_idx)[:, None] & (kb < kb_first + n_kb)[None, :]
        offs = scale_offsets(idx[:, None], kb[None, :], k_blocks, stride_r, stride_c, SWIZZLED)
        bits = gl.load(s_ptr + offs, mask=mask, other=0).to(gl.int32)
        best = gl.maximum(best, gl.where(mask & (bits != E8M0_NAN), bits, -1))
    top = gl.max(best, axis=1)
    return gl.where(top < 0, 127, top)


@gluon.jit
def block_factor(bits, e_ref):
    """2^(bits - e_ref) as BF16, exactly (subnormal down to 2^-133, zero below); NaN for byte 255."""
    d = bits - e_ref
    subnormal = gl.where(d >= -133, 1 << gl.maximum(d + 133, 0), 0)
    pattern = gl.where(d >= -126, (d + 127) << 7, subnormal)
    pattern = gl.where(bits == E8M0_NAN, BF16_NAN, pattern)
    return pattern.to(gl.uint16).to(gl.bfloat16, bitcast=True)


@gluon.jit
def upcast_block(slot_tile, dst, factor, j: gl.constexpr, FP4: gl.constexpr, ROWS: gl.constexpr,
                 num_warps: gl.constexpr):
    """K-block j of a ring slot tile [ROWS, slot bytes] -> BF16 [ROWS, 32] in ``dst``, row r times
    factor[r] (``factor``: BF16 [ROWS] in SliceLayout(1, block_layout))."""
    layout: gl.constexpr = block_layout(FP4, ROWS, num_warps)
    if FP4:
        packed = slot_tile.slice(j * PACKED_BLOCK, PACKED_BLOCK, dim=1).load(layout)
        lo, hi = gl.inline_asm_elementwise(_UNPACK_ASM, "=r,=r,r", [packed], dtype=(gl.uint8, gl.uint8),
                                           is_pure=True, pack=4)
        codes = gl.reshape(gl.join(lo, hi), [ROWS, SCALE_BLOCK])     # (low, high) nibble = (k even, k odd)
        half, _ = gl.broadcast(factor[:, None], packed)
        factors = gl.reshape(gl.join(half, half), [ROWS, SCALE_BLOCK])
    else:
        codes = slot_tile.slice(j * SCALE_BLOCK, SCALE_BLOCK, dim=1).load(layout).to(gl.uint8, bitcast=True)
        factors, _ = gl.broadcast(factor[:, None], codes)
    values = gl.inline_asm_elementwise(_UPCAST_ASM, "=r,=r,r,r,r", [codes, factors], dtype=gl.bfloat16,
                                       is_pure=True, pack=4)
    dst.store(values)


@gluon.jit
def upcast_slot(slot_tile, bf_bufs, FIRST: gl.constexpr, words, e_ref, kb0, k_blocks, FP4: gl.constexpr,
                ROWS: gl.constexpr, num_warps: gl.constexpr):
    """The slot's four K-blocks into BF16 block buffers FIRST .. FIRST + 3."""
    for j in gl.static_range(BLOCKS_PER_SLOT):
        factor = block_factor(word_byte(words, j, kb0 + j, k_blocks), e_ref)
        upcast_block(slot_tile, bf_bufs[FIRST + j], factor, j, FP4, ROWS, num_warps)


@gluon.jit
def pair_words(sx_ptr, sy_ptr, rows, cols, M, N, kb_pair, kb_last_slot, k_blocks, stride_sxr, stride_sxc,
               stride_syr, stride_syc, X_SWIZZLED: gl.constexpr, Y_SWIZZLED: gl.constexpr, X_WORDS: gl.constexpr,
               Y_WORDS: gl.constexpr, HALF: gl.constexpr):
    """X and Y scale words of slot HALF of the pair starting at K-block ``kb_pair`` (clamped to the
    program's last slot: a word past it is loaded but never used)."""
    kb0 = gl.minimum(kb_pair + HALF * BLOCKS_PER_SLOT, kb_last_slot)
    wx = slot_scale_words(sx_ptr, rows, M, kb0, k_blocks, stride_sxr, stride_sxc, X_SWIZZLED, X_WORDS)
    wy = slot_scale_words(sy_ptr, cols, N, kb0, k_blocks, stride_syr, stride_syc, Y_SWIZZLED, Y_WORDS)
    return wx, wy


@gluon.jit
def slot_step(x_desc, y_desc, x_bufs, y_bufs, bars, x_bf, y_bf, acc, s, k_slots, slot_first, off_m, off_n,
              wx, wy, x_ref, y_ref, k_blocks, FIRST: gl.constexpr, FP4: gl.constexpr, BLOCK_M: gl.constexpr,
              BLOCK_N: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
    """Slot s: upcast into block buffers FIRST .. FIRST + 3, refill its ring slot, issue its four
    wgmmas (async: the caller waits)."""
    SLOT_BYTES: gl.constexpr = x_desc.block_type.shape[1]
    slot = s % STAGES
    kb0 = (slot_first + s) * BLOCKS_PER_SLOT
    wait_ready(bars, s, STAGES)
    upcast_slot(x_bufs.index(slot), x_bf, FIRST, wx, x_ref, kb0, k_blocks, FP4, BLOCK_M, num_warps)
    upcast_slot(y_bufs.index(slot), y_bf, FIRST, wy, y_ref, kb0, k_blocks, FP4, BLOCK_N, num_warps)
    fence_async_shared()
    # Every warp has read the ring slot and fenced its BF16 stores: refill, then multiply.
    gl.thread_barrier()
    ahead = s + STAGES
    issue_load(x_desc, y_desc, x_bufs, y_bufs, bars, ahead, off_m, off_n, (slot_first + ahead) * SLOT_BYTES,
               True, True, STAGES, pred=ahead < k_slots)
    for j in gl.static_range(BLOCKS_PER_SLOT):
        acc = warpgroup_mma(x_bf[FIRST + j], y_bf[FIRST + j].permute((1, 0)), acc, is_async=True)
    return acc


@gluon.jit(do_not_specialize=_INTS, do_not_specialize_on_alignment=["bias_ptr"])
def mx_gemm_v3_kernel(x_desc, y_desc, sx_ptr, sy_ptr, c_ptr, bias_ptr, ws_ptr, ticket_ptr,
                      M, N, K, stride_sxr, stride_sxc, stride_syr, stride_syc, stride_cm, stride_cn, stride_bias,
                      slots_per_split,
                      BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, FP4: gl.constexpr,
                      X_SWIZZLED: gl.constexpr, Y_SWIZZLED: gl.constexpr, X_WORDS: gl.constexpr,
                      Y_WORDS: gl.constexpr, SETS: gl.constexpr, BIAS: gl.constexpr,
                      C_ROWS_CONTIGUOUS: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
    acc_layout: gl.constexpr = wgmma_layout(BLOCK_M, BLOCK_N, num_warps, 16)
    x_rows_layout: gl.constexpr = gl.SliceLayout(1, block_layout(FP4, BLOCK_M, num_warps))
    y_rows_layout: gl.constexpr = gl.SliceLayout(1, block_layout(FP4, BLOCK_N, num_warps))
    SLOT_BYTES: gl.constexpr = x_desc.block_type.shape[1]     # 128 (FP8) or 64 (packed FP4)
    tile, off_m, off_n, split, num_splits = splitk_tile(N, BLOCK_M, BLOCK_N)
    k_blocks = K // SCALE_BLOCK
    slot_first = split * slots_per_split
    k_slots = gl.minimum(slots_per_split, gl.cdiv(K, BLOCK_K) - slot_first)
    kb_first = slot_first * BLOCKS_PER_SLOT
    kb_last_slot = (slot_first + k_slots - 1) * BLOCKS_PER_SLOT
    n_kb = gl.minimum(k_slots * BLOCKS_PER_SLOT, k_blocks - kb_first)

    x_bufs, y_bufs, bars = alloc_ring(x_desc, y_desc, STAGES)
    x_bf = alloc_block_buffers(BLOCK_M, SETS)
    y_bf = alloc_block_buffers(BLOCK_N, SETS)
    for i in gl.static_range(STAGES):
        issue_load(x_desc, y_desc, x_bufs, y_bufs, bars, i, off_m, off_n, (slot_first + i) * SLOT_BYTES,
                   True, True, STAGES, pred=i < k_slots)

    ex_ref = scale_row_max(sx_ptr, off_m, M, kb_first, n_kb, k_blocks, stride_sxr, stride_sxc, X_SWIZZLED,
                           BLOCK_M, num_warps)
    ey_ref = scale_row_max(sy_ptr, off_n, N, kb_first, n_kb, k_blocks, stride_syr, stride_syc, Y_SWIZZLED,
                           BLOCK_N, num_warps)
    x_ref = gl.convert_layout(ex_ref, x_rows_layout)
    y_ref = gl.convert_layout(ey_ref, y_rows_layout)
    rows = off_m + gl.arange(0, BLOCK_M, layout=x_rows_layout)
    cols = off_n + gl.arange(0, BLOCK_N, layout=y_rows_layout)
    # Scale words of the current pair of slots, loaded one pair ahead.
    wx0, wy0 = pair_words(sx_ptr, sy_ptr, rows, cols, M, N, kb_first, kb_last_slot, k_blocks, stride_sxr,
                          stride_sxc, stride_syr, stride_syc, X_SWIZZLED, Y_SWIZZLED, X_WORDS, Y_WORDS, 0)
    wx1, wy1 = pair_words(sx_ptr, sy_ptr, rows, cols, M, N, kb_first, kb_last_slot, k_blocks, stride_sxr,
                          stride_sxc, stride_syr, stride_syc, X_SWIZZLED, Y_SWIZZLED, X_WORDS, Y_WORDS, 1)
    acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
    # Slots go in pairs: slot 2p + 1 is upcast while slot 2p's wgmmas run, and each pair drains
    # before the loop's back edge (a wgmma in flight there makes ptxas serialize them all, C7514).
    for pair in range(k_slots // 2):
        s = 2 * pair
        kb_ahead = kb_first + (s + 2) * BLOCKS_PER_SLOT
        wx2, wy2 = pair_words(sx_ptr, sy_ptr, rows, cols, M, N, kb_ahead, kb_last_slot, k_blocks, stride_sxr,
                              stride_sxc, stride_syr, stride_syc, X_SWIZZLED, Y_SWIZZLED, X_WORDS, Y_WORDS, 0)
        wx3, wy3 = pair_words(sx_ptr, sy_ptr, rows, cols, M, N, kb_ahead, kb_last_slot, k_blocks, stride_sxr,
                              stride_sxc, stride_syr, stride_syc, X_SWIZZLED, Y_SWIZZLED, X_WORDS, Y_WORDS, 1)
        acc = slot_step(x_desc, y_desc, x_bufs, y_bufs, bars, x_bf, y_bf, acc, s, k_slots, slot_first, off_m, off_n,
                        wx0, wy0, x_ref, y_ref, k_blocks, 0, FP4, BLOCK_M, BLOCK_N, STAGES, num_warps)
        if SETS == 1:   # one set: this slot's wgmmas must retire before the next slot overwrites it
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        acc = slot_step(x_desc, y_desc, x_bufs, y_bufs, bars, x_bf, y_bf, acc, s + 1, k_slots, slot_first, off_m,
                        off_n, wx1, wy1, x_ref, y_ref, k_blocks, (SETS - 1) * BLOCKS_PER_SLOT, FP4, BLOCK_M, BLOCK_N,
                        STAGES, num_warps)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        wx0, wy0, wx1, wy1 = wx2, wy2, wx3, wy3
    if k_slots % 2:
        acc = slot_step(x_desc, y_desc, x_bufs, y_bufs, bars, x_bf, y_bf, acc, k_slots - 1, k_slots, slot_first,
                        off_m, off_n, wx0, wy0, x_ref, y_ref, k_blocks, 0, FP4, BLOCK_M, BLOCK_N, STAGES, num_warps)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    ex = gl.convert_layout(ex_ref, gl.SliceLayout(1, acc_layout))
    ey = gl.convert_layout(ey_ref, gl.SliceLayout(0, acc_layout))
    acc = add_scaled(gl.zeros_like(acc), acc, ex, ey)
    finish_splitk(acc, ws_ptr, ticket_ptr, tile, split, num_splits, bias_ptr, stride_bias, c_ptr, stride_cm,
                  stride_cn, off_m, off_n, M, N, BLOCK_M, BLOCK_N, BIAS, C_ROWS_CONTIGUOUS, num_warps)

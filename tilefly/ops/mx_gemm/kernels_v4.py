"""MX GEMM kernel v4 for Hopper in Gluon, MXFP4 only: the block scales folded into the FP8 operands
while the FP4 nibbles are unpacked, so a slot's four K-blocks chain on one wgmma accumulator and the
FP32 scaling runs once a slot instead of once a K-block.

Same problem and contract as v1-v3 (kernels.py explains the math): C = X @ Y^T, X [ROWS, K] and
Y [COLS, K] packed E2M1 nibble pairs, K-major, one E8M0 scale per row per 32 K.

Why: on decode shapes v2's staged MXFP4 build is bound by instructions, not bytes (0.5-0.9 TB/s of
weights, BENCHMARKS.md session 23): per 128-K slot a thread unpacks its nibbles and then scales four
FP32 partials, two FP32 ops per accumulator element per K-block. Here the scale goes into the operand:
an E2M1 value times 2^d is an E4M3 normal for every d in [-5, 0] (0.5 * 2^-5 = 2^-6, E4M3's smallest
normal), so if every K-block scale of a row in a slot lies within 2^5 of that row's largest scale in
the slot (e_max), unpacking through a table whose exponent fields are lowered by e_max - e gives
x * 2^(e - e_max) exactly, and the slot's partial needs one scaling by 2^(ex_max + ey_max - 254).

Layout plan (one program per (output tile, K-split), num_warps 4 = one warpgroup; BLOCK_M 64 or 128):

    ring            v2's: STAGES slots of 128 K, X [BLOCK_M, 64] and Y [BLOCK_N, 64] packed bytes, one
                    TMA box per operand behind one ``ready`` mbarrier (tilefly.gluon.tma_ring), all
                    slots issued up front; slot s is refilled with s + STAGES after its wgmmas retire.
    staged scales   v2's (scales.load_scale_words / stage_words): every scale word of the program's
                    K-range (at most SCALE_SLOTS slots) in shared memory before the loop. The same
                    registers give ``fold_bits``: bit s set when slot s folds, i.e. every row of both
                    tiles spans at most 2^FOLD_SPAN over the slot's four K-blocks (NaN spans 128+).
    unpack          one unpacked FP8 buffer per operand, [rows, 128] with the 128-byte NVMMA swizzle.
                    A thread holds 16 packed bytes = one K-block of one row (fp4_unpack's ``packed_layout``
                    viewed as [rows, 4 blocks, 16]); folded slots look its nibbles up in the E4M3
                    table of the eight E2M1 magnitudes with every nonzero entry's exponent field
                    lowered by e_max - e (``folded_tables``: two integer ops per row and block, the
                    PRMT program ``fp4_unpack._UNPACK_TABLE_ASM``), other slots as v2's
                    (``unpack_fp4_slot``: values times 2^-6, made good in ``add_block``).
    MMA             folded slot: four async FP8 wgmmas (one a K-block) chained into one FP32 partial,
                    retired, then ``add_slot`` (one FMA and one multiply an element: v2's plain decode
                    of the slot's largest scale bytes when the program's scales are all moderate, else
                    the exact paths of scales.py). Other slots: v2's block-by-block sequence (two
                    partials, ``add_block``). Registers: the accumulator and two partials, as v2.
    PDL             as v2's (kernels_v2.py).
    barriers        ``ready`` per ring slot; a CTA barrier before each slot's unpack (the previous
                    slot's wgmmas, which read the unpacked buffers, retired in every warp) and after
                    it (fence_async_shared, then every warp's stores are visible to the wgmmas).
    X_REGS          (``MXConfig.x_regs``, what ``configs.pick`` runs at 33-64 tokens) folded slots feed X to the
                    wgmma from registers instead of the unpacked buffer: no X stores, and the wgmma reads only Y
                    from shared memory. A thread loads 16 packed bytes, one K-block of one row, from the ring slot
                    (``x_packed_layout``: the rows a thread holds are those of its wgmma A fragment, rows 16w + g
                    and g + 8 of each 64), unpacks them as above, and the 32 values are renamed into the fragment by
                    a reshape and permute that the compiler proves register-only
                    (``convert_layout(assert_trivial=True)``). That order is not K order: the fragment's K position
                    32i + 16h + 4q + c (wgmma i, half h, lane q % 4, byte c) holds K element 32q + 8i + 4h + c of
                    the slot (``fragment_order``), a permutation inside the slot, and Y's unpacked tile is stored
                    permuted the same way, so the four wgmmas still sum every product once. The folded scale factors
                    are per element, so the order does not matter to them; slots that do not fold take the K-ordered
                    buffers and v2's per-block path, as without X_REGS. Unpacking the next slot while this one's
                    register-A wgmma ran (a second Y buffer, 3f473a9) took 1.2-1.9x the time on every decode shape
                    (decode probe at d3f67b9, BENCHMARKS.md session 28), so it was removed.
    epilogue        tilefly.gluon.epilogue.finish_splitk, as v2.
    tails           TMA zero-fills rows past ROWS/COLS and K past the end; their staged scale bytes
                    are 127, so they contribute zeros (a K-tail slot may then not fold: its unused
                    blocks read 2^0 against the row's real scales).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from tilefly.gluon.epilogue import finish_splitk
from tilefly.gluon.grid_dependency import wait_prior_grid
from tilefly.gluon.layouts import wgmma_layout
from tilefly.gluon.scheduler import splitk_tile
from tilefly.gluon.tma_ring import alloc_ring, issue_load, wait_ready
from tilefly.ops.mx_gemm.fp4_unpack import (BLOCK_K, FOLD_SPAN, PACKED_BLOCK, SHIFTED_PRODUCT_EXP, block_layout3,
                                            max_byte, min_byte, table_unpack, tables_below, unpack_fp4_slot)
from tilefly.ops.mx_gemm.kernels_v2 import block_operands, slot_block_3, slot_blocks_0_to_2, x_blocks
from tilefly.ops.mx_gemm.scales import (BLOCKS_PER_SLOT, SCALE_BLOCK, add_scaled_any, load_program_scales,
                                        program_scale_paths, stage_words)

_INTS = ["K", "stride_sxr", "stride_sxc", "stride_syr", "stride_syc", "stride_bias", "slots_per_split"]


@gluon.jit
def word_span(words):
    """Per word: largest minus smallest of its four bytes."""
    return max_byte(words) - min_byte(words)


@gluon.jit
def slot_fold_bits(staged_x, staged_y, SLOTS: gl.constexpr):
    """int32 with bit s set when slot s folds: every row of both tiles spans at most 2^FOLD_SPAN
    over the slot's four K-blocks (``staged_*``: [rows, SLOTS] words in one layout)."""
    span = gl.maximum(gl.max(word_span(staged_x), axis=0), gl.max(word_span(staged_y), axis=0))
    slot = gl.arange(0, SLOTS, layout=span.type.layout)
    return gl.sum(gl.where(span <= FOLD_SPAN, 1 << slot, 0), axis=0)


@gluon.jit
def folded_tables(words, num_warps: gl.constexpr):
    """Per row (``words``: the slot's scale words, int32 [rows] in the rows slice of block_layout3)
    and K-block j: the two table words of the E4M3 bytes of the E2M1 magnitudes times
    2^(e_j - e_max), [rows, 4] each. Every nonzero entry has its exponent field lowered by
    e_max - e_j (<= FOLD_SPAN in a folded slot, so no field drops below 1); the zero entry (byte 0
    of the low word) stays zero."""
    return folded_tables_in(words, gl.SliceLayout(2, block_layout3(num_warps)))


@gluon.jit
def folded_tables_in(words, layout: gl.constexpr):
    """``folded_tables`` for words in the rows slice of ``layout``, a [rows, 4] layout."""
    return tables_below(max_byte(words), words, layout)


@gluon.jit
def unpack_folded_bytes(bytes_, lo_table, hi_table, ROWS: gl.constexpr):
    """Packed E2M1 bytes [ROWS, 4, 16] (a K-block per [r, j, :]) and their rows' table words [ROWS, 4]
    (``folded_tables``, in the slice layout of the bytes' dim 2) -> the E4M3 bytes [ROWS, 128] in K order."""
    lo, hi = table_unpack(bytes_, lo_table, hi_table)
    return gl.reshape(gl.join(lo, hi), [ROWS, BLOCK_K])    # (block, byte, low/high nibble) = K order


@gluon.jit
def folded_values(packed, words, ROWS: gl.constexpr, num_warps: gl.constexpr):
    """Packed E2M1 slot [ROWS, 64] in shared memory -> E4M3 bytes [ROWS, 128] with each K-block of row r
    scaled by 2^(e - e_max(r)) (``words``: the slot's scale words of the rows)."""
    layout3: gl.constexpr = block_layout3(num_warps)
    bytes_ = gl.convert_layout(gl.reshape(packed.load(gl.BlockedLayout([1, 16], [8, 4], [num_warps, 1], [1, 0])),
                                          [ROWS, BLOCKS_PER_SLOT, PACKED_BLOCK]), layout3)
    lo_table, hi_table = folded_tables(words, num_warps)
    return unpack_folded_bytes(bytes_, lo_table, hi_table, ROWS)


@gluon.jit
def unpack_fp4_folded(packed, unpacked, words, ROWS: gl.constexpr, num_warps: gl.constexpr):
    """``folded_values`` stored into the FP8 buffer ``unpacked`` [ROWS, 128]."""
    unpacked.store(folded_values(packed, words, ROWS, num_warps).to(gl.float8e4nv, bitcast=True))


@gluon.constexpr_function
def x_packed_layout(block_m, blocks_dim):
    """X_REGS: a packed X slot, [block_m, 64] bytes (``blocks_dim`` False) or [block_m, 4, 16] (True).
    Each thread holds 16 bytes, a K-block, of the rows its wgmma A fragment holds: lanes 4g + q take
    rows g and g + 8 of each 64-row slab (registers), block q (lanes), warp w rows 16w + (warps)."""
    def at(row, byte):
        return [row, byte // 16, byte % 16] if blocks_dim else [row, byte]

    reg = [at(0, 1), at(0, 2), at(0, 4), at(0, 8), at(8, 0)]
    slab = 64
    while slab < block_m:
        reg.append(at(slab, 0))
        slab *= 2
    shape = [block_m, BLOCKS_PER_SLOT, PACKED_BLOCK] if blocks_dim else [block_m, BLOCK_K // 2]
    return gl.DistributedLinearLayout(reg_bases=reg, lane_bases=[at(0, 16), at(0, 32), at(1, 0), at(2, 0), at(4, 0)],
                                      warp_bases=[at(16, 0), at(32, 0)], block_bases=[], shape=shape)


@gluon.jit
def fragment_order(values, ROWS: gl.constexpr):
    """E4M3 bytes [ROWS, 128] of a slot in K order -> the order of X_REGS's fragments (module docstring):
    position 32i + 16h + 4q + c takes K element 32q + 8i + 4h + c."""
    parts = gl.permute(gl.reshape(values, [ROWS, 4, 4, 2, 4]), (0, 2, 3, 1, 4))
    return gl.reshape(parts, [ROWS, BLOCK_K])


@gluon.jit
def x_operand_folded(packed, words, BLOCK_M: gl.constexpr, acc_layout: gl.constexpr):
    """X_REGS: a folded X slot (packed [BLOCK_M, 64] in shared memory, ``words`` the slot's staged scale
    words) as the wgmma's register A operand, in ``fragment_order``."""
    layout3: gl.constexpr = x_packed_layout(BLOCK_M, True)
    bytes_ = gl.convert_layout(gl.reshape(packed.load(x_packed_layout(BLOCK_M, False)),
                                          [BLOCK_M, BLOCKS_PER_SLOT, PACKED_BLOCK]), layout3, assert_trivial=True)
    row_words = words.load(gl.SliceLayout(1, gl.SliceLayout(2, layout3)))
    lo_table, hi_table = folded_tables_in(row_words, gl.SliceLayout(2, layout3))
    values = fragment_order(unpack_folded_bytes(bytes_, lo_table, hi_table, BLOCK_M), BLOCK_M)
    return gl.convert_layout(values.to(gl.float8e4nv, bitcast=True),
                             gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=4), assert_trivial=True)


@gluon.jit
def add_slot(acc, partial, wx, wy, moderate, plain):
    """acc + a folded slot's partial times 2^(ex_max - 127) * 2^(ey_max - 127) per row and column."""
    ex = max_byte(wx)
    ey = max_byte(wy)
    if plain:
        fx = (ex << 23).to(gl.float32, bitcast=True)
        fy = (ey << 23).to(gl.float32, bitcast=True)
        acc = gl.fma(partial * fx[:, None], fy[None, :], acc)
    else:
        acc = add_scaled_any(acc, partial, ex, ey, moderate)
    return acc


@gluon.jit(do_not_specialize=_INTS, do_not_specialize_on_alignment=["bias_ptr"])
def mx_gemm_v4_kernel(x_desc, y_desc, sx_ptr, sy_ptr, c_ptr, bias_ptr, ws_ptr, ticket_ptr,
                      M, N, K, stride_sxr, stride_sxc, stride_syr, stride_syc, stride_cm, stride_cn, stride_bias,
                      slots_per_split,
                      BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, FP4: gl.constexpr,
                      X_SWIZZLED: gl.constexpr, Y_SWIZZLED: gl.constexpr, X_WORDS: gl.constexpr,
                      Y_WORDS: gl.constexpr, BIAS: gl.constexpr, C_ROWS_CONTIGUOUS: gl.constexpr,
                      STAGES: gl.constexpr, SCALE_SLOTS: gl.constexpr, X_REGS: gl.constexpr,
                      PDL: gl.constexpr, num_warps: gl.constexpr):
    if PDL:   # launched early (programmatic dependent launch): nothing read yet may predate the kernel ahead
        wait_prior_grid()
    gl.static_assert(FP4, "v4 folds scales into unpacked FP4 operands: MXFP4 only")
    gl.static_assert(num_warps == 4, "one warpgroup")
    acc_layout: gl.constexpr = wgmma_layout(BLOCK_M, BLOCK_N, num_warps, 8)
    SLOT_BYTES: gl.constexpr = x_desc.block_type.shape[1]     # 64 packed bytes
    tile, off_m, off_n, split, num_splits = splitk_tile(N, BLOCK_M, BLOCK_N)
    k_blocks = K // SCALE_BLOCK
    slot_first = split * slots_per_split
    k_slots = gl.minimum(slots_per_split, gl.cdiv(K, BLOCK_K) - slot_first)
    kb_first = slot_first * BLOCKS_PER_SLOT
    # Issued before the ring, so these loads are not queued behind its operand bytes.
    staged_x, staged_y = load_program_scales(sx_ptr, sy_ptr, off_m, off_n, M, N, kb_first, k_slots, k_blocks,
                                             stride_sxr, stride_sxc, stride_syr, stride_syc, X_SWIZZLED, Y_SWIZZLED,
                                             X_WORDS, Y_WORDS, BLOCK_M, BLOCK_N, SCALE_SLOTS, num_warps)

    x_bufs, y_bufs, bars = alloc_ring(x_desc, y_desc, STAGES)
    x_fp8 = gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_M, BLOCK_K],
                                      gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_K], gl.float8e4nv))
    y_fp8 = gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_N, BLOCK_K],
                                      gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_K], gl.float8e4nv))
    for i in gl.static_range(STAGES):
        issue_load(x_desc, y_desc, x_bufs, y_bufs, bars, i, off_m, off_n, (slot_first + i) * SLOT_BYTES,
                   True, True, STAGES, pred=i < k_slots)

    moderate, plain = program_scale_paths(staged_x, staged_y)
    fold_bits = slot_fold_bits(staged_x, staged_y, SCALE_SLOTS)
    words_x = stage_words(staged_x, BLOCK_M, SCALE_SLOTS)
    words_y = stage_words(staged_y, BLOCK_N, SCALE_SLOTS)
    gl.thread_barrier()

    acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
    even = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
    odd = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
    for s in range(k_slots):
        slot = s % STAGES
        kb0 = (slot_first + s) * BLOCKS_PER_SLOT
        wait_ready(bars, s, STAGES)
        wx = words_x.index(s).load(gl.SliceLayout(1, acc_layout))
        wy = words_y.index(s).load(gl.SliceLayout(0, acc_layout))
        # The previous slot's wgmmas (readers of the unpacked buffers) retired in every warp.
        gl.thread_barrier()
        if ((fold_bits >> s) & 1) != 0:
            rows_layout: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, block_layout3(num_warps)))
            y_values = folded_values(y_bufs.index(slot), words_y.index(s).load(rows_layout), BLOCK_N, num_warps)
            if X_REGS:
                x_op = x_operand_folded(x_bufs.index(slot), words_x.index(s), BLOCK_M, acc_layout)
                y_fp8.store(fragment_order(y_values, BLOCK_N).to(gl.float8e4nv, bitcast=True))
                fence_async_shared()
                gl.thread_barrier()
                even = warpgroup_mma(x_op, y_fp8.permute((1, 0)), even, use_acc=False, is_async=True)
            else:
                unpack_fp4_folded(x_bufs.index(slot), x_fp8, words_x.index(s).load(rows_layout), BLOCK_M, num_warps)
                y_fp8.store(y_values.to(gl.float8e4nv, bitcast=True))
                fence_async_shared()
                gl.thread_barrier()
                for j in gl.static_range(BLOCKS_PER_SLOT):
                    x_op, y_op = block_operands(x_fp8, y_fp8, j)
                    even = warpgroup_mma(x_op, y_op, even, use_acc=j > 0, is_async=True)
            even = warpgroup_mma_wait(num_outstanding=0, deps=(even,))
            acc = add_slot(acc, even, wx, wy, moderate, plain)
        else:
            unpack_fp4_slot(x_bufs.index(slot), x_fp8, BLOCK_M, num_warps)
            unpack_fp4_slot(y_bufs.index(slot), y_fp8, BLOCK_N, num_warps)
            fence_async_shared()
            gl.thread_barrier()
            x0, x1, x2, x3 = x_blocks(x_fp8)
            acc, even, odd = slot_blocks_0_to_2(x0, x1, x2, x3, y_fp8, acc, even, odd, wx, wy, kb0, k_blocks,
                                                moderate, plain, False, SHIFTED_PRODUCT_EXP)
            acc, odd = slot_block_3(acc, odd, wx, wy, kb0, k_blocks, moderate, plain, False, SHIFTED_PRODUCT_EXP)
        # Both paths retired every wgmma and read the ring slot during the unpack: refill it.
        ahead = s + STAGES
        issue_load(x_desc, y_desc, x_bufs, y_bufs, bars, ahead, off_m, off_n, (slot_first + ahead) * SLOT_BYTES,
                   True, True, STAGES, pred=ahead < k_slots)

    finish_splitk(acc, ws_ptr, ticket_ptr, tile, split, num_splits, bias_ptr, stride_bias, c_ptr, stride_cm,
                  stride_cn, off_m, off_n, M, N, BLOCK_M, BLOCK_N, BIAS, C_ROWS_CONTIGUOUS, num_warps)

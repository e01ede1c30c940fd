"""FP4 (E2M1) -> FP8 (E4M3) unpack programs shared by the MX kernels (v2, v3, v4), and the scale fold
that rides on them.

Packed MXFP4 bytes hold two E2M1 values (even K in the low nibble). The wgmma takes FP8, so every slot's
nibbles become E4M3 bytes in registers first. Two programs:

    shifted     a nibble's sign to bit 7 and its three magnitude bits to bits 4..2 (seven integer ops for
                8 values, ``_UNPACK_SHIFTED_ASM``): the E4M3 byte of the value times 2^-6, exact for all 16
                codes (code 1, 0.5, lands on the E4M3 subnormal 2^-7). A wgmma over two such operands gives
                2^-12 of the true products (SHIFTED_PRODUCT_EXP); over one shifted and one table operand 2^-6
                (FOLDED_PRODUCT_EXP). v2's default.
    table       PRMT looks the three magnitude bits up in an 8-byte table of E4M3 bytes (``unpack_ptx``, 17
                ops for 8 values): the exact values (``E4M3_OF_E2M1_*``, v3) or, with per-row and per-block
                tables (``tables_below``), the values times 2^(e - top), the block's scale folded in: an E2M1
                value times 2^-d is an E4M3 normal for d in 0..FOLD_SPAN (0.5 * 2^-5 = 2^-6, the smallest
                normal), so lowering every nonzero entry's exponent field by d is exact (v4, v2's FOLD_Y).

Layouts: ``packed_layout`` gives a thread 16 packed bytes (one K-block of one row, 4 threads a 64-byte
row, 8 rows a warp); ``block_layout3`` is the same viewed as [rows, 4 K-blocks, 16 bytes], so a thread's
table is one (row, block) pair. ``unpack_fp4_slot`` and ``unpack_fp4_slot_below`` store each K-block's 16
even-K values, then its 16 odd-K ones: no byte shuffles, and a permutation inside each block, the same in
both operands, which the block's dot product does not see.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from tilefly.ops.mx_gemm.scales import BLOCKS_PER_SLOT, SCALE_BLOCK

BLOCK_K = gl.constexpr(BLOCKS_PER_SLOT * SCALE_BLOCK)   # K elements a ring slot holds (128)
PACKED_BLOCK = gl.constexpr(SCALE_BLOCK // 2)            # packed bytes of one K-block


@gluon.constexpr_function
def packed_layout(num_warps, rows=None):
    """16 packed bytes a thread, 4 threads a 64-byte row, 8 rows a warp. A tile of ``rows`` fewer
    than that covers (the token side at 8 or 16 tokens) is spread instead, 64 * rows / threads bytes
    a thread (at least 4), rather than replicated in every warp."""
    per_thread = 16
    if rows is not None:
        while per_thread > 4 and rows * 64 < per_thread * 32 * num_warps:
            per_thread //= 2
    row_threads = 64 // per_thread
    return gl.BlockedLayout([1, per_thread], [32 // row_threads, row_threads], [num_warps, 1], [1, 0])


# E4M3 bytes of the E2M1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 (codes 0..7; v1's fp4_to_e4m3_bits),
# bytes 0-3 and 4-7 of an 8-byte table that PRMT indexes with a 3-bit code.
E4M3_OF_E2M1_LO = 0x3C383000
E4M3_OF_E2M1_HI = 0x4C484440

# Four packed bytes (one 32-bit register, pack=4) -> the E4M3 bytes of their low nibbles ($0) and of
# their high nibbles ($1). Per nibble set: mask the 3-bit magnitude codes into the low bits of each
# byte, fold bytes (0,1) and (2,3) into the four selector nibbles of one PRMT, look the four
# magnitudes up in the table, and OR in the sign (nibble bit 3 -> byte bit 7). 17 instructions
# for 8 values, against ~10 integer ops a value for the arithmetic formula of the exact value
# (``_UNPACK_SHIFTED_ASM`` below gives the value times 2^-6 in seven ops for 8 values).
def unpack_ptx(lut_lo: str, lut_hi: str) -> str:
    """The unpack's instructions with the table's low and high words in registers ``lut_lo`` and
    ``lut_hi``, declared by the caller (kernels_v4 passes per-row tables as operands)."""
    return f"""and.b32 code, $2, 0x07070707;
shr.u32 fold, code, 4;
or.b32 fold, fold, code;
prmt.b32 sel, fold, fold, 0x0020;
prmt.b32 mag, {lut_lo}, {lut_hi}, sel;
shl.b32 sgn, $2, 4;
and.b32 sgn, sgn, 0x80808080;
or.b32 $0, mag, sgn;
shr.u32 code, $2, 4;
and.b32 code, code, 0x07070707;
shr.u32 fold, code, 4;
or.b32 fold, fold, code;
prmt.b32 sel, fold, fold, 0x0020;
prmt.b32 mag, {lut_lo}, {lut_hi}, sel;
and.b32 sgn, $2, 0x80808080;
or.b32 $1, mag, sgn;
"""


_UNPACK_ASM = gl.constexpr("{\n.reg .b32 lut0, lut1, code, fold, sel, mag, sgn;\n"
                           f"mov.b32 lut0, {E4M3_OF_E2M1_LO:#x};\nmov.b32 lut1, {E4M3_OF_E2M1_HI:#x};\n"
                           + unpack_ptx("lut0", "lut1") + "}")


# Four packed bytes -> the E4M3 bytes of their nibbles' values times 2^-6, low nibbles ($0) and high
# nibbles ($1). A nibble's sign goes to bit 7 and its magnitude bits e1 e0 m to bits 4..2: the E4M3
# exponent field then holds e (0..3) and the mantissa's top bit m, so the byte's value is
# 2^(e - 7) * (1 + m/2), the E2M1 value 2^(e - 1) * (1 + m/2) times 2^-6; for e = 0 it is the E4M3
# subnormal m * 2^-7, E2M1's m * 0.5 times 2^-6. Seven instructions for 8 values, against the table
# lookup's 17 (``_UNPACK_ASM``, what v3 and v4's folded slots use for exact values). The bytes of a
# word move across byte lanes in the shifts, but each mask keeps only bits that came from the byte's
# own nibble.
_UNPACK_SHIFTED_ASM = gl.constexpr("""{
.reg .b32 mag, sgn;
shl.b32 mag, $2, 2;
and.b32 mag, mag, 0x1C1C1C1C;
shl.b32 sgn, $2, 4;
and.b32 sgn, sgn, 0x80808080;
or.b32 $0, mag, sgn;
shr.u32 mag, $2, 2;
and.b32 mag, mag, 0x1C1C1C1C;
and.b32 sgn, $2, 0x80808080;
or.b32 $1, mag, sgn;
}""")
SHIFTED_PRODUCT_EXP = gl.constexpr(12)   # a product of two shifted-unpacked operands is 2^-12 of the true one
FOLDED_PRODUCT_EXP = gl.constexpr(6)     # a shifted operand times a table-unpacked one: 2^-6 of the true product


@gluon.jit
def unpack_fp4_slot(packed, unpacked, ROWS: gl.constexpr, num_warps: gl.constexpr):
    """Packed E2M1 slot [ROWS, 64] (even K in the low nibble) -> FP8 E4M3 tile [ROWS, 128] of the
    values times 2^-6 (``_UNPACK_SHIFTED_ASM``): wgmmas over two such tiles need ``add_block``'s
    ``PRODUCT_EXP`` = SHIFTED_PRODUCT_EXP."""
    bytes_ = packed.load(packed_layout(num_warps, ROWS))
    lo, hi = gl.inline_asm_elementwise(_UNPACK_SHIFTED_ASM, "=r,=r,r", [bytes_], dtype=(gl.uint8, gl.uint8),
                                       is_pure=True, pack=4)
    # Each K-block's 16 even-K values, then its 16 odd-K ones: a thread's 16 packed bytes are one
    # K-block, so this order needs no byte shuffles, and it permutes K only inside a block, the same
    # way in both operands, which the block's dot product does not see.
    lo = gl.reshape(lo, [ROWS, BLOCKS_PER_SLOT, SCALE_BLOCK // 2])
    hi = gl.reshape(hi, [ROWS, BLOCKS_PER_SLOT, SCALE_BLOCK // 2])
    values = gl.reshape(gl.permute(gl.join(lo, hi), (0, 1, 3, 2)), [ROWS, BLOCK_K])
    unpacked.store(values.to(gl.float8e4nv, bitcast=True))


# ---- tables: the block scales folded into the unpacked values (v4, v2's FOLD_Y) ----------------------

TABLE_LO = gl.constexpr(E4M3_OF_E2M1_LO)  # the E4M3 bytes of the E2M1 magnitudes, as constexprs
TABLE_HI = gl.constexpr(E4M3_OF_E2M1_HI)
FOLD_SPAN = gl.constexpr(5)              # largest top - e a folded K-block may have (module docstring)

# ``unpack_ptx`` with the two table registers as operands: $2 four packed bytes, $3 and $7 the table's
# low and high words ($4-$6 and $8-$10: the same values for the other three bytes of the pack, unused).
_UNPACK_TABLE_ASM = gl.constexpr("{\n.reg .b32 code, fold, sel, mag, sgn;\n" + unpack_ptx("$3", "$7") + "}")


@gluon.constexpr_function
def block_layout3(num_warps):
    """``packed_layout`` viewed as [rows, 4 K-blocks, 16 bytes]: a thread's 16 bytes are one block."""
    return gl.BlockedLayout([1, 1, 16], [8, 4, 1], [num_warps, 1, 1], [2, 1, 0])


@gluon.jit
def max_byte(word):
    """The largest of the four bytes of int32 scale words."""
    top = word & 255
    for j in gl.static_range(1, BLOCKS_PER_SLOT):
        top = gl.maximum(top, (word >> (8 * j)) & 255)
    return top


@gluon.jit
def min_byte(word):
    """The smallest of the four bytes of int32 scale words: 255 minus the largest of their complements."""
    return 255 - max_byte(word ^ -1)


@gluon.jit
def tables_below(top, words, layout: gl.constexpr):
    """Per row (``top`` and the slot's scale ``words``: int32 [rows] in the rows slice of ``layout``, a
    [rows, 4] layout) and K-block j: the two table words of the E4M3 bytes of the E2M1 magnitudes times
    2^(e_j - top), [rows, 4] each. Every nonzero entry has its exponent field lowered by top - e_j (at
    most FOLD_SPAN where the caller folds, so no field drops below 1); the zero entry (byte 0 of the low
    word) stays zero."""
    j = gl.arange(0, BLOCKS_PER_SLOT, layout=gl.SliceLayout(0, layout))
    shift = (top[:, None] - ((words[:, None] >> (8 * j[None, :])) & 255)) * 8
    return TABLE_LO - shift * 0x01010100, TABLE_HI - shift * 0x01010101


@gluon.jit
def table_unpack(bytes_, lo_table, hi_table):
    """Packed E2M1 bytes [rows, 4, 16] (a K-block per [r, j, :]) through their (row, block) tables ([rows,
    4], ``tables_below``, in the slice layout of the bytes' dim 2) -> the E4M3 bytes of their low nibbles
    and of their high nibbles, [rows, 4, 16] each."""
    lo_table, _ = gl.broadcast(lo_table[:, :, None], bytes_)
    hi_table, _ = gl.broadcast(hi_table[:, :, None], bytes_)
    return gl.inline_asm_elementwise(_UNPACK_TABLE_ASM, "=r,=r,r,r,r,r,r,r,r,r,r", [bytes_, lo_table, hi_table],
                                     dtype=(gl.uint8, gl.uint8), is_pure=True, pack=4)


@gluon.jit
def program_tops(staged, k_slots, SLOTS: gl.constexpr):
    """Per row of a program's staged scale words ([rows, SLOTS], scales.load_scale_words; slots past
    ``k_slots`` left out): (its largest scale byte, largest minus smallest)."""
    live = gl.arange(0, SLOTS, layout=gl.SliceLayout(0, staged.type.layout))[None, :] < k_slots
    top = gl.max(gl.where(live, max_byte(staged), 0), axis=1)
    low = gl.min(gl.where(live, min_byte(staged), 255), axis=1)
    return top, top - low


@gluon.jit
def unpack_fp4_slot_below(packed, unpacked, words, top, ROWS: gl.constexpr, num_warps: gl.constexpr):
    """``unpack_fp4_slot`` with each K-block's scale folded in: packed E2M1 slot [ROWS, 64] -> FP8 E4M3
    [ROWS, 128] of the values times 2^(e - top(row)), exact while top - e <= FOLD_SPAN, in
    ``unpack_fp4_slot``'s order. ``words``: the slot's scale words of the rows (shared, [ROWS]); ``top``:
    int32 [ROWS] in the rows slice of block_layout3's [rows, blocks] slice."""
    gl.static_assert(ROWS >= 8 * num_warps, "one K-block of one row a thread: at least 8 rows a warp")
    layout3: gl.constexpr = block_layout3(num_warps)
    bytes_ = gl.convert_layout(gl.reshape(packed.load(packed_layout(num_warps, ROWS)),
                                          [ROWS, BLOCKS_PER_SLOT, PACKED_BLOCK]), layout3, assert_trivial=True)
    row_words = words.load(gl.SliceLayout(1, gl.SliceLayout(2, layout3)))
    lo_table, hi_table = tables_below(top, row_words, gl.SliceLayout(2, layout3))
    lo, hi = table_unpack(bytes_, lo_table, hi_table)
    values = gl.reshape(gl.permute(gl.join(lo, hi), (0, 1, 3, 2)), [ROWS, BLOCK_K])
    unpacked.store(values.to(gl.float8e4nv, bitcast=True))

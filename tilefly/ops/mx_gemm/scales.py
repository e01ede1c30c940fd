"""E8M0 block scales of the MX GEMM kernels, in Gluon: where a scale byte lives, how the kernels read
it (byte by byte, one 32-bit word of four K-blocks, or staged in shared memory for a whole K-range),
and how a K-block's FP32 partial product is scaled into the accumulator exactly.

A scale is one byte e per row per 32 K-elements (``SCALE_BLOCK``), worth 2^(e - 127); byte 255 is
NaN and 0 is 2^-127, an FP32 subnormal. Two layouts, as F.scaled_mm names them:

    NO_SWIZZLE       row r, K-block kb at r * stride_r + kb * stride_c.
    SWIZZLE_32_4_4   128 x 4 tiles of 512 bytes, rows of tiles first: byte (r, kb) at
                     tile * 512 + (r % 32) * 16 + ((r // 32) % 4) * 4 + kb % 4, so the 4 K-blocks of
                     one row and tile are 4 consecutive bytes (one aligned word). K-blocks are padded
                     to a multiple of 4 with arbitrary bytes, which a kernel must never use.

Scaling a partial p of K-block kb into acc for row scale ex and column scale ey:

    add_scaled       exact for every pair of scales: both exponents halved and crossed, so each
                     factor stays within FP32 and the FMA rounds once (four ops an element).
    add_scaled_fast  two ops an element, exact when the row scales are within 2^+-MODERATE_EXP
                     (``scales_moderate`` checks a program's rows once).
    exponent_scale   the decode of a staged word's byte straight into the FP32 exponent field, for
                     programs whose every scale is a moderate non-NaN (kernels_v2's ``plain``).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

SCALE_BLOCK = gl.constexpr(32)   # K elements per E8M0 scale; also one FP8 wgmma instruction's K
E8M0_NAN = gl.constexpr(255)
# SWIZZLE_32_4_4 tiles (module docstring)
SWZ_TILE_ROWS = gl.constexpr(128)
SWZ_TILE_COLS = gl.constexpr(4)
SWZ_TILE_BYTES = gl.constexpr(512)
# Row scales within 2^+-100 keep partial * row scale an FP32 normal (|partial| in [2^-18, 2^23]).
MODERATE_EXP = gl.constexpr(100)
SCAN_K = gl.constexpr(16)        # K-blocks a step of the scale scan reads
BLOCKS_PER_SLOT = gl.constexpr(4)        # K-blocks in one scale word (and in one v2 ring slot)
NEUTRAL_WORD = gl.constexpr(0x7F7F7F7F)  # four bytes 127: 2^0 for every block of a masked row


# ---- where scales live, read byte by byte --------------------------------------------------------

@gluon.jit
def scale_offsets(idx, kb, k_blocks, stride_r, stride_c, SWIZZLED: gl.constexpr):
    """Byte offsets of scales (idx, kb), elementwise (idx and kb broadcast against each other)."""
    idx64 = idx.to(gl.int64)
    if SWIZZLED:
        col_tiles = (k_blocks + SWZ_TILE_COLS - 1) // SWZ_TILE_COLS
        tile = (idx64 // SWZ_TILE_ROWS) * col_tiles + kb // SWZ_TILE_COLS
        return tile * SWZ_TILE_BYTES + (idx64 % 32) * 16 + ((idx64 // 32) % 4) * 4 + kb % SWZ_TILE_COLS
    return idx64 * stride_r + kb * stride_c


@gluon.jit
def scale_bytes(s_ptr, idx, n_idx, kb, k_blocks, stride_r, stride_c, SWIZZLED: gl.constexpr):
    """The E8M0 bytes (as int32) of rows ``idx`` for K-block ``kb``; 127 (2^0) past ``n_idx``."""
    offs = scale_offsets(idx, kb, k_blocks, stride_r, stride_c, SWIZZLED)
    return gl.load(s_ptr + offs, mask=idx < n_idx, other=127).to(gl.int32)


@gluon.constexpr_function
def scan_layout(num_warps):
    return gl.BlockedLayout([1, 4], [8, 4], [num_warps, 1], [1, 0])


@gluon.jit
def scales_moderate(s_ptr, off, n_idx, k_first, k_iters, k_blocks, stride_r, stride_c,
                    SWIZZLED: gl.constexpr, BLOCK: gl.constexpr, num_warps: gl.constexpr):
    """Whether every scale of rows [off, off + BLOCK) in this program's K-blocks is NaN or within
    2^+-MODERATE_EXP: then ``add_scaled_fast`` is exact for the whole tile. One pass over the
    tile's scale bytes (BLOCK x k_iters, small next to its BLOCK x 32 x k_iters operand bytes)."""
    layout: gl.constexpr = scan_layout(num_warps)
    idx = off + gl.arange(0, BLOCK, layout=gl.SliceLayout(1, layout))
    worst = gl.zeros([BLOCK, SCAN_K], gl.int32, layout)
    for k0 in range(0, k_iters, SCAN_K):
        kb = k_first + k0 + gl.arange(0, SCAN_K, layout=gl.SliceLayout(0, layout))
        offs = scale_offsets(idx[:, None], kb[None, :], k_blocks, stride_r, stride_c, SWIZZLED)
        mask = (idx < n_idx)[:, None] & (kb < k_first + k_iters)[None, :]
        bits = gl.load(s_ptr + offs, mask=mask, other=127).to(gl.int32)
        dev = gl.where(bits == E8M0_NAN, 0, gl.abs(bits - 127))
        worst = gl.maximum(worst, dev)
    return gl.max(gl.max(worst, axis=1), axis=0) <= MODERATE_EXP


# ---- exact scaling of a partial product ------------------------------------------------------------

@gluon.jit
def pow2(h):
    """2^h as FP32 from its exponent bits, for integer h in [-126, 127]."""
    return ((h + 127) << 23).to(gl.float32, bitcast=True)


@gluon.jit
def scale_halves(bits):
    """E8M0 bytes (int32) -> (2^floor(e/2), 2^ceil(e/2)) with e = bits - 127: two normal FP32
    powers of two (|half| <= 64) whose product is the scale; the first is NaN for byte 255."""
    e = bits - 127
    lo = e >> 1
    return gl.where(bits == E8M0_NAN, float("nan"), pow2(lo)), pow2(e - lo)


@gluon.jit
def add_scaled(acc, partial, ex, ey):
    """acc + partial * 2^(ex-127) * 2^(ey-127), ex per row and ey per column (int32 E8M0 bytes
    in slices of acc's layout); NaN where either byte is 255.

    The product of the two scales, 2^-254 .. 2^254, is outside FP32, and applying one scale
    first can overflow or lose bits in the intermediate. So each scale is split in halves and
    the halves are crossed: g1 = 2^(floor(ex'/2) + ceil(ey'/2)), g2 = 2^(ceil(ex'/2) +
    floor(ey'/2)), each in [2^-127, 2^127] and exact (2^-127 is an FP32 subnormal, still a
    power of two), g1 * g2 the full scale. ``partial * g1`` lies between the partial and the
    result, so it overflows only when the result does, and the FMA rounds once: the result is
    exact-then-rounded wherever it is an FP32 normal. Per element: two products for g1, g2,
    one for partial * g1, one FMA."""
    x_lo, x_hi = scale_halves(ex)
    y_lo, y_hi = scale_halves(ey)
    g1 = x_lo[:, None] * y_hi[None, :]
    g2 = x_hi[:, None] * y_lo[None, :]
    return gl.fma(partial * g1, g2, acc)


@gluon.jit
def scale_value(bits):
    """E8M0 bytes (int32) -> 2^(bits - 127) as FP32, exactly (byte 0 is the subnormal 2^-127);
    NaN for byte 255."""
    pattern = gl.where(bits == 0, 1 << 22, bits << 23)
    return gl.where(bits == E8M0_NAN, float("nan"), pattern.to(gl.float32, bitcast=True))


@gluon.jit
def add_scaled_fast(acc, partial, ex, ey):
    """``add_scaled`` in two FP32 ops an element, for rows whose scales are within
    2^+-MODERATE_EXP (or NaN): partial * 2^ex' is then exact (|partial| is in [2^-18, 2^23] or 0,
    so the product stays an FP32 normal), and the FMA with the column scale rounds once."""
    return gl.fma(partial * scale_value(ex)[:, None], scale_value(ey)[None, :], acc)


@gluon.jit
def add_scaled_any(acc, partial, ex, ey, moderate):
    """``add_scaled_fast`` when the program's row scales are ``moderate``, else ``add_scaled``."""
    if moderate:
        acc = add_scaled_fast(acc, partial, ex, ey)
    else:
        acc = add_scaled(acc, partial, ex, ey)
    return acc


# ---- scale words: the 4 K-blocks of a 128-K slot in one int32 -------------------------------------

@gluon.jit
def slot_scale_words(s_ptr, idx, n_idx, kb0, k_blocks, stride_r, stride_c,
                     SWIZZLED: gl.constexpr, WORDS: gl.constexpr, more_valid=True):
    """One int32 per entry of ``idx`` (and ``kb0``, broadcast against it): byte j holds the E8M0 byte
    of (idx, kb0 + j), j < 4; 127 (all four bytes) for rows past ``n_idx`` or where ``more_valid`` is
    false, and, read byte by byte, for K-blocks past ``k_blocks`` (a word read keeps those bytes:
    ``word_byte`` neutralizes them). ``kb0`` is a multiple of 4."""
    valid = (idx < n_idx) & more_valid
    if WORDS:
        offs = scale_offsets(idx, kb0, k_blocks, stride_r, stride_c, SWIZZLED)
        word_ptr = (s_ptr + offs).to(gl.pointer_type(gl.int32), bitcast=True)
        word = gl.load(word_ptr, mask=valid, other=NEUTRAL_WORD)
    else:
        word = gl.zeros_like(idx)
        for j in gl.static_range(BLOCKS_PER_SLOT):
            offs = scale_offsets(idx, kb0 + j, k_blocks, stride_r, stride_c, SWIZZLED)
            byte = gl.load(s_ptr + offs, mask=valid & (kb0 + j < k_blocks), other=127).to(gl.int32)
            word = word | (byte << (8 * j))
    return word


@gluon.jit
def word_byte(word, j: gl.constexpr, kb, k_blocks):
    """Byte j of scale words (int32, 0..255); 127 when K-block ``kb`` is past K (the swizzled
    layout pads K-blocks to 4 with arbitrary bytes, which must not turn zero padding into NaN)."""
    byte = (word >> (8 * j)) & 255
    return gl.where(kb < k_blocks, byte, 127)


# ---- staged scales: a program's whole K-range in shared memory -------------------------------------

@gluon.constexpr_function
def staging_layout(num_warps):
    """[rows, slots] scale words: 4 consecutive slots of one row a thread (16 contiguous bytes of a
    NO_SWIZZLE row), 8 rows by 4 slot groups a warp, warps along the rows."""
    return gl.BlockedLayout([1, 4], [8, 4], [num_warps, 1], [1, 0])


@gluon.jit
def load_scale_words(s_ptr, off, n_idx, kb_first, k_slots, k_blocks, stride_r, stride_c,
                     SWIZZLED: gl.constexpr, WORDS: gl.constexpr, BLOCK: gl.constexpr, SLOTS: gl.constexpr,
                     num_warps: gl.constexpr):
    """int32 [BLOCK, SLOTS]: word (r, s) holds in byte j the E8M0 byte of row off + r and K-block
    kb_first + 4 s + j; 127 for rows past ``n_idx``, slots past ``k_slots`` and K-blocks past K."""
    layout: gl.constexpr = staging_layout(num_warps)
    idx = (off + gl.arange(0, BLOCK, layout=gl.SliceLayout(1, layout)))[:, None]
    slot = gl.arange(0, SLOTS, layout=gl.SliceLayout(0, layout))[None, :]
    kb0 = kb_first + slot * BLOCKS_PER_SLOT
    loaded = slot_scale_words(s_ptr, idx, n_idx, kb0, k_blocks, stride_r, stride_c, SWIZZLED, WORDS, slot < k_slots)
    if WORDS:   # bytes past K as 127 once here, so the loop's decode needs no K-tail check
        words = gl.zeros([BLOCK, SLOTS], gl.int32, layout)
        for j in gl.static_range(BLOCKS_PER_SLOT):
            words = words | (word_byte(loaded, j, kb0 + j, k_blocks) << (8 * j))
    else:
        words = loaded
    return words


@gluon.jit
def load_program_scales(sx_ptr, sy_ptr, off_m, off_n, M, N, kb_first, k_slots, k_blocks, stride_sxr, stride_sxc,
                        stride_syr, stride_syc, X_SWIZZLED: gl.constexpr, Y_SWIZZLED: gl.constexpr,
                        X_WORDS: gl.constexpr, Y_WORDS: gl.constexpr, BLOCK_M: gl.constexpr,
                        BLOCK_N: gl.constexpr, SLOTS: gl.constexpr, num_warps: gl.constexpr):
    """``load_scale_words`` of both operands of a program's tile: (X words, Y words)."""
    staged_x = load_scale_words(sx_ptr, off_m, M, kb_first, k_slots, k_blocks, stride_sxr, stride_sxc,
                                X_SWIZZLED, X_WORDS, BLOCK_M, SLOTS, num_warps)
    staged_y = load_scale_words(sy_ptr, off_n, N, kb_first, k_slots, k_blocks, stride_syr, stride_syc,
                                Y_SWIZZLED, Y_WORDS, BLOCK_N, SLOTS, num_warps)
    return staged_x, staged_y


@gluon.jit
def words_range(words):
    """(largest |e - 127| over the staged words' bytes other than NaN, whether any byte is NaN)."""
    worst = gl.zeros_like(words)
    nan = gl.zeros_like(words)
    for j in gl.static_range(BLOCKS_PER_SLOT):
        byte = (words >> (8 * j)) & 255
        worst = gl.maximum(worst, gl.where(byte == E8M0_NAN, 0, gl.abs(byte - 127)))
        nan = gl.maximum(nan, (byte == E8M0_NAN).to(gl.int32))
    return gl.max(gl.max(worst, axis=1), axis=0), gl.max(gl.max(nan, axis=1), axis=0) > 0


@gluon.jit
def program_scale_paths(staged_x, staged_y):
    """(moderate, plain) of a program from its staged words: ``moderate`` when every X byte is NaN
    or within 2^+-MODERATE_EXP (``add_scaled_fast`` is exact), ``plain`` when moreover every Y byte
    is within it and no byte of either is NaN (``exponent_scale`` decodes them)."""
    worst_x, nan_x = words_range(staged_x)
    worst_y, nan_y = words_range(staged_y)
    moderate = worst_x <= MODERATE_EXP
    return moderate, moderate & (worst_y <= MODERATE_EXP) & (not nan_x) & (not nan_y)


@gluon.jit
def stage_words(words, BLOCK: gl.constexpr, SLOTS: gl.constexpr):
    """Shared int32 [SLOTS, BLOCK] holding ``words`` transposed: a slot's words are one row."""
    smem = gl.allocate_shared_memory(gl.int32, [SLOTS, BLOCK], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    smem.store(gl.permute(words, (1, 0)))
    # The same bytes with a rank-1 layout, so that ``.index(slot)`` gives a loadable row.
    return smem._reinterpret(gl.int32, [SLOTS, BLOCK], gl.SwizzledSharedLayout(1, 1, 1, [0]))


@gluon.jit
def exponent_scale(word, j: gl.constexpr):
    """2^(e - 127) as FP32 for byte j (= e) of scale words: e moved into the exponent field, two
    integer ops. Exact for e in 1..254 only (0 is a subnormal, 255 NaN): the ``plain`` path."""
    if j == 3:
        bits = (word >> 1) & 0x7F800000
    else:
        bits = (word << (23 - 8 * j)) & 0x7F800000
    return bits.to(gl.float32, bitcast=True)

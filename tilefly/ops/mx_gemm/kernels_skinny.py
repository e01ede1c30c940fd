"""Skinny MX GEMM (plain Triton): C = X @ Y^T with E8M0 block scales for few tokens.

Problem as in kernels.py: X [ROWS, K] and Y [COLS, K] K-major (MXFP8 bytes or MXFP4 nibble
pairs, low nibble first), one E8M0 scale per row per 32 K elements,
``C[r, c] = sum_kb 2^(ex[r,kb]-127) * 2^(ey[c,kb]-127) * sum_{k in kb} x[r,k] * y[c,k]``.
skinny.py maps F.scaled_mm onto it with the weight (the big side) as X and the tokens as Y, so
a decode GEMM streams its weight rows through the dot's M side (swap-AB): C is the transposed
output tile [BLOCK_R weight rows, BLOCK_C tokens].

Layout plan (grid: (weight tiles x token tiles, K-splits), token tiles fastest, so the programs
that share a weight tile run together and its bytes come from HBM once; 4 or 8 warps):

    K step          128 K elements (4 scale blocks) a loop iteration; Triton's pipeliner keeps
                    ``num_stages`` iterations of loads in flight (cp.async into shared memory,
                    its default swizzle). Rows past ROWS / COLS and blocks past the split's end
                    are masked (values 0, scales 2^0).
    DEQUANT path    (constexpr DEQUANT; kept when the guard below passes) per step one
                    [BLOCK_R, 4, 32] load of weight bytes (MXFP4 [*, 4, 16]) and its [BLOCK_R, 4]
                    scales, the same for the tokens (MXFP4 tokens: each byte loaded for both its
                    nibbles, see _scaled_step); each value becomes BF16 times its block scale in
                    registers (MXFP8: E4M3 -> FP32, times 2^e built from the scale byte, -> BF16;
                    MXFP4: the BF16 bit pattern straight from the nibble, the scale added to its
                    exponent field); then ONE BF16 ``tl.dot`` over the 128 K (wgmma, M = weight
                    rows from registers (MXFP8) or a BF16 shared tile (MXFP4), N = tokens from a
                    BF16 shared tile) accumulates into the FP32 tile: no per-block promotion.
                    Triton 3.6 still waits for each step's wgmma before the next conversion;
                    the two programs an SM runs overlap each other's. Each thread holds
                    BLOCK_R * BLOCK_C / (32 * num_warps) accumulator values.
    exactness guard Scaled values are exact in BF16 while they stay normal: E4M3 magnitudes lie
                    in [2^-9, 448 < 2^9], E2M1 in [2^-1, 6], so a scale 2^s with |s| <= SAFE_EXP
                    = 54 keeps them in [2^-63, 2^63]. The MMA multiplies two such values exactly
                    into FP32: |products| lie in [2^-126, 2^125.7], FP32 normals, so no product
                    flushes to zero or overflows where the exact path's would not (108 = 126 - 18
                    is the binding bound). The check costs no load: the loop carries the running
                    max |byte - 127| of the [BLOCK, 4] scale bytes it loads anyway (loaded one step
                    ahead, masked ones read as 127), reduced once after the loop; NaN (255)
                    fails it. A program that fails discards its BF16 tile and reruns its K range
                    on the exact path below (twice the time for that program, only for scales
                    beyond 2^+-54), so every input keeps its exact result.
    exact path      per 32-K block a fresh FP8 ``tl.dot`` into an FP32 partial (MXFP4 nibbles
                    unpacked to the E4M3 bytes of the same values); the block's scales split
                    into halves that are crossed, so 2^(ex+ey-254) is applied as two FP32 factors
                    within 2^+-127: acc = fma(p * g1, g2, acc). Exact then rounded once wherever
                    the result is an FP32 normal, also at 2^+-127; byte 255 makes its row or
                    token NaN. Non-DEQUANT builds run only this path (the first version).
    split-K         K is split so that about two programs run per SM. Each program stores its
                    FP32 tile into a workspace slot, then takes a ticket (acq_rel atomic); the
                    last program of a tile sums the slots in split order (deterministic, no
                    zeroed buffer, no second launch), resets the ticket, and finishes.
    epilogue        bias (along C's columns or rows), cast, masked store with any C strides.
    barriers        one CTA barrier before the ticket (every thread's partial is issued).
"""
import os

import triton
import triton.language as tl

SCALE_BLOCK = tl.constexpr(32)
E8M0_NAN = tl.constexpr(255)
BLOCKS_PER_STEP = tl.constexpr(4)
# Dequantizing path: every scale of the program's tiles within 2^+-SAFE_EXP (see the header).
SAFE_EXP = tl.constexpr(54)
# Triton 3.6's interpreter multiplies BF16 dot operands as their uint16 bit patterns; CPU checks
# (TRITON_INTERPRET=1, set before this module is imported) feed the dot FP32 copies instead.
INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")


@triton.jit
def _scale_offsets(idx, kb, k_blocks, stride_r, stride_c, SWIZZLED: tl.constexpr):
    """Byte offsets of scales (idx, kb); SWIZZLE_32_4_4: 128 x 4 tiles of 512 bytes, scale
    (r, c) of a tile at (r % 32) * 16 + (r // 32) * 4 + c (tilefly.mx.layout)."""
    idx = idx.to(tl.int64)
    if SWIZZLED:
        col_tiles = (k_blocks + 3) // 4
        tile = (idx // 128) * col_tiles + kb // 4
        return tile * 512 + (idx % 32) * 16 + ((idx // 32) % 4) * 4 + kb % 4
    return idx * stride_r + kb * stride_c


@triton.jit
def _halves(bits):
    """E8M0 bytes (int32) -> (2^floor(e/2), 2^ceil(e/2)), e = bits - 127: two FP32 normals whose
    product is the scale; the first is NaN for byte 255."""
    e = bits - 127
    lo = e >> 1
    lo_value = ((lo + 127) << 23).to(tl.float32, bitcast=True)
    hi_value = ((e - lo + 127) << 23).to(tl.float32, bitcast=True)
    return tl.where(bits == E8M0_NAN, float("nan"), lo_value), hi_value


@triton.jit
def _e2m1_to_e4m3(code):
    """E2M1 codes (int32 0..15) -> E4M3 bytes of the same value: exponent field e > 0 is
    2^(e-1) * (1 + m/2), E4M3 field e + 6 with mantissa m << 2; e = 0, m = 1 is 0.5 (field 6)."""
    e = (code >> 1) & 3
    m = code & 1
    mag = tl.where(e == 0, m * (6 << 3), ((e + 6) << 3) | (m << 2))
    return ((code & 8) << 4) | mag


@triton.jit
def _e2m1_scaled_bf16(code, bits):
    """E2M1 codes (int32 0..15) times 2^(bits - 127) -> BF16 bit patterns (int32), for scale bytes
    within 127 +- SAFE_EXP: the value's exponent is f - 1 for field f (f = 0: 0.5 when m = 1), so
    the BF16 exponent field is f + bits - 1 (72..183, normal), mantissa m << 6 when f > 0."""
    f = (code >> 1) & 3
    m = code & 1
    mag = ((f + bits - 1) << 7) | tl.where(f == 0, 0, m << 6)
    return ((code & 8) << 12) | tl.where((code & 7) == 0, 0, mag)


@triton.jit
def _as_fp8(raw, ROWS: tl.constexpr, FP4: tl.constexpr):
    """A loaded K-block (bytes) -> [ROWS, 32] FP8 values."""
    if FP4:
        packed = raw.to(tl.int32)
        pairs = tl.join(_e2m1_to_e4m3(packed & 15), _e2m1_to_e4m3(packed >> 4))   # (k even, k odd)
        raw = tl.reshape(pairs, [ROWS, SCALE_BLOCK]).to(tl.uint8)
    return raw.to(tl.float8e4nv, bitcast=True)


@triton.jit
def _step_scales(s_ptr, idx, count, kb0, kb_end, k_blocks, stride_r, stride_c, SWIZZLED: tl.constexpr):
    """[BLOCK, 4] scale bytes (int32) of the K step from block kb0; 127 (2^0) where masked."""
    kb = kb0 + tl.arange(0, BLOCKS_PER_STEP)
    live = (idx < count)[:, None] & (kb < kb_end)[None, :]
    return tl.load(s_ptr + _scale_offsets(idx[:, None], kb[None, :], k_blocks, stride_r, stride_c, SWIZZLED),
                   mask=live, other=127).to(tl.int32)


@triton.jit
def _scaled_step(q_rows, bits, idx, count, kb0, kb_end, BLOCK: tl.constexpr, FP4: tl.constexpr,
                 NIBBLE_GATHER: tl.constexpr):
    """[BLOCK, 128] BF16: the K step's values from K-block kb0 on, each times its block scale
    (``bits``: _step_scales; exact for scales within 2^+-SAFE_EXP); rows past ``count`` and blocks
    past kb_end are zero. MXFP4 unpacks a byte's two nibbles with a join, or (NIBBLE_GATHER) loads
    each byte for both of its elements and shifts: the token operand's joined tile, transposed
    into the dot, made Triton 3.6's dot-operand pass fail ("Illegal shared layout") at 32 and 64
    tokens."""
    BYTES: tl.constexpr = SCALE_BLOCK // 2 if FP4 else SCALE_BLOCK
    kb = kb0 + tl.arange(0, BLOCKS_PER_STEP)
    live = (idx < count)[:, None] & (kb < kb_end)[None, :]
    bits = bits[:, :, None]
    block_base = q_rows[:, :, None] + (kb * BYTES)[None, :, None]
    if FP4 and NIBBLE_GATHER:
        k = tl.arange(0, SCALE_BLOCK)[None, None, :]
        q = tl.load(block_base + k // 2, mask=live[:, :, None], other=0).to(tl.int32)
        values = _e2m1_scaled_bf16((q >> ((k % 2) * 4)) & 15, bits).to(tl.int16).to(tl.bfloat16, bitcast=True)
    else:
        q = tl.load(block_base + tl.arange(0, BYTES)[None, None, :], mask=live[:, :, None], other=0)
        if FP4:
            code = q.to(tl.int32)
            pairs = tl.join(_e2m1_scaled_bf16(code & 15, bits), _e2m1_scaled_bf16(code >> 4, bits))
            values = pairs.to(tl.int16).to(tl.bfloat16, bitcast=True)
        else:
            scale = (bits << 23).to(tl.float32, bitcast=True)
            values = (q.to(tl.float8e4nv, bitcast=True).to(tl.float32) * scale).to(tl.bfloat16)
    return tl.reshape(values, [BLOCK, BLOCKS_PER_STEP * SCALE_BLOCK])


@triton.jit
def _dequant_steps(x_rows, y_rows, sx_ptr, sy_ptr, rows, cols, ROWS, COLS, kb_first, kb_end, k_blocks,
                   stride_sxr, stride_sxc, stride_syr, stride_syc, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                   FP4: tl.constexpr, X_SWIZZLED: tl.constexpr, Y_SWIZZLED: tl.constexpr):
    """(FP32 tile, whether every live scale byte it used lay within 127 +- SAFE_EXP): when not, the
    tile may be wrong (a value left BF16's normal range) and the caller discards it."""
    acc = tl.zeros([BLOCK_R, BLOCK_C], tl.float32)
    x_worst = tl.zeros([BLOCK_R, BLOCKS_PER_STEP], tl.int32)
    y_worst = tl.zeros([BLOCK_C, BLOCKS_PER_STEP], tl.int32)
    # The scale bytes are loaded a step ahead: the pipeliner stages the data through shared memory
    # but leaves these small loads in place, where each step would wait out their latency.
    x_bits = _step_scales(sx_ptr, rows, ROWS, kb_first, kb_end, k_blocks, stride_sxr, stride_sxc, X_SWIZZLED)
    y_bits = _step_scales(sy_ptr, cols, COLS, kb_first, kb_end, k_blocks, stride_syr, stride_syc, Y_SWIZZLED)
    for kb0 in range(kb_first, kb_end, BLOCKS_PER_STEP):
        kb_next = kb0 + BLOCKS_PER_STEP
        x_next = _step_scales(sx_ptr, rows, ROWS, kb_next, kb_end, k_blocks, stride_sxr, stride_sxc, X_SWIZZLED)
        y_next = _step_scales(sy_ptr, cols, COLS, kb_next, kb_end, k_blocks, stride_syr, stride_syc, Y_SWIZZLED)
        xb = _scaled_step(x_rows, x_bits, rows, ROWS, kb0, kb_end, BLOCK_R, FP4, False)
        yb = _scaled_step(y_rows, y_bits, cols, COLS, kb0, kb_end, BLOCK_C, FP4, True)
        x_worst = tl.maximum(x_worst, tl.abs(x_bits - 127))   # masked bytes read as 127
        y_worst = tl.maximum(y_worst, tl.abs(y_bits - 127))
        x_bits, y_bits = x_next, y_next
        if INTERPRETED:
            acc = tl.dot(xb.to(tl.float32), tl.trans(yb.to(tl.float32)), acc)
        else:
            acc = tl.dot(xb, tl.trans(yb), acc)
    worst = tl.maximum(tl.max(tl.max(x_worst, axis=1), axis=0), tl.max(tl.max(y_worst, axis=1), axis=0))
    return acc, worst <= SAFE_EXP


@triton.jit
def _exact_steps(acc, x_rows, y_rows, sx_ptr, sy_ptr, rows, cols, ROWS, COLS, kb_first, kb_end, k_blocks,
                 stride_sxr, stride_sxc, stride_syr, stride_syc, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                 FP4: tl.constexpr, X_SWIZZLED: tl.constexpr, Y_SWIZZLED: tl.constexpr):
    BLOCK_BYTES: tl.constexpr = SCALE_BLOCK // 2 if FP4 else SCALE_BLOCK
    byte = tl.arange(0, BLOCK_BYTES)[None, :]
    row_in = rows < ROWS
    col_in = cols < COLS
    for kb0 in range(kb_first, kb_end, BLOCKS_PER_STEP):
        for j in tl.static_range(BLOCKS_PER_STEP):
            kb = kb0 + j
            live = kb < kb_end
            xq = tl.load(x_rows + kb * BLOCK_BYTES + byte, mask=row_in[:, None] & live, other=0)
            yq = tl.load(y_rows + kb * BLOCK_BYTES + byte, mask=col_in[:, None] & live, other=0)
            # Masked scales read as 2^0: rows past the edge and blocks past the split add zeros.
            ex = tl.load(sx_ptr + _scale_offsets(rows, kb, k_blocks, stride_sxr, stride_sxc, X_SWIZZLED),
                         mask=row_in & live, other=127).to(tl.int32)
            ey = tl.load(sy_ptr + _scale_offsets(cols, kb, k_blocks, stride_syr, stride_syc, Y_SWIZZLED),
                         mask=col_in & live, other=127).to(tl.int32)
            partial = tl.dot(_as_fp8(xq, BLOCK_R, FP4), tl.trans(_as_fp8(yq, BLOCK_C, FP4)))
            x_lo, x_hi = _halves(ex)
            y_lo, y_hi = _halves(ey)
            acc = tl.fma(partial * (x_lo[:, None] * y_hi[None, :]), x_hi[:, None] * y_lo[None, :], acc)
    return acc


@triton.jit
def _finish(acc, c_ptr, bias_ptr, rows, cols, ROWS, COLS, stride_cr, stride_cc, stride_bias, BIAS: tl.constexpr):
    if BIAS == 1:
        acc += tl.load(bias_ptr + cols * stride_bias, mask=cols < COLS, other=0).to(tl.float32)[None, :]
    if BIAS == 2:
        acc += tl.load(bias_ptr + rows * stride_bias, mask=rows < ROWS, other=0).to(tl.float32)[:, None]
    offs = rows.to(tl.int64)[:, None] * stride_cr + cols.to(tl.int64)[None, :] * stride_cc
    mask = (rows < ROWS)[:, None] & (cols < COLS)[None, :]
    tl.store(c_ptr + offs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def mx_skinny_kernel(x_ptr, y_ptr, sx_ptr, sy_ptr, c_ptr, bias_ptr, ws_ptr, ticket_ptr,
                     ROWS, COLS, K, stride_x, stride_y, stride_sxr, stride_sxc, stride_syr, stride_syc,
                     stride_cr, stride_cc, stride_bias, blocks_per_split,
                     BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, FP4: tl.constexpr,
                     X_SWIZZLED: tl.constexpr, Y_SWIZZLED: tl.constexpr, BIAS: tl.constexpr,
                     DEQUANT: tl.constexpr):
    tile = tl.program_id(0)
    split = tl.program_id(1)
    num_splits = tl.num_programs(1)
    col_tiles = tl.cdiv(COLS, BLOCK_C)
    pid_r = tile // col_tiles
    pid_c = tile % col_tiles
    k_blocks = K // SCALE_BLOCK
    kb_first = split * blocks_per_split
    kb_end = tl.minimum(kb_first + blocks_per_split, k_blocks)

    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_x
    y_rows = y_ptr + cols.to(tl.int64)[:, None] * stride_y

    if DEQUANT:
        acc, safe = _dequant_steps(x_rows, y_rows, sx_ptr, sy_ptr, rows, cols, ROWS, COLS, kb_first, kb_end,
                                   k_blocks, stride_sxr, stride_sxc, stride_syr, stride_syc, BLOCK_R, BLOCK_C, FP4,
                                   X_SWIZZLED, Y_SWIZZLED)
        if safe == 0:   # a scale out of range: the BF16 tile may be wrong, redo the K range exactly
            acc = _exact_steps(tl.zeros([BLOCK_R, BLOCK_C], tl.float32), x_rows, y_rows, sx_ptr, sy_ptr, rows,
                               cols, ROWS, COLS, kb_first, kb_end, k_blocks, stride_sxr, stride_sxc, stride_syr,
                               stride_syc, BLOCK_R, BLOCK_C, FP4, X_SWIZZLED, Y_SWIZZLED)
    else:
        acc = _exact_steps(tl.zeros([BLOCK_R, BLOCK_C], tl.float32), x_rows, y_rows, sx_ptr, sy_ptr, rows, cols,
                           ROWS, COLS, kb_first, kb_end, k_blocks, stride_sxr, stride_sxc, stride_syr, stride_syc,
                           BLOCK_R, BLOCK_C, FP4, X_SWIZZLED, Y_SWIZZLED)

    if num_splits == 1:
        _finish(acc, c_ptr, bias_ptr, rows, cols, ROWS, COLS, stride_cr, stride_cc, stride_bias, BIAS)
    else:
        TILE: tl.constexpr = BLOCK_R * BLOCK_C
        slot = tl.arange(0, BLOCK_R)[:, None] + tl.arange(0, BLOCK_C)[None, :] * BLOCK_R
        tile_ws = ws_ptr + tile.to(tl.int64) * num_splits * TILE
        tl.store(tile_ws + split * TILE + slot, acc)
        tl.debug_barrier()
        ticket = tl.atomic_add(ticket_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if ticket == num_splits - 1:
            total = tl.zeros([BLOCK_R, BLOCK_C], tl.float32)
            for s in range(num_splits):
                total += tl.load(tile_ws + s * TILE + slot, cache_modifier=".cg")
            tl.atomic_xchg(ticket_ptr + tile, 0, sem="relaxed", scope="gpu")
            _finish(total, c_ptr, bias_ptr, rows, cols, ROWS, COLS, stride_cr, stride_cc, stride_bias, BIAS)

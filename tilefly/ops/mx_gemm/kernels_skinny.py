"""Skinny MX GEMM (plain Triton): C = X @ Y^T with E8M0 block scales for few tokens.

Problem as in kernels.py: X [ROWS, K] and Y [COLS, K] K-major (MXFP8 bytes or MXFP4 nibble
pairs, low nibble first), one E8M0 scale per row per 32 K elements,
``C[r, c] = sum_kb 2^(ex[r,kb]-127) * 2^(ey[c,kb]-127) * sum_{k in kb} x[r,k] * y[c,k]``.
skinny.py maps F.scaled_mm onto it with the weight (the big side) as X and the tokens as Y, so
a decode GEMM streams its weight rows through the dot's M side (swap-AB): C is the transposed
output tile [BLOCK_R weight rows, BLOCK_C tokens].

Layout plan (grid: weight tiles x K-splits x token tiles, ``num_warps`` 4 or 8):

    K step          128 K elements (4 scale blocks) a loop iteration, as 4 separate loads per
                    operand ([BLOCK_R, 32] and [BLOCK_C, 32] bytes; MXFP4 [*, 16]), rows
                    masked past ROWS / COLS, blocks past the split's end masked off; Triton's
                    pipeliner keeps ``num_stages`` iterations of them in flight (cp.async into
                    shared memory, its default swizzle).
    FP4 unpack      MXFP4: each E2M1 nibble becomes the E4M3 byte of the same value in registers
                    (exact), low nibble first, so both formats feed one FP8 dot.
    MMA             per 32-K block a fresh FP8 ``tl.dot`` (wgmma, M = weight rows, N = tokens,
                    K = 32) into an FP32 partial; each thread holds
                    BLOCK_R * BLOCK_C / (32 * num_warps) partial and accumulator values.
    scaling         the block's scales (one byte per weight row and per token, L1/L2 hits; in
                    NO_SWIZZLE through their strides, in SWIZZLE_32_4_4 through the tile
                    offsets) are split into halves that are crossed, so the product 2^(ex+ey-254)
                    is applied as two FP32 factors each within 2^+-127: acc = fma(p * g1, g2, acc).
                    Exact then rounded once wherever the result is an FP32 normal, also for
                    scales at 2^+-127; a NaN scale (byte 255) makes its row or token NaN.
    split-K         K is split so that about two programs run per SM. Each program stores its
                    FP32 tile into a workspace slot, then takes a ticket (acq_rel atomic); the
                    last program of a tile sums the slots in split order (deterministic, no
                    zeroed buffer, no second launch), resets the ticket, and finishes.
    epilogue        bias (along C's columns or rows), cast, masked store with any C strides.
    barriers        one CTA barrier before the ticket (every thread's partial is issued).
"""
import triton
import triton.language as tl

SCALE_BLOCK = tl.constexpr(32)
E8M0_NAN = tl.constexpr(255)
BLOCKS_PER_STEP = tl.constexpr(4)


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
def _as_fp8(raw, ROWS: tl.constexpr, FP4: tl.constexpr):
    """A loaded K-block (bytes) -> [ROWS, 32] FP8 values."""
    if FP4:
        packed = raw.to(tl.int32)
        pairs = tl.join(_e2m1_to_e4m3(packed & 15), _e2m1_to_e4m3(packed >> 4))   # (k even, k odd)
        raw = tl.reshape(pairs, [ROWS, SCALE_BLOCK]).to(tl.uint8)
    return raw.to(tl.float8e4nv, bitcast=True)


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
                     X_SWIZZLED: tl.constexpr, Y_SWIZZLED: tl.constexpr, BIAS: tl.constexpr):
    pid_r = tl.program_id(0)
    split = tl.program_id(1)
    pid_c = tl.program_id(2)
    num_splits = tl.num_programs(1)
    BLOCK_BYTES: tl.constexpr = SCALE_BLOCK // 2 if FP4 else SCALE_BLOCK
    k_blocks = K // SCALE_BLOCK
    kb_first = split * blocks_per_split
    kb_end = tl.minimum(kb_first + blocks_per_split, k_blocks)

    rows = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    row_in = rows < ROWS
    col_in = cols < COLS
    byte = tl.arange(0, BLOCK_BYTES)
    x_rows = x_ptr + rows.to(tl.int64)[:, None] * stride_x + byte[None, :]
    y_rows = y_ptr + cols.to(tl.int64)[:, None] * stride_y + byte[None, :]

    acc = tl.zeros([BLOCK_R, BLOCK_C], tl.float32)
    for kb0 in range(kb_first, kb_end, BLOCKS_PER_STEP):
        for j in tl.static_range(BLOCKS_PER_STEP):
            kb = kb0 + j
            live = kb < kb_end
            xq = tl.load(x_rows + kb * BLOCK_BYTES, mask=row_in[:, None] & live, other=0)
            yq = tl.load(y_rows + kb * BLOCK_BYTES, mask=col_in[:, None] & live, other=0)
            # Masked scales read as 2^0: rows past the edge and blocks past the split add zeros.
            ex = tl.load(sx_ptr + _scale_offsets(rows, kb, k_blocks, stride_sxr, stride_sxc, X_SWIZZLED),
                         mask=row_in & live, other=127).to(tl.int32)
            ey = tl.load(sy_ptr + _scale_offsets(cols, kb, k_blocks, stride_syr, stride_syc, Y_SWIZZLED),
                         mask=col_in & live, other=127).to(tl.int32)
            partial = tl.dot(_as_fp8(xq, BLOCK_R, FP4), tl.trans(_as_fp8(yq, BLOCK_C, FP4)))
            x_lo, x_hi = _halves(ex)
            y_lo, y_hi = _halves(ey)
            acc = tl.fma(partial * (x_lo[:, None] * y_hi[None, :]), x_hi[:, None] * y_lo[None, :], acc)

    if num_splits == 1:
        _finish(acc, c_ptr, bias_ptr, rows, cols, ROWS, COLS, stride_cr, stride_cc, stride_bias, BIAS)
    else:
        tile = pid_r + pid_c * tl.num_programs(0)
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

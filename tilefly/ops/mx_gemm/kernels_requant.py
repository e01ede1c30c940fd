"""Requantize MX operand rows to one scale per row (plain Triton), so PyTorch's row-scaled FP8 GEMM
can run MX operands (requant.py says when tilefly does that).

Row r of an MX operand holds K values v = q * 2^(e_b - 127), one E8M0 exponent e_b per 32-value
block b. With e_max the row's largest exponent, v = (q * 2^(e_b - e_max)) * 2^(e_max - 127): the
first factor is rounded to E4M3 (exact unless it falls below E4M3's normal range, 2^-6), the second
becomes the row's FP32 scale. A NaN exponent (byte 255) anywhere in the row makes its scale NaN,
so the row of the product is NaN, as the exact kernels make it.

Layout plan: one program per row, ``num_warps`` 4. The row's exponents are one [BLOCK_KB] register
vector (BLOCK_KB = K / 32 rounded up to a power of two) for the maximum. The values then stream as
[CHUNK / 32, 32] tiles, a block per tile row (FP8: 32 contiguous bytes; FP4: 16 packed bytes, low
nibble first, joined back into 32 values), so each block's exponent is loaded once and broadcast
along its row as 2^(e_b - e_max) built from exponent bits; results go out as E4M3 bytes,
row-major [rows, K]. No shared memory, no barriers.
"""
import triton
import triton.language as tl

E8M0_NAN = tl.constexpr(255)
SCALE_BLOCK = tl.constexpr(32)


@triton.jit
def _pow2(shift):
    """2^shift as FP32 for integer shift <= 0; 0 below 2^-126 (E4M3 flushes those to zero anyway)."""
    return tl.where(shift < -126, 0.0, ((shift + 127) << 23).to(tl.float32, bitcast=True))


@triton.jit
def _e2m1_value(code):
    """E2M1 codes (int32 0..15) -> FP32 values: +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}."""
    e = (code >> 1) & 3
    m = (code & 1).to(tl.float32)
    mag = tl.where(e == 0, 0.5 * m, _pow2(e - 1) * (1.0 + 0.5 * m))
    return tl.where((code & 8) != 0, -mag, mag)


@triton.jit
def mx_requant_rows_kernel(q_ptr, s_ptr, out_ptr, row_scale_ptr, K, stride_q, stride_s, stride_out,
                           FP4: tl.constexpr, BLOCK_KB: tl.constexpr, CHUNK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    k_blocks = K // SCALE_BLOCK
    kb = tl.arange(0, BLOCK_KB)
    bits = tl.load(s_ptr + row * stride_s + kb, mask=kb < k_blocks, other=0).to(tl.int32)
    has_nan = tl.max(tl.where(bits == E8M0_NAN, 1, 0), axis=0) > 0
    e_max = tl.max(tl.where(bits == E8M0_NAN, 0, bits), axis=0)
    scale = tl.where(e_max == 0, 1 << 22, e_max << 23).to(tl.float32, bitcast=True)   # 2^(e_max - 127)
    tl.store(row_scale_ptr + row, tl.where(has_nan, float("nan"), scale))
    BLOCKS: tl.constexpr = CHUNK // SCALE_BLOCK
    for kb0 in range(0, k_blocks, BLOCKS):
        blocks = kb0 + tl.arange(0, BLOCKS)
        in_k = blocks < k_blocks
        e = tl.load(s_ptr + row * stride_s + blocks, mask=in_k, other=0).to(tl.int32)
        factor = _pow2(tl.where(e == E8M0_NAN, 0, e - e_max))[:, None]
        if FP4:  # a block is 16 bytes, low nibble first
            byte = blocks[:, None] * (SCALE_BLOCK // 2) + tl.arange(0, SCALE_BLOCK // 2)[None, :]
            packed = tl.load(q_ptr + row * stride_q + byte, mask=in_k[:, None], other=0).to(tl.int32)
            v = tl.reshape(tl.join(_e2m1_value(packed & 15), _e2m1_value(packed >> 4)), [BLOCKS, SCALE_BLOCK])
        else:
            col = blocks[:, None] * SCALE_BLOCK + tl.arange(0, SCALE_BLOCK)[None, :]
            v = tl.load(q_ptr + row * stride_q + col, mask=in_k[:, None], other=0)
            v = v.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        col = blocks[:, None] * SCALE_BLOCK + tl.arange(0, SCALE_BLOCK)[None, :]
        out = (v * factor).to(tl.float8e4nv).to(tl.uint8, bitcast=True)
        tl.store(out_ptr + row * stride_out + col, out, mask=in_k[:, None])

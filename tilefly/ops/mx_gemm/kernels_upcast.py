"""Upcast MX operand rows to BF16 and rescale the BF16 GEMM's product (plain Triton); upcast.py says
when tilefly takes this route and why.

Row r of an MX operand holds K values v = q * 2^(e_b - 127), one E8M0 exponent e_b per 32-value block
b. ``mx_upcast_rows_kernel`` writes v / 2^(e_ref - 127) in BF16 and 2^(e_ref - 127) as the row's FP32
scale, where e_ref = 127 (scale 1: v itself) when every exponent of the row lies in [E_LO, E_HI], and
e_ref = the row's largest exponent otherwise. Inside that range every v is exact in BF16 (E4M3 and E2M1
need 3 and 1 mantissa bits of BF16's 7; the magnitudes 2^-9 .. 448 times 2^-117 .. 2^119 stay in
BF16's normal range), so a row of ordinary scales has scale 1 and needs no rescaling. A shifted row is
exact unless a block sits more than 2^117 below the row's largest (it then flushes to zero). A NaN
exponent (255) turns its block's values NaN, which the GEMM spreads over the row of the product, as
the exact kernels do.

``mx_rescale_kernel`` then multiplies C' = A'B'^T by scale_a[i] * scale_b[j] (one FP32 product, exact:
both are powers of two), adds the bias and casts. Rows and columns of scale 1 are left untouched: a
program whose tile only holds such rows and columns returns after reading the two scale vectors,
unless ALWAYS (C' in an FP32 buffer that must be cast, or a bias to add).

Layout plan, upcast: both operands in one launch, one program per ROWS rows of either, num_warps 4.
Pass 1 streams the rows' exponents as [ROWS, BLOCKS] tiles for their range; pass 2 streams values as
[ROWS, BLOCKS, 32] tiles (a 32-value block per innermost row: FP8 32 contiguous bytes, FP4 16 packed
bytes joined back into 32 values, low nibble first), each block's factor loaded once and broadcast
along it, stored as contiguous BF16 rows; ROWS * BLOCKS * 32 = 4096 values a step, 32 a thread.
Rescale: [32, 256] tiles of C over 8 warps, 32 elements a thread. No barriers; shared memory only
for Triton's row reductions and layout changes (2-4 KB, sm_90a compile).
"""
import triton
import triton.language as tl

from tilefly.ops.mx_gemm.scales import SWZ_TILE_BYTES, SWZ_TILE_COLS, SWZ_TILE_ROWS
from tilefly.ops.mx_gemm.kernels_requant import _e2m1_value, _pow2

E8M0_NAN = tl.constexpr(255)
SCALE_BLOCK = tl.constexpr(32)
E_LO = tl.constexpr(10)     # 2^-9 * 2^(10 - 127) = 2^-126, BF16's smallest normal
E_HI = tl.constexpr(246)    # 448 * 2^(246 - 127) < 2^128, BF16's overflow


@triton.jit
def _scale_offsets(rows, kb, k_blocks, stride_r, stride_c, SWIZZLED: tl.constexpr):
    """Byte offsets of scales (rows, kb), broadcast against each other: scales.scale_offsets for plain
    Triton kernels (the Gluon one compiles when called from here, but Triton's interpreter, which
    runs these kernels in CI, cannot call a Gluon function)."""
    r = rows.to(tl.int64)
    if SWIZZLED:
        col_tiles = (k_blocks + SWZ_TILE_COLS - 1) // SWZ_TILE_COLS
        tile = (r // SWZ_TILE_ROWS) * col_tiles + kb // SWZ_TILE_COLS
        return tile * SWZ_TILE_BYTES + (r % 32) * 16 + ((r // 32) % 4) * 4 + kb % SWZ_TILE_COLS
    return r * stride_r + kb * stride_c


@triton.jit
def _row_scale(e_ref):
    """2^(e_ref - 127) as FP32, 2^-127 (a subnormal) included."""
    return tl.where(e_ref == 0, 1 << 22, e_ref << 23).to(tl.float32, bitcast=True)


@triton.jit
def _upcast_rows(q_ptr, s_ptr, out_ptr, row_scale_ptr, block, n_rows, K, stride_q, stride_sr, stride_sc,
                 stride_out, FP4: tl.constexpr, SWIZZLED: tl.constexpr, ROWS: tl.constexpr, BLOCKS: tl.constexpr):
    """Rows [block * ROWS, block * ROWS + ROWS) of one operand."""
    rows = block * ROWS + tl.arange(0, ROWS)
    in_rows = rows < n_rows
    k_blocks = K // SCALE_BLOCK
    e_hi = tl.zeros([ROWS], tl.int32)
    e_lo = tl.full([ROWS], 255, tl.int32)
    for kb0 in range(0, k_blocks, BLOCKS):
        kb = kb0 + tl.arange(0, BLOCKS)
        mask = in_rows[:, None] & (kb < k_blocks)[None, :]
        e = tl.load(s_ptr + _scale_offsets(rows[:, None], kb[None, :], k_blocks, stride_sr, stride_sc, SWIZZLED),
                    mask=mask, other=127).to(tl.int32)
        e_hi = tl.maximum(e_hi, tl.max(tl.where(e == E8M0_NAN, 0, e), axis=1))
        e_lo = tl.minimum(e_lo, tl.min(tl.where(e == E8M0_NAN, 127, e), axis=1))
    e_ref = tl.where((e_lo >= E_LO) & (e_hi <= E_HI), 127, e_hi)
    tl.store(row_scale_ptr + rows, _row_scale(e_ref), mask=in_rows)

    row_q = rows.to(tl.int64)[:, None, None] * stride_q
    row_out = rows.to(tl.int64)[:, None, None] * stride_out
    lane = tl.arange(0, SCALE_BLOCK)[None, None, :]
    for kb0 in range(0, k_blocks, BLOCKS):
        kb = kb0 + tl.arange(0, BLOCKS)
        mask2 = in_rows[:, None] & (kb < k_blocks)[None, :]
        e = tl.load(s_ptr + _scale_offsets(rows[:, None], kb[None, :], k_blocks, stride_sr, stride_sc, SWIZZLED),
                    mask=mask2, other=127).to(tl.int32)
        factor = tl.where(e == E8M0_NAN, float("nan"), _pow2(e - e_ref[:, None]))[:, :, None]
        mask = mask2[:, :, None]
        if FP4:
            byte = kb[None, :, None] * (SCALE_BLOCK // 2) + tl.arange(0, SCALE_BLOCK // 2)[None, None, :]
            packed = tl.load(q_ptr + row_q + byte, mask=mask, other=0).to(tl.int32)
            v = tl.reshape(tl.join(_e2m1_value(packed & 15), _e2m1_value(packed >> 4)), [ROWS, BLOCKS, SCALE_BLOCK])
        else:
            v = tl.load(q_ptr + row_q + kb[None, :, None] * SCALE_BLOCK + lane, mask=mask, other=0)
            v = v.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        col = kb[None, :, None] * SCALE_BLOCK + lane
        tl.store(out_ptr + row_out + col, (v * factor).to(tl.bfloat16), mask=mask)


@triton.jit(do_not_specialize=["M", "N"])  # M and N size pointer offsets: never constexprs
def mx_upcast_rows_kernel(qa_ptr, sa_ptr, qb_ptr, sb_ptr, out_ptr, row_scale_ptr, M, N, K, stride_qa, stride_sar,
                          stride_sac, stride_qb, stride_sbr, stride_sbc, stride_out, FP4: tl.constexpr,
                          A_SWIZZLED: tl.constexpr, B_SWIZZLED: tl.constexpr, ROWS: tl.constexpr,
                          BLOCKS: tl.constexpr):
    """Both operands in one launch: the first cdiv(M, ROWS) programs take A's rows into rows 0..M-1 of
    ``out`` and ``row_scale``, the others B's into rows M..M+N-1."""
    pid = tl.program_id(0)
    a_programs = tl.cdiv(M, ROWS)
    if pid < a_programs:
        _upcast_rows(qa_ptr, sa_ptr, out_ptr, row_scale_ptr, pid, M, K, stride_qa, stride_sar, stride_sac, stride_out,
                     FP4, A_SWIZZLED, ROWS, BLOCKS)
    else:
        _upcast_rows(qb_ptr, sb_ptr, out_ptr + M.to(tl.int64) * stride_out, row_scale_ptr + M, pid - a_programs, N, K,
                     stride_qb, stride_sbr, stride_sbc, stride_out, FP4, B_SWIZZLED, ROWS, BLOCKS)


@triton.jit
def mx_rescale_kernel(c_ptr, out_ptr, scale_a_ptr, scale_b_ptr, bias_ptr, M, N, stride_c, stride_out,
                      stride_bias, BIAS: tl.constexpr, ALWAYS: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    sa = tl.load(scale_a_ptr + rows, mask=rows < M, other=1.0)
    sb = tl.load(scale_b_ptr + cols, mask=cols < N, other=1.0)
    todo = tl.max(tl.where(sa != 1.0, 1, 0), axis=0) | tl.max(tl.where(sb != 1.0, 1, 0), axis=0) | ALWAYS
    if todo != 0:
        mask = (rows < M)[:, None] & (cols < N)[None, :]
        r = rows.to(tl.int64)[:, None]
        c = tl.load(c_ptr + r * stride_c + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        c = c * (sa[:, None] * sb[None, :])
        if BIAS:
            c += tl.load(bias_ptr + cols.to(tl.int64) * stride_bias, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + r * stride_out + cols[None, :], c.to(out_ptr.dtype.element_ty), mask=mask)

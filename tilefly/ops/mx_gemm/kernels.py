"""MX GEMM kernel for Hopper in Gluon: C = X @ Y^T with E8M0 block scales, FP32 accumulate.

Problem: X is [ROWS, K] and Y is [COLS, K], both K-major (row-major rows of K elements,
MXFP8 bytes or MXFP4 nibble pairs), each with one E8M0 scale per row per 32 K elements.
``C[r, c] = sum_kb 2^(ex[r,kb]-127) * 2^(ey[c,kb]-127) * sum_{k in kb} x[r,k] * y[c,k]``.
The launcher maps F.scaled_mm onto it: X = A, Y = B^T, or swapped (X = B^T, Y = A, C^T)
so that the larger of M and N fills the wgmma M slot (a decode GEMM streams its weight
rows there while the few tokens ride in the N slot).

Layout plan (one program per (output tile, K-split), ``num_warps`` 4 or 8):

    ring            STAGES slots, one K-block (32 elements) each: X tile [BLOCK_M, 32] and
                    Y tile [BLOCK_N, 32] FP8 bytes (MXFP4: [*, 16] packed bytes), loaded by TMA
                    with a ``ready`` mbarrier per slot (tilefly.gluon.tma_ring); 32-byte
                    NVMMA swizzle for FP8 tiles, unswizzled 16-byte rows for packed FP4.
    FP4 unpack      MXFP4 only: each thread loads one row's 16 packed bytes from the ring
                    slot, turns each E2M1 nibble into the E4M3 byte of the same value (every
                    E2M1 value is exact in E4M3) and stores the 32 bytes into a one-slot
                    [rows, 32] FP8 buffer (32-byte swizzle) that the wgmma reads.
    MMA             one synchronous FP8 wgmma per K-block (K = 32 is one instruction) into a
                    fresh FP32 partial in the wgmma accumulator layout (tilefly.gluon.layouts);
                    every thread holds BLOCK_M * BLOCK_N / (32 * num_warps) partial values
                    and as many accumulator values.
    scales          per K-block, each thread loads the scale bytes of its own accumulator rows
                    and columns (slices of the accumulator layout, a few bytes, L1/L2 hits)
                    from NO_SWIZZLE (row, col strides) or SWIZZLE_32_4_4 offsets (scales.py holds
                    the scale helpers all MX kernels share).
    scaling         a program first scans its X rows' scale bytes (``scales_moderate``). All
                    within 2^+-100 (the common case): acc = fma(partial * 2^ex', 2^ey', acc),
                    two FP32 ops an element (``add_scaled_fast``). Otherwise, for every K-block
                    of the tile, acc = fma(partial * g1, g2, acc) with the two exponents split in
                    halves and crossed so g1 * g2 is the scale product (``add_scaled``), four ops.
                    Both are exact for every pair of E8M0 scales (2^-127 .. 2^127 each) and
                    round once where the result is representable; a NaN scale (byte 255) makes
                    its row or column NaN.
    epilogue        (tilefly.gluon.epilogue) accumulator -> blocked store layout (8 contiguous
                    outputs a thread), split-K partials summed in split order by the program
                    with the last ticket, bias, masked store with any output strides.
    tails           TMA zero-fills rows past ROWS/COLS; scale loads there are masked to 2^0.
                    K is a multiple of 32, so K-blocks are never partial.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma

from tilefly.gluon.epilogue import finish_splitk
from tilefly.gluon.layouts import wgmma_layout
from tilefly.gluon.scheduler import splitk_tile
from tilefly.gluon.tma_ring import alloc_ring, issue_load, wait_ready
from tilefly.gluon.wgmma import prefetch
from tilefly.ops.mx_gemm.scales import SCALE_BLOCK, add_scaled_any, scale_bytes, scales_moderate

_INTS = ["K", "stride_sxr", "stride_sxc", "stride_syr", "stride_syc", "stride_bias", "iters_per_split"]


@gluon.jit
def fp4_to_e4m3_bits(code):
    """E2M1 codes (int32 0..15) -> E4M3 bytes of the same value: normal E2M1 (exponent field
    e > 0) is 2^(e-1) * (1 + m/2), i.e. E4M3 exponent field e + 6 and mantissa m << 2; the
    subnormal 0.5 (e = 0, m = 1) is E4M3 exponent field 6; zero stays zero."""
    sign = (code & 8) << 4
    e = (code >> 1) & 3
    m = code & 1
    mag = gl.where(e == 0, m * (6 << 3), ((e + 6) << 3) | (m << 2))
    return sign | mag


@gluon.constexpr_function
def unpack_layout(num_warps):
    """One packed row (16 bytes) per thread; rows spread over lanes, then warps (tiles of fewer
    rows than threads are replicated: every copy stores the same bytes)."""
    return gl.BlockedLayout([1, 16], [32, 1], [num_warps, 1], [1, 0])


@gluon.jit
def unpack_fp4(packed, unpacked, ROWS: gl.constexpr, num_warps: gl.constexpr):
    """Packed E2M1 tile [ROWS, 16] (even K index in the low nibble) -> FP8 tile [ROWS, 32]."""
    bytes_ = packed.load(unpack_layout(num_warps)).to(gl.int32)
    lo = fp4_to_e4m3_bits(bytes_ & 15)
    hi = fp4_to_e4m3_bits(bytes_ >> 4)
    pairs = gl.join(lo, hi)                       # [ROWS, 16, 2]: (low, high) = (k even, k odd)
    values = gl.reshape(pairs, [ROWS, 2 * 16])
    unpacked.store(values.to(gl.uint8).to(gl.float8e4nv, bitcast=True))


@gluon.jit(do_not_specialize=_INTS, do_not_specialize_on_alignment=["bias_ptr"])
def mx_gemm_kernel(x_desc, y_desc, sx_ptr, sy_ptr, c_ptr, bias_ptr, ws_ptr, ticket_ptr,
                   M, N, K, stride_sxr, stride_sxc, stride_syr, stride_syc, stride_cm, stride_cn, stride_bias,
                   iters_per_split,
                   BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, FP4: gl.constexpr,
                   X_SWIZZLED: gl.constexpr, Y_SWIZZLED: gl.constexpr, BIAS: gl.constexpr,
                   C_ROWS_CONTIGUOUS: gl.constexpr, STAGES: gl.constexpr, num_warps: gl.constexpr):
    acc_layout: gl.constexpr = wgmma_layout(BLOCK_M, BLOCK_N, num_warps, 8)
    ITEM_K: gl.constexpr = x_desc.block_type.shape[1]     # bytes of one K-block: 32 (FP8) or 16 (FP4)
    tile, off_m, off_n, split, num_splits = splitk_tile(N, BLOCK_M, BLOCK_N)
    k_blocks = K // SCALE_BLOCK
    k_first = split * iters_per_split
    k_iters = gl.minimum(iters_per_split, k_blocks - k_first)

    x_bufs, y_bufs, bars = alloc_ring(x_desc, y_desc, STAGES)
    if FP4:
        x_fp8 = gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_M, SCALE_BLOCK],
                                          gl.NVMMASharedLayout.get_default_for([BLOCK_M, SCALE_BLOCK], gl.float8e4nv))
        y_fp8 = gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_N, SCALE_BLOCK],
                                          gl.NVMMASharedLayout.get_default_for([BLOCK_N, SCALE_BLOCK], gl.float8e4nv))
    prefetch(x_desc, y_desc, x_bufs, y_bufs, bars, 0, off_m, off_n, k_first, k_iters, True, True, STAGES, ITEM_K)

    moderate = scales_moderate(sx_ptr, off_m, M, k_first, k_iters, k_blocks, stride_sxr, stride_sxc, X_SWIZZLED,
                               BLOCK_M, num_warps)
    rows = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc_layout))
    cols = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc_layout))
    acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
    for k in range(k_iters):
        kb = k_first + k
        # Issued before the MMA, so their latency hides behind it.
        ex = scale_bytes(sx_ptr, rows, M, kb, k_blocks, stride_sxr, stride_sxc, X_SWIZZLED)
        ey = scale_bytes(sy_ptr, cols, N, kb, k_blocks, stride_syr, stride_syc, Y_SWIZZLED)
        slot = k % STAGES
        wait_ready(bars, k, STAGES)
        if FP4:
            unpack_fp4(x_bufs.index(slot), x_fp8, BLOCK_M, num_warps)
            unpack_fp4(y_bufs.index(slot), y_fp8, BLOCK_N, num_warps)
            fence_async_shared()
            partial = warpgroup_mma(x_fp8, y_fp8.permute((1, 0)), acc, use_acc=False)
        else:
            partial = warpgroup_mma(x_bufs.index(slot), y_bufs.index(slot).permute((1, 0)), acc, use_acc=False)
        # The synchronous wgmma has read this slot: refill it with the block STAGES-1 ahead.
        ahead = k + STAGES - 1
        issue_load(x_desc, y_desc, x_bufs, y_bufs, bars, ahead, off_m, off_n, (k_first + ahead) * ITEM_K,
                   True, True, STAGES, pred=ahead < k_iters)
        acc = add_scaled_any(acc, partial, ex, ey, moderate)

    finish_splitk(acc, ws_ptr, ticket_ptr, tile, split, num_splits, bias_ptr, stride_bias, c_ptr, stride_cm,
                  stride_cn, off_m, off_n, M, N, BLOCK_M, BLOCK_N, BIAS, C_ROWS_CONTIGUOUS, num_warps)

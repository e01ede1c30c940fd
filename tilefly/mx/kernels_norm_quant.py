"""Residual add, RMSNorm and MX quantization of BF16 rows in one pass (plain Triton).

What a decoder layer computes before its q/k/v or gate/up projections, when they are MX layers:

    h = a + b                                  (the residual stream, BF16; written out)
    x = w * (h * rsqrt(mean(h^2) + eps))       (RMSNorm, rounded to BF16 where eager mode rounds)
    data, scales = quantize_rows(x, fmt)       (tilefly.mx.quant's rules, kernels_quant's helpers)

Compiled, that was two kernels: Inductor's fused add-and-RMSNorm reduction and the quantization
(``tilefly::mx_quantize_rows``, an opaque op Inductor cannot fuse). This kernel is both
(``tilefly.mx.norm_quant`` says when it runs).

Every rounding happens where the PyTorch ops round (the BF16 add, the normalised value, its product
with the weight), by integer operations (``rne_bf16``) so that Triton's interpreter gives the same
bits. The kernel's own are the mean's summation order and its division by K, as Inductor's fused
kernel has it (ATen's CUDA mean multiplies by 1 / K).

Layout plan: one program a row. The row is one [BLOCK_K] tile (K rounded up to a power of two,
masked past K) over num_warps warps, so a thread holds BLOCK_K / (32 * num_warps) consecutive
elements of a, b and w (int16-viewed BF16, 16-byte loads from 8 elements up). The mean is one
``tl.sum`` across the CTA. The tile is then viewed as [BLOCK_K / 32, 32] scale blocks, each block's
exponent maximum a reduction inside the block, and stored as kernels_quant stores its tiles (E4M3
bytes, or E2M1 nibble pairs, and one scale byte a block). With ``EXPAND`` (MXFP4) the row's expanded
copy follows (kernels_quant.store_expanded, tilefly.mx.expanded): the row's top and lowest nonzero
scales are one more reduction across the CTA, and each thread stores its E4M3 bytes in unpack order,
its 8 even-K and 8 odd-K bytes as two 8-byte stores. No shared memory beyond the reductions' scratch;
no barriers of its own.

With ``TRIGGER`` (config.mx_pdl) every program first signals ``griddepcontrol.launch_dependents``, so
the MX GEMM after it, launched with PDL, starts streaming its weights while this kernel runs.
"""
import triton
import triton.language as tl

from tilefly.mx.kernels_quant import SCALE_BLOCK, bf16_to_f32, block_scales, store_blocks, store_expanded

BF16_NAN_BITS = tl.constexpr(0x7FC00000)   # a quiet NaN (PyTorch's casts give various NaN bits, none compared)


@triton.jit
def rne_bf16(x):
    """FP32 x rounded to BF16 precision (nearest, ties to even; NaN to BF16's NaN), still FP32."""
    bits = x.to(tl.int32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    rounded = tl.where((bits & 0x7FFFFFFF) > 0x7F800000, BF16_NAN_BITS, rounded)
    return rounded.to(tl.float32, bitcast=True)


@triton.jit
def add_rms_norm_mx_quantize_kernel(a_ptr, b_ptr, w_ptr, h_ptr, data_ptr, scale_ptr, expanded_ptr, expanded_scale_ptr,
                                    K, EPS: tl.constexpr, EMAX: tl.constexpr, FP4: tl.constexpr,
                                    BLOCK_K: tl.constexpr, TRIGGER: tl.constexpr, EXPAND: tl.constexpr):
    if TRIGGER:   # config.mx_pdl: the MX GEMM after may launch now (it reads our output after its wait)
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    col = tl.arange(0, BLOCK_K)
    live = col < K
    a = bf16_to_f32(tl.load(a_ptr + row * K + col, mask=live, other=0))
    b = bf16_to_f32(tl.load(b_ptr + row * K + col, mask=live, other=0))
    w = bf16_to_f32(tl.load(w_ptr + col, mask=live, other=0))
    h = rne_bf16(a + b)
    tl.store(h_ptr + row * K + col, (h.to(tl.int32, bitcast=True) >> 16).to(tl.int16), mask=live)
    rstd = tl.math.rsqrt(tl.sum(h * h, axis=0) / K + EPS)   # approximate on the GPU, as torch.rsqrt
    x = rne_bf16(w * rne_bf16(h * rstd))

    BLOCKS: tl.constexpr = BLOCK_K // SCALE_BLOCK
    blk = tl.arange(0, BLOCKS)
    live_blk = blk < K // SCALE_BLOCK
    scale, y = block_scales(tl.reshape(x, [BLOCKS, SCALE_BLOCK]), EMAX)
    store_blocks(data_ptr, scale_ptr, row * (K // SCALE_BLOCK) + blk, scale, y, live_blk, FP4, BLOCKS)
    if EXPAND:   # MXFP4: the expanded copy too (tilefly.mx.expanded), from the same registers
        store_expanded(expanded_ptr, expanded_scale_ptr, row, K, 0, scale, y, live_blk, BLOCKS)   # a whole row

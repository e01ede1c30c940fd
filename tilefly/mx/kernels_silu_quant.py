"""SiLU-gated product and MX quantization of BF16 rows in one pass (plain Triton).

What a Llama / Qwen3 MLP computes before its down projection, when that is an MX layer:

    x = silu(gate) * up                        (each product rounded to BF16 where eager mode rounds)
    data, scales = quantize_rows(x, fmt)       (tilefly.mx.quant's rules, kernels_quant's helpers)

Compiled, that was Inductor's pointwise kernel and then the quantization (``tilefly::mx_quantize_rows``,
an opaque op Inductor cannot fuse); this kernel is both (``tilefly.mx.silu_quant`` says when it runs).
silu(g) is g / (1 + exp(-g)) in FP32, as Inductor's decomposition computes it, with Triton's exp and
division, as Inductor's kernel has them; eager CUDA's silu rounds a last bit differently at times.

Layout plan: a program takes CHUNK = 2048 elements of one row (64 scale blocks) as a [64, 32] tile
over 4 warps, so a thread holds 16 consecutive elements of gate and of up (two 16-byte loads each;
the rows may be strided, e.g. column slices of one packed gate/up GEMM output, but each row's
elements are contiguous). Each block's exponent maximum is a reduction inside the block; the stores
are kernels_quant's (E4M3 bytes or E2M1 nibble pairs, one scale byte a block). With ``EXPAND`` (MXFP4)
the chunk's expanded copy follows, the chunk one fold group (kernels_quant.store_expanded,
tilefly.mx.expanded). Grid: rows x ceil(N / CHUNK). No shared memory beyond the layout change of the
E2M1 pairs; no barriers.

With ``TRIGGER`` (config.mx_pdl) every program first signals ``griddepcontrol.launch_dependents``, so
the MX GEMM after it, launched with PDL, starts streaming its weights while this kernel runs.
"""
import triton
import triton.language as tl

from tilefly.mx.kernels_norm_quant import rne_bf16
from tilefly.mx.kernels_quant import SCALE_BLOCK, bf16_to_f32, block_scales, store_blocks, store_expanded


@triton.jit
def silu_mul_mx_quantize_kernel(g_ptr, u_ptr, data_ptr, scale_ptr, expanded_ptr, expanded_scale_ptr, N, stride_g,
                                stride_u, EMAX: tl.constexpr, FP4: tl.constexpr, BLOCKS: tl.constexpr,
                                TRIGGER: tl.constexpr, EXPAND: tl.constexpr):
    if TRIGGER:   # config.mx_pdl: the MX GEMM after may launch now (it reads our output after its wait)
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1) * BLOCKS + tl.arange(0, BLOCKS)
    live = blk < N // SCALE_BLOCK
    element = tl.arange(0, SCALE_BLOCK)
    col = blk[:, None] * SCALE_BLOCK + element[None, :]
    g = bf16_to_f32(tl.load(g_ptr + row * stride_g + col, mask=live[:, None], other=0))
    u = bf16_to_f32(tl.load(u_ptr + row * stride_u + col, mask=live[:, None], other=0))
    x = rne_bf16(rne_bf16(g / (tl.exp(-g) + 1.0)) * u)
    scale, y = block_scales(x, EMAX)
    store_blocks(data_ptr, scale_ptr, row * (N // SCALE_BLOCK) + blk, scale, y, live, FP4, BLOCKS)
    if EXPAND:   # MXFP4: the expanded copy too (tilefly.mx.expanded), the program's chunk one fold group
        store_expanded(expanded_ptr, expanded_scale_ptr, row, N, tl.program_id(1) * BLOCKS, scale, y, live, BLOCKS)

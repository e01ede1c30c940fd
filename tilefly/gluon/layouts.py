"""Layouts for Hopper wgmma tiles, decided at compile time.

The accumulator of a wgmma lives in registers in an NVMMADistributedLayout
(version 3): each warp owns 16-row slabs, four warps (one warpgroup) cover 64
rows per instruction, and every thread holds pairs of adjacent columns. A
BM x BN FP32 accumulator therefore costs BM * BN / (32 * num_warps) registers
per thread; 128 is the most a kernel keeps while leaving room for addresses
and the epilogue (128x256 over 8 warps, 128x128 or 64x256 over 4).

Shared-memory operand tiles use NVMMASharedLayout with the widest swizzle the
tile's contiguous row allows (128 bytes for 64 BF16 elements), which is what
both TMA and wgmma read without bank conflicts.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

WGMMA_M = 16        # rows per warp per instruction
WARPGROUP = 4       # warps that issue one wgmma together
MAX_INSTR_N = 256   # widest wgmma N


@gluon.constexpr_function
def wgmma_warps(block_m, num_warps):
    """warps_per_cta for a wgmma accumulator: stack warpgroups along M while each
    still gets its own rows, then split N."""
    warps = [WARPGROUP, 1]
    while warps[0] * warps[1] < num_warps:
        if block_m > WGMMA_M * warps[0]:
            warps[0] *= 2
        else:
            warps[1] *= 2
    return warps


@gluon.constexpr_function
def wgmma_layout(block_m, block_n, num_warps, element_bits=16):
    """The accumulator layout of a block_m x block_n wgmma tile over num_warps warps."""
    warps = wgmma_warps(block_m, num_warps)
    max_n = block_n // warps[1]
    n = min(MAX_INSTR_N, max_n) // 8 * 8
    while n > 8 and block_n % n:
        n -= 8
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=warps,
                                     instr_shape=[WGMMA_M, n, 256 // element_bits])


def gl_dtype(torch_dtype):
    """The Gluon element type of a torch dtype tilefly's GEMMs take."""
    import torch

    return {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float32: gl.float32}[torch_dtype]


def shared_tile_layout(block_shape, element_dtype):
    """Host side: the NVMMA shared layout a TMA descriptor and the kernel agree on."""
    return gl.NVMMASharedLayout.get_default_for(list(block_shape), element_dtype)

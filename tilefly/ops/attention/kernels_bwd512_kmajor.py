"""The K-major copy of a grouped-GEMM B operand for kernels_bwd512g: ``dst[g, d, k] = src[g, k, d]``
(src [G, K, D] with unit column stride, group and row strides multiples of 16 elements; dst
[G, D, K] rows padded to 16 elements), in one plain-Triton launch.

Why a kernel: bwd512g copies Q, dO and K this way where the GEMM's inner size is off its BLOCK_K
(64), and torch's transposing copy moved ~0.6 TB/s there (H200, BENCHMARKS.md session 16: 167 us
of copies against 217 us of kernels at B2 H8 S1000).

Layout plan (plain Triton, 4 warps): one program per [BLOCK_K = 64, BLOCK_D = 64] tile of one
group, grid (cdiv(K, 64), D / 64, G). It loads the tile row by row (64 contiguous elements, 128
bytes, per source row), and ``tl.trans`` hands it to the store layout through shared memory (the
compiler's layout conversion), which writes 64 contiguous K elements per destination row. Rows
of the K tail load as zeros; stores stop at the padded row length (a multiple of 16 elements, so
the stores stay 16-byte vectors), writing zeros into the padding, which TMA never reads (the copy's
column bound is K).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_K = 64
BLOCK_D = 64
NUM_WARPS = 4
# Destination rows padded to 16 elements: 32 bytes, a multiple of TMA's 16-byte row-stride unit, and
# a stride Triton specializes as divisible by 16, so its stores are 16-byte vectors.
ROW_PAD = 16
DTYPES = ("bf16", "fp16")


@triton.jit
def kmajor_copy_kernel(src_ptr, dst_ptr, K, K_PAD, src_group_stride, src_row_stride, dst_group_stride,
                       dst_row_stride, D: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    g = tl.program_id(2).to(tl.int64)
    k = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    tile = tl.load(src_ptr + g * src_group_stride + k[:, None].to(tl.int64) * src_row_stride + d[None, :],
                   mask=(k < K)[:, None], other=0.0)
    # Masked at the padded row length (a multiple of 16, so whole 16-byte vectors): the padding
    # takes zeros, never read.
    tl.store(dst_ptr + g * dst_group_stride + d[:, None].to(tl.int64) * dst_row_stride + k[None, :],
             tl.trans(tile), mask=(k < K_PAD)[None, :])


def kmajor(b: torch.Tensor) -> torch.Tensor:
    """``b`` [G, K, D] (unit column stride, D a multiple of 64) as the same values K-major: a
    [G, D, K'] copy, K' = K rounded up to 16, viewed back as [G, K, D] (strides (D K', 1, K'))."""
    g, k, d = b.shape
    if b.stride(2) != 1 or d % BLOCK_D:
        raise ValueError(f"kmajor takes unit-stride rows of a multiple of {BLOCK_D} elements, got {tuple(b.shape)} "
                         f"strides {b.stride()}")
    padded = -(-k // ROW_PAD) * ROW_PAD
    dst = torch.empty(g, d, padded, dtype=b.dtype, device=b.device)
    if g and k:     # replayed when every argument repeats (the attention kernels' replay cache)
        from tilefly.ops.attention.kernels import replay

        replay(kmajor_copy_kernel, (-(-k // BLOCK_K), d // BLOCK_D, g),
               [b, dst, k, padded, b.stride(0), b.stride(1), dst.stride(0), dst.stride(1)],
               dict(D=d, BLOCK_K=BLOCK_K, BLOCK_D=BLOCK_D, num_warps=NUM_WARPS), b)
    return dst[:, :, :k].transpose(1, 2)


# ---- compile specs and interpreter checks -----------------------------------------------------

def compile_specs():
    """The copy per dtype at D = 512 as bwd512g launches it: pointers and strides divisible by 16
    (Triton specializes them so; the source rows are 512 elements, the destination's padded)."""
    from tilefly.compile_check import KernelSpec

    specs = []
    for dtype in DTYPES:
        sig = {"src_ptr": f"*{dtype}", "dst_ptr": f"*{dtype}", "K": "i32", "K_PAD": "i32", "src_group_stride": "i32",
               "src_row_stride": "i32", "dst_group_stride": "i32", "dst_row_stride": "i32"}
        constexprs = dict(D=512, BLOCK_K=BLOCK_K, BLOCK_D=BLOCK_D)
        sig.update({name: "constexpr" for name in constexprs})
        aligned = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 3, 4, 5, 6, 7)}
        specs.append(KernelSpec(name=f"attention.bwd512g_kmajor_copy[{dtype}]", kernel=lambda: kmajor_copy_kernel,
                                signature=sig, constexprs=constexprs, attrs=aligned, num_warps=NUM_WARPS))
    return specs


def interpreter_checks():
    """The copy on CPU tensors against the source: K off 64 and off 8, a single row, and a strided
    source (a row block of a longer group)."""
    def check(g, k, d, group_rows, row0, dtype):
        torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
        whole = torch.randn(g, group_rows, d).to(torch_dtype)
        src = whole[:, row0:row0 + k]
        got = kmajor(src)
        if got.shape != src.shape or got.stride(1) != 1 or got.stride(2) % ROW_PAD:
            raise AssertionError(f"view {tuple(got.shape)} strides {got.stride()}")
        if not torch.equal(got, src):
            raise AssertionError(f"copy differs in {(got != src).sum().item()} elements")

    cases = ((3, 77, 128, 77, 0, "bf16"), (2, 1, 64, 1, 0, "fp16"), (1, 130, 512, 300, 64, "bf16"),
             (2, 64, 64, 64, 0, "fp16"))
    return [(f"bwd512g_kmajor_copy[{c[5]},G={c[0]},K={c[1]},D={c[2]},rows {c[4]}..{c[4] + c[1]} of {c[3]}]",
             lambda c=c: check(*c)) for c in cases]

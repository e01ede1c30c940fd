"""MX GEMMs through PyTorch's row-scaled FP8 GEMM, when ``tilefly.config.mx_requantize`` asks for it.

The exact kernels promote an FP32 partial per 32-K block, which costs more than the FP8 MMA itself
on large shapes (~130 TFLOP/s on the H200, BENCHMARKS.md). Here both operands are rewritten with
one scale per row (kernels_requant.py: each block shifted down by the row's largest exponent and
rounded to E4M3), and ``torch._scaled_mm`` with row-wise FP32 scales runs the product on the FP8
tensor cores with FP32 accumulation. Not exact: a value whose shifted magnitude falls below E4M3's
normal range loses low bits. On a float64 reference (``scripts/mx_requant_error.py``) the error is
3.2e-7 of max|C| for Gaussian blocks and 1.3e-5 with block scales spread over 2^+-8, against
3.2e-3 for rounding C to BF16 alone. Hence opt-in, and only for shapes where the GEMM is large
enough to pay for the two requantization passes: ``serves``.
"""
from __future__ import annotations

from typing import Any

import torch

from tilefly import _triton_launch, config
from tilefly.mx.layout import from_blocked
from tilefly.ops.mx_gemm.eligibility import MXProblem

# M and N at least this. H200 (scripts/mx_requant_probe.py at cfd3494, BENCHMARKS.md): served in 139 us
# against 178 us for BF16 mm at 4096^3 MXFP8, but 108 against 90 us at 2048 x 4096 x 4096 and 116
# against 27 us at 512 x 4096 x 4096, where the two extra launches and passes do not pay.
MIN_SIDE = 4096
ALIGN = 16          # the FP8 GEMM wants M, N and K in multiples of 16
CHUNK = 2048        # elements a requantization program moves per step: 16 bytes a thread (FP8)
SCALE_BLOCK = 32


def serves(p: MXProblem, out_dtype: torch.dtype) -> bool:
    """Whether this call goes through requantization (the option is on and the shape qualifies)."""
    return (config.mx_requantize and out_dtype == torch.bfloat16 and min(p.m, p.n) >= MIN_SIDE
            and p.m % ALIGN == 0 and p.n % ALIGN == 0 and p.k % ALIGN == 0)


def _plain_scales(scale: torch.Tensor, rows: int, k_blocks: int, swizzled: bool) -> torch.Tensor:
    """The (rows, K / 32) exponent bytes, whatever layout the call gave."""
    scale = scale.view(torch.uint8)
    return from_blocked(scale, rows, k_blocks) if swizzled else scale.reshape(rows, k_blocks)


def requantize_rows(q: torch.Tensor, exponents: torch.Tensor, k: int, fp4: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 [rows, k] with one scale per row, FP32 row scales [rows]) from row-major MX data
    ``q`` ([rows, k] E4M3, or [rows, k / 2] packed E2M1 bytes) and its (rows, k / 32) exponents."""
    rows = q.shape[0]
    out = torch.empty(rows, k, dtype=torch.uint8, device=q.device)
    row_scale = torch.empty(rows, dtype=torch.float32, device=q.device)
    q = q.view(torch.uint8)
    block_kb = max(2, 1 << (k // SCALE_BLOCK - 1).bit_length())
    _triton_launch.launch_direct(_launches, _requant_kernel, (rows, 1), (q, exponents, out, row_scale),
                                 (k, q.stride(0), exponents.stride(0), out.stride(0)),
                                 dict(FP4=fp4, BLOCK_KB=block_kb, CHUNK=CHUNK), num_warps=4)
    return out.view(torch.float8_e4m3fn), row_scale


# Compiled requantization kernels, replayed through Triton's C launcher (_triton_launch.launch_direct):
# its Python launch path costs tens of microseconds, more than the kernel on a 512-row operand.
_launches: dict[tuple, Any] = {}


def _requant_kernel():
    from tilefly.ops.mx_gemm.kernels_requant import mx_requant_rows_kernel

    return mx_requant_rows_kernel


def run(p: MXProblem, a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
        out: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """out = scaled_mm(a, b) (+ bias) through requantization; a is M x K row-major, b K x N
    column-major, as eligibility.parse accepted them."""
    fp4 = p.fmt == "mxfp4"
    k_blocks = p.k // SCALE_BLOCK
    qa, ra = requantize_rows(a, _plain_scales(scale_a, p.m, k_blocks, p.swizzled_a), p.k, fp4)
    qb, rb = requantize_rows(b.t(), _plain_scales(scale_b, p.n, k_blocks, p.swizzled_b), p.k, fp4)
    torch._scaled_mm(qa, qb.t(), ra[:, None], rb[None, :], bias=bias, out_dtype=out.dtype, out=out)
    return out

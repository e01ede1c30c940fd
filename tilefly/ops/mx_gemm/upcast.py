"""MX GEMMs through PyTorch's BF16 GEMM: the route for shapes where the product, not the weight
stream, sets the time.

The exact kernels (kernels_v2) promote an FP32 partial every 32 K, which costs more issue slots than
the FP8 MMA it scales: they reach ~100-130 TFLOP/s on the H200 where cuBLAS's BF16 GEMM reaches
~700. Where the operands are read once per several output tiles (both sides of the product at least
``MIN_SIDE``), tilefly instead upcasts both operands to BF16 in one launch (kernels_upcast.py),
multiplies them with ``torch.mm`` and rescales the rows and columns that carried a scale. This is
what the stock path (dequantize, then ``torch.mm``) computes, with the dequantization in one kernel.
Unlike the stock path it keeps rows whose scales leave BF16's range: such a row is upcast relative
to its largest scale and its product rescaled in FP32. Rows whose scales all lie in 2^-117 .. 2^119
are exact; a shifted row loses only blocks more than 2^117 below its largest (flushed to zero), which
the exact kernels would keep (``TILEFLY_MX_UPCAST=never`` sends every call to them).

Upcasting inside the GEMM's CTAs instead (kernels_v3 on tiles of up to 128 x 128, ``configs.v3_wide_configs``)
reached at most ~300 TFLOP/s on the H200, level with this route at 128 tokens and slower beyond (BENCHMARKS.md,
session 47), so this route stays.

Output: BF16 without bias goes straight from the GEMM into ``out`` (rescaled in place where needed);
FP16 and FP32 outputs and a bias take the GEMM's FP32 product through one more pass (cast, scale,
bias), so the result is rounded once, as the exact kernels round it.
"""
from __future__ import annotations

import torch

from tilefly import config
from tilefly.ops.mx_gemm.eligibility import MXProblem

# The smaller of M and N at least this (both formats). H200, scripts/mx_upcast_probe.py (BENCHMARKS.md,
# session 20): at 128 tokens the route took 33-42 us against 45-54 for the exact kernels; at 64 the
# exact MXFP8 kernel won (29.8 against 32.8 us).
MIN_SIDE = 128
SCALE_BLOCK = 32
CHUNK = 4096                 # values an upcast program converts a step: 32 a thread over 4 warps
RESCALE_TILE = (32, 256)     # rows x columns a rescale program covers, 8 warps

# Compiled upcast and rescale kernels, replayed through Triton's C launcher (_triton_launch.launch_direct):
# through the JIT the route's launches cost ~150 us of host time a call on the H200 host.
_launches: dict = {}


def _upcast_kernel():
    from tilefly.ops.mx_gemm.kernels_upcast import mx_upcast_rows_kernel

    return mx_upcast_rows_kernel


def _rescale_kernel():
    from tilefly.ops.mx_gemm.kernels_upcast import mx_rescale_kernel

    return mx_rescale_kernel


def serves(p: MXProblem, out_dtype: torch.dtype) -> bool:
    """Whether this call takes the upcast route (``tilefly.config.mx_upcast``: 'auto' by shape)."""
    mode = config.mx_upcast
    if mode == "auto":
        return min(p.m, p.n) >= MIN_SIDE
    return mode == "always"


def _pow2_at_least(x: int) -> int:
    return 1 << max(0, x - 1).bit_length()


def upcast_operands(a: torch.Tensor, scale_a: torch.Tensor, b: torch.Tensor, scale_b: torch.Tensor, m: int, n: int,
                    k: int, fp4: bool, a_swizzled: bool, b_swizzled: bool):
    """(BF16 A [m, k], BF16 B [n, k], FP32 row scales of A [m] and of B [n]), one launch, one buffer
    each: ``a16[r] * scale_a[r]`` is row r of the dequantized A (and so for B). a and b row-major
    [rows, k] E4M3 (or [rows, k / 2] packed E2M1 bytes)."""
    from tilefly import _triton_launch

    out = torch.empty(m + n, k, dtype=torch.bfloat16, device=a.device)
    row_scale = torch.empty(m + n, dtype=torch.float32, device=a.device)
    qa, sa, qb, sb = a.view(torch.uint8), scale_a.view(torch.uint8), b.view(torch.uint8), scale_b.view(torch.uint8)
    blocks = min(_pow2_at_least(k // SCALE_BLOCK), CHUNK // SCALE_BLOCK)
    per_program = CHUNK // SCALE_BLOCK // blocks
    grid = -(-m // per_program) + -(-n // per_program)
    _triton_launch.launch_direct(_launches, _upcast_kernel, (grid, 1), (qa, sa, qb, sb, out, row_scale),
                                 (m, n, k, qa.stride(0), *_scale_strides(sa, a_swizzled), qb.stride(0),
                                  *_scale_strides(sb, b_swizzled), out.stride(0)),
                                 dict(FP4=fp4, A_SWIZZLED=a_swizzled, B_SWIZZLED=b_swizzled, ROWS=per_program,
                                      BLOCKS=blocks), num_warps=4)
    a16, b16 = out.split((m, n))
    ra, rb = row_scale.split((m, n))
    return a16, b16, ra, rb


def _scale_strides(s: torch.Tensor, swizzled: bool) -> tuple[int, int]:
    return (0, 0) if swizzled else (s.stride(0), s.stride(1))


def rescale(c: torch.Tensor, out: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
            bias: torch.Tensor | None, always: bool) -> None:
    """out = c * scale_a[:, None] * scale_b[None, :] (+ bias), cast to out's dtype; c and out have
    unit column stride. Unless ``always``, tiles whose scales are all 1 are skipped, so c must then
    be ``out`` itself (rescaled in place)."""
    from tilefly import _triton_launch

    m, n = out.shape
    block_m, block_n = RESCALE_TILE
    _triton_launch.launch_direct(_launches, _rescale_kernel, (-(-m // block_m), -(-n // block_n)),
                                 (c, out, scale_a, scale_b, out if bias is None else bias),
                                 (m, n, c.stride(0), out.stride(0), 0 if bias is None else bias.stride(0)),
                                 dict(BIAS=bias is not None, ALWAYS=int(always), BLOCK_M=block_m, BLOCK_N=block_n),
                                 num_warps=8)


def _mm_fp32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b with FP32 output from BF16 operands (ATen's ``mm.dtype`` is CUDA-only; on CPU the
    FP32 product of the BF16 values is the same thing)."""
    if a.is_cuda:
        return torch.mm(a, b, out_dtype=torch.float32)
    return torch.mm(a.float(), b.float())


def run(p: MXProblem, a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
        out: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """out = scaled_mm(a, b) (+ bias) through BF16; a is M x K row-major, b K x N column-major, as
    eligibility.parse accepted them; out M x N contiguous."""
    a16, b16, ra, rb = upcast_operands(a, scale_a, b.t(), scale_b, p.m, p.n, p.k, p.fmt == "mxfp4", p.swizzled_a,
                                       p.swizzled_b)
    if out.dtype == torch.bfloat16 and bias is None:
        torch.mm(a16, b16.t(), out=out)
        rescale(out, out, ra, rb, None, always=False)
    else:
        rescale(_mm_fp32(a16, b16.t()), out, ra, rb, bias, always=True)
    return out

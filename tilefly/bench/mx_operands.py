"""MX operands for the mxfp_gemm suite: a small OCP-MX quantizer and a BF16 dequantizer.

Benchmark input generation only (tilefly's user-facing ``tilefly.mx`` is separate).
Rules, after the OCP Microscaling Formats spec v1.0:

- blocks of 32 consecutive elements along the last dim (K) share one E8M0 scale
  ``2**e``, stored biased by 127 (0 -> 2**-127, 254 -> 2**127, 255 = NaN);
- ``e = floor(log2(amax)) - emax_elem`` where ``emax_elem`` is the exponent of
  the element format's largest normal (E4M3: 448 = 1.75 * 2**8 -> 8;
  E2M1: 6 = 1.5 * 2**2 -> 2), clamped to [-127, 127]; an all-zero block gets 2**-127;
  a block holding NaN or Inf gets the NaN scale;
- elements are ``x / 2**e`` converted with saturation (to +-448 or +-6), rounding
  to nearest, ties to even;
- MXFP4 packs two E2M1 codes a byte, the element of even index in the low nibble
  (``torch.float4_e2m1fn_x2``). E2M1 code = sign << 3 | exponent << 1 | mantissa,
  magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK = 32
FORMATS = ("mxfp8", "mxfp4")
_EMAX = {"mxfp8": 8, "mxfp4": 2}
_MAX = {"mxfp8": 448.0, "mxfp4": 6.0}
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Midpoints between neighbouring E2M1 magnitudes, and whether a tie there rounds up
# (to the neighbour with an even code, i.e. mantissa bit 0).
_FP4_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_FP4_TIE_UP = (False, True, False, True, False, True, False)


@dataclass
class MXOperand:
    data: torch.Tensor    # float8_e4m3fn (rows, K) or float4_e2m1fn_x2 (rows, K // 2)
    scale: torch.Tensor   # float8_e8m0fnu (rows, K // 32)
    fmt: str

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size() + self.scale.numel()


def _check(x: torch.Tensor, fmt: str) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    if x.dim() != 2 or x.shape[-1] % BLOCK:
        raise ValueError(f"expected a 2-D tensor whose last dim is a multiple of {BLOCK}, got {tuple(x.shape)}")


def block_exponents(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """Unbiased shared exponent per block of 32 along the last dim (int32, rows x K/32);
    255 - 127 = 128 marks a NaN scale."""
    _check(x, fmt)
    amax = x.float().reshape(x.shape[0], -1, BLOCK).abs().amax(-1)
    _, exp = torch.frexp(amax)                 # amax = m * 2**exp, m in [0.5, 1): floor(log2) = exp - 1
    e = (exp - 1 - _EMAX[fmt]).clamp(-127, 127)
    e = torch.where(amax == 0, torch.full_like(e, -127), e)
    return torch.where(torch.isfinite(amax), e, torch.full_like(e, 128))


def _fp4_codes(y: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8, 0..15) of float32 ``y`` already divided by its scale; saturating."""
    mag = y.abs()
    code = torch.zeros(y.shape, dtype=torch.uint8, device=y.device)
    for mid, up in zip(_FP4_MIDPOINTS, _FP4_TIE_UP):
        code += (mag >= mid if up else mag > mid).to(torch.uint8)
    return code | (torch.signbit(y).to(torch.uint8) << 3)


def quantize(x: torch.Tensor, fmt: str) -> MXOperand:
    """Quantize a (rows, K) tensor to ``fmt`` ("mxfp8" or "mxfp4") with 1x32 E8M0 block scales."""
    e = block_exponents(x, fmt)
    rows, k = x.shape
    scale = torch.exp2(e.clamp(max=127).float())
    y = (x.float().reshape(rows, -1, BLOCK) / scale.unsqueeze(-1)).reshape(rows, k)
    y = y.clamp(-_MAX[fmt], _MAX[fmt])
    if fmt == "mxfp8":
        data = y.to(torch.float8_e4m3fn)
    else:
        codes = _fp4_codes(y).reshape(rows, k // 2, 2)
        data = (codes[..., 0] | (codes[..., 1] << 4)).view(torch.float4_e2m1fn_x2)
    biased = (e + 127).to(torch.uint8)
    return MXOperand(data, biased.view(torch.float8_e8m0fnu), fmt)


def _fp4_table(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(FP4_VALUES + tuple(-v for v in FP4_VALUES), dtype=dtype, device=device)


def dequantize_bits(data: torch.Tensor, scale_bits: torch.Tensor, fmt: str, fp4_table: torch.Tensor | None = None,
                    dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Dequantize from plain views: ``data`` float8_e4m3fn (mxfp8) or uint8 packed codes (mxfp4),
    ``scale_bits`` the E8M0 scales viewed as uint8. Written with ordinary ops so that
    ``torch.compile`` can trace it. In BF16 every product is exact (E4M3/E2M1 values times a
    power of two), so BF16 is a lossless target."""
    rows = data.shape[0]
    s = torch.exp2(scale_bits.float() - 127.0)
    s = torch.where(scale_bits == 255, torch.full_like(s, float("nan")), s).to(dtype)
    if fmt == "mxfp8":
        values = data.to(dtype)
    else:
        table = fp4_table if fp4_table is not None else _fp4_table(data.device, dtype)
        low = table[(data & 15).long()]
        high = table[(data >> 4).long()]
        values = torch.stack((low, high), dim=-1).reshape(rows, -1)
    return (values.reshape(rows, -1, BLOCK) * s.unsqueeze(-1)).reshape(rows, -1)


def dequantize(op: MXOperand, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    data = op.data if op.fmt == "mxfp8" else op.data.view(torch.uint8)
    return dequantize_bits(data, op.scale.view(torch.uint8), op.fmt, dtype=dtype)

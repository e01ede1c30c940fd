"""MX operands for the mxfp_gemm suite, quantized by ``tilefly.mx`` (the project's one MX quantizer;
its rounding rules are in ``tilefly/mx/quant.py``).

An operand holds the data and unswizzled (rows, K/32) scales as ``F.scaled_mm`` takes them, and
hands the dequantizing baselines plain views of them (float8_e4m3fn data or uint8 packed FP4
codes, uint8 scale bytes): Inductor's CPU backend cannot hold float4_e2m1fn_x2 or
float8_e8m0fnu tensors in a compiled graph, and the views cost nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tilefly import mx

FORMATS = mx.FORMATS


@dataclass
class MXOperand:
    data: torch.Tensor    # float8_e4m3fn (rows, K) or float4_e2m1fn_x2 (rows, K // 2)
    scale: torch.Tensor   # float8_e8m0fnu (rows, K // 32)
    fmt: str

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size() + self.scale.numel()

    def plain(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(data, scale bytes) without the float4 / e8m0 dtypes; ``tilefly.mx.dequantize`` takes them."""
        data = self.data if self.data.dtype == torch.float8_e4m3fn else self.data.view(torch.uint8)
        return data, self.scale.view(torch.uint8)


def quantize(x: torch.Tensor, fmt: str) -> MXOperand:
    """Quantize a (rows, K) tensor to ``fmt`` ("mxfp8" or "mxfp4"), scales unswizzled."""
    data, scale = mx.quantize(x, fmt)
    return MXOperand(data, scale, fmt)

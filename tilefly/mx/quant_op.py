"""``tilefly::mx_quantize_rows``: MX activation quantization as one opaque op in compiled graphs.

Traced as PyTorch ops, ``quantize_rows`` gave Inductor a poor decode step (Llama-3.1-8B, 32
requests, H200, BENCHMARKS.md session 29): the block amax, a reduction over 32 elements, cannot
share a kernel with the RMSNorm before it, a reduction over K, so each quantization took kernels of
its own, and two RMSNorm reductions feeding them took 13.8 and 23.5 µs a call. The op runs
kernels_quant's one-pass kernel instead (bit-identical to the ops, which serve wherever the kernel
does not: CPU tensors, no Triton, a failed launch): at 57a0cc3 the step's Inductor kernels fell from
1586 to 697 µs, and the op's took 328. It quantizes its input as eager mode rounded it (BF16), where
Inductor's fused ops may quantize an unrounded FP32 intermediate.

Compiled graphs do not deduplicate calls: q, k and v projections of one activation make three.
``tilefly.mx.shared_quant_pass`` (installed by ``tilefly.enable()``) keeps one.
"""
from __future__ import annotations

import torch

from tilefly.mx import formats
from tilefly.mx.formats import BLOCK
from tilefly.mx.quant import quantize_rows


@torch.library.custom_op("tilefly::mx_quantize_rows", mutates_args=())
def mx_quantize_rows(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_rows(x, fmt)`` as uint8 (data, scale bytes): (rows, K / elements-a-byte), (rows, K / 32)."""
    data, scale_bits = quantize_rows(x, formats.ELEMENTS[fmt])
    return data.view(torch.uint8), scale_bits


@mx_quantize_rows.register_fake
def _mx_quantize_rows_fake(x, fmt):
    rows, k = x.shape
    return (x.new_empty((rows, k // formats.ELEMENTS[fmt].per_byte), dtype=torch.uint8),
            x.new_empty((rows, k // BLOCK), dtype=torch.uint8))

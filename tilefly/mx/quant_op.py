"""``tilefly::mx_quantize_rows``: MX activation quantization as one opaque op in compiled graphs.

Traced as PyTorch ops, ``quantize_rows`` gave Inductor a poor decode step (Llama-3.1-8B, 32
requests, H200, session 29 profile): the block amax, a reduction over 32 elements, cannot share a
kernel with the RMSNorm before it, a reduction over K, so each quantization became kernels of its
own, and the two largest RMSNorm reductions feeding them took 13.8 and 23.5 µs a call (the BF16
model's: 7.4 and 9.6). The op hands the
quantization to kernels_quant's one-pass kernel (bit-identical to the ops, which serve wherever the
kernel does not: CPU tensors, no Triton, a failed launch), and Inductor writes a plain RMSNorm.

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

"""``tilefly::attention_mx_quantize``: a masked attention call and the MX quantization of its output as one op.

A compiled MX model's o_proj input is the attention output, transposed and reshaped (views) and quantized
(``tilefly::mx_quantize_rows``): at 32 requests the Llama-3.1-8B MXFP4 decode step ran the quantization as a
kernel of its own after every layer's attention, about 1.9 µs each plus its launch gap in the CUDA graph
(BENCHMARKS.md session 40). ``tilefly.mx.attention_fusion`` (a step of the post-grad pass,
``config.mx_fused_quant``) replaces the attention op, the views and the quantization by this op.

Where tilefly's router would serve the attention call with its decode kernel (``eager.decode_refusal``: the
attention family enabled, a mask given, the decode kernel taking the shapes), the kernel quantizes the
output as it would have stored it (kernels_decode's QUANT: bit-identical). Anywhere else (CPU tensors, the
attention family off, a call the decode kernel does not take) the op runs what the graph ran: the same
ATen attention op (through the router, whatever serves it), the same views, ``quantize_rows``.

It returns ``(data, scale_bytes)`` as ``mx_quantize_rows`` does for rows of ``row_len`` elements;
``out_strides`` are the attention output's strides the graph had, from which the pass checked that the views
make its memory, in order, the quantized rows.
"""
from __future__ import annotations

import logging

import torch

from tilefly.mx import formats
from tilefly.mx.formats import BLOCK
from tilefly.mx.quant import quantize_rows

_log = logging.getLogger("tilefly.mx")

# The ATen attention ops the pass fuses: the two CUDA ops that take a mask (the decode kernel serves them)
# and the CPU op (the fallback path only; it makes the pass testable without a GPU).
BACKENDS = {
    "cudnn": torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    "efficient": torch.ops.aten._scaled_dot_product_efficient_attention.default,
    "cpu": torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
}


def attention_output(q, k, v, attn_bias, scale, compute_log_sumexp: bool, backend: str) -> torch.Tensor:
    """The attention op's output as the graph computed it (no dropout, not causal: the pass checked)."""
    if backend == "cpu":
        return BACKENDS[backend](q, k, v, 0.0, False, attn_mask=attn_bias, scale=scale)[0]
    return BACKENDS[backend](q, k, v, attn_bias, compute_log_sumexp, scale=scale)[0]


def _rows_of(out: torch.Tensor, out_strides: list[int], row_len: int) -> torch.Tensor:
    """The quantized rows: ``out``'s memory, in order, laid out as the graph's strides had it."""
    if list(out.stride()) != list(out_strides):
        out = torch.empty_strided(out.shape, out_strides, dtype=out.dtype, device=out.device).copy_(out)
    return out.as_strided((out.numel() // row_len, row_len), (row_len, 1))


def _decoded(q, k, v, attn_bias, scale, backend: str, out_strides: list[int], spec) -> tuple:
    """(the decode kernel's quantized output, None), or (None, why not) where the router would not serve
    the call with that kernel or the kernel failed."""
    if not q.is_cuda or backend == "cpu":
        return None, f"{q.device.type} tensors on the {backend} op"
    from tilefly.ops.attention import decode, eager

    reason = decode.quant_reason(q.shape[-1], out_strides) or eager.decode_refusal(backend, q, k, v, attn_bias,
                                                                                    scale)
    if reason is not None:
        return None, reason
    data = torch.empty(q.numel() // spec.per_byte, dtype=torch.uint8, device=q.device)
    scale_bits = torch.empty(q.numel() // BLOCK, dtype=torch.uint8, device=q.device)
    try:
        decode.run(q, k, v, attn_bias, scale, quant=decode.Quantized(data, scale_bits, spec.name == "mxfp4",
                                                                      spec.emax, tuple(out_strides[:3])))
    except Exception as err:  # noqa: BLE001 - a failed launch leaves the graph's own ops to serve
        _log.warning("tilefly.mx: attention + quantization with the graph's own ops: the decode kernel failed: "
                     "%s: %s", type(err).__name__, err)
        return None, f"the decode kernel failed: {type(err).__name__}"
    return (data, scale_bits), None


@torch.library.custom_op("tilefly::attention_mx_quantize", mutates_args=())
def attention_mx_quantize(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_bias: torch.Tensor | None,
                          scale: float | None, compute_log_sumexp: bool, backend: str, out_strides: list[int],
                          row_len: int, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The MX bytes of an attention call's output rows: see the module docstring."""
    spec = formats.ELEMENTS[fmt]
    rows = q.numel() // row_len
    decoded, reason = _decoded(q, k, v, attn_bias, scale, backend, out_strides, spec)
    if decoded is not None:
        data, scale_bits = decoded
        return data.view(rows, row_len // spec.per_byte), scale_bits.view(rows, row_len // BLOCK)
    _log.debug("tilefly.mx: attention + quantization with the graph's own ops: %s", reason)
    out = attention_output(q, k, v, attn_bias, scale, compute_log_sumexp, backend)
    data, scale_bits = quantize_rows(_rows_of(out, out_strides, row_len), spec)
    return data.view(torch.uint8), scale_bits


@attention_mx_quantize.register_fake
def _attention_mx_quantize_fake(q, k, v, attn_bias, scale, compute_log_sumexp, backend, out_strides, row_len, fmt):
    return fake_outputs(q, row_len, formats.ELEMENTS[fmt])


def fake_outputs(q: torch.Tensor, row_len: int, spec) -> tuple[torch.Tensor, torch.Tensor]:
    """Empty tensors shaped as the op's outputs (q: real or fake; the output has q's shape)."""
    rows = q.numel() // row_len
    return (q.new_empty((rows, row_len // spec.per_byte), dtype=torch.uint8),
            q.new_empty((rows, row_len // BLOCK), dtype=torch.uint8))

"""``tilefly::silu_mul_mx_quantize``: an MLP's ``silu(gate) * up`` and its MX quantization as one op.

The input of a compiled Llama / Qwen3 MLP's down projection, when that is an MX layer, took Inductor's
pointwise kernel and then tilefly's quantization kernel (``tilefly::mx_quantize_rows``); at 32 requests the
Llama-3.1-8B MXFP4 step ran 32 of each (BENCHMARKS.md session 37). ``tilefly.mx.silu_fusion`` (a step of
the post-grad pass, ``config.mx_fused_quant``) replaces both by this op, whose CUDA path is
kernels_silu_quant's one kernel.

It returns ``(data, scale_bytes)``: ``quantize_rows`` of ``silu(gate) * up``'s rows as uint8 bytes,
exactly as ``mx_quantize_rows`` returns them. gate and up may be strided rows (column slices of one packed
gate/up GEMM output) as long as each row's elements are contiguous. Where the kernel does not serve (CPU
tensors, a dtype other than BF16, a row length that is not a multiple of 32, a failed launch) the PyTorch
ops compute the values (``silu_mul_quantize_ops``). ``tilefly::silu_mul_mx_quantize_expanded`` (MXFP4)
also returns their expanded copy, which the down projection's GEMM takes instead of unpacking the nibbles
(tilefly.mx.expanded; each program's chunk of CHUNK_BLOCKS blocks is one fold group).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tilefly import config
from tilefly.mx import expanded, formats
from tilefly.mx.formats import BLOCK, ElementFormat
from tilefly.mx.quant import kernel_or_ops, quantize_rows_ops

CHUNK_BLOCKS = 64          # scale blocks a program takes: 2048 elements, 16 a thread over NUM_WARPS warps
NUM_WARPS = 4
_launches: dict = {}       # compiled kernels, replayed through _triton_launch.launch_direct
_kernel_failed: dict = {}  # device index -> why the kernel could not run there (the ops serve instead)


def shape_reason(shape, dtype: torch.dtype) -> str | None:
    """Why rows of this shape and dtype are not the kernel's, or None (also what the fusion checks on
    the graph's fake values)."""
    n = shape[-1] if len(shape) else 0
    if dtype != torch.bfloat16:
        return f"{dtype} rows (the kernel reads BF16)"
    if n % BLOCK or n <= 0:
        return f"row length {n} (the kernel takes a positive multiple of {BLOCK})"
    return None


def kernel_reason(gate: torch.Tensor, up: torch.Tensor) -> str | None:
    """Why the kernel does not run on these tensors, or None when it does."""
    if not gate.is_cuda:
        return f"{gate.device.type} tensors (the kernel runs on CUDA devices)"
    if (reason := shape_reason(gate.shape, gate.dtype)) is not None:
        return reason
    if up.shape != gate.shape or up.dtype != gate.dtype:
        return f"gate {tuple(gate.shape)} {gate.dtype} and up {tuple(up.shape)} {up.dtype} differ"
    return _kernel_failed.get(gate.get_device())


def silu_mul_quantize_ops(gate, up, spec: ElementFormat):
    """The PyTorch ops: transformers' ``act_fn(gate) * up`` with SiLU, then ``quantize_rows_ops``."""
    x = F.silu(gate) * up
    data, scale_bits = quantize_rows_ops(x.reshape(-1, x.shape[-1]), spec)
    return data.view(torch.uint8), scale_bits


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as (rows, N) with contiguous rows, a view where one exists."""
    rows = t.reshape(-1, t.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def _kernel():
    from tilefly.mx.kernels_silu_quant import silu_mul_mx_quantize_kernel

    return silu_mul_mx_quantize_kernel


def silu_mul_quantize_kernel(gate, up, spec: ElementFormat, out=None, expand: bool = False):
    """kernels_silu_quant's kernel on BF16 operands (CPU tensors: Triton's interpreter, for the CI
    checks); ``out``: (data, scale bytes[, expanded, expanded scales]) to write into. ``expand`` (MXFP4):
    also the expanded copy (tilefly.mx.expanded, fold groups of CHUNK_BLOCKS), returned after the scales."""
    from tilefly import _triton_launch

    g, u = _rows(gate), _rows(up)
    rows, n = g.shape
    if out is None:
        out = fake_outputs(g, spec, expand)
    if rows:
        chunks = -(-(n // BLOCK) // CHUNK_BLOCKS)
        extra = out[2:4] if expand else out[0:2]     # the unexpanded build never touches these two
        _triton_launch.launch_direct(_launches, _kernel, (rows, chunks),
                                     (g.view(torch.int16), u.view(torch.int16), *out[0:2], *extra),
                                     (n, g.stride(0), u.stride(0)),
                                     dict(EMAX=spec.emax, FP4=spec.name == "mxfp4", BLOCKS=CHUNK_BLOCKS,
                                          TRIGGER=bool(config.mx_pdl and g.is_cuda), EXPAND=expand),
                                     num_warps=NUM_WARPS)
    return out


@torch.library.custom_op("tilefly::silu_mul_mx_quantize", mutates_args=())
def silu_mul_mx_quantize(gate: torch.Tensor, up: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The MX bytes of ``silu(gate) * up``'s rows: see the module docstring."""
    spec = formats.ELEMENTS[fmt]
    return kernel_or_ops(_kernel_failed, gate, kernel_reason(gate, up),
                         lambda: silu_mul_quantize_kernel(gate, up, spec),
                         lambda: silu_mul_quantize_ops(gate, up, spec), "SiLU product + quantization")


@silu_mul_mx_quantize.register_fake
def _silu_mul_mx_quantize_fake(gate, up, fmt):
    return fake_outputs(gate, formats.ELEMENTS[fmt])


def silu_mul_quantize_expanded_ops(gate, up):
    """``silu_mul_quantize_ops`` to MXFP4, then the expanded copy (tilefly.mx.expanded) in the kernel's chunks."""
    data, scale_bits = silu_mul_quantize_ops(gate, up, formats.ELEMENTS["mxfp4"])
    return (data, scale_bits) + expanded.expand_rows_ops(data, scale_bits, CHUNK_BLOCKS)


@torch.library.custom_op("tilefly::silu_mul_mx_quantize_expanded", mutates_args=())
def silu_mul_mx_quantize_expanded(gate: torch.Tensor, up: torch.Tensor
                                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``silu_mul_mx_quantize(gate, up, "mxfp4")``'s bytes, then their expanded copy (expanded, expanded scale
    bytes; tilefly.mx.expanded, fold groups of CHUNK_BLOCKS blocks), from the same kernel."""
    spec = formats.ELEMENTS["mxfp4"]
    return kernel_or_ops(_kernel_failed, gate, kernel_reason(gate, up),
                         lambda: silu_mul_quantize_kernel(gate, up, spec, expand=True),
                         lambda: silu_mul_quantize_expanded_ops(gate, up), "SiLU product + quantization")


@silu_mul_mx_quantize_expanded.register_fake
def _silu_mul_mx_quantize_expanded_fake(gate, up):
    return fake_outputs(gate, formats.ELEMENTS["mxfp4"], expand=True)


def fake_outputs(gate: torch.Tensor, spec: ElementFormat, expand: bool = False):
    """Empty tensors shaped as the op's outputs for a ``gate`` (real or fake); ``expand``: the expanded op's."""
    n = gate.shape[-1]
    rows = gate.numel() // n
    out = (gate.new_empty((rows, n // spec.per_byte), dtype=torch.uint8),
           gate.new_empty((rows, n // BLOCK), dtype=torch.uint8))
    if expand:
        out += (gate.new_empty((rows, n), dtype=torch.uint8), gate.new_empty((rows, n // BLOCK), dtype=torch.uint8))
    return out

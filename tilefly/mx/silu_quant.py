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
ops compute the values (``silu_mul_quantize_ops``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tilefly import config
from tilefly.mx import formats
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


def silu_mul_quantize_kernel(gate, up, spec: ElementFormat, out=None):
    """kernels_silu_quant's kernel on BF16 operands (CPU tensors: Triton's interpreter, for the CI
    checks); ``out``: (data, scale bytes) to write into."""
    from tilefly import _triton_launch

    g, u = _rows(gate), _rows(up)
    rows, n = g.shape
    if out is None:
        out = (torch.empty((rows, n // spec.per_byte), dtype=torch.uint8, device=g.device),
               torch.empty((rows, n // BLOCK), dtype=torch.uint8, device=g.device))
    data, scale_bits = out
    if rows:
        chunks = -(-(n // BLOCK) // CHUNK_BLOCKS)
        _triton_launch.launch_direct(_launches, _kernel, (rows, chunks),
                                     (g.view(torch.int16), u.view(torch.int16), data, scale_bits),
                                     (n, g.stride(0), u.stride(0)),
                                     dict(EMAX=spec.emax, FP4=spec.name == "mxfp4", BLOCKS=CHUNK_BLOCKS,
                                          TRIGGER=bool(config.mx_pdl and g.is_cuda)), num_warps=NUM_WARPS)
    return data, scale_bits


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


def fake_outputs(gate: torch.Tensor, spec: ElementFormat):
    """Empty tensors shaped as the op's outputs for a ``gate`` (real or fake)."""
    n = gate.shape[-1]
    rows = gate.numel() // n
    return (gate.new_empty((rows, n // spec.per_byte), dtype=torch.uint8),
            gate.new_empty((rows, n // BLOCK), dtype=torch.uint8))

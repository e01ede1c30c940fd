"""``tilefly::add_rms_norm_mx_quantize``: residual add, RMSNorm and MX activation quantization as one op.

A compiled decoder layer with MX projections quantized the output of Inductor's fused add-and-RMSNorm
kernel with a kernel of its own (``tilefly::mx_quantize_rows``): at 32 requests the Llama-3.1-8B MXFP4
step ran 128 quantization kernels, 240 µs of its 5013 µs of GPU time plus their launch gaps (BENCHMARKS.md
session 37). ``tilefly.mx.norm_fusion`` (a step of the post-grad pass, ``config.mx_fused_quant``)
replaces the add, the RMSNorm and the quantization after it by this op, whose CUDA path is
kernels_norm_quant's one kernel.

It returns ``(h, data, scale_bytes)``: ``h = a + b`` in a's shape, and ``quantize_rows`` of the
normalised rows as uint8 bytes, exactly as ``mx_quantize_rows`` returns them.
``tilefly::add_rms_norm_mx_quantize_expanded`` (MXFP4) also returns their expanded copy, which the MX
GEMMs reading them take instead of unpacking the nibbles (tilefly.mx.expanded). Where the kernel does not
serve (CPU tensors, a dtype other than BF16, rows that are not contiguous, K beyond ``MAX_K``, a failed
launch) the PyTorch ops compute the same values (``add_rms_norm_quantize_ops``).
"""
from __future__ import annotations

import torch

from tilefly import config
from tilefly.mx import expanded, formats
from tilefly.mx.formats import BLOCK, ElementFormat
from tilefly.mx.quant import kernel_or_ops, quantize_rows_ops

MAX_K = 16384             # one row a program in registers: 16384 BF16 elements over 16 warps
_launches: dict = {}      # compiled kernels, replayed through _triton_launch.launch_direct
_kernel_failed: dict = {}  # device index -> why the kernel could not run there (the ops serve instead)


def shape_reason(shape, dtype: torch.dtype) -> str | None:
    """Why rows of this shape and dtype are not the kernel's, or None (also what the fusion checks
    on the graph's fake values)."""
    k = shape[-1] if len(shape) else 0
    if dtype != torch.bfloat16:
        return f"{dtype} rows (the kernel reads BF16)"
    if k % BLOCK or not 0 < k <= MAX_K:
        return f"row length {k} (the kernel takes a multiple of {BLOCK} up to {MAX_K})"
    return None


def kernel_reason(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor) -> str | None:
    """Why the kernel does not run on these tensors, or None when it does."""
    if not a.is_cuda:
        return f"{a.device.type} tensors (the kernel runs on CUDA devices)"
    if (reason := shape_reason(a.shape, a.dtype)) is not None:
        return reason
    if b.shape != a.shape or b.dtype != a.dtype or weight.dtype != a.dtype or weight.shape != a.shape[-1:]:
        return f"operands {tuple(a.shape)}/{tuple(b.shape)}/{tuple(weight.shape)} of {a.dtype}/{b.dtype}/{weight.dtype}"
    if not (a.is_contiguous() and b.is_contiguous() and weight.is_contiguous()):
        return "operands that are not contiguous"
    return _kernel_failed.get(a.get_device())


def add_rms_norm_quantize_ops(a, b, weight, eps: float, spec: ElementFormat):
    """The PyTorch ops of a transformers RMSNorm after a residual add, then ``quantize_rows_ops``."""
    h = a + b
    hf = h.float()
    x = weight * (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype)
    data, scale_bits = quantize_rows_ops(x.reshape(-1, x.shape[-1]), spec)
    return h, data.view(torch.uint8), scale_bits


def block_k_of(k: int) -> int:
    """The kernel's row tile: K rounded up to a power of two."""
    return 1 << (k - 1).bit_length()


def num_warps(block_k: int) -> int:
    """Warps a row, 4 to 16: 16 elements a thread (two 16-byte loads an operand) from K = 2048 to 8192."""
    return max(4, min(16, block_k // 512))


def _kernel():
    from tilefly.mx.kernels_norm_quant import add_rms_norm_mx_quantize_kernel

    return add_rms_norm_mx_quantize_kernel


def add_rms_norm_quantize_kernel(a, b, weight, eps: float, spec: ElementFormat, out=None, expand: bool = False):
    """kernels_norm_quant's kernel on contiguous BF16 operands (CPU tensors: Triton's interpreter, for
    the CI checks); ``out``: (h, data, scale bytes[, expanded, expanded scales]) to write into. ``expand``
    (MXFP4): also the expanded copy (tilefly.mx.expanded), returned after the scale bytes."""
    from tilefly import _triton_launch

    k = a.shape[-1]
    rows = a.numel() // k
    if out is None:
        out = fake_outputs(a, spec, expand)
    if rows:
        block_k = block_k_of(k)
        views = (a.view(torch.int16), b.view(torch.int16), weight.view(torch.int16), out[0].view(torch.int16))
        extra = out[3:5] if expand else out[1:3]     # the unexpanded build never touches these two
        _triton_launch.launch_direct(_launches, _kernel, (rows, 1), (*views, *out[1:3], *extra), (k,),
                                     dict(EPS=float(eps), EMAX=spec.emax, FP4=spec.name == "mxfp4", BLOCK_K=block_k,
                                          TRIGGER=bool(config.mx_pdl and a.is_cuda), EXPAND=expand),
                                     num_warps=num_warps(block_k))
    return out


@torch.library.custom_op("tilefly::add_rms_norm_mx_quantize", mutates_args=())
def add_rms_norm_mx_quantize(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor, eps: float,
                             fmt: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(a + b, then the MX bytes of ``weight * RMSNorm(a + b)``'s rows): see the module docstring."""
    spec = formats.ELEMENTS[fmt]
    return kernel_or_ops(_kernel_failed, a, kernel_reason(a, b, weight),
                         lambda: add_rms_norm_quantize_kernel(a, b, weight, eps, spec),
                         lambda: add_rms_norm_quantize_ops(a, b, weight, eps, spec), "add + RMSNorm + quantization")


@add_rms_norm_mx_quantize.register_fake
def _add_rms_norm_mx_quantize_fake(a, b, weight, eps, fmt):
    return fake_outputs(a, formats.ELEMENTS[fmt])


def add_rms_norm_quantize_expanded_ops(a, b, weight, eps: float):
    """``add_rms_norm_quantize_ops`` to MXFP4, then the expanded copy (tilefly.mx.expanded)."""
    h, data, scale_bits = add_rms_norm_quantize_ops(a, b, weight, eps, formats.ELEMENTS["mxfp4"])
    return (h, data, scale_bits) + expanded.expand_rows_ops(data, scale_bits)


@torch.library.custom_op("tilefly::add_rms_norm_mx_quantize_expanded", mutates_args=())
def add_rms_norm_mx_quantize_expanded(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor, eps: float
                                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``add_rms_norm_mx_quantize(a, b, weight, eps, "mxfp4")``'s three outputs, then the expanded copy of the
    quantized rows (expanded, expanded scale bytes; tilefly.mx.expanded), from the same kernel."""
    spec = formats.ELEMENTS["mxfp4"]
    return kernel_or_ops(_kernel_failed, a, kernel_reason(a, b, weight),
                         lambda: add_rms_norm_quantize_kernel(a, b, weight, eps, spec, expand=True),
                         lambda: add_rms_norm_quantize_expanded_ops(a, b, weight, eps),
                         "add + RMSNorm + quantization")


@add_rms_norm_mx_quantize_expanded.register_fake
def _add_rms_norm_mx_quantize_expanded_fake(a, b, weight, eps):
    return fake_outputs(a, formats.ELEMENTS["mxfp4"], expand=True)


def fake_outputs(a: torch.Tensor, spec: ElementFormat, expand: bool = False):
    """Empty tensors shaped as the op's outputs for an ``a`` (real or fake); ``expand``: the expanded op's."""
    k = a.shape[-1]
    rows = a.numel() // k
    out = (torch.empty_like(a), a.new_empty((rows, k // spec.per_byte), dtype=torch.uint8),
           a.new_empty((rows, k // BLOCK), dtype=torch.uint8))
    if expand:
        out += (a.new_empty((rows, k), dtype=torch.uint8), a.new_empty((rows, k // BLOCK), dtype=torch.uint8))
    return out

"""quantize / dequantize: high-precision tensors to and from MX data + E8M0 block scales.

Rules (OCP Microscaling Formats v1.0; torchao calls this scale rounding FLOOR):

- each block of 32 consecutive elements along the last dim (K) shares one scale ``2**e`` with
  ``e = floor(log2(amax)) - emax`` (amax: the block's largest magnitude; emax: 8 for E4M3,
  2 for E2M1), clamped to [-127, 127]. Rounding the exponent down puts amax / 2**e in
  [2**emax, 2**(emax + 1)), which can pass the element format's largest value (448 <= y < 512
  for E4M3, 6 <= y < 8 for E2M1): those elements saturate;
- elements are ``x / 2**e`` rounded to nearest, ties to even, saturating at the largest
  finite value (+-448, +-6): never Inf or NaN from a finite input;
- a block containing NaN or Inf gets the NaN scale (255); dequantizing it gives NaN everywhere;
- an all-zero block gets the smallest scale, 2**-127 (byte 0), and zero elements, so it
  dequantizes to zeros, never NaN. Blocks whose amax is below 2**(emax - 126) get that scale too
  (the clamp), their elements then using fewer bits than the format has, or flushing to zero.

Dequantizing is exact (an MX value times a power of two), up to the output dtype's range:
products beyond FP32/BF16 range (scales near 2**127) become Inf, those below its subnormals 0.
"""
from __future__ import annotations

import functools
import importlib.util
import logging
import math

import torch

from tilefly import config
from tilefly.mx import formats
from tilefly.mx.formats import BLOCK, ElementFormat
from tilefly.mx.layout import blocked_numel, from_blocked, to_blocked

_log = logging.getLogger("tilefly.mx")

KERNEL_BLOCKS = 64             # 32-element blocks a program of kernels_quant takes: 2048 elements, 16 a thread
_launches: dict = {}           # compiled quantization kernels, replayed through _triton_launch.launch_direct
_kernel_failed: dict = {}      # device index -> why the kernel could not run there (the ops serve instead)


def quantize_rows(x: torch.Tensor, spec: ElementFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, K) float tensor -> (data, scale bytes): data float8_e4m3fn (rows, K) or packed
    uint8 E2M1 codes (rows, K / 2); scale bytes uint8 (rows, K / 32), unswizzled. No checks:
    the caller validated ``x``. Eager CUDA calls run kernels_quant's one-pass kernel
    (bit-identical); elsewhere, and while ``torch.compile`` traces (Inductor fuses the ops
    itself), ``quantize_rows_ops``."""
    return kernel_or_ops(_kernel_failed, x, kernel_reason(x), lambda: quantize_rows_kernel(x, spec),
                         lambda: quantize_rows_ops(x, spec), "quantizing")


def kernel_or_ops(failed: dict, x: torch.Tensor, reason: str | None, kernel, ops, what: str):
    """``kernel()`` when ``reason`` (why the kernel cannot serve ``x``) is None, else ``ops()``; a kernel
    that raises is remembered in ``failed`` for x's device (with a warning), and the ops serve from then
    on. tilefly.mx's kernels with a PyTorch-ops twin (this module, norm_quant, silu_quant) serve so."""
    if reason is None:
        try:
            return kernel()
        except Exception as err:  # noqa: BLE001 - any failure of the kernel leaves the ops to serve
            reason = failed[x.get_device()] = f"the kernel failed here: {type(err).__name__}: {err}"
            _log.warning("tilefly.mx: %s with PyTorch ops from now on on %s, %s", what, x.device, reason)
    if x.is_cuda and not torch.compiler.is_compiling():   # logging while traced would break the graph
        _log.debug("tilefly.mx: %s with PyTorch ops: %s", what, reason)
    return ops()


def kernel_reason(x: torch.Tensor) -> str | None:
    """Why ``quantize_rows`` does not run kernels_quant on ``x``, or None when it does."""
    if not x.is_cuda:
        return f"{x.device.type} tensor (the kernel runs on CUDA devices)"
    if torch.compiler.is_compiling():
        return "traced by torch.compile (Inductor fuses the PyTorch ops)"
    return _kernel_failed.get(x.get_device()) or _triton_missing()


@functools.cache
def _triton_missing() -> str | None:
    return None if importlib.util.find_spec("triton") else "Triton is not installed"


def _quantize_kernel():
    from tilefly.mx.kernels_quant import mx_quantize_kernel

    return mx_quantize_kernel


def quantize_rows_kernel(x: torch.Tensor, spec: ElementFormat,
                         out: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_rows`` through kernels_quant's kernel, whatever the device (CPU tensors: Triton's
    interpreter, for the CI checks); ``out``: contiguous uint8 (data, scale bytes) to write into."""
    from tilefly import _triton_launch

    rows, k = x.shape
    x = x.contiguous()
    if out is None:
        out = (torch.empty((rows, k // spec.per_byte), dtype=torch.uint8, device=x.device),
               torch.empty((rows, k // BLOCK), dtype=torch.uint8, device=x.device))
    data, scale_bits = out
    n_blocks = scale_bits.numel()
    if n_blocks:
        pdl = bool(config.mx_pdl and x.is_cuda)
        _triton_launch.launch_direct(_launches, _quantize_kernel, (-(-n_blocks // KERNEL_BLOCKS), 1),
                                     (x, data, scale_bits), (n_blocks,),
                                     dict(EMAX=spec.emax, FP4=spec.name == "mxfp4", BLOCKS=KERNEL_BLOCKS, PDL=pdl),
                                     num_warps=4, launch_pdl=pdl)
    return (data.view(torch.float8_e4m3fn) if spec.name == "mxfp8" else data), scale_bits


def quantize_rows_ops(x: torch.Tensor, spec: ElementFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_rows`` in ordinary PyTorch ops: the rules' reference, and what ``torch.compile``
    traces."""
    rows, k = x.shape
    blocks = x.float().reshape(rows, k // BLOCK, BLOCK)
    scale_bits = formats.scale_bits_from_amax(blocks.abs().amax(-1), spec.emax)
    y = blocks * formats.inverse_scale(scale_bits).unsqueeze(-1)   # exact: a power of two, no over/underflow
    if spec.name == "mxfp8":
        data = y.clamp(-spec.max_value, spec.max_value).to(torch.float8_e4m3fn).reshape(rows, k)
    else:
        codes = formats.fp4_encode(y).reshape(rows, k // 2, 2)
        data = codes[..., 0] | (codes[..., 1] << 4)
    return data, scale_bits


def dequantize_rows(data: torch.Tensor, scale_bits: torch.Tensor, spec: ElementFormat,
                    dtype: torch.dtype) -> torch.Tensor:
    """The inverse of ``quantize_rows`` (data may also be the typed tensor or a uint8 view).
    BF16, FP32 and FP64 outputs are computed in that dtype (every product is exact there, so
    this equals computing in FP32 and rounding); FP16 goes through FP32, since E8M0 scales
    reach far beyond FP16's range."""
    compute = dtype if dtype in (torch.bfloat16, torch.float32, torch.float64) else torch.float32
    rows = data.shape[0]
    if spec.name == "mxfp8":
        values = data.view(torch.float8_e4m3fn).to(compute)
    else:
        values = formats.fp4_pair_table(data.device, compute)[data.view(torch.uint8).int()]
    scales = formats.scale_bits_to_float(scale_bits).to(compute)
    out = values.reshape(rows, -1, BLOCK) * scales.unsqueeze(-1)
    return out.reshape(rows, -1).to(dtype)


def check_input(x: object, arg: str = "x") -> int:
    """K (the last dim) of a tensor quantize accepts, or a clear TypeError / ValueError."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{arg} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in formats.INPUT_DTYPES:
        raise TypeError(f"{arg} must be float32, bfloat16 or float16 to quantize, got {x.dtype}")
    if x.dim() == 0 or x.shape[-1] == 0 or x.shape[-1] % BLOCK:
        raise ValueError(f"{arg} must have a last dim (K) that is a positive multiple of {BLOCK} "
                         f"(one E8M0 scale per {BLOCK} elements), got shape {tuple(x.shape)}")
    return x.shape[-1]


def quantize(x: torch.Tensor, fmt: str, *, swizzle="none", block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``x`` (..., K) to ``fmt`` ("mxfp8" or "mxfp4") with one E8M0 scale per 32 K elements.

    Returns ``(data, scales)`` in exactly the form ``F.scaled_mm(..., ScalingType.BlockWise1x32)``
    takes them: data ``float8_e4m3fn`` (..., K) or ``float4_e2m1fn_x2`` (..., K / 2) (two
    elements a byte, the even one in the low nibble); scales ``float8_e8m0fnu``, (..., K / 32)
    row-major for ``swizzle="none"`` (``SwizzleType.NO_SWIZZLE``), or the 1-D blocked layout
    of the (rows, K / 32) matrix for ``"32_4_4"`` (``SwizzleType.SWIZZLE_32_4_4``; rows = the
    product of the leading dims; see ``tilefly.mx.layout``). Rounding rules: the module docstring.
    """
    spec = formats.element_format(fmt)
    layout = formats.swizzle_name(swizzle)
    formats.check_block(block)
    k = check_input(x)
    lead = x.shape[:-1]
    data, scale_bits = quantize_rows(x.reshape(-1, k), spec)
    scales = scale_bits.view(torch.float8_e8m0fnu)
    scales = to_blocked(scales) if layout == "32_4_4" else scales.reshape(*lead, k // BLOCK)
    return data.view(spec.dtype).reshape(*lead, k // spec.per_byte), scales


def _check_dtypes(data: torch.Tensor, scales: torch.Tensor, spec: ElementFormat, dtype: torch.dtype) -> None:
    if data.dtype not in (spec.dtype, torch.uint8):
        other = [f.name for f in formats.ELEMENTS.values() if f.dtype == data.dtype]
        hint = f" ({other[0]} data: pass fmt={other[0]!r})" if other else ""
        raise TypeError(f"data must be {spec.dtype} (or its raw bytes as uint8) for fmt={spec.name!r}, "
                        f"got {data.dtype}{hint}")
    if scales.dtype not in (torch.float8_e8m0fnu, torch.uint8):
        raise TypeError(f"scales must be float8_e8m0fnu (or its raw bytes as uint8), got {scales.dtype}")
    if dtype not in formats.OUTPUT_DTYPES:
        raise TypeError(f"dtype must be one of {formats.OUTPUT_DTYPES}, got {dtype}")


def dequantize(data: torch.Tensor, scales: torch.Tensor, fmt: str, *, swizzle="none",
               dtype: torch.dtype = torch.bfloat16, shape=None) -> torch.Tensor:
    """``data * scale`` per block of 32 K elements, as ``dtype``: the inverse of ``quantize``.

    ``data`` and ``scales`` as ``quantize`` returns them (or their uint8 views, e.g. to keep
    float4/e8m0 dtypes out of a compiled graph); ``swizzle`` names the scales' layout. The
    result has shape (..., K) for data (..., K / elements-a-byte), or ``shape`` (whose last dim
    must be K) when given.
    """
    spec = formats.element_format(fmt)
    layout = formats.swizzle_name(swizzle)
    _check_dtypes(data, scales, spec, dtype)
    if data.dim() == 0:
        raise ValueError("data must have at least one dim (K last)")
    lead, k = data.shape[:-1], data.shape[-1] * spec.per_byte
    if k % BLOCK:
        raise ValueError(f"data's last dim holds K = {k} {spec.name} elements, not a multiple of {BLOCK}")
    rows, cols = math.prod(lead), k // BLOCK
    if layout == "none":
        if tuple(scales.shape) != (*lead, cols):
            raise ValueError(f"scales has shape {tuple(scales.shape)}, but data of shape {tuple(data.shape)} "
                             f"({spec.name}, K = {k}) needs {(*lead, cols)} with swizzle='none'")
        scale_bits = scales.view(torch.uint8).reshape(rows, cols)
    else:
        if scales.numel() != blocked_numel(rows, cols):
            raise ValueError(f"scales has {scales.numel()} elements, but data of shape {tuple(data.shape)} "
                             f"({spec.name}, {rows} rows, K = {k}) needs {blocked_numel(rows, cols)} with "
                             f"swizzle='32_4_4' (({rows}, {cols}) scales padded to 128 x 4 tiles)")
        scale_bits = from_blocked(scales.view(torch.uint8), rows, cols)
    out = dequantize_rows(data.reshape(rows, -1), scale_bits, spec, dtype)
    if shape is None:
        return out.reshape(*lead, k)
    shape = tuple(shape)
    if not shape or shape[-1] != k or math.prod(shape) != rows * k:
        raise ValueError(f"shape {shape} does not fit the dequantized data: last dim must be K = {k} "
                         f"and the elements {rows * k}")
    return out.reshape(shape)

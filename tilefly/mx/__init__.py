"""MX (OCP Microscaling) quantization for F.scaled_mm: MXFP8 / MXFP4 data with E8M0 block scales.

    import tilefly.mx as mx
    data, scales = mx.quantize(x, "mxfp8", swizzle="32_4_4")    # what F.scaled_mm takes
    x_hat = mx.dequantize(data, scales, "mxfp8", swizzle="32_4_4")
    names = mx.swap_linears(model, "mxfp4")                    # nn.Linear -> MXLinear, lm_head kept

Modules: ``formats`` (element/scale formats, bit-level helpers), ``layout`` (the
SWIZZLE_32_4_4 scale layout), ``quant`` (quantize/dequantize and their rounding rules),
``kernels_quant`` (the one-pass Triton quantization kernel CUDA tensors run), ``quant_op``
(that kernel as ``tilefly::mx_quantize_rows`` in compiled graphs), ``shared_quant_pass`` (the
Inductor pass ``tilefly.enable()`` installs so one activation is quantized once and sibling layers
run one GEMM), ``linear`` (MXLinear, swap_linears), ``siblings`` (pack_sibling_weights: sibling
layers' weights back to back, which ``swap_linears`` does and a ``model.to(device)`` undoes),
``expanded`` (MXFP4 activations expanded to the MX GEMM's FP8 operand by the fused quantizing kernels
of ``norm_quant`` and ``silu_quant``, which the pass's ``norm_fusion`` and ``silu_fusion`` steps put in).
Importing this compiles nothing and does not import Inductor.
"""
from tilefly.mx.formats import BLOCK, FORMATS, FP4_VALUES, SWIZZLES
from tilefly.mx.layout import blocked_numel, from_blocked, to_blocked
from tilefly.mx.linear import BACKENDS, MXKernelUnavailable, MXLinear, swap_linears
from tilefly.mx.quant import dequantize, quantize
from tilefly.mx.siblings import pack_sibling_weights

__all__ = ["BLOCK", "FORMATS", "FP4_VALUES", "SWIZZLES", "BACKENDS", "quantize", "dequantize", "to_blocked",
           "from_blocked", "blocked_numel", "MXLinear", "MXKernelUnavailable", "swap_linears",
           "pack_sibling_weights"]

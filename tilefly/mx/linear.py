"""MXLinear: an nn.Linear whose GEMM runs in MXFP8 or MXFP4, and swap_linears to put it in a model.

Weights are quantized once, at construction; the activation is quantized on every forward
(A8W8 / A4W4: "dynamic" activations), its leading dims flattened. Two backends, switchable on
a built module (``m.backend = ...``) so an A/B run compares the same weights:

- ``"scaled_mm"`` (default): ``F.scaled_mm(a, w.t(), ..., BlockWise1x32)``, A (M, K) row-major
  and B the N x K weight seen as K x N column-major (the NT case), bias and output dtype
  passed through. On Hopper, tilefly's override serves it (``tilefly.enable()``); ATen itself
  has no MX kernel on CPU or sm_90, and that failure is raised as ``MXKernelUnavailable``,
  never silently replaced by the other backend (a benchmark must know which path ran).
  On torch without ``F.scaled_mm``, the legacy ``torch._scaled_mm`` is called, which takes
  MX scales only in the SWIZZLE_32_4_4 layout.
- ``"dequant"``: the stock Hopper path, dequantize both operands to the module's dtype, then
  ``torch.mm`` (``torch.addmm`` with a bias).

The default scale layout is ``"32_4_4"``: the only one ATen's CUDA ``F.scaled_mm`` accepts for MX;
tilefly's MX GEMM takes both. Under ``torch.compile`` the module calls ``F.scaled_mm`` through a
custom op of its own, ``tilefly::mx_linear_mm`` (uint8 bits in, the output's shape from its fake
implementation), because tracing ``F.scaled_mm`` itself fails both ways: torch 2.11's Dynamo does
not trace ``aten::_scaled_mm_v2`` (a graph break at every MX layer, so a decode step is no longer
one CUDA graph), and torch 2.13's meta function rejects NO_SWIZZLE MX scales and counts MXFP4
scales from the packed K / 2 (so K > 128 fails). The op runs the same eager call at run time, where
tilefly's override serves it. On CUDA the activation's quantization is opaque too,
``tilefly::mx_quantize_rows`` (tilefly.mx.quant_op says why); the ``"dequant"`` backend, the stock
path, keeps the PyTorch ops for Inductor to fuse.

Inference only: quantization passes no gradient.

Quantized weights are kept as uint8 buffers (``weight_bits``, ``weight_scale_bits``), with
``weight_data`` / ``weight_scales`` giving the float8/float4/e8m0 views: FP8 and E8M0 count as
floating point, so ``model.to(torch.bfloat16)`` would otherwise convert them, and Inductor's CPU
backend cannot hold the float4/e8m0 dtypes in a compiled graph.
"""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from tilefly.mx import expanded, formats, weight_operand
from tilefly.mx.formats import BLOCK
from tilefly.mx.layout import from_blocked, to_blocked
from tilefly.mx.quant import dequantize_rows, quantize_rows
from tilefly.mx.quant_op import mx_quantize_rows

BACKENDS = ("scaled_mm", "dequant")
ACTIVATIONS = ("dynamic",)
MODULE_DTYPES = (torch.bfloat16, torch.float16)

_log = logging.getLogger("tilefly.mx")


class MXKernelUnavailable(RuntimeError):
    """F.scaled_mm found no MX kernel for these inputs on this device (ATen has none on CPU or sm_90)."""


def _device_name(t: torch.Tensor) -> str:
    if t.device.type != "cuda":
        return str(t.device)
    major, minor = torch.cuda.get_device_capability(t.device)
    return f"{t.device} ({torch.cuda.get_device_name(t.device)}, sm_{major}{minor})"


def _mx_mm(a_bits: torch.Tensor, w_bits: torch.Tensor, a_scale_bits: torch.Tensor, w_scale_bits: torch.Tensor,
           fmt: str, swizzle: str, bias: torch.Tensor | None, out_dtype: torch.dtype,
           a_expanded: torch.Tensor | None = None, a_expanded_scales: torch.Tensor | None = None) -> torch.Tensor:
    """``a @ w.t()`` (+ bias) through F.scaled_mm, from the operands' bits (uint8 or already typed):
    a (M, K or K / 2 bytes), w (N, K or K / 2), scales (M, K / 32) (blocked when swizzled) and the weight's in its
    layout; ``a_expanded`` and ``a_expanded_scales``: MXFP4 a's expanded copy, offered to tilefly's MX GEMM
    (tilefly.mx.expanded), which may read it instead of a. Errors F.scaled_mm raises (no MX kernel here) come
    back as MXKernelUnavailable."""
    dtype = formats.ELEMENTS[fmt].dtype
    args = (a_bits.view(dtype), w_bits.view(dtype).t(), a_scale_bits.view(torch.float8_e8m0fnu),
            w_scale_bits.view(torch.float8_e8m0fnu), swizzle, bias, out_dtype)
    try:
        if a_expanded is not None and a_expanded_scales is not None:
            return expanded.offering(weight_operand.call_on_constant_weight, args[0], a_expanded, a_expanded_scales,
                                     _scaled_mm, *args)
        return weight_operand.call_on_constant_weight(_scaled_mm, *args)
    except (RuntimeError, NotImplementedError, ValueError) as err:
        first_line = (str(err).strip().splitlines() or [""])[0]
        raise MXKernelUnavailable(
            f"MXLinear(backend='scaled_mm'): F.scaled_mm found no {fmt.upper()} kernel for these inputs on "
            f"{_device_name(a_bits)} ({type(err).__name__}: {first_line}). ATen has no MX GEMM on CPU or on "
            f"Hopper (sm_90); on Hopper, tilefly.enable() serves MX F.scaled_mm. To run the stock path instead, "
            f"set backend='dequant' (dequantize both operands to {out_dtype}, then torch.mm).") from err


# What compiled graphs call (module docstring): the eager call behind an opaque op whose output
# shape comes from the fake below, not from ATen's meta function.
_MX_MM_SCHEMA = ("(Tensor a_bits, Tensor w_bits, Tensor a_scale_bits, Tensor w_scale_bits, str fmt, str swizzle, "
                 "Tensor? bias, ScalarType out_dtype, Tensor? a_expanded=None, Tensor? a_expanded_scales=None) "
                 "-> Tensor")
mx_linear_mm = torch.library.custom_op("tilefly::mx_linear_mm", _mx_mm, mutates_args=(), schema=_MX_MM_SCHEMA)


@mx_linear_mm.register_fake
def _mx_mm_fake(a_bits, w_bits, a_scale_bits, w_scale_bits, fmt, swizzle, bias, out_dtype, a_expanded=None,
                a_expanded_scales=None):
    return a_bits.new_empty((a_bits.shape[0], w_bits.shape[0]), dtype=out_dtype)


def _scaled_mm(a, b, scale_a, scale_b, swizzle: str, bias, out_dtype) -> torch.Tensor:
    scaled_mm = getattr(F, "scaled_mm", None)
    if scaled_mm is not None:  # torch >= 2.10
        layout = F.SwizzleType.SWIZZLE_32_4_4 if swizzle == "32_4_4" else F.SwizzleType.NO_SWIZZLE
        recipe = F.ScalingType.BlockWise1x32
        return scaled_mm(a, b, scale_a, recipe, scale_b, recipe, swizzle_a=layout, swizzle_b=layout,
                         bias=bias, output_dtype=out_dtype)
    # The legacy op infers MX from the e8m0 scale dtype and the blocked scale count.
    return torch._scaled_mm(a, b, scale_a, scale_b, bias=bias, out_dtype=out_dtype)


class MXLinear(nn.Module):
    """``y = x @ W.T + b`` with W (and, every call, x) quantized to MXFP8 or MXFP4.

    Build one with ``MXLinear.from_linear(linear, fmt=...)`` or from a weight tensor (N x K,
    BF16 or FP16, K a multiple of 32). The output dtype is the weight's dtype (``self.dtype``);
    ``module.to(dtype)`` changes it, like nn.Linear's.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *, fmt: str = "mxfp8",
                 activations: str = "dynamic", swizzle="32_4_4", backend: str = "scaled_mm"):
        super().__init__()
        self.fmt = formats.element_format(fmt).name
        self.swizzle = formats.swizzle_name(swizzle)
        if activations not in ACTIVATIONS:
            raise ValueError(f"activations must be one of {ACTIVATIONS} (quantized on the fly each forward), "
                             f"got {activations!r}")
        self.activations = activations
        self.backend = backend
        if weight.dim() != 2 or weight.dtype not in MODULE_DTYPES:
            raise TypeError(f"weight must be a 2-D bfloat16 or float16 tensor (N x K), got {weight.dtype} "
                            f"of shape {tuple(weight.shape)}")
        if weight.shape[1] % BLOCK or weight.shape[1] == 0:
            raise ValueError(f"weight's in_features (K = {weight.shape[1]}) must be a positive multiple of {BLOCK}")
        self.out_features, self.in_features = weight.shape
        self.dtype = weight.dtype
        data, scale_bits = quantize_rows(weight.detach(), formats.ELEMENTS[self.fmt])
        if self.swizzle == "32_4_4":
            scale_bits = to_blocked(scale_bits)
        self.register_buffer("weight_bits", data.view(torch.uint8))
        self.register_buffer("weight_scale_bits", scale_bits)
        if bias is not None and tuple(bias.shape) != (self.out_features,):
            raise ValueError(f"bias must have shape ({self.out_features},), got {tuple(bias.shape)}")
        self.register_buffer("bias", None if bias is None else bias.detach().to(self.dtype).clone())

    @classmethod
    def from_linear(cls, linear: nn.Linear, fmt: str = "mxfp8", *, activations: str = "dynamic",
                    swizzle="32_4_4", backend: str = "scaled_mm") -> "MXLinear":
        """An MXLinear holding ``linear``'s weight quantized to ``fmt`` (the float weight is not kept)."""
        return cls(linear.weight, linear.bias, fmt=fmt, activations=activations, swizzle=swizzle, backend=backend)

    def _apply(self, fn, recurse=True):
        # model.to(dtype) / .half() cast the bias; the output dtype follows, as nn.Linear's would.
        # (The quantized buffers are uint8, which those casts leave alone.)
        super()._apply(fn, recurse)
        probe = fn(torch.empty(0, dtype=self.dtype))
        if probe.is_floating_point():
            self.dtype = probe.dtype
        return self

    @property
    def backend(self) -> str:
        return self._backend

    @backend.setter
    def backend(self, value: str) -> None:
        if value not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {value!r}")
        self._backend = value

    @property
    def weight_data(self) -> torch.Tensor:
        """The quantized weight, N x K float8_e4m3fn or N x K/2 float4_e2m1fn_x2."""
        return self.weight_bits.view(formats.ELEMENTS[self.fmt].dtype)

    @property
    def weight_scales(self) -> torch.Tensor:
        """The weight's float8_e8m0fnu scales in the module's layout: (N, K/32) or 1-D blocked."""
        return self.weight_scale_bits.view(torch.float8_e8m0fnu)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, fmt={self.fmt}, "
                f"bias={self.bias is not None}, swizzle={self.swizzle}, backend={self.backend}, dtype={self.dtype}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in formats.INPUT_DTYPES or x.shape[-1] != self.in_features:
            raise ValueError(f"MXLinear expects a float32/bfloat16/float16 input with last dim {self.in_features}, "
                             f"got {x.dtype} of shape {tuple(x.shape)}")
        lead = x.shape[:-1]
        rows = x.reshape(-1, self.in_features)
        if self.backend == "scaled_mm" and _quantize_as_op(rows):
            a_data, a_scale_bits = mx_quantize_rows(rows, self.fmt)   # tilefly.mx.quant_op says why
        else:
            a_data, a_scale_bits = quantize_rows(rows, formats.ELEMENTS[self.fmt])
        if self.backend == "dequant":
            out = self._dequant_mm(a_data, a_scale_bits)
        else:
            out = self._scaled_mm(a_data, a_scale_bits)
        return out.reshape(*lead, self.out_features)

    def _dequant_mm(self, a_data: torch.Tensor, a_scale_bits: torch.Tensor) -> torch.Tensor:
        spec = formats.ELEMENTS[self.fmt]
        w_scale_bits = self.weight_scale_bits
        if self.swizzle == "32_4_4":
            w_scale_bits = from_blocked(w_scale_bits, self.out_features, self.in_features // BLOCK)
        a = dequantize_rows(a_data, a_scale_bits, spec, self.dtype)
        w = dequantize_rows(self.weight_bits, w_scale_bits, spec, self.dtype)
        if self.bias is None:
            return torch.mm(a, w.t())
        return torch.addmm(self.bias, a, w.t())

    def _scaled_mm(self, a_data: torch.Tensor, a_scale_bits: torch.Tensor) -> torch.Tensor:
        if self.swizzle != "32_4_4" and not hasattr(F, "scaled_mm"):
            raise ValueError(f"torch {torch.__version__} has no F.scaled_mm, and the legacy torch._scaled_mm takes "
                             f"MX scales only in the SWIZZLE_32_4_4 layout: build MXLinear with swizzle='32_4_4'")
        if self.swizzle == "32_4_4":
            a_scale_bits = to_blocked(a_scale_bits)
        args = (self.weight_bits, a_scale_bits, self.weight_scale_bits, self.fmt, self.swizzle, self.bias,
                self.dtype)
        if torch.compiler.is_compiling():
            return mx_linear_mm(a_data.view(torch.uint8), *args)   # the op takes uint8 bits (schema)
        return _mx_mm(a_data, *args)


def _quantize_as_op(rows: torch.Tensor) -> bool:
    """Whether a traced forward quantizes through the opaque op: CUDA rows being compiled (CPU graphs keep
    the PyTorch ops, which Inductor fuses; the CPU tests of the post-grad pass replace this)."""
    return rows.is_cuda and torch.compiler.is_compiling()


def _skipped(name: str, skip) -> bool:
    return name in skip or name.rsplit(".", 1)[-1] in skip


def _why_not(linear: nn.Linear) -> str | None:
    k = linear.in_features
    if k % BLOCK:
        return f"in_features (K) = {k} is not a multiple of {BLOCK}"
    if linear.weight.dtype not in MODULE_DTYPES:
        return f"weight is {linear.weight.dtype}; MXLinear takes bfloat16 or float16 layers"
    return None


def swap_linears(model: nn.Module, fmt: str, *, skip=("lm_head",), backend: str = "scaled_mm",
                 swizzle="32_4_4", activations: str = "dynamic", pack_siblings: bool = True) -> list[str]:
    """Replace ``model``'s ``nn.Linear`` layers by ``MXLinear`` in place; returns the names swapped.
    With ``pack_siblings``, layers of one parent and one in_features then share weight buffers
    (``tilefly.mx.siblings``), so that compiled graphs run sibling projections as one GEMM.

    A layer is left alone when its qualified name, or the name's last part, is in ``skip``; when
    its K is not a multiple of 32 or its dtype is not BF16/FP16 (logged on ``tilefly.mx`` with the
    reason); and when it is an ``nn.Linear`` subclass (e.g. attention's out_proj, whose weight
    its owner reads directly). A layer shared by several parents is quantized once.
    """
    formats.element_format(fmt)
    swapped: list[str] = []
    built: dict[int, MXLinear | None] = {}
    for name, child in list(model.named_modules(remove_duplicate=False)):
        if type(child) is not nn.Linear or not name:
            continue
        if _skipped(name, skip):
            _log.debug("swap_linears: %s skipped by name", name)
            continue
        if id(child) not in built:
            reason = _why_not(child)
            if reason:
                _log.info("swap_linears: leaving %s as nn.Linear: %s", name, reason)
            built[id(child)] = None if reason else MXLinear.from_linear(
                child, fmt, activations=activations, swizzle=swizzle, backend=backend)
        if built[id(child)] is not None:
            parent_name, _, child_name = name.rpartition(".")
            setattr(model.get_submodule(parent_name), child_name, built[id(child)])
            swapped.append(name)
    if pack_siblings:
        from tilefly.mx.siblings import pack_sibling_weights   # siblings imports this module

        pack_sibling_weights(model)
    return swapped

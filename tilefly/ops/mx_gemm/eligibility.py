"""Which ``_scaled_mm`` calls tilefly's MX GEMM serves, and the checks behind its error messages.

``aten::_scaled_mm_v2`` (what ``F.scaled_mm`` calls) and the legacy ``aten::_scaled_mm`` are
routed here on the CUDA key. A call is **MX** when both recipes are ``BlockWise1x32`` (v2) or
both scales are ``float8_e8m0fnu`` (legacy, which infers the recipe from that dtype and, like
ATen's CUDA kernel, takes the scales in the SWIZZLE_32_4_4 layout). Decisions:

| call                                                        | outcome                             |
|-------------------------------------------------------------|-------------------------------------|
| not MX (tensor-wise, row-wise, 1x128, NVFP4 ...)            | ATen (reason returned)              |
| MX, tensors not on an sm_90 GPU                             | ATen (reason returned)              |
| MX on sm_90, malformed (below)                              | ``MXInputError`` raised here: ATen  |
|                                                             |   has no MX kernel on sm_90 to      |
|                                                             |   fall back to (cuBLAS fails there) |
| MX on sm_90, well formed, outside what the kernel takes     | ATen (reason returned)              |
|   (out_dtype not BF16/FP16/FP32, non-vector bias,           |                                     |
|   contraction_dim other than (1, 0), empty, TMA alignment)  |                                     |
| otherwise                                                   | tilefly (the ``MXProblem``, which   |
|                                                             |   the router hands to the op)       |

Well formed: A (self) 2-D row-major, B (mat2) 2-D column-major (B.t() row-major, the NT case),
both ``float8_e4m3fn`` (MXFP8) or both ``float4_e2m1fn_x2`` (MXFP4, K / 2 bytes a row); K a
multiple of 32; one scale tensor each, ``float8_e8m0fnu``; NO_SWIZZLE scales shaped (M, K/32)
and (N, K/32), SWIZZLE_32_4_4 scales contiguous with ``blocked_numel`` elements (rows padded to
128, K/32 to 4). An empty swizzle list means NO_SWIZZLE, as in ATen's meta function.

``parse_*`` do the checks on metadata only (no device access), so CPU tests cover every message.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tilefly import _device
from tilefly.mx.layout import blocked_numel

BLOCKWISE_1X32 = 3        # torch.nn.functional.ScalingType.BlockWise1x32
NO_SWIZZLE, SWIZZLE_32_4_4 = 0, 1
SCALE_BLOCK = 32
TMA_ALIGN = 16
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
BIAS_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
FORMAT_OF = {torch.float8_e4m3fn: "mxfp8", torch.float4_e2m1fn_x2: "mxfp4"}


class MXInputError(ValueError):
    """An MX ``scaled_mm`` call whose operands or scales do not fit together."""


@dataclass(frozen=True)
class MXProblem:
    fmt: str                  # "mxfp8" or "mxfp4"
    m: int
    n: int
    k: int                    # elements (an MXFP4 byte holds two)
    swizzled_a: bool
    swizzled_b: bool


def _swizzle(arg: object, name: str) -> bool:
    values = list(arg) if arg is not None else []
    if values in ([], [NO_SWIZZLE]):
        return False
    if values == [SWIZZLE_32_4_4]:
        return True
    raise MXInputError(f"{name} must be [] or one SwizzleType (NO_SWIZZLE = 0, SWIZZLE_32_4_4 = 1) for MX "
                       f"scaling, got {values}")


def _row_major(t: torch.Tensor) -> bool:
    return t.stride(1) == 1 and (t.shape[0] <= 1 or t.stride(0) >= t.shape[1])


def _check_scale(scale: torch.Tensor, name: str, rows: int, k_blocks: int, swizzled: bool, what: str) -> None:
    if scale.dtype != torch.float8_e8m0fnu:
        raise MXInputError(f"{name} must be float8_e8m0fnu for MX (BlockWise1x32) scaling, got {scale.dtype}")
    if swizzled:
        need = blocked_numel(rows, k_blocks)
        if scale.numel() != need or not scale.is_contiguous():
            raise MXInputError(
                f"{name} must be a contiguous SWIZZLE_32_4_4 tensor of {need} elements for {what} "
                f"({rows} rows padded to 128, K/32 = {k_blocks} padded to 4), got {scale.numel()} elements, "
                f"shape {tuple(scale.shape)}, contiguous={scale.is_contiguous()}")
    elif tuple(scale.shape) != (rows, k_blocks):
        raise MXInputError(f"{name} must have shape ({rows}, {k_blocks}) for {what} with NO_SWIZZLE "
                           f"(one scale per 32 K elements), got {tuple(scale.shape)}")


def parse(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
          swizzled_a: bool, swizzled_b: bool) -> MXProblem:
    """The MX problem these tensors describe, or ``MXInputError`` saying what does not fit."""
    if a.dim() != 2 or b.dim() != 2:
        raise MXInputError(f"MX scaled_mm takes 2-D operands, got self {tuple(a.shape)} and mat2 {tuple(b.shape)}")
    fmt_a, fmt_b = FORMAT_OF.get(a.dtype), FORMAT_OF.get(b.dtype)
    if fmt_a is None or fmt_b is None:
        raise MXInputError(f"MX (BlockWise1x32) operands must be float8_e4m3fn (MXFP8) or float4_e2m1fn_x2 "
                           f"(MXFP4), got self {a.dtype} and mat2 {b.dtype}")
    if fmt_a != fmt_b:
        raise MXInputError(f"mismatched MX formats: self is {a.dtype} ({fmt_a}) but mat2 is {b.dtype} ({fmt_b}); "
                           f"both operands must be MXFP8 or both MXFP4")
    per_byte = 2 if fmt_a == "mxfp4" else 1
    m, n = a.shape[0], b.shape[1]
    if b.shape[0] != a.shape[1]:
        raise MXInputError(f"self ({m} x {a.shape[1]}) and mat2 ({b.shape[0]} x {n}) cannot be multiplied"
                           + (" (MXFP4 shapes count packed bytes: K / 2)" if per_byte == 2 else ""))
    k = a.shape[1] * per_byte
    if k % SCALE_BLOCK:
        raise MXInputError(f"K = {k} must be a multiple of {SCALE_BLOCK} for MX scaling (one E8M0 scale per "
                           f"{SCALE_BLOCK} elements)")
    if not _row_major(a):
        raise MXInputError(f"self must be row-major for MX scaled_mm, got stride {tuple(a.stride())}")
    if not _row_major(b.t()):
        raise MXInputError(f"mat2 must be column-major (mat2.t() row-major) for MX scaled_mm, "
                           f"got stride {tuple(b.stride())}")
    _check_scale(scale_a, "scale_a", m, k // SCALE_BLOCK, swizzled_a, f"self ({m} x K = {k}, {fmt_a})")
    _check_scale(scale_b, "scale_b", n, k // SCALE_BLOCK, swizzled_b, f"mat2 (K = {k} x {n}, {fmt_a})")
    return MXProblem(fmt_a, m, n, k, swizzled_a, swizzled_b)


def _aligned(t: torch.Tensor) -> bool:
    rows = t if t.stride(1) == 1 else t.t()
    row_bytes = rows.stride(0) * t.element_size()
    return t.data_ptr() % TMA_ALIGN == 0 and (rows.shape[0] <= 1 or row_bytes % TMA_ALIGN == 0)


def kernel_reason(p: MXProblem, a: torch.Tensor, b: torch.Tensor, bias, out_dtype, contraction_dim=()) -> str | None:
    """Why a well-formed MX problem is outside what the kernel serves, or None."""
    if out_dtype not in OUT_DTYPES:
        return f"out_dtype {out_dtype}: tilefly's MX GEMM writes bfloat16, float16 or float32"
    if contraction_dim and list(contraction_dim) != [1, 0]:
        return f"contraction_dim {list(contraction_dim)}: only K = (self dim 1, mat2 dim 0) is served"
    if p.m == 0 or p.n == 0:
        return "empty output"
    if bias is not None:
        if bias.dim() != 1 or bias.shape[0] != p.n or bias.dtype not in BIAS_DTYPES or bias.device != a.device:
            return (f"bias must be a ({p.n},) bfloat16/float16/float32 vector on {a.device}, "
                    f"got {bias.dtype} {tuple(bias.shape)} on {bias.device}")
    if not (_aligned(a) and _aligned(b)):
        return "operand address or row stride not 16-byte aligned (TMA)"
    return None


def _device_reason(*tensors: torch.Tensor) -> str | None:
    for t in tensors:
        reason = _device.hopper_reason(t)
        if reason is not None:
            return reason
    if len({t.device for t in tensors}) > 1:
        return "tensors on different devices"
    return None


# Verdicts of CUDA calls by everything they depend on (tensor metadata, the other arguments, the
# operands' 16-byte alignment), so a repeated call only builds its key: on the 2-core CPU box
# (scripts/mx_predicate_host.py, MXFP8 32x4096x4096) 10.1 us a call computed, 2.8 kept; on the
# H200's host the predicate took 60 of 228 us under cProfile (BENCHMARKS.md session 19).
MAX_PLANS = 1024
_plans: dict = {}


def _keeps_plans(t: torch.Tensor) -> bool:
    """Whether a call's verdict is kept: CUDA calls only (CPU tests mock the device check)."""
    return t.is_cuda


def _meta(t):
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


def _kept(key, decide, *args):
    """``decide(*args)``'s verdict for ``key``, kept unless it raised (a malformed call raises
    every time)."""
    verdict = _plans.get(key)
    if verdict is None:
        verdict = decide(*args)
        if len(_plans) >= MAX_PLANS:
            _plans.clear()
        _plans[key] = verdict
    return verdict


def scaled_mm_v2_plan(self, mat2, scale_a, recipe_a, swizzle_a, scale_b, recipe_b, swizzle_b, bias=None,
                      out_dtype=None, contraction_dim=(), use_fast_accum=False) -> MXProblem | str:
    """Predicate for ``aten::_scaled_mm_v2``: the ``MXProblem`` tilefly serves, which the router
    hands to ``eager.scaled_mm_v2_served`` (no second parse), or the reason it declines. Raises
    ``MXInputError`` on malformed MX calls on sm_90."""
    args = (self, mat2, scale_a, recipe_a, swizzle_a, scale_b, recipe_b, swizzle_b, bias, out_dtype, contraction_dim)
    if not (_keeps_plans(self) and len(scale_a) == 1 and len(scale_b) == 1):
        return _v2_verdict(*args)
    key = ("v2", _meta(self), _meta(mat2), _meta(scale_a[0]), _meta(scale_b[0]), _meta(bias), tuple(recipe_a),
           tuple(recipe_b), tuple(swizzle_a or ()), tuple(swizzle_b or ()), out_dtype, tuple(contraction_dim),
           (self.data_ptr() | mat2.data_ptr()) % TMA_ALIGN)
    return _kept(key, _v2_verdict, *args)


def _v2_verdict(self, mat2, scale_a, recipe_a, swizzle_a, scale_b, recipe_b, swizzle_b, bias, out_dtype,
                contraction_dim) -> MXProblem | str:
    if list(recipe_a) != [BLOCKWISE_1X32] or list(recipe_b) != [BLOCKWISE_1X32]:
        return f"recipes {list(recipe_a)} x {list(recipe_b)} are not MX (BlockWise1x32 = {BLOCKWISE_1X32})"
    if len(scale_a) != 1 or len(scale_b) != 1:
        raise MXInputError(f"MX scaling takes one scale tensor per operand, got {len(scale_a)} and {len(scale_b)}")
    reason = _device_reason(self, mat2, scale_a[0], scale_b[0])
    if reason is not None:
        return reason
    p = parse(self, mat2, scale_a[0], scale_b[0], _swizzle(swizzle_a, "swizzle_a"), _swizzle(swizzle_b, "swizzle_b"))
    return kernel_reason(p, self, mat2, bias, out_dtype, contraction_dim) or p


def scaled_mm_plan(self, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None,
                   use_fast_accum=False) -> MXProblem | str:
    """Predicate for the legacy ``aten::_scaled_mm``: MX when both scales are E8M0, which ATen
    reads in the SWIZZLE_32_4_4 layout. Returns the ``MXProblem`` served or the reason it declines
    (raises ``MXInputError`` on malformed MX calls on sm_90)."""
    args = (self, mat2, scale_a, scale_b, bias, scale_result, out_dtype)
    if not _keeps_plans(self):
        return _legacy_verdict(*args)
    key = ("legacy", _meta(self), _meta(mat2), _meta(scale_a), _meta(scale_b), _meta(bias), _meta(scale_result),
           out_dtype, (self.data_ptr() | mat2.data_ptr()) % TMA_ALIGN)
    return _kept(key, _legacy_verdict, *args)


def _legacy_verdict(self, mat2, scale_a, scale_b, bias, scale_result, out_dtype) -> MXProblem | str:
    if scale_a.dtype != torch.float8_e8m0fnu or scale_b.dtype != torch.float8_e8m0fnu:
        return f"scales {scale_a.dtype} x {scale_b.dtype} are not MX (float8_e8m0fnu)"
    reason = _device_reason(self, mat2, scale_a, scale_b)
    if reason is not None:
        return reason
    if scale_result is not None:
        return "scale_result is not served with MX scaling"
    p = parse(self, mat2, scale_a, scale_b, True, True)
    return kernel_reason(p, self, mat2, bias, out_dtype) or p


def _reason(plan: MXProblem | str) -> str | None:
    return plan if isinstance(plan, str) else None


def scaled_mm_v2_reason(self, mat2, scale_a, recipe_a, swizzle_a, scale_b, recipe_b, swizzle_b, bias=None,
                        out_dtype=None, contraction_dim=(), use_fast_accum=False) -> str | None:
    """``scaled_mm_v2_plan`` as a reason: None when tilefly serves the call."""
    return _reason(scaled_mm_v2_plan(self, mat2, scale_a, recipe_a, swizzle_a, scale_b, recipe_b, swizzle_b, bias,
                                     out_dtype, contraction_dim, use_fast_accum))


def scaled_mm_reason(self, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None,
                     use_fast_accum=False) -> str | None:
    """``scaled_mm_plan`` as a reason: None when tilefly serves the call."""
    return _reason(scaled_mm_plan(self, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum))

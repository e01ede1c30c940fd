"""MX element and scale formats as PyTorch stores them, and the argument checks tilefly.mx shares.

Element formats (OCP Microscaling Formats v1.0):

========  =====================  =====  =========  ================================================
format    data dtype             emax   largest    storage
========  =====================  =====  =========  ================================================
mxfp8     float8_e4m3fn          8      448        one byte an element
mxfp4     float4_e2m1fn_x2       2      6          two elements a byte, even index in the low nibble
========  =====================  =====  =========  ================================================

``emax`` is the exponent of the format's largest normal (448 = 1.75 * 2**8, 6 = 1.5 * 2**2).
An E2M1 code is ``sign << 3 | exponent << 1 | mantissa``: magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.

Scales are E8M0 (``float8_e8m0fnu``): a biased exponent byte, ``b -> 2**(b - 127)`` for
b in 0..254 (2**-127 .. 2**127) and 255 = NaN, one per 32 consecutive K elements.

Everything here works on plain views (uint8 codes and scale bytes, float8_e4m3fn data) built
from ordinary ops, so the same code runs eagerly and inside ``torch.compile``: Inductor's CPU
backend cannot hold float4_e2m1fn_x2 or float8_e8m0fnu tensors at all.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK = 32
FORMATS = ("mxfp8", "mxfp4")
SWIZZLES = ("none", "32_4_4")
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
OUTPUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
E8M0_NAN = 255
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # E2M1 magnitudes, indexed by the code's low 3 bits
# Midpoints between neighbouring E2M1 magnitudes, and whether a tie there rounds up: ties go to
# the neighbour whose code is even (mantissa bit 0), i.e. round to nearest, ties to even.
_FP4_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_FP4_TIE_UP = (False, True, False, True, False, True, False)


@dataclass(frozen=True)
class ElementFormat:
    name: str
    dtype: torch.dtype       # the data dtype quantize returns
    emax: int                # exponent of the largest normal
    max_value: float         # saturation bound
    per_byte: int            # elements a stored byte holds


ELEMENTS = {
    "mxfp8": ElementFormat("mxfp8", torch.float8_e4m3fn, 8, 448.0, 1),
    "mxfp4": ElementFormat("mxfp4", torch.float4_e2m1fn_x2, 2, 6.0, 2),
}


def element_format(fmt: object, arg: str = "fmt") -> ElementFormat:
    if not isinstance(fmt, str) or fmt not in ELEMENTS:
        raise ValueError(f"{arg} must be one of {FORMATS}, got {fmt!r}")
    return ELEMENTS[fmt]


def swizzle_name(swizzle: object, arg: str = "swizzle") -> str:
    """"none" or "32_4_4"; also accepts torch.nn.functional.SwizzleType members (torch >= 2.10)."""
    name = getattr(swizzle, "name", swizzle)  # SwizzleType.NO_SWIZZLE / SWIZZLE_32_4_4
    if isinstance(name, str):
        name = {"NO_SWIZZLE": "none", "SWIZZLE_32_4_4": "32_4_4"}.get(name, name)
    if name not in SWIZZLES:
        raise ValueError(f"{arg} must be one of {SWIZZLES} or a torch.nn.functional.SwizzleType "
                         f"(NO_SWIZZLE, SWIZZLE_32_4_4), got {swizzle!r}")
    return name


def check_block(block: object) -> None:
    if block != BLOCK:
        raise ValueError(f"block must be {BLOCK}: MX formats (and F.scaled_mm's BlockWise1x32) "
                         f"share one scale per 32 elements, got {block!r}")


def scale_bits_from_amax(amax: torch.Tensor, emax: int) -> torch.Tensor:
    """E8M0 scale bytes (uint8) for FP32 block maxima: ``2**(floor(log2(amax)) - emax)``.

    The biased FP32 exponent field of ``amax`` is ``floor(log2(amax)) + 127`` for normal
    values, so the biased scale is that field minus ``emax``, clamped below at 0 (2**-127):
    zero and FP32-subnormal maxima (field 0) land there too. Field 255 (Inf or NaN in the
    block) gives the NaN scale. The field is at most 254, so no clamp above is needed."""
    field = (amax.view(torch.int32) >> 23) & 0xFF
    bits = (field - emax).clamp(min=0)
    return torch.where(field == 0xFF, E8M0_NAN, bits).to(torch.uint8)


def scale_bits_to_float(bits: torch.Tensor) -> torch.Tensor:
    """FP32 powers of two for E8M0 bytes, built from their bit patterns (exact, incl. 2**-127,
    an FP32 subnormal); 255 -> NaN."""
    b = bits.to(torch.int32)
    pattern = torch.where(b == 0, 1 << 22, b << 23)
    pattern = torch.where(b == E8M0_NAN, 0x7FC00000, pattern)
    return pattern.view(torch.float32)


def inverse_scale(bits: torch.Tensor) -> torch.Tensor:
    """FP32 ``2**-e`` for E8M0 bytes as quantize makes them (``e <= 127 - emax``), always a
    normal float; NaN-scale blocks get 1.0 (their elements are meaningless anyway)."""
    b = bits.to(torch.int32)
    biased = torch.where(b == E8M0_NAN, 127, 254 - b)
    return (biased << 23).view(torch.float32)


def fp4_encode(y: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8, 0..15) of FP32 ``y`` (already divided by its block scale): round to
    nearest, ties to even, saturating at +-6. NaN encodes as a signed zero (E2M1 has no NaN;
    such blocks carry the NaN scale)."""
    mag = y.abs()
    code = torch.zeros(y.shape, dtype=torch.uint8, device=y.device)
    for mid, up in zip(_FP4_MIDPOINTS, _FP4_TIE_UP):
        code += (mag >= mid if up else mag > mid).to(torch.uint8)
    return code | (torch.signbit(y).to(torch.uint8) << 3)


_PAIR_TABLES: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def _build_pair_table(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    values = FP4_VALUES + tuple(-v for v in FP4_VALUES)
    return torch.tensor([(values[b & 15], values[b >> 4]) for b in range(256)], dtype=dtype, device=device)


def fp4_pair_table(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(256, 2) table: a packed byte -> (value of its low nibble, value of its high nibble).
    One gather decodes both elements of a byte, already in element order. Cached per device
    and dtype in eager mode; a compiled graph builds it as a constant."""
    if torch.compiler.is_compiling():
        return _build_pair_table(device, dtype)
    key = (torch.device(device), dtype)
    if key not in _PAIR_TABLES:
        _PAIR_TABLES[key] = _build_pair_table(*key)
    return _PAIR_TABLES[key]

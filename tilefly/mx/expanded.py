"""Expanded MXFP4 activations: the quantized activation once more, as the MX GEMM's FP8 operand wants it.

At decode sizes tilefly's MXFP4 GEMM (kernels_v2, X_REGS + FOLD_Y) unpacks the activation's E2M1
nibbles to E4M3 in every program, every K slot, through shared memory: a 32 x 28672 x 4096 GEMM spent
about 16 % of its time there (BENCHMARKS.md session 41). Every program unpacks the same bytes, so the
kernel that quantizes the activation writes them unpacked once ("expanded"), and the GEMM's ring reads
them in place (``Y_EXPANDED``).

The expanded copy of a quantized activation (``data`` (rows, K / 2) packed E2M1, ``scales`` (rows,
K / 32) E8M0 bytes, NO_SWIZZLE) is two uint8 tensors:

- ``expanded`` (rows, K): E4M3 bytes in the unpack's order, each 32-element block's 16 even-K values
  first, then its 16 odd-K ones (fp4_unpack's order, which the GEMM's X operand shares);
- ``expanded_scales`` (rows, K / 32): one E8M0 byte a block, what the byte's value is to be scaled by.

Each row is cut into fold groups of consecutive blocks: the whole row where the producing kernel holds
rows (the fused RMSNorm's), its chunks of CHUNK_BLOCKS where programs take chunks (the SiLU product's). A
group is **folded** when every block in it that holds a nonzero value has a scale within EXPAND_SPAN of
the group's largest, ``top``, and none is NaN (255): its bytes are E2M1 value x 2^(scale - top), exact in
E4M3 (0.5 x 2^-8 is its smallest subnormal, 6 its largest normal here), and its every expanded scale is
``top``. Any other group keeps its values (E2M1 is a subset of E4M3) and its own scales. Either way
``expanded x 2^(expanded_scales - 127)`` is the quantized activation, exactly. A GEMM program whose rows'
expanded scales are constant over its K-range (inside one folded group) multiplies by them once per
column, after its K loop; others scale every block as the unfolded build does, still without an unpack.

MXLinear passes the expanded copy with its F.scaled_mm call through ``offering``; tilefly's launcher
(ops/mx_gemm/launch.py) takes it where it would run a folded MXFP4 build and the copy matches the call's
activation, and ignores it otherwise. ``expand_rows_ops`` computes it with PyTorch ops (CPU, tests); the
fused add + RMSNorm + quantization kernel (tilefly.mx.norm_quant) and the fused SiLU product +
quantization kernel (tilefly.mx.silu_quant) write it.
"""
from __future__ import annotations

import threading

import torch

from tilefly.mx.formats import BLOCK

EXPAND_SPAN = 8            # largest top - scale of a folded row's nonzero block (module docstring)
E8M0_NAN = 255
_E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def kernel_order(values: torch.Tensor) -> torch.Tensor:
    """(rows, K) -> the same values with each 32-element block's even-K entries first, then its odd-K ones."""
    rows, k = values.shape
    return values.view(rows, k // BLOCK, BLOCK // 2, 2).transpose(2, 3).reshape(rows, k)


def folded_rows(codes: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(folded, top) per row of E2M1 codes (rows, K, int) and their scale bytes (rows, K / 32, int), each
    row one fold group."""
    rows, k = codes.shape
    nonzero = ((codes & 7) != 0).view(rows, k // BLOCK, BLOCK).any(-1)
    top = scales.amax(-1, keepdim=True)
    near = (top - scales <= EXPAND_SPAN) | ~nonzero
    return near.all(-1) & (top[:, 0] != E8M0_NAN), top[:, 0]


def expand_rows_ops(data: torch.Tensor, scales: torch.Tensor, group_blocks: int | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(expanded, expanded_scales) of packed MXFP4 rows ``data`` (rows, K / 2 uint8) and their scale bytes
    ``scales`` (rows, K / 32 uint8, NO_SWIZZLE), as the module docstring defines them, with PyTorch ops;
    fold groups of ``group_blocks`` blocks (None: whole rows)."""
    rows, half = data.shape
    k = 2 * half
    packed = data.to(torch.int32)
    codes = torch.stack((packed & 15, packed >> 4), dim=-1).view(rows, k)      # even K in the low nibble
    e = scales.to(torch.int32)
    step = group_blocks or max(k // BLOCK, 1)
    shift, expanded_scales = torch.zeros_like(e), torch.empty_like(e)
    for first in range(0, k // BLOCK, step):
        blocks = slice(first, first + step)
        folded, top = folded_rows(codes[:, blocks.start * BLOCK:blocks.stop * BLOCK], e[:, blocks])
        shift[:, blocks] = torch.where(folded[:, None], e[:, blocks] - top[:, None], 0)
        expanded_scales[:, blocks] = torch.where(folded[:, None], top[:, None], e[:, blocks])
    table = torch.tensor(_E2M1_MAGNITUDES, dtype=torch.float32, device=data.device)
    values = table[codes & 7] * torch.where(codes & 8 != 0, -1.0, 1.0)
    values = torch.ldexp(values, shift.repeat_interleave(BLOCK, dim=1).to(torch.float32))   # exact: E4M3 has it
    return kernel_order(values.to(torch.float8_e4m3fn).view(torch.uint8)), expanded_scales.to(torch.uint8)


# ---- MXLinear's offer to the launcher --------------------------------------------------------------------

_local = threading.local()


def offered() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(packed activation, expanded, expanded_scales) offered for the F.scaled_mm call now being served."""
    return getattr(_local, "offer", None)


def offering(fn, packed: torch.Tensor, expanded: torch.Tensor, expanded_scales: torch.Tensor, *args):
    """``fn(*args)`` with ``packed``'s expanded copy on offer (``offered()``), restored after."""
    before = offered()
    _local.offer = (packed, expanded, expanded_scales)
    try:
        return fn(*args)
    finally:
        _local.offer = before


def matching(activation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The offered (expanded, expanded_scales) when they are ``activation``'s (the packed rows the GEMM
    reads: same storage address and shape) and laid out as the kernel reads them, else None."""
    offer = offered()
    if offer is None:
        return None
    packed, expanded, expanded_scales = offer
    rows, half = activation.shape
    if (packed.data_ptr() != activation.data_ptr() or tuple(packed.shape) != (rows, half)
            or tuple(expanded.shape) != (rows, 2 * half) or tuple(expanded_scales.shape) != (rows, 2 * half // BLOCK)
            or expanded.dtype != torch.uint8 or expanded_scales.dtype != torch.uint8
            or not (expanded.is_contiguous() and expanded_scales.is_contiguous())
            or expanded.data_ptr() % 16 or expanded_scales.data_ptr() % 4 or expanded.device != activation.device):
        return None
    return expanded, expanded_scales

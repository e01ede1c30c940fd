"""When tilefly's grouped GEMM can serve ``torch._grouped_mm(a, b, offs)``: the one predicate.

    condition                                   reason when it fails
    CUDA tensors on an sm_90 GPU                the kernel uses wgmma and TMA (Hopper only)
    A, B FP16 or BF16, same dtype; output the   FP32 accumulate; the epilogue casts
      same dtype or FP32
    A 2-D (sum M x K), B 3-D (G x K x N),       the MoE forward; the weight-gradient case
      offs given                                  (2-D x 2-D, ragged K), 3-D A and the
                                                  batched 3-D x 3-D case stay with ATen
    offs: 1-D int32, G entries, same device     read on the device, never synced to the host
    1 <= G <= 1024                              the group table lives in registers
    static shapes, M, N, K >= 1, < 2**31        int32 tile math
    A row-major, row stride a 16-byte multiple, one TMA descriptor over all rows
      base 16-byte aligned
    B row- or column-major per group, groups    one 2-D TMA view of [G*K, N] or [G*N, K]
      packed (group stride = rows x row
      stride), row stride a 16-byte multiple,
      base 16-byte aligned
    no bias                                     ATen has none on sm_90 either

Row-major B additionally needs K to be a multiple of a config's BLOCK_K; that is
a per-config condition (configs.problem_reason), not part of this predicate.
Works on ``TensorFacts`` (tilefly.ops.tensor_facts, shared with the dense GEMM) so the
same code judges Inductor IR nodes, fake or meta tensors and real tensors.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tilefly.ops.grouped_gemm.configs import MAX_GROUPS
from tilefly.ops.tensor_facts import (GEMM_DTYPES as DTYPES, MAX_DIM, TMA_ALIGN, TensorFacts,  # noqa: F401
                                      facts_from_node, facts_from_tensor)


@dataclass(frozen=True)
class BView:
    """How the kernel reads B: a 2-D [rows, cols] view with unit column stride."""
    kmajor: bool       # True: [G*N, K] (each group column-major); False: [G*K, N]
    rows: int
    cols: int
    row_stride: int


def _merged_stride(g: int, s_group: int, inner: int, s_inner: int) -> int | None:
    """Stride of the flattened (group, inner) row index, or None when the rows are not uniform."""
    if inner == 1:
        return s_group
    if g == 1 or s_group == inner * s_inner:
        return s_inner
    return None


def b_view(shape: tuple[int, int, int], stride: tuple[int, int, int], itemsize: int) -> BView | None:
    """The 2-D TMA view of a G x K x N B, column-major per group preferred (no K condition)."""
    g, k, n = shape
    s_g, s_k, s_n = stride
    for kmajor, inner, s_inner, unit, cols in ((True, n, s_n, s_k, k), (False, k, s_k, s_n, n)):
        if cols > 1 and unit != 1:
            continue
        row_stride = _merged_stride(g, s_g, inner, s_inner)
        if row_stride is None:
            continue
        if g * inner > 1 and (row_stride <= 0 or row_stride * itemsize % TMA_ALIGN):
            continue
        if g * inner == 1:  # a single row: its stride is never used, TMA still wants it aligned
            row_stride = -(-cols * itemsize // TMA_ALIGN) * TMA_ALIGN // itemsize
        return BView(kmajor, g * inner, cols, row_stride)
    return None


def a_row_stride(shape: tuple[int, int], stride: tuple[int, int], itemsize: int) -> int | None:
    """A's row stride for its TMA descriptor, or None when A is not readable as rows."""
    m, k = shape
    if k > 1 and stride[1] != 1:
        return None
    if m == 1:
        return -(-k * itemsize // TMA_ALIGN) * TMA_ALIGN // itemsize
    if stride[0] <= 0 or stride[0] * itemsize % TMA_ALIGN:
        return None
    return stride[0]


def grouped_reason(a: TensorFacts, b: TensorFacts, offs: TensorFacts | None, *, out_dtype: torch.dtype | None = None,
                   has_bias: bool = False, device_type: str = "cuda", offs_device_type: str | None = None,
                   capability: tuple[int, int] | None = (9, 0)) -> str | None:
    """None when tilefly's grouped GEMM can compute ``_grouped_mm(a, b, offs)``, else a one-line reason."""
    if device_type != "cuda":
        return f"tensors are on {device_type}; tilefly's grouped GEMM runs on CUDA"
    if capability != (9, 0):
        return f"GPU capability {capability}; tilefly's grouped GEMM needs sm_90 (Hopper)"
    if a.dtype not in DTYPES or b.dtype != a.dtype:
        return f"dtypes {a.dtype}/{b.dtype}; tilefly's grouped GEMM takes FP16 or BF16, both the same"
    if out_dtype is not None and out_dtype != a.dtype and out_dtype != torch.float32:
        return f"output dtype {out_dtype}; tilefly writes the inputs' dtype or FP32"
    if has_bias:
        return "bias is not served (ATen's sm_90 grouped GEMM has none either)"
    if a.shape is None or b.shape is None or a.stride is None or b.stride is None:
        return "dynamic (symbolic) shape or stride; tilefly's grouped GEMM serves static shapes"
    if offs is None:
        return "no offs: the batched 3-D x 3-D case is not served"
    if len(a.shape) == 2 and len(b.shape) == 2:
        return "2-D x 2-D (weight gradient, ragged K) is not served"
    if len(a.shape) != 2 or len(b.shape) != 3:
        return f"A is {len(a.shape)}-D and B {len(b.shape)}-D; tilefly serves 2-D A (sum M x K) with 3-D B (G x K x N)"
    if offs.dtype != torch.int32 or offs.shape is None or len(offs.shape) != 1:
        return f"offs must be a 1-D int32 tensor (got {offs.dtype}, shape {offs.shape})"
    if offs_device_type is not None and offs_device_type != device_type:
        return f"offs is on {offs_device_type}; it must be on the GPU with the operands"
    (m, k), (g, k2, n) = a.shape, b.shape
    if offs.shape[0] != g:
        return f"offs has {offs.shape[0]} entries for {g} groups"
    if not 1 <= g <= MAX_GROUPS:
        return f"{g} groups; tilefly serves 1..{MAX_GROUPS}"
    if k != k2:
        return f"inner sizes differ ({k} vs {k2})"
    if min(m, n, k) < 1 or max(m, n, k, g * n, g * k) > MAX_DIM:
        return f"sizes M={m} N={n} K={k} out of range (each 1..{MAX_DIM})"
    if a_row_stride(a.shape, a.stride, a.itemsize) is None:
        return (f"A strides {a.stride} are not TMA-readable rows (unit last stride, rows a multiple of "
                f"{TMA_ALIGN} bytes)")
    if b_view(b.shape, b.stride, b.itemsize) is None:
        return (f"B strides {b.stride} are not one TMA view (each group row- or column-major, groups packed, "
                f"rows a multiple of {TMA_ALIGN} bytes)")
    for name, f in (("A", a), ("B", b)):
        if f.misalign is None or f.misalign:
            return f"{name}'s base address is not known to be {TMA_ALIGN}-byte aligned"
    return None

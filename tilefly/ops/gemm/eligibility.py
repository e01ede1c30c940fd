"""When tilefly's dense GEMM can serve ``mm`` / ``addmm``: the one eligibility predicate.

    condition                                   reason when it fails
    CUDA tensors on an sm_90 GPU                the kernels use wgmma and TMA (Hopper only)
    A, B FP16 or BF16, same dtype, output too   FP32 accumulate, same-dtype out
    static 2-D shapes, M, N, K >= 1, < 2**31    one binary per layout, int32 tile math
    A and B each row- or column-major, other    TMA: last stride 1, other stride a 16-byte
      stride a multiple of 16 bytes, nonzero      multiple, base 16-byte aligned
    base address 16-byte aligned
    addmm: beta == 1, alpha == 1                the epilogue adds the bias unscaled
    addmm: bias of the same dtype, a vector     1-D bias of N (broadcast rows) or a column
      broadcast along rows or columns             vector; a full M x N bias stays with ATen

The predicate works on ``MatrixFacts`` (tilefly.ops.tensor_facts) so the same code judges Inductor IR
nodes at choice time (``facts_from_node``), fake or meta tensors in tests and
real tensors at run time (``facts_from_tensor``).
"""
from __future__ import annotations

from typing import Any

import torch

from tilefly.ops.tensor_facts import (GEMM_DTYPES as DTYPES, MAX_DIM, TMA_ALIGN, TensorFacts,  # noqa: F401
                                      facts_from_node, facts_from_tensor)

MatrixFacts = TensorFacts  # the name this family's code and tests use


def row_major_ok(shape: tuple[int, int], stride: tuple[int, int], itemsize: int) -> bool:
    """Can a TMA descriptor read this 2-D view as rows (the last dim contiguous)?"""
    rows, cols = shape
    if cols > 1 and stride[1] != 1:
        return False
    if rows > 1 and (stride[0] <= 0 or stride[0] * itemsize % TMA_ALIGN):
        return False
    return True


def orientation(f: MatrixFacts) -> str | None:
    """"row" when TMA reads the matrix as stored, "col" when it reads its transpose, else None."""
    if f.shape is None or f.stride is None or len(f.shape) != 2:
        return None
    if row_major_ok(f.shape, f.stride, f.itemsize):
        return "row"
    if row_major_ok(f.shape[::-1], f.stride[::-1], f.itemsize):
        return "col"
    return None


def bias_mode(bias: MatrixFacts, m: int, n: int) -> tuple[int, int] | None:
    """(mode, stride) of a bias broadcast to (m, n): mode 1 = bias[n] per column, 2 = bias[m]
    per row; None for a full 2-D bias or one that does not broadcast."""
    shape, stride = list(bias.shape), list(bias.stride)
    if len(shape) > 2:
        return None
    while len(shape) < 2:
        shape.insert(0, 1)
        stride.insert(0, 0)
    strides = []
    for size, st, want in zip(shape, stride, (m, n)):
        if size not in (1, want):
            return None
        strides.append(0 if size == 1 else st)
    if strides[0] == 0:
        return 1, strides[1]
    if strides[1] == 0:
        return 2, strides[0]
    return None


def gemm_reason(a: MatrixFacts, b: MatrixFacts, *, out_dtype: torch.dtype | None = None,
                bias: MatrixFacts | None = None, alpha: Any = 1, beta: Any = 1,
                device_type: str = "cuda", capability: tuple[int, int] | None = (9, 0)) -> str | None:
    """None when tilefly's GEMM can compute ``bias + a @ b``, else a one-line reason."""
    if device_type != "cuda":
        return f"tensors are on {device_type}; tilefly's GEMM runs on CUDA"
    if capability != (9, 0):
        return f"GPU capability {capability}; tilefly's GEMM needs sm_90 (Hopper)"
    if a.dtype not in DTYPES or b.dtype != a.dtype:
        return f"dtypes {a.dtype}/{b.dtype}; tilefly's GEMM takes FP16 or BF16, both the same"
    if out_dtype is not None and out_dtype != a.dtype:
        return f"output dtype {out_dtype} differs from the inputs' {a.dtype}"
    if a.shape is None or b.shape is None or a.stride is None or b.stride is None:
        return "dynamic (symbolic) shape or stride; tilefly's GEMM serves static shapes"
    if len(a.shape) != 2 or len(b.shape) != 2:
        return f"operands are {len(a.shape)}-D and {len(b.shape)}-D; tilefly's GEMM is 2-D"
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2:
        return f"inner sizes differ ({k} vs {k2})"
    if min(m, n, k) < 1 or max(m, n, k) > MAX_DIM:
        return f"sizes {m}x{n}x{k} out of range (each 1..{MAX_DIM})"
    for name, f in (("A", a), ("B", b)):
        if orientation(f) is None:
            return (f"{name} strides {f.stride} are not TMA-readable (need one unit stride and the other "
                    f"a nonzero multiple of {TMA_ALIGN} bytes)")
        if f.misalign is None or f.misalign:
            return f"{name}'s base address is not known to be {TMA_ALIGN}-byte aligned"
    if alpha != 1 or beta != 1:
        return f"addmm with alpha={alpha}, beta={beta}; tilefly serves alpha=1, beta=1"
    if bias is not None:
        if bias.dtype != a.dtype:
            return f"bias dtype {bias.dtype} differs from the inputs' {a.dtype}"
        if bias.shape is None or bias.stride is None:
            return "bias has a dynamic shape"
        if bias_mode(bias, m, n) is None:
            return f"bias of shape {bias.shape} strides {bias.stride} is not a broadcast vector"
    return None

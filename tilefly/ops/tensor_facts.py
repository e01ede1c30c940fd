"""What the GEMM families' predicates know about an operand: shape, strides, dtype and base
misalignment, from a real, fake or meta tensor (run time, tests) or from an Inductor IR node
(choice time), so one predicate judges all of them. Torch only: nothing here imports Triton
or Inductor.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

GEMM_DTYPES = (torch.float16, torch.bfloat16)  # FP32 accumulate, same-dtype out (wgmma inputs)
TMA_ALIGN = 16                                 # bytes: TMA base and non-unit strides
MAX_DIM = 2**31 - 1                            # int32 tile math


@dataclass(frozen=True)
class TensorFacts:
    shape: tuple[int, ...] | None     # None when any size is symbolic
    stride: tuple[int, ...] | None
    dtype: torch.dtype
    misalign: int | None = 0          # base address modulo 16 bytes (None: unknown)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize


def static_ints(values) -> tuple[int, ...] | None:
    """The values as ints, or None when any is symbolic."""
    try:
        return tuple(int(v) for v in values)
    except (TypeError, ValueError):
        return None


def facts_from_tensor(t: torch.Tensor) -> TensorFacts:
    from torch._subclasses.fake_tensor import FakeTensor

    if t.device.type in ("meta", "cpu") or isinstance(t, FakeTensor):
        misalign = (t.storage_offset() * t.element_size()) % TMA_ALIGN  # no real address to read
    else:
        misalign = t.data_ptr() % TMA_ALIGN
    return TensorFacts(tuple(t.shape), tuple(t.stride()), t.dtype, misalign)


def facts_from_node(node: Any) -> TensorFacts:
    """Facts of an Inductor IR node (buffer or view) at choice time."""
    offset = None
    try:
        offset = static_ints([node.get_layout().offset])
    except Exception:  # noqa: BLE001 - views without a layout offset: treat as unknown
        pass
    misalign = None if offset is None else (offset[0] * node.get_dtype().itemsize) % TMA_ALIGN
    return TensorFacts(static_ints(node.get_size()), static_ints(node.get_stride()), node.get_dtype(), misalign)


def device_of_node(node: Any) -> tuple[str, tuple[int, int] | None]:
    """(device type, compute capability or None) of an Inductor IR node's device."""
    device = node.get_device()
    if device is None:
        return "unknown", None
    if device.type == "cuda" and torch.cuda.is_available():
        return "cuda", torch.cuda.get_device_capability(device)
    return device.type, None

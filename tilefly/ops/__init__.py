"""Operator families. Each subpackage's ``__init__`` registers its implementations
with the router (or its Inductor candidates) when imported, and nothing else;
kernels live in each family's ``kernels.py`` and are imported on first use.

``FAMILIES`` maps the names users pass to ``tilefly.enable(ops=...)`` to their
packages and says how each is reached.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    name: str
    module: str
    reached_by: str  # "eager" (dispatch router) or "inductor" (max-autotune candidates)
    summary: str
    default: bool = True  # installed by enable() without ops=; False until the family pays for itself
    # A module whose install() / uninstall() enable() / disable() call beside the family's own routes:
    # an Inductor graph pass its compiled graphs need. Imported only by enable().
    graph_pass: str | None = None


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("rms_norm", "tilefly.ops.rms_norm", "eager",
               "F.rms_norm forward (aten::_fused_rms_norm); backward stays ATen's"),
        Family("topk", "tilefly.ops.topk", "eager", "torch.topk and its out= form"),
        Family("attention", "tilefly.ops.attention", "eager",
               "F.scaled_dot_product_attention, FP16/BF16: each fused backend op (cuDNN, flash, efficient; "
               "forward and backward) served by what the tuning database picks",
               graph_pass="tilefly.ops.attention.mask_pass"),
        Family("gemm", "tilefly.ops.gemm", "inductor",
               "torch.mm / @ / addmm under torch.compile(mode='max-autotune'), backend TILEFLY"),
        Family("grouped_gemm", "tilefly.ops.grouped_gemm", "inductor",
               "torch._grouped_mm / F.grouped_mm (MoE: 2-D A, 3-D B, offs) under "
               "torch.compile(mode='max-autotune'), backend TILEFLY"),
        Family("mx_gemm", "tilefly.ops.mx_gemm", "eager",
               "MXFP8 / MXFP4 F.scaled_mm (BlockWise1x32 E8M0 scales; aten::_scaled_mm_v2 and the legacy "
               "_scaled_mm), which ATen cannot run on sm_90", graph_pass="tilefly.mx.shared_quant_pass"),
    )
}


def defaults() -> tuple[str, ...]:
    return tuple(name for name, family in FAMILIES.items() if family.default)


def load(name: str) -> Family:
    """Import a family's package (registering it) and return its description."""
    family = FAMILIES.get(name)
    if family is None:
        raise ValueError(f"unknown tilefly op family {name!r}; known: {', '.join(sorted(FAMILIES))}")
    importlib.import_module(family.module)
    return family

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


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("rms_norm", "tilefly.ops.rms_norm", "eager",
               "F.rms_norm forward (aten::_fused_rms_norm); backward stays ATen's"),
        Family("topk", "tilefly.ops.topk", "eager", "torch.topk and its out= form"),
        Family("attention", "tilefly.ops.attention", "eager",
               "F.scaled_dot_product_attention, FP16/BF16: each fused backend op (cuDNN, flash, efficient; "
               "forward and backward) served by what the tuning database picks",
               # No H200 database ships yet: routing would only add host cost. Opt in with
               # enable(["attention"]) and a database from `python -m tilefly tune attention`.
               default=False),
        Family("gemm", "tilefly.ops.gemm", "inductor",
               "torch.mm / @ / addmm under torch.compile(mode='max-autotune'), backend TILEFLY",
               # Its kernels compile for sm_90a but have not yet passed their GPU tests; Inductor's
               # autotuning times candidates without checking results, so the family stays opt-in
               # (enable(["gemm"])) until they have.
               default=False),
        Family("grouped_gemm", "tilefly.ops.grouped_gemm", "inductor",
               "torch._grouped_mm / F.grouped_mm (MoE: 2-D A, 3-D B, offs) under "
               "torch.compile(mode='max-autotune'), backend TILEFLY",
               # Compiles for sm_90a; opt-in (enable(["grouped_gemm"])) until its GPU tests pass.
               default=False),
        Family("mx_gemm", "tilefly.ops.mx_gemm", "eager",
               "MXFP8 / MXFP4 F.scaled_mm (BlockWise1x32 E8M0 scales; aten::_scaled_mm_v2 and the legacy "
               "_scaled_mm), which ATen cannot run on sm_90",
               # First version: not yet verified on the GPU nor tuned; opt in with enable(["mx_gemm"]).
               default=False),
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

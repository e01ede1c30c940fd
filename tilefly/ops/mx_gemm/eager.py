"""The implementations the router calls for MX ``_scaled_mm_v2`` / ``_scaled_mm`` (after
``eligibility``'s predicates accepted the call; ``*_served`` take the problem the predicate
parsed, Impl.takes_plan): allocate ATen's output (M x N, contiguous, ``out_dtype``), launch,
return it. The kernel module loads on the first call. Large shapes go through BF16
(upcast.py); with ``tilefly.config.mx_requantize`` on, large BF16-output calls go through
requant.py instead."""
from __future__ import annotations

import torch


def _run(p, a, b, scale_a, scale_b, bias, out_dtype) -> torch.Tensor:
    from tilefly.ops.mx_gemm import launch, requant, upcast

    out = torch.empty(p.m, p.n, dtype=out_dtype, device=a.device)
    if requant.serves(p, out_dtype):
        return requant.run(p, a, b, scale_a, scale_b, out, bias)
    if upcast.serves(p, out_dtype):
        return upcast.run(p, a, b, scale_a, scale_b, out, bias)
    return launch.run(p, a, b, scale_a, scale_b, out, bias)


def scaled_mm_v2_served(plan, self, mat2, scale_a, recipe_a, swizzle_a, scale_b, recipe_b, swizzle_b, bias=None,
                        out_dtype=None, contraction_dim=(), use_fast_accum=False) -> torch.Tensor:
    """The routed op: ``plan`` is the predicate's MXProblem (Impl.takes_plan)."""
    return _run(plan, self, mat2, scale_a[0], scale_b[0], bias, out_dtype)


def scaled_mm_served(plan, self, mat2, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None,
                     use_fast_accum=False) -> torch.Tensor:
    return _run(plan, self, mat2, scale_a, scale_b, bias, out_dtype)

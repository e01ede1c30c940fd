"""MX GEMM (MXFP8 / MXFP4 ``F.scaled_mm`` with BlockWise1x32 E8M0 scales) on Hopper, eager.

Registration only: ``aten::_scaled_mm_v2`` (what ``F.scaled_mm`` calls; on torch 2.11 also an
eager fallback inside compiled graphs) and the legacy ``aten::_scaled_mm`` go through the router;
non-MX calls stay ATen's. See eligibility.py (the predicate and its error messages), eager.py
(the ops), launch.py (host side), configs.py, kernels.py (Gluon, v1: one 32-K block a ring slot,
synchronous wgmma), kernels_v2.py (Gluon, v2: 128-K slots, async wgmma with the block-scale
promotion overlapped, PRMT FP4 unpack) and bench.py.
"""
from tilefly import _dispatch
from tilefly.ops.mx_gemm import eager, eligibility

_dispatch.register(_dispatch.Impl(
    family="mx_gemm", op="aten::_scaled_mm_v2", name="gluon_mx_gemm",
    predicate=eligibility.scaled_mm_v2_plan, fn=eager.scaled_mm_v2_served, takes_plan=True))
_dispatch.register(_dispatch.Impl(
    family="mx_gemm", op="aten::_scaled_mm", name="gluon_mx_gemm",
    predicate=eligibility.scaled_mm_plan, fn=eager.scaled_mm_served, takes_plan=True))

"""MX GEMM (MXFP8 / MXFP4 ``F.scaled_mm`` with BlockWise1x32 E8M0 scales) on Hopper, eager.

Registration only: ``aten::_scaled_mm_v2`` (what ``F.scaled_mm`` calls; on torch 2.11 also an
eager fallback inside compiled graphs) and the legacy ``aten::_scaled_mm`` go through the router;
non-MX calls stay ATen's. See eligibility.py (the predicate and its error messages), eager.py
(the ops), launch.py (host side), configs.py, scales.py (Gluon: reading, staging and applying the
E8M0 scales, shared by the kernels), kernels.py (Gluon, v1: one 32-K block a ring slot, synchronous
wgmma), kernels_v2.py (Gluon, v2: 128-K slots, async wgmma with the block-scale promotion overlapped,
FP4 unpack, scales staged for decode, MXFP4 X from registers picked up to 32 tokens), kernels_v3.py
(Gluon, operands upcast to BF16 in the CTA), kernels_v4.py (Gluon, MXFP4 with the scales folded into
the unpacked operands and X fed from registers, picked at 33-64 tokens), upcast.py (the BF16 route of
large shapes), requant.py (opt-in, inexact) and bench.py.

No Inductor candidates: on torch 2.13 a compiled MX ``F.scaled_mm`` never reaches
``tuned_scaled_mm_v2``'s choices. The meta function requires SWIZZLE_32_4_4 scales for MX and the
lowering asserts that no scale is swizzled, so the graph does not compile with or without
max-autotune (tests/ops/mx_gemm/test_mx_inductor.py watches for a torch that changes this).
``MXLinear`` compiles through its own opaque op (tilefly.mx.linear) instead.
"""
from tilefly import _dispatch
from tilefly.ops.mx_gemm import eager, eligibility

_dispatch.register(_dispatch.Impl(
    family="mx_gemm", op="aten::_scaled_mm_v2", name="gluon_mx_gemm",
    predicate=eligibility.scaled_mm_v2_plan, fn=eager.scaled_mm_v2_served, takes_plan=True))
_dispatch.register(_dispatch.Impl(
    family="mx_gemm", op="aten::_scaled_mm", name="gluon_mx_gemm",
    predicate=eligibility.scaled_mm_plan, fn=eager.scaled_mm_served, takes_plan=True))

"""Why the MX GEMM offers Inductor no TILEFLY candidates: on torch >= 2.13 (CI's CPU torch) a compiled
MX ``F.scaled_mm`` cannot reach ``tuned_scaled_mm_v2``'s choices. The meta function requires
SWIZZLE_32_4_4 scales for MX, and the lowering rejects every swizzle. These tests watch that: when a
torch lowers MX scaled_mm, they fail, and candidates become possible (tilefly/ops/mx_gemm/__init__.py)."""
import pytest
import torch
import torch.nn.functional as F

from tilefly import mx

pytestmark = pytest.mark.skipif(
    tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) < (2, 13) or not hasattr(F, "ScalingType"),
    reason="the upstream behaviour watched here is torch 2.13's")


def _compile_mx(swizzle: str):
    from torch._inductor import config as inductor_config

    a, sa = mx.quantize(torch.randn(128, 256), "mxfp8", swizzle=swizzle)
    b, sb = mx.quantize(torch.randn(128, 256), "mxfp8", swizzle=swizzle)
    blockwise = F.ScalingType.BlockWise1x32
    layout = F.SwizzleType.SWIZZLE_32_4_4 if swizzle == "32_4_4" else F.SwizzleType.NO_SWIZZLE

    def f(a, b, sa, sb):
        return F.scaled_mm(a, b.t(), sa, blockwise, sb, blockwise, swizzle_a=layout, swizzle_b=layout,
                           output_dtype=torch.bfloat16)

    torch._dynamo.reset()
    with inductor_config.patch(max_autotune=True, max_autotune_gemm_backends="ATEN", force_disable_caches=True):
        try:
            return torch.compile(f, fullgraph=True)(a, b, sa, sb)
        finally:
            torch._dynamo.reset()


def test_swizzled_mx_scales_are_rejected_by_the_lowering():
    with pytest.raises(Exception, match="does not yet support non-trivial swizzles"):
        _compile_mx("32_4_4")


def test_plain_mx_scales_are_rejected_by_the_meta_function():
    with pytest.raises(Exception, match="SWIZZLE_32_4_4"):
        _compile_mx("none")

"""The ``tl.dot_scaled`` MX GEMM experiment (scaled_dot.py, kernels_scaled_dot.py): its launch arguments
and compile specs on CPU (Triton's interpreter has no dot_scaled); on the H200, every config against
the float64 product of the dequantized operands, poisoned outputs, both formats and scale layouts."""
import pytest
import torch

from tilefly import mx
from tilefly.ops.mx_gemm import configs, eligibility, scaled_dot


def test_compile_specs_cover_every_config_and_format():
    names = {s.name for s in configs.compile_specs()}
    for fmt in ("mxfp8", "mxfp4"):
        for cfg in scaled_dot.CONFIGS:
            assert f"mx_gemm.scaled_dot.{cfg.name}[{fmt},swz=0,bias=0,bf16]" in names


def test_launch_arguments_follow_the_kernel_signature(monkeypatch):
    from tilefly import _triton_launch
    from tilefly.ops.mx_gemm import kernels_scaled_dot

    seen = {}
    monkeypatch.setattr(_triton_launch, "launch_direct", lambda cache, kernel_of, grid, tensors, ints, constexprs,
                        num_warps, num_stages: seen.update(grid=grid, tensors=tensors, ints=ints, constexprs=constexprs,
                                                           kernel=kernel_of()))
    a, sa = mx.quantize(torch.randn(100, 256), "mxfp4")
    b, sb = mx.quantize(torch.randn(300, 256), "mxfp4")
    p = eligibility.parse(a, b.t(), sa, sb, False, False)
    out = torch.empty(100, 300, dtype=torch.bfloat16)
    cfg = scaled_dot.CONFIGS[0]
    scaled_dot.run(p, a, b.t(), sa, sb, out, cfg=cfg)
    names = seen["kernel"].arg_names
    values = [*seen["tensors"], *seen["ints"], *seen["constexprs"].values()]
    assert len(names) == len(values)
    args = dict(zip(names, values))
    assert args["a_ptr"].dtype == torch.uint8 and args["b_ptr"].shape == (300, 128)    # packed FP4 as bytes
    assert (args["M"], args["N"], args["K"]) == (100, 300, 256)
    assert args["stride_bn"] == 128 and args["stride_cm"] == 300 and args["FORMAT"] == "e2m1"
    assert seen["grid"] == (1 * 3, 1) and kernels_scaled_dot.mx_scaled_dot_kernel is seen["kernel"]


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("swizzle", mx.SWIZZLES)
@pytest.mark.parametrize("cfg", scaled_dot.CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("m, n, k", [(1, 4096, 4096), (200, 333, 544), (1024, 256, 1024)])
def test_every_config_matches_float64(fmt, swizzle, cfg, m, n, k):
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    a, sa = mx.quantize(torch.randn(m, k, device="cuda", generator=g), fmt, swizzle=swizzle)
    b, sb = mx.quantize(torch.randn(n, k, device="cuda", generator=g), fmt, swizzle=swizzle)
    p = eligibility.parse(a, b.t(), sa, sb, swizzle == "32_4_4", swizzle == "32_4_4")
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    scaled_dot.run(p, a, b.t(), sa, sb, out, cfg=cfg)
    torch.cuda.synchronize()
    ref = (mx.dequantize(a, sa, fmt, swizzle=swizzle, dtype=torch.float64)
           @ mx.dequantize(b, sb, fmt, swizzle=swizzle, dtype=torch.float64).t())
    assert not out.isnan().any()
    torch.testing.assert_close(out.double(), ref, rtol=2 ** -7, atol=2 ** -7 * ref.abs().max().item())


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", mx.FORMATS)
def test_bias_and_fp16_output(fmt):
    m, n, k = 130, 520, 768
    a, sa = mx.quantize(torch.randn(m, k, device="cuda"), fmt)
    b, sb = mx.quantize(torch.randn(n, k, device="cuda"), fmt)
    bias = torch.randn(n, device="cuda", dtype=torch.float16)
    p = eligibility.parse(a, b.t(), sa, sb, False, False)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
    scaled_dot.run(p, a, b.t(), sa, sb, out, bias)
    ref = (mx.dequantize(a, sa, fmt, dtype=torch.float64) @ mx.dequantize(b, sb, fmt, dtype=torch.float64).t()
           + bias.double())
    torch.testing.assert_close(out.double(), ref, rtol=2 ** -10, atol=2 ** -10 * ref.abs().max().item())

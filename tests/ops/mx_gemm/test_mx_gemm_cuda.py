"""MX GEMM on the H200: F.scaled_mm / torch._scaled_mm with tilefly's mx_gemm family against a
float64 reference from the dequantized operands; extreme and NaN scales; routing (MX served,
non-MX untouched), eager and inside a compiled graph."""
import functools

import pytest
import torch
import torch.nn.functional as F

import tilefly
from tilefly import _dispatch, mx
from tilefly.ops.mx_gemm import eligibility

from mx_cases import operands, raw_data, reference

pytestmark = pytest.mark.cuda
FAMILY = "mx_gemm"
IMPL = "gluon_mx_gemm"
BLOCKWISE = F.ScalingType.BlockWise1x32 if hasattr(F, "ScalingType") else None
_cuda_operands = functools.partial(operands, device="cuda")


def _scaled_mm(a, b, sa, sb, swizzle, bias=None, dtype=torch.bfloat16):
    layout = F.SwizzleType.SWIZZLE_32_4_4 if swizzle == "32_4_4" else F.SwizzleType.NO_SWIZZLE
    return F.scaled_mm(a, b, sa, BLOCKWISE, sb, BLOCKWISE, swizzle_a=layout, swizzle_b=layout, bias=bias,
                       output_dtype=dtype)


def _check(out, ref, dtype):
    assert out.dtype == dtype and out.shape == ref.shape and out.is_contiguous()
    # FP32 accumulation of exact products, one rounding to the output dtype; tolerance from its epsilon
    # (FP32 output: the FP8 wgmma sums each 32-element K-block in reduced precision, ~2^-14, before
    # the block's scaled partial joins the FP32 accumulator.)
    eps = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -13}[dtype]
    torch.testing.assert_close(out.double(), ref, rtol=2 * eps, atol=2 * eps * ref.abs().max().item() + 1e-30)


def _served(fn):
    with tilefly.enabled(FAMILY), _dispatch.recording() as decisions:
        out = fn()
        torch.cuda.synchronize()
    assert decisions and all(d.impl == IMPL for d in decisions), decisions
    return out


@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("swizzle", mx.SWIZZLES)
@pytest.mark.parametrize("m", [1, 16, 33, 128])
@pytest.mark.parametrize("n", [32, 256, 4096])
@pytest.mark.parametrize("k", [32, 256, 4096])
def test_matches_float64_reference(fmt, swizzle, m, n, k):
    a, b, sa, sb = _cuda_operands(fmt, m, n, k, swizzle, seed=m * 7 + n + k)
    out = _served(lambda: _scaled_mm(a, b, sa, sb, swizzle))
    _check(out, reference(a, b, sa, sb, fmt, swizzle), torch.bfloat16)


@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("swizzle", mx.SWIZZLES)
@pytest.mark.parametrize("m, n, k", [(16, 14336, 4096), (33, 4096, 14336), (4096, 14336, 256), (1, 256, 14336)])
def test_matches_float64_reference_at_14336(fmt, swizzle, m, n, k):
    """The issue's N and K of 14336 (an MoE or MLP width), each side, skinny and wide."""
    a, b, sa, sb = _cuda_operands(fmt, m, n, k, swizzle, seed=m + n + k)
    out = _served(lambda: _scaled_mm(a, b, sa, sb, swizzle))
    _check(out, reference(a, b, sa, sb, fmt, swizzle), torch.bfloat16)


@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("swizzle", mx.SWIZZLES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("m, n, k", [(33, 256, 4096), (128, 4096, 256), (16, 4096, 4096), (4096, 32, 256)])
def test_output_dtypes_and_bias(fmt, swizzle, dtype, m, n, k):
    a, b, sa, sb = _cuda_operands(fmt, m, n, k, swizzle, seed=5)
    bias = torch.randn(n, device="cuda", dtype=dtype)
    out = _served(lambda: _scaled_mm(a, b, sa, sb, swizzle, bias=bias, dtype=dtype))
    _check(out, reference(a, b, sa, sb, fmt, swizzle, bias), dtype)


@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("m", [1, 128])
def test_legacy_scaled_mm_is_served(fmt, m):
    a, b, sa, sb = _cuda_operands(fmt, m, 256, 512, "32_4_4", seed=9)
    bias = torch.randn(256, device="cuda", dtype=torch.bfloat16)
    out = _served(lambda: torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.bfloat16))
    _check(out, reference(a, b, sa, sb, fmt, "32_4_4", bias), torch.bfloat16)


@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("swizzle", mx.SWIZZLES)
@pytest.mark.parametrize("m, n", [(1, 4096), (33, 256), (256, 64)])
def test_extreme_scales(fmt, swizzle, m, n, monkeypatch):
    """A's K-blocks scaled by 2^-127 / 2^127 / ..., B's by the inverse (+- a few octaves): every
    product is representable although each factor is at the end of the E8M0 range. A row spanning
    2^254 is past what the upcasting paths keep (v3 at 33-64 tokens, the BF16 route from 128), so
    this runs with ``mx_upcast="never"``: the exact kernels."""
    from tilefly import config

    monkeypatch.setattr(config, "mx_upcast", "never")
    k = 512
    g = torch.Generator(device="cuda").manual_seed(11)
    a, b_nk = raw_data(fmt, m, k, g), raw_data(fmt, n, k, g)
    base = torch.tensor([0, 254, 127, 1, 253, 0, 254, 100, 0, 254, 30, 200, 0, 254, 127, 127][:k // 32],
                        device="cuda", dtype=torch.int32)
    delta = torch.randint(-6, 7, (n, k // 32), device="cuda", generator=g, dtype=torch.int32)
    bits_a = base.expand(m, -1).contiguous().to(torch.uint8)
    bits_b = (254 - base + delta).clamp(0, 254).to(torch.uint8)
    bits_b[3, 2] = 255                  # and a NaN scale: column 3 is NaN (the exact scaling path)
    sa, sb = bits_a.view(torch.float8_e8m0fnu), bits_b.view(torch.float8_e8m0fnu)
    if swizzle == "32_4_4":
        sa, sb = mx.to_blocked(sa), mx.to_blocked(sb)
    b = b_nk.t()
    ref = reference(a, b, sa, sb, fmt, swizzle)
    finite = torch.ones(n, dtype=torch.bool, device="cuda")
    finite[3] = False
    assert ref[:, finite].abs().max() > 1e-3 and torch.isfinite(ref[:, finite]).all() and ref[:, 3].isnan().all()
    out = _served(lambda: _scaled_mm(a, b, sa, sb, swizzle, dtype=torch.float32))
    assert out[:, 3].isnan().all()
    _check(out[:, finite].contiguous(), ref[:, finite], torch.float32)


@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("swizzle", mx.SWIZZLES)
def test_nan_scales_poison_their_row_and_column(fmt, swizzle):
    m, n, k = 40, 300, 256
    a, b, sa, sb = _cuda_operands(fmt, m, n, k, "none", seed=13)
    bits_a, bits_b = sa.view(torch.uint8).clone(), sb.view(torch.uint8).clone()
    bits_a[7, 3] = 255
    bits_b[123, 0] = 255
    bits_b[299, 7] = 255
    sa, sb = bits_a.view(torch.float8_e8m0fnu), bits_b.view(torch.float8_e8m0fnu)
    if swizzle == "32_4_4":
        sa, sb = mx.to_blocked(sa), mx.to_blocked(sb)
    out = _served(lambda: _scaled_mm(a, b, sa, sb, swizzle)).double()
    expect_nan = torch.zeros(m, n, dtype=torch.bool, device="cuda")
    expect_nan[7, :] = True
    expect_nan[:, 123] = True
    expect_nan[:, 299] = True
    assert torch.equal(torch.isnan(out), expect_nan)
    ref = reference(a, b, sa, sb, fmt, swizzle)
    assert torch.equal(torch.isnan(ref), expect_nan)
    _check(torch.where(expect_nan, 0.0, out).to(torch.bfloat16), torch.where(expect_nan, 0.0, ref), torch.bfloat16)


@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("m, n", [(1, 4096), (300, 200), (4096, 8)])
def test_every_output_element_is_written(fmt, m, n):
    """launch.run into a NaN-poisoned output, row-major and column-major."""
    from tilefly.ops.mx_gemm import launch

    a, b, sa, sb = _cuda_operands(fmt, m, n, 1024, "none", seed=17)
    p = eligibility.parse(a, b, sa, sb, False, False)
    ref = reference(a, b, sa, sb, fmt, "none")
    for out in (torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16),
                torch.full((n, m), float("nan"), device="cuda", dtype=torch.bfloat16).t()):
        launch.run(p, a, b, sa, sb, out)
        torch.cuda.synchronize()
        assert not torch.isnan(out).any()
        torch.testing.assert_close(out.double(), ref, rtol=2 ** -7, atol=2 ** -7 * ref.abs().max().item())


def test_row_wise_fp8_stays_on_cublas():
    a = torch.randn(64, 256, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(128, 256, device="cuda").to(torch.float8_e4m3fn).t()
    sa = torch.rand(64, 1, device="cuda") + 0.5
    sb = torch.rand(1, 128, device="cuda") + 0.5
    stock = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    with tilefly.enabled(FAMILY), _dispatch.recording() as decisions:
        routed = torch._scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)
    assert decisions and all(d.impl is None for d in decisions)
    assert torch.equal(routed, stock)


@pytest.mark.skipif(not hasattr(F, "scaled_mm"), reason="torch without F.scaled_mm")
def test_row_wise_fp8_through_f_scaled_mm_stays_on_cublas():
    """F.scaled_mm with RowWise scales (aten::_scaled_mm_v2, the op tilefly overrides for MX):
    the override declines it and the result is cuBLAS's, bit for bit."""
    a = torch.randn(64, 256, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(128, 256, device="cuda").to(torch.float8_e4m3fn).t()
    sa = torch.rand(64, 1, device="cuda") + 0.5
    sb = torch.rand(1, 128, device="cuda") + 0.5

    def call():
        return F.scaled_mm(a, b, sa, F.ScalingType.RowWise, sb, F.ScalingType.RowWise, output_dtype=torch.bfloat16)

    stock = call()
    with tilefly.enabled(FAMILY), _dispatch.recording() as decisions:
        routed = call()
    assert decisions and all(d.impl is None for d in decisions), decisions
    assert torch.equal(routed, stock)


def test_malformed_mx_call_raises_clearly():
    a, b, sa, sb = _cuda_operands("mxfp8", 16, 32, 256, "none")
    with tilefly.enabled(FAMILY), pytest.raises(eligibility.MXInputError, match=r"scale_b must have shape"):
        _scaled_mm(a, b, sa, sb[:, :4], "none")


@pytest.mark.parametrize("fmt, k", [("mxfp8", 256), ("mxfp4", 128)])
def test_served_inside_a_compiled_graph(fmt, k):
    """A compiled function calling F.scaled_mm reaches the override. On torch 2.11 Dynamo does not
    trace torch._scaled_mm_v2 (a graph break: the call runs eagerly between graphs), on 2.13 it is an
    eager fallback inside the graph; either way the dispatcher calls tilefly.
    (SWIZZLE_32_4_4 only: ATen's meta function rejects NO_SWIZZLE MX scales; its MXFP4 scale count
    is taken from the packed K / 2, so K stays <= 128 for MXFP4.)"""
    a, b, sa, sb = _cuda_operands(fmt, 16, 256, k, "32_4_4", seed=19)
    torch._dynamo.reset()
    compiled = torch.compile(lambda *xs: _scaled_mm(*xs, "32_4_4") * 2)
    with tilefly.enabled(FAMILY), _dispatch.recording(all_threads=True) as decisions:
        out = compiled(a, b, sa, sb)
        torch.cuda.synchronize()
    assert any(d.impl == IMPL for d in decisions), decisions
    _check(out / 2, reference(a, b, sa, sb, fmt, "32_4_4"), torch.bfloat16)
    torch._dynamo.reset()


@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("m, n, k", [(16, 4096, 4096), (4096, 256, 512), (300, 40, 256)])
def test_a_repeated_call_replays_its_plan_on_new_values(fmt, m, n, k):
    """The second call with the same tensors replays the cached launch (the dense GEMM's run_cached,
    no JIT): new values written into the same operands and a poisoned output must give the new
    product, split-K partials and tickets included (the 16-token decode shape splits K)."""
    from tilefly._triton_launch import CachedLaunch
    from tilefly.ops.mx_gemm import launch

    a, b, sa, sb = _cuda_operands(fmt, m, n, k, "none", seed=21)
    p = eligibility.parse(a, b, sa, sb, False, False)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    launch.run(p, a, b, sa, sb, out)
    assert isinstance(launch._plans[launch.plan_key(p, a, b, sa, sb, out)], CachedLaunch)
    _check(out, reference(a, b, sa, sb, fmt, "none"), torch.bfloat16)
    for seed in (22, 23):
        a2, b2, sa2, sb2 = _cuda_operands(fmt, m, n, k, "none", seed=seed)
        for dst, src in ((a, a2), (b, b2), (sa, sa2), (sb, sb2)):
            dst.view(torch.uint8).copy_(src.view(torch.uint8))
        out.fill_(float("nan"))
        launch.run(p, a, b, sa, sb, out)
        torch.cuda.synchronize()
        _check(out, reference(a, b, sa, sb, fmt, "none"), torch.bfloat16)

"""The BF16 route of the MX GEMM (upcast.py, kernels_upcast.py, config.mx_upcast): when it serves, the
eager op's order of routes, its compile specs; on the H200, F.scaled_mm through it against the float64
product of the dequantized operands, extreme and NaN scales, every output element written. Its
kernels run in Triton's interpreter through configs.interpreter_checks (test_mx_requant.py)."""
import pytest
import torch

from tilefly import config, mx
from tilefly.ops.mx_gemm import configs, eager, eligibility, launch, requant, upcast
from tilefly.ops.mx_gemm.eligibility import MXProblem


@pytest.mark.parametrize("m, n, mode, served", [
    (4096, 4096, "auto", True),
    (upcast.MIN_SIDE, 4096, "auto", True),
    (4096, upcast.MIN_SIDE, "auto", True),
    (upcast.MIN_SIDE - 1, 4096, "auto", False),      # weight-bound: the exact kernels stream it
    (4096, 32, "auto", False),
    (32, 4096, "always", True),
    (4096, 4096, "never", False),
])
def test_serves_by_the_smaller_side_unless_told(monkeypatch, m, n, mode, served):
    monkeypatch.setattr(config, "mx_upcast", mode)
    for fmt in ("mxfp8", "mxfp4"):
        assert upcast.serves(MXProblem(fmt, m, n, 4096, False, False), torch.bfloat16) == served


def test_the_option_reads_its_environment_variable(monkeypatch):
    monkeypatch.setenv("TILEFLY_MX_UPCAST", "never")
    try:
        config.reload()
        assert config.mx_upcast == "never"
        monkeypatch.setenv("TILEFLY_MX_UPCAST", "sometimes")
        with pytest.raises(ValueError, match="TILEFLY_MX_UPCAST|auto, always, never"):
            config.reload()
    finally:
        monkeypatch.delenv("TILEFLY_MX_UPCAST")
        config.reload()


def test_the_eager_op_tries_requantization_then_upcast_then_the_exact_kernels(monkeypatch):
    taken = []
    monkeypatch.setattr(requant, "run", lambda p, *args: taken.append(("requant", p.m)) or args[4])
    monkeypatch.setattr(upcast, "run", lambda p, *args: taken.append(("upcast", p.m)) or args[4])
    monkeypatch.setattr(launch, "run", lambda p, *args: taken.append(("kernel", p.m)) or args[4])
    monkeypatch.setattr(requant, "MIN_SIDE", 512)    # CPU-sized operands
    monkeypatch.setattr(upcast, "MIN_SIDE", 256)
    for m, requantize in ((1024, True), (1024, False), (256, True), (64, False)):
        monkeypatch.setattr(config, "mx_requantize", requantize)
        a, sa = mx.quantize(torch.randn(m, 512), "mxfp8")
        b, sb = mx.quantize(torch.randn(512, 512), "mxfp8")
        p = eligibility.parse(a, b.t(), sa, sb, False, False)
        out = eager._run(p, a, b.t(), sa, sb, None, torch.bfloat16)
        assert out.shape == (m, 512) and out.dtype == torch.bfloat16
    assert taken == [("requant", 1024), ("upcast", 1024), ("upcast", 256), ("kernel", 64)]


def test_compile_specs_cover_the_upcast_kernels():
    names = {s.name for s in configs.compile_specs()}
    assert {n for n in names if n.startswith("mx_gemm.upcast[")} == {
        f"mx_gemm.upcast[{fmt},swz={s},K={k}]" for fmt in ("mxfp8", "mxfp4") for s in (0, 1) for k in (4096, 256)}
    assert len([n for n in names if n.startswith("mx_gemm.rescale[")]) == 4


@pytest.mark.parametrize("m, n, k", [(1, 4096, 32), (37, 21, 320), (300, 520, 4096), (5, 7, 14336)])
def test_one_upcast_launch_covers_both_operands(monkeypatch, m, n, k):
    """The launch's arguments in the kernel's order; its programs cover A's rows, then B's, each
    program ROWS rows of BLOCKS K-blocks a step (a chunk of values, whatever K)."""
    from tilefly import _triton_launch
    from tilefly.ops.mx_gemm import kernels_upcast

    seen = {}
    monkeypatch.setattr(_triton_launch, "launch_direct", lambda cache, kernel_of, grid, tensors, ints, constexprs,
                        num_warps: seen.update(grid=grid, values=[*tensors, *ints, *constexprs.values()],
                                               kernel=kernel_of()))
    a, sa = mx.quantize(torch.randn(m, k), "mxfp4")
    b, sb = mx.quantize(torch.randn(n, k), "mxfp4", swizzle="32_4_4")
    a16, b16, ra, rb = upcast.upcast_operands(a, sa, b, sb, m, n, k, True, False, True)
    assert seen["kernel"] is kernels_upcast.mx_upcast_rows_kernel
    args = dict(zip(seen["kernel"].arg_names, seen["values"]))
    rows, blocks = args["ROWS"], args["BLOCKS"]
    assert rows * blocks * 32 == upcast.CHUNK and blocks >= min(k // 32, upcast.CHUNK // 32)
    assert seen["grid"] == (-(-m // rows) + -(-n // rows), 1)
    assert (args["M"], args["N"], args["K"], args["stride_qa"], args["stride_qb"]) == (m, n, k, k // 2, k // 2)
    assert (args["stride_sar"], args["stride_sac"], args["stride_sbr"], args["stride_sbc"]) == (k // 32, 1, 0, 0)
    assert args["A_SWIZZLED"] is False and args["B_SWIZZLED"] is True
    assert a16.shape == (m, k) and b16.shape == (n, k) and b16.data_ptr() == a16.data_ptr() + m * k * 2
    assert ra.shape == (m,) and rb.shape == (n,)


# ---- on the H200 --------------------------------------------------------------------------------

def _scaled_mm(a, b, sa, sb, swizzle, bias=None, dtype=torch.bfloat16):
    import torch.nn.functional as F

    layout = F.SwizzleType.SWIZZLE_32_4_4 if swizzle == "32_4_4" else F.SwizzleType.NO_SWIZZLE
    blockwise = F.ScalingType.BlockWise1x32
    return F.scaled_mm(a, b, sa, blockwise, sb, blockwise, swizzle_a=layout, swizzle_b=layout, bias=bias,
                       output_dtype=dtype)


def _through_upcast(monkeypatch, fn):
    import tilefly
    from tilefly import _dispatch

    calls = []
    real = upcast.run
    monkeypatch.setattr(upcast, "run", lambda *args: calls.append(args[0]) or real(*args))
    with tilefly.enabled("mx_gemm"), _dispatch.recording() as decisions:
        out = fn()
        torch.cuda.synchronize()
    assert decisions and all(d.impl is not None for d in decisions), decisions
    assert calls, "the call did not take the upcast route"
    return out


def _check(out, ref, dtype):
    eps = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -16}[dtype]
    assert out.dtype == dtype and out.shape == ref.shape
    torch.testing.assert_close(out.double(), ref, rtol=2 * eps, atol=2 * eps * ref.abs().max().item())


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("swizzle", mx.SWIZZLES)
@pytest.mark.parametrize("dtype, with_bias", [(torch.bfloat16, False), (torch.bfloat16, True), (torch.float16, True),
                                              (torch.float32, False)])
@pytest.mark.parametrize("m, n, k", [(128, 4096, 4096), (1000, 300, 544), (4096, 256, 14336)])
def test_scaled_mm_through_upcast_matches_float64(monkeypatch, fmt, swizzle, dtype, with_bias, m, n, k):
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    a, sa = mx.quantize(torch.randn(m, k, device="cuda", generator=g), fmt, swizzle=swizzle)
    b, sb = mx.quantize(torch.randn(n, k, device="cuda", generator=g), fmt, swizzle=swizzle)
    bias = torch.randn(n, device="cuda", generator=g).to(dtype) if with_bias else None
    for _ in range(2):  # the second call replays the cached launches
        out = _through_upcast(monkeypatch, lambda: _scaled_mm(a, b.t(), sa, sb, swizzle, bias, dtype))
    ref = (mx.dequantize(a, sa, fmt, swizzle=swizzle, dtype=torch.float64)
           @ mx.dequantize(b, sb, fmt, swizzle=swizzle, dtype=torch.float64).t())
    _check(out, ref if bias is None else ref + bias.double(), dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", mx.FORMATS)
def test_rows_of_extreme_scales_are_rescaled(monkeypatch, fmt):
    """Rows of A whose scales are 2^+120 or 2^-120 against columns of B at the inverse: values far
    outside BF16 whose products are ordinary numbers (the stock dequantize-then-mm path loses them)."""
    m, n, k = 256, 384, 1024
    g = torch.Generator(device="cuda").manual_seed(5)
    a, sa = mx.quantize(torch.randn(m, k, device="cuda", generator=g), fmt)
    b, sb = mx.quantize(torch.randn(n, k, device="cuda", generator=g), fmt)
    bits_a, bits_b = sa.view(torch.uint8), sb.view(torch.uint8)
    bits_a[:64], bits_a[64:128] = 247, 7        # 2^120, 2^-120
    bits_b[:64], bits_b[64:128] = 7, 247
    bits_a[200, 5] = 255                          # and a NaN scale: row 200 is NaN
    out = _through_upcast(monkeypatch, lambda: _scaled_mm(a, b.t(), sa, sb, "none", dtype=torch.float32))
    ref = mx.dequantize(a, sa, fmt, dtype=torch.float64) @ mx.dequantize(b, sb, fmt, dtype=torch.float64).t()
    assert out[200].isnan().all() and ref[200].isnan().all()
    for rows, cols in ((slice(0, 64), slice(0, 64)), (slice(64, 128), slice(64, 128)), (slice(128, 200), slice(128, n))):
        assert ref[rows, cols].abs().max() > 1.0 and torch.isfinite(ref[rows, cols]).all()
        _check(out[rows, cols], ref[rows, cols], torch.float32)


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", mx.FORMATS)
def test_every_output_element_is_written(fmt):
    m, n, k = 300, 520, 256
    a, sa = mx.quantize(torch.randn(m, k, device="cuda"), fmt)
    b, sb = mx.quantize(torch.randn(n, k, device="cuda"), fmt)
    p = eligibility.parse(a, b.t(), sa, sb, False, False)
    ref = mx.dequantize(a, sa, fmt, dtype=torch.float64) @ mx.dequantize(b, sb, fmt, dtype=torch.float64).t()
    for dtype in (torch.bfloat16, torch.float32):
        out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
        upcast.run(p, a, b.t(), sa, sb, out)
        torch.cuda.synchronize()
        assert not out.isnan().any()
        _check(out, ref, dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("swizzle_a, swizzle_b", [("32_4_4", "none"), ("none", "32_4_4")])
def test_operands_of_different_scale_layouts(monkeypatch, fmt, swizzle_a, swizzle_b):
    """One launch upcasts both operands, each with its own scale layout."""
    import torch.nn.functional as F

    m, n, k = 333, 200, 1056
    g = torch.Generator(device="cuda").manual_seed(3)
    a, sa = mx.quantize(torch.randn(m, k, device="cuda", generator=g), fmt, swizzle=swizzle_a)
    b, sb = mx.quantize(torch.randn(n, k, device="cuda", generator=g), fmt, swizzle=swizzle_b)
    layout = {"none": F.SwizzleType.NO_SWIZZLE, "32_4_4": F.SwizzleType.SWIZZLE_32_4_4}
    blockwise = F.ScalingType.BlockWise1x32
    out = _through_upcast(monkeypatch, lambda: F.scaled_mm(
        a, b.t(), sa, blockwise, sb, blockwise, swizzle_a=layout[swizzle_a], swizzle_b=layout[swizzle_b],
        output_dtype=torch.bfloat16))
    ref = (mx.dequantize(a, sa, fmt, swizzle=swizzle_a, dtype=torch.float64)
           @ mx.dequantize(b, sb, fmt, swizzle=swizzle_b, dtype=torch.float64).t())
    _check(out, ref, torch.bfloat16)


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", mx.FORMATS)
def test_the_route_replays_inside_a_cuda_graph(monkeypatch, fmt):
    """Warmed up once (kernels compiled), then captured: the replay computes new operands' product."""
    import torch.nn.functional as F

    m, n, k = 256, 512, 1024
    a, sa = mx.quantize(torch.randn(m, k, device="cuda"), fmt)
    b, sb = mx.quantize(torch.randn(n, k, device="cuda"), fmt)
    blockwise = F.ScalingType.BlockWise1x32

    def call():
        return F.scaled_mm(a, b.t(), sa, blockwise, sb, blockwise, output_dtype=torch.bfloat16)

    _through_upcast(monkeypatch, call)
    graph = torch.cuda.CUDAGraph()
    import tilefly

    with tilefly.enabled("mx_gemm"):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            call()
            with torch.cuda.graph(graph, stream=stream):
                out = call()
        torch.cuda.current_stream().wait_stream(stream)
    a2, sa2 = mx.quantize(torch.randn(m, k, device="cuda"), fmt)
    a.copy_(a2)
    sa.copy_(sa2)
    graph.replay()
    torch.cuda.synchronize()
    ref = mx.dequantize(a, sa, fmt, dtype=torch.float64) @ mx.dequantize(b, sb, fmt, dtype=torch.float64).t()
    _check(out, ref, torch.bfloat16)

"""The requantizing path (requant.py, kernels_requant.py, config.mx_requantize): when it serves,
its kernel in Triton's interpreter on CPU, its compile specs; on the H200, F.scaled_mm through it
against the float64 product of the dequantized operands."""
import pytest
import torch

from tilefly import config, mx
from tilefly._interpreter import run_checks
from tilefly.ops.mx_gemm import configs, eager, eligibility, launch, requant
from tilefly.ops.mx_gemm.eligibility import MXProblem

def test_interpreter_checks_pass():
    pytest.importorskip("triton")
    proc = run_checks(["mx_gemm"], timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("ok ") == len(configs.interpreter_checks()) >= 6, proc.stdout


@pytest.mark.parametrize("m, n, k, dtype, served", [
    (4096, 4096, 4096, torch.bfloat16, True),
    (4096, 14336, 4096, torch.bfloat16, True),
    (2048, 4096, 4096, torch.bfloat16, False),      # smaller: the extra passes do not pay (requant.MIN_SIDE)
    (256, 4096, 4096, torch.bfloat16, False),       # weight-bound: the exact kernels
    (4096, 4096, 4096, torch.float16, False),       # the row-scaled FP8 GEMM writes BF16
    (4096, 4112, 4096, torch.bfloat16, True),
    (4096, 4100, 4096, torch.bfloat16, False),      # N not a multiple of 16
])
def test_serves_large_bf16_calls_only_when_asked(monkeypatch, m, n, k, dtype, served):
    p = MXProblem("mxfp8", m, n, k, False, False)
    monkeypatch.setattr(config, "mx_requantize", False)
    assert not requant.serves(p, dtype)
    monkeypatch.setattr(config, "mx_requantize", True)
    assert requant.serves(p, dtype) == served


def test_the_eager_op_takes_the_requantizing_path_when_it_serves(monkeypatch):
    taken = []
    monkeypatch.setattr(requant, "run", lambda p, *args: taken.append(("requant", p.m)) or args[4])
    monkeypatch.setattr(launch, "run", lambda p, *args: taken.append(("kernel", p.m)) or args[4])
    monkeypatch.setattr(requant, "MIN_SIDE", 512)    # CPU-sized operands
    monkeypatch.setattr(config, "mx_upcast", "never")  # test_mx_upcast.py has the three-way order
    for m, on in ((1024, True), (1024, False), (64, True)):
        monkeypatch.setattr(config, "mx_requantize", on)
        a, sa = mx.quantize(torch.randn(m, 512), "mxfp8")
        b, sb = mx.quantize(torch.randn(512, 512), "mxfp8")
        p = eligibility.parse(a, b.t(), sa, sb, False, False)
        out = eager._run(p, a, b.t(), sa, sb, None, torch.bfloat16)
        assert out.shape == (m, 512) and out.dtype == torch.bfloat16
    assert taken == [("requant", 1024), ("kernel", 1024), ("kernel", 64)]


def test_compile_specs_cover_the_requantization_kernel():
    names = [s.name for s in configs.compile_specs()]
    assert {n for n in names if n.startswith("mx_gemm.requant[")} == {
        f"mx_gemm.requant[{fmt},K={k}]" for fmt in ("mxfp8", "mxfp4") for k in (4096, 16384)}


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("swizzle", mx.SWIZZLES)
@pytest.mark.parametrize("m, n, k", [(512, 512, 256), (1024, 4096, 4096), (4096, 512, 1024)])
def test_scaled_mm_through_requantization_matches_float64(monkeypatch, fmt, swizzle, m, n, k):
    import torch.nn.functional as F

    import tilefly
    from tilefly import _dispatch

    monkeypatch.setattr(config, "mx_requantize", True)
    monkeypatch.setattr(requant, "MIN_SIDE", 512)    # small shapes, so the float64 reference stays cheap
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    for _ in range(2):  # the second call of a shape launches the cached requantization kernels
        a, sa = mx.quantize(torch.randn(m, k, device="cuda", generator=g), fmt, swizzle=swizzle)
        b, sb = mx.quantize(torch.randn(n, k, device="cuda", generator=g), fmt, swizzle=swizzle)
        bias = torch.randn(n, device="cuda", generator=g).to(torch.bfloat16)
        layout = F.SwizzleType.SWIZZLE_32_4_4 if swizzle == "32_4_4" else F.SwizzleType.NO_SWIZZLE
        blockwise = F.ScalingType.BlockWise1x32
        with tilefly.enabled("mx_gemm"), _dispatch.recording() as decisions:
            out = F.scaled_mm(a, b.t(), sa, blockwise, sb, blockwise, swizzle_a=layout, swizzle_b=layout, bias=bias,
                              output_dtype=torch.bfloat16)
            torch.cuda.synchronize()
        assert decisions and all(d.impl is not None for d in decisions), decisions
        ref = (mx.dequantize(a, sa, fmt, swizzle=swizzle, dtype=torch.float64)
               @ mx.dequantize(b, sb, fmt, swizzle=swizzle, dtype=torch.float64).t() + bias.double())
        eps = 2.0 ** -8
        torch.testing.assert_close(out.double(), ref, rtol=2 * eps, atol=2 * eps * ref.abs().max().item())


@pytest.mark.cuda
def test_a_nan_scale_makes_its_row_nan():
    a, sa = mx.quantize(torch.randn(512, 256, device="cuda"), "mxfp8")
    b, sb = mx.quantize(torch.randn(512, 256, device="cuda"), "mxfp8")
    sa.view(torch.uint8)[7, 3] = 255
    out = torch.empty(512, 512, dtype=torch.bfloat16, device="cuda")
    requant.run(MXProblem("mxfp8", 512, 512, 256, False, False), a, b.t(), sa, sb, out)
    assert out[7].isnan().all() and not out[:7].isnan().any() and not out[8:].isnan().any()

"""The mxfp_gemm suite's operands come from tilefly.mx (whose rounding is tested in tests/mx), and
its dequantizing baseline computes the GEMM of exactly those operands."""
import pytest
import torch

from tilefly import mx
from tilefly.bench import mx_operands
from tilefly.bench.suites import mxfp_gemm


@pytest.mark.parametrize("fmt", mx_operands.FORMATS)
def test_operand_is_tilefly_mx_quantize(fmt):
    torch.manual_seed(0)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    op = mx_operands.quantize(x, fmt)
    data, scales = mx.quantize(x, fmt)
    assert op.fmt == fmt and op.data.dtype == data.dtype and op.scale.dtype == torch.float8_e8m0fnu
    assert torch.equal(op.data.view(torch.uint8), data.view(torch.uint8))
    assert torch.equal(op.scale.view(torch.uint8), scales.view(torch.uint8))
    assert op.scale.shape == (3, 2)  # unswizzled
    assert op.nbytes == (3 * 64 if fmt == "mxfp8" else 3 * 32) + 3 * 2
    plain_data, plain_scale = op.plain()
    assert plain_data.dtype == (torch.float8_e4m3fn if fmt == "mxfp8" else torch.uint8)
    assert plain_scale.dtype == torch.uint8
    assert plain_data.data_ptr() == op.data.data_ptr()  # views, not copies


@pytest.mark.parametrize("fmt", mx_operands.FORMATS)
def test_dequant_mm_is_the_gemm_of_the_quantized_operands(fmt):
    torch.manual_seed(1)
    qa = mx_operands.quantize(torch.randn(5, 96, dtype=torch.bfloat16), fmt)
    qb = mx_operands.quantize(torch.randn(7, 96, dtype=torch.bfloat16), fmt)
    got = mxfp_gemm.dequant_mm(*qa.plain(), *qb.plain(), fmt=fmt)
    assert got.dtype == torch.bfloat16 and got.shape == (5, 7)
    a = mx.dequantize(qa.data, qa.scale, fmt, dtype=torch.float64)
    b = mx.dequantize(qb.data, qb.scale, fmt, dtype=torch.float64)
    ref = a @ b.t()
    torch.testing.assert_close(got.double(), ref, rtol=2.0 ** -8, atol=2.0 ** -8 * ref.abs().max().item())

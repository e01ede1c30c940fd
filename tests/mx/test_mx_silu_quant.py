"""tilefly::silu_mul_mx_quantize and the SiLU step of the post-grad pass (tilefly.mx.silu_fusion), on CPU.

The kernel is checked in Triton's interpreter (tilefly.ops.mx_gemm.checks, run by
tests/ops/mx_gemm/test_mx_requant.py) and on the GPU (test_mx_cuda.py); the fusion in whole transformers
models in test_mx_norm_quant.py."""
import pytest
import torch
import torch.nn.functional as F

from tilefly import mx
from tilefly.mx import formats, silu_quant
from tilefly.mx.quant import quantize_rows_ops

FUSED = "torch.ops.tilefly.silu_mul_mx_quantize.default("
QUANT = "torch.ops.tilefly.mx_quantize_rows.default("
N = 96


def _gate_up(rows=4, n=N, dtype=torch.bfloat16):
    """Column slices of one packed tensor, as the packed gate/up GEMM gives them."""
    packed = torch.randn(rows, 1, 2 * n) * 3
    packed[0, 0, 5] = float("nan")
    packed = packed.to(dtype)
    return packed[..., :n], packed[..., n:]


@pytest.mark.parametrize("fmt", mx.FORMATS)
def test_the_ops_path_is_silu_product_then_quantize_rows(fmt):
    gate, up = _gate_up()
    data, scales = torch.ops.tilefly.silu_mul_mx_quantize(gate, up, fmt)
    want_data, want_scales = quantize_rows_ops((F.silu(gate) * up).reshape(-1, N), formats.ELEMENTS[fmt])
    assert data.dtype == scales.dtype == torch.uint8
    assert torch.equal(data, want_data.view(torch.uint8)) and torch.equal(scales, want_scales)
    assert scales[0, 0] == 255      # the NaN's block


@pytest.mark.parametrize("fmt", mx.FORMATS)
def test_fake_outputs_match_the_op(fmt):
    from torch._subclasses.fake_tensor import FakeTensorMode

    gate, up = _gate_up(rows=3)
    real = torch.ops.tilefly.silu_mul_mx_quantize(gate, up, fmt)
    with FakeTensorMode() as mode:
        fake = torch.ops.tilefly.silu_mul_mx_quantize(mode.from_tensor(gate), mode.from_tensor(up), fmt)
    assert [(t.shape, t.dtype) for t in fake] == [(t.shape, t.dtype) for t in real]


def test_kernel_reason_names_what_the_kernel_does_not_take():
    gate, up = _gate_up()
    assert "cpu tensors" in silu_quant.kernel_reason(gate, up)
    assert "float16 rows" in silu_quant.shape_reason((4, N), torch.float16)
    assert "row length 100" in silu_quant.shape_reason((4, 100), torch.bfloat16)
    assert silu_quant.shape_reason((4, N), torch.bfloat16) is None


def _mlp_input(fmt="mxfp4", extra_user=False):
    """An MLP's down-projection input quantized as MXLinear traces it."""
    def f(packed):
        gate, up = packed[..., :N], packed[..., N:]
        x = F.silu(gate) * up
        data, scales = torch.ops.tilefly.mx_quantize_rows(x.reshape(-1, N), fmt)
        return (data, scales, x.float().sum()) if extra_user else (data, scales)
    return f


@pytest.mark.parametrize("fmt", mx.FORMATS)
def test_the_pass_fuses_the_silu_product_and_its_quantization(compile_fused, fmt):
    packed = (torch.randn(4, 1, 2 * N) * 3).bfloat16()
    f = _mlp_input(fmt)
    out, code = compile_fused(f, packed)
    assert code.count(FUSED) == 1 and QUANT not in code
    for got, want in zip(out, f(packed)):      # the op's CPU path is the eager ops
        assert torch.equal(got, want)


@pytest.mark.parametrize("case", ["option off", "product used elsewhere", "float16 rows"])
def test_the_pass_leaves_what_it_does_not_match(compile_fused, case):
    packed = (torch.randn(4, 1, 2 * N) * 3).to(torch.float16 if case == "float16 rows" else torch.bfloat16)
    _, code = compile_fused(_mlp_input(extra_user=case == "product used elsewhere"), packed,
                        fused=case != "option off")
    assert FUSED not in code and code.count(QUANT) == 1

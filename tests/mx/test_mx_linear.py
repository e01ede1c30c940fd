"""MXLinear and swap_linears on CPU: the "dequant" backend against float64, the "scaled_mm"
backend's call (F.scaled_mm faked, ATen has no MX kernel here) and its clear error."""
import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tilefly import mx

K, N = 96, 48


def _linear(dtype=torch.bfloat16, bias=True, k=K, n=N, seed=0):
    torch.manual_seed(seed)
    lin = nn.Linear(k, n, bias=bias).to(dtype)
    with torch.no_grad():
        lin.weight.normal_(0, 0.1)
        if bias:
            lin.bias.normal_(0, 1.0)
    return lin


def _reference(module: mx.MXLinear, x: torch.Tensor) -> torch.Tensor:
    """float64 GEMM of the dequantized operands: the activation quantized as the module must."""
    a_data, a_scales = mx.quantize(x.reshape(-1, module.in_features), module.fmt)
    a = mx.dequantize(a_data, a_scales, module.fmt, dtype=torch.float64)
    w = mx.dequantize(module.weight_data, module.weight_scales, module.fmt, swizzle=module.swizzle,
                      dtype=torch.float64)
    out = a @ w.t()
    if module.bias is not None:
        out = out + module.bias.double()
    return out.reshape(*x.shape[:-1], module.out_features)


def _assert_close_to(out: torch.Tensor, ref: torch.Tensor) -> None:
    # operands are exact in BF16/FP16; what is left is FP32 accumulation and the output rounding
    torch.testing.assert_close(out.double(), ref, rtol=2.0 ** -8, atol=2.0 ** -8 * ref.abs().max().item())


@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("swizzle", mx.SWIZZLES)
@pytest.mark.parametrize("dtype,bias", [(torch.bfloat16, True), (torch.float16, False), (torch.float16, True)])
def test_dequant_backend_matches_float64(fmt, swizzle, dtype, bias):
    lin = _linear(dtype, bias)
    m = mx.MXLinear.from_linear(lin, fmt, swizzle=swizzle, backend="dequant")
    torch.manual_seed(1)
    for shape in [(1, K), (2, 17, K)]:
        x = torch.randn(shape, dtype=dtype)
        out = m(x)
        assert out.dtype == dtype and out.shape == (*shape[:-1], N)
        ref = _reference(m, x)
        _assert_close_to(out, ref)
        # and the quantized layer is near the float one (loosely: MX element precision)
        dense = lin(x).double()
        assert (ref - dense).abs().max() <= (0.1 if fmt == "mxfp8" else 0.5) * dense.abs().max()


def test_module_holds_only_quantized_weights():
    lin = _linear()
    m = mx.MXLinear.from_linear(lin, "mxfp4", swizzle="none", backend="dequant")
    assert not hasattr(m, "weight")
    assert m.weight_data.dtype == torch.float4_e2m1fn_x2 and m.weight_data.shape == (N, K // 2)
    assert m.weight_scales.dtype == torch.float8_e8m0fnu and m.weight_scales.shape == (N, K // 32)
    data, scales = mx.quantize(lin.weight, "mxfp4")
    assert torch.equal(m.weight_bits, data.view(torch.uint8))
    assert torch.equal(m.weight_scale_bits, scales.view(torch.uint8))
    assert set(m.state_dict()) == {"weight_bits", "weight_scale_bits", "bias"}
    x = torch.randn(4, K, dtype=torch.bfloat16)
    before = m(x)
    m.to(torch.float16)  # the quantized buffers are uint8: a dtype cast leaves them alone
    assert m.weight_bits.dtype == torch.uint8 and torch.equal(m.weight_bits, data.view(torch.uint8))
    assert m.dtype == m.bias.dtype == torch.float16
    after = m(x)
    assert after.dtype == torch.float16
    _assert_close_to(after, before.double())
    assert "fmt=mxfp4" in repr(m) and "backend=dequant" in repr(m)


@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("swizzle", mx.SWIZZLES)
def test_scaled_mm_backend_on_cpu_raises_clear_error(fmt, swizzle):
    m = mx.MXLinear.from_linear(_linear(), fmt, swizzle=swizzle)
    assert m.backend == "scaled_mm"
    with pytest.raises(mx.MXKernelUnavailable, match=r"no MX.* kernel .* on cpu.*backend='dequant'") as info:
        m(torch.randn(3, K, dtype=torch.bfloat16))
    assert fmt.upper() in str(info.value)
    m.backend = "dequant"  # the documented way out
    assert m(torch.randn(3, K, dtype=torch.bfloat16)).shape == (3, N)


def _fake_scaled_mm(calls, fmt, swizzle, K=K, N=N):
    """Stands in for an MX F.scaled_mm: checks the operands are what the API needs, then computes
    the result from the dequantized operands in float64."""
    def scaled_mm(mat_a, mat_b, scale_a, recipe_a, scale_b, recipe_b, swizzle_a=None, swizzle_b=None,
                  bias=None, output_dtype=torch.bfloat16, contraction_dim=(), use_fast_accum=False):
        per_byte = 2 if fmt == "mxfp4" else 1
        m_rows, n_cols = mat_a.shape[0], mat_b.shape[1]
        assert mat_a.dtype == mat_b.dtype == (torch.float4_e2m1fn_x2 if fmt == "mxfp4" else torch.float8_e4m3fn)
        assert mat_a.shape == (m_rows, K // per_byte) and mat_a.stride() == (K // per_byte, 1)  # row-major
        assert mat_b.shape == (K // per_byte, N) and mat_b.stride() == (1, K // per_byte)      # column-major
        assert recipe_a == recipe_b == F.ScalingType.BlockWise1x32
        expected_swizzle = F.SwizzleType.SWIZZLE_32_4_4 if swizzle == "32_4_4" else F.SwizzleType.NO_SWIZZLE
        assert swizzle_a == swizzle_b == expected_swizzle
        assert scale_a.dtype == scale_b.dtype == torch.float8_e8m0fnu
        if swizzle == "32_4_4":
            assert scale_a.shape == (mx.blocked_numel(m_rows, K // 32),)
            assert scale_b.shape == (mx.blocked_numel(N, K // 32),)
        else:
            assert scale_a.shape == (m_rows, K // 32) and scale_b.shape == (N, K // 32)
        calls.append((bias, output_dtype))
        a = mx.dequantize(mat_a, scale_a, fmt, swizzle=swizzle, dtype=torch.float64)
        b = mx.dequantize(mat_b.t(), scale_b, fmt, swizzle=swizzle, dtype=torch.float64)
        out = a @ b.t() + (0 if bias is None else bias.double())
        return out.to(output_dtype)
    return scaled_mm


@pytest.mark.skipif(not hasattr(F, "scaled_mm"), reason="torch without F.scaled_mm")
@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("swizzle", mx.SWIZZLES)
def test_scaled_mm_backend_passes_the_operands_f_scaled_mm_expects(monkeypatch, fmt, swizzle):
    from tilefly.mx import weight_operand

    calls, constant = [], []
    fake = _fake_scaled_mm(calls, fmt, swizzle)
    monkeypatch.setattr(F, "scaled_mm", lambda *args, **kwargs: constant.append(weight_operand.constant())
                        or fake(*args, **kwargs))
    m = mx.MXLinear.from_linear(_linear(torch.float16), fmt, swizzle=swizzle)
    x = torch.randn(2, 5, K, dtype=torch.float16)
    out = m(x)
    assert len(calls) == 1 and calls[0][0] is m.bias and calls[0][1] == torch.float16
    assert constant == [True] and not weight_operand.constant()   # B was the layer's weight, for that call only
    assert out.shape == (2, 5, N) and out.dtype == torch.float16
    _assert_close_to(out, _reference(m, x))
    m.backend = "dequant"  # both backends compute the same thing
    _assert_close_to(m(x), out.double())


@pytest.mark.skipif(not hasattr(F, "scaled_mm"), reason="torch without F.scaled_mm")
@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("swizzle", mx.SWIZZLES)
def test_scaled_mm_backend_compiles_without_graph_breaks(monkeypatch, fmt, swizzle):
    """Compiled, the layer reaches F.scaled_mm through tilefly::mx_linear_mm: one graph for both
    scale layouts and K > 128, where tracing F.scaled_mm itself fails (torch 2.13's meta function:
    NO_SWIZZLE scales, MXFP4 scales counted from K / 2) or breaks the graph (torch 2.11); at run
    time the op makes the same F.scaled_mm call as eager mode."""
    k = 256
    calls = []
    monkeypatch.setattr(F, "scaled_mm", _fake_scaled_mm(calls, fmt, swizzle, K=k))
    m = mx.MXLinear.from_linear(_linear(k=k), fmt, swizzle=swizzle)
    x = torch.randn(2, 5, k, dtype=torch.bfloat16)
    graphs = []

    def recording(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    out = torch.compile(m, fullgraph=True, backend=recording)(x)
    targets = [node.target for node in graphs[0].graph.nodes if node.op == "call_function"]
    assert torch.ops.tilefly.mx_linear_mm.default in targets      # opaque: F.scaled_mm is not traced
    assert len(calls) == 1 and calls[0][1] == torch.bfloat16      # ... and runs inside the op
    torch.testing.assert_close(out, m(x), rtol=0, atol=0)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(m, fullgraph=True)(x), out, rtol=0, atol=0)   # Inductor
    torch._dynamo.reset()


@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("swizzle", mx.SWIZZLES)
def test_compiled_scaled_mm_backend_on_cpu_traces_then_raises_the_clear_error(fmt, swizzle):
    """The real F.scaled_mm: tracing needs no ATen meta function (which refuses NO_SWIZZLE MX
    scales and MXFP4 at K > 128 on torch 2.13); at run time ATen's missing CPU kernel is reported
    as MXKernelUnavailable, as in eager mode."""
    k = 256
    torch._dynamo.reset()
    m = mx.MXLinear.from_linear(_linear(k=k), fmt, swizzle=swizzle)
    with pytest.raises(mx.MXKernelUnavailable, match="backend='dequant'"):
        torch.compile(m, fullgraph=True)(torch.randn(3, k, dtype=torch.bfloat16))
    torch._dynamo.reset()


def test_legacy_scaled_mm_fallback(monkeypatch):
    monkeypatch.delattr(F, "scaled_mm", raising=False)
    seen = []

    def legacy(a, b, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False):
        seen.append((scale_a.shape, scale_b.shape, out_dtype))
        return torch.zeros(a.shape[0], b.shape[1], dtype=out_dtype)

    monkeypatch.setattr(torch, "_scaled_mm", legacy)
    m = mx.MXLinear.from_linear(_linear(), "mxfp8")
    assert m(torch.randn(3, K, dtype=torch.bfloat16)).shape == (3, N)
    assert seen == [((mx.blocked_numel(3, K // 32),), (mx.blocked_numel(N, K // 32),), torch.bfloat16)]
    m = mx.MXLinear.from_linear(_linear(), "mxfp8", swizzle="none")
    with pytest.raises(ValueError, match="swizzle='32_4_4'"):
        m(torch.randn(3, K, dtype=torch.bfloat16))


def test_construction_errors():
    with pytest.raises(ValueError, match="backend must be one of"):
        mx.MXLinear.from_linear(_linear(), "mxfp8", backend="cublas")
    m = mx.MXLinear.from_linear(_linear(), "mxfp8")
    with pytest.raises(ValueError, match="backend must be one of"):
        m.backend = "cublas"
    with pytest.raises(ValueError, match="activations must be one of"):
        mx.MXLinear.from_linear(_linear(), "mxfp8", activations="static")
    with pytest.raises(ValueError, match="fmt must be one of"):
        mx.MXLinear.from_linear(_linear(), "nvfp4")
    with pytest.raises(TypeError, match="bfloat16 or float16"):
        mx.MXLinear.from_linear(_linear(torch.float32), "mxfp8")
    with pytest.raises(ValueError, match="K = 48.*multiple of 32"):
        mx.MXLinear.from_linear(_linear(k=48), "mxfp8")
    with pytest.raises(ValueError, match="last dim 96"):
        m(torch.randn(2, 64, dtype=torch.bfloat16))


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(64, 96)
        self.down = nn.Linear(96, 64)
        self.odd = nn.Linear(48, 64)  # K % 32 != 0

    def forward(self, h):
        return h + self.down(F.gelu(self.up(h))) + self.odd(h[..., :48])


class _Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([_Block(), _Block()])
        self.shared = self.layers[0].up  # one layer reachable under two names
        self.lm_head = nn.Linear(64, 40)

    def forward(self, h):
        for layer in self.layers:
            h = layer(h)
        return self.lm_head(h)


def test_swap_linears(caplog):
    torch.manual_seed(3)
    model = _Tiny().to(torch.bfloat16)
    x = torch.randn(2, 3, 64, dtype=torch.bfloat16)
    dense = model(x).double()
    with caplog.at_level(logging.INFO, logger="tilefly.mx"):
        names = mx.swap_linears(model, "mxfp8", backend="dequant")
    assert names == ["layers.0.up", "layers.0.down", "layers.1.up", "layers.1.down", "shared"]
    assert isinstance(model.layers[1].down, mx.MXLinear) and model.layers[1].down.backend == "dequant"
    assert model.shared is model.layers[0].up  # quantized once, still shared
    assert type(model.lm_head) is nn.Linear and type(model.layers[0].odd) is nn.Linear
    assert "layers.0.odd" in caplog.text and "in_features (K) = 48 is not a multiple of 32" in caplog.text
    got = model(x).double()
    assert not torch.equal(got, dense)
    assert (got - dense).abs().max() <= 0.1 * dense.abs().max()
    # a second call finds nothing left; skip takes full names too
    assert mx.swap_linears(model, "mxfp8") == []
    other = _Tiny().to(torch.bfloat16)
    assert mx.swap_linears(other, "mxfp4", skip=("lm_head", "layers.1.down")) == \
        ["layers.0.up", "layers.0.down", "layers.1.up", "shared"]
    assert isinstance(other.layers[0].up, mx.MXLinear) and other.layers[0].up.fmt == "mxfp4"


@pytest.mark.parametrize("fmt", mx.FORMATS)
def test_dequant_backend_compiles_without_graph_breaks(fmt):
    torch._dynamo.reset()
    m = mx.MXLinear.from_linear(_linear(), fmt, backend="dequant")
    x = torch.randn(2, 3, K, dtype=torch.bfloat16)
    compiled = torch.compile(m, fullgraph=True)
    torch.testing.assert_close(compiled(x), m(x), rtol=0, atol=0)

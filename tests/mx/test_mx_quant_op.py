"""tilefly::mx_quantize_rows and the SharedQuantization pass on CPU: the op's results and fake
shapes, one call per activation in Inductor's output once tilefly.enable() installed the pass, and
the pass slot given back by tilefly.disable() (chaining with a displaced pass: tests/test_graph_pass.py)."""
import pytest
import torch
from torch._inductor import config as inductor_config
from torch._inductor.utils import run_and_get_code

import tilefly
from tilefly import mx
from tilefly.mx import formats
from tilefly.mx.quant import quantize_rows_ops
from tilefly.mx.quant_op import mx_quantize_rows
from tilefly.mx.shared_quant_pass import SharedQuantization

OP = "torch.ops.tilefly.mx_quantize_rows.default("


def _activation(rows=6, k=128, seed=None):
    gen = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % 2**31)
    x = torch.randn(rows, k, generator=gen, dtype=torch.float32) * 4
    x[0, 3] = float("nan")   # a NaN block: scale byte 255
    return x.to(torch.bfloat16)


@pytest.mark.parametrize("fmt", mx.FORMATS)
def test_op_returns_quantize_rows_bits(fmt):
    x = _activation()
    data, scale_bits = mx_quantize_rows(x, fmt)
    ref_data, ref_scales = quantize_rows_ops(x, formats.ELEMENTS[fmt])
    assert data.dtype == scale_bits.dtype == torch.uint8
    assert torch.equal(data, ref_data.view(torch.uint8)) and torch.equal(scale_bits, ref_scales)
    assert scale_bits[0, 0] == 255


@pytest.mark.parametrize("fmt", mx.FORMATS)
def test_fake_shapes_match_the_op(fmt):
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = _activation(rows=5, k=96)
    real = mx_quantize_rows(x, fmt)
    with FakeTensorMode() as mode:
        fake = mx_quantize_rows(mode.from_tensor(x), fmt)
    assert [(t.shape, t.dtype) for t in fake] == [(t.shape, t.dtype) for t in real]


def _three_projections(x, w):
    """q / k / v-like: three quantizations of one activation, each flattening it with a view of its
    own (as MXLinear does). ``x * w`` with w a power of two: exact, so eager and compiled agree bit
    for bit."""
    h = x * w
    outs = [mx_quantize_rows(h.reshape(-1, h.shape[-1]), "mxfp8") for _ in range(3)]
    return outs[0][0].float().sum(-1) + outs[1][1].float().sum(-1) + outs[2][0].float().amax(-1)


def test_enable_installs_the_pass_and_one_call_remains():
    x, w = _activation(seed=None).reshape(6, 1, 128), torch.full((128,), 0.5, dtype=torch.bfloat16)
    expected = _three_projections(x, w)
    torch._dynamo.reset()
    _, (code,) = run_and_get_code(torch.compile(_three_projections), x, w)
    assert code.count(OP) == 3                  # Inductor alone keeps every call
    tilefly.enable("mx_gemm")
    assert isinstance(inductor_config.post_grad_custom_pre_pass, SharedQuantization)
    torch._dynamo.reset()
    out, (code,) = run_and_get_code(torch.compile(_three_projections), x, w)
    assert code.count(OP) == 1
    torch.testing.assert_close(out, expected, rtol=0, atol=0, equal_nan=True)
    tilefly.disable("mx_gemm")
    assert inductor_config.post_grad_custom_pre_pass is None
    torch._dynamo.reset()


def test_pass_keeps_calls_on_other_inputs_shapes_or_formats():
    def distinct(x, y):
        calls = (mx_quantize_rows(x, "mxfp8"), mx_quantize_rows(y, "mxfp8"), mx_quantize_rows(x, "mxfp4"),
                 mx_quantize_rows(x.reshape(-1, 64), "mxfp8"), mx_quantize_rows(x.reshape(-1, 64), "mxfp8"))
        return sum(c[0].float().sum() for c in calls)

    gm = torch.fx.experimental.proxy_tensor.make_fx(distinct)(_activation(k=128), _activation(k=128))
    SharedQuantization()(gm.graph)
    assert sum(n.target is torch.ops.tilefly.mx_quantize_rows.default for n in gm.graph.nodes) == 4


class _Unhashable:
    __hash__ = None   # as a symbolic size object (torch.SymInt) would be


def test_pass_leaves_calls_with_unhashable_arguments_alone():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    target = torch.ops.tilefly.mx_quantize_rows.default
    odd = _Unhashable()
    calls = [graph.call_function(target, (x, "mxfp8", odd)) for _ in range(2)]
    graph.output(tuple(calls))
    SharedQuantization()(graph)
    assert sum(n.target is target for n in graph.nodes) == 2


def test_mxlinear_on_cpu_compiles_the_pytorch_ops():
    """The op is for CUDA tensors (kernels_quant's kernel); on CPU Inductor fuses the ops itself."""
    torch.manual_seed(0)
    m = mx.MXLinear(torch.randn(32, 64, dtype=torch.bfloat16), fmt="mxfp8", backend="dequant")
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    torch._dynamo.reset()
    out, (code,) = run_and_get_code(torch.compile(m), x)
    assert OP not in code
    torch.testing.assert_close(out, m(x), rtol=0, atol=0)
    torch._dynamo.reset()


def test_importing_tilefly_mx_leaves_inductor_unimported():
    import subprocess
    import sys

    code = "import sys, tilefly.mx; assert 'torch._inductor.config' not in sys.modules, 'Inductor imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)

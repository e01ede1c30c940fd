"""tilefly::add_rms_norm_mx_quantize and the fusion step of the post-grad pass (tilefly.mx.norm_fusion), on CPU.

The kernel's bits are checked in Triton's interpreter (tilefly.ops.mx_gemm.checks, run by
tests/ops/mx_gemm/test_mx_requant.py) and on the GPU (test_mx_cuda.py); here: the op's PyTorch path
against transformers' RMSNorm, and which graphs the pass rewrites."""
import functools

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from tilefly import config, mx
from tilefly.mx import formats, norm_quant
from tilefly.mx.quant import quantize_rows_ops
from tilefly.mx.shared_quant_pass import SharedQuantization

FUSED = "torch.ops.tilefly.add_rms_norm_mx_quantize.default("
EXPANDED = "torch.ops.tilefly.add_rms_norm_mx_quantize_expanded.default("
QUANT = "torch.ops.tilefly.mx_quantize_rows.default("
K = 128


def _same(got, want):
    """Bit for bit, a NaN matching any NaN (its sign and payload are the cast's choice)."""
    if got.is_floating_point():
        return got.shape == want.shape and bool(((got == want) | (got.isnan() & want.isnan())).all())
    return torch.equal(got, want)


def _rms_norm(k=K, eps=1e-5, seed=0):
    norm = LlamaRMSNorm(k, eps=eps).to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(k, generator=torch.Generator().manual_seed(seed)))
    return norm


def _operands(rows=4, k=K, dtype=torch.bfloat16):
    a, b = torch.randn(rows, 1, k) * 3, torch.randn(rows, 1, k)
    a[0, 0, 5] = float("nan")
    return a.to(dtype), b.to(dtype)


@pytest.mark.parametrize("fmt", mx.FORMATS)
def test_the_ops_path_is_transformers_rms_norm_then_quantize_rows(fmt):
    norm = _rms_norm(eps=1e-6)
    a, b = _operands()
    h, data, scales = torch.ops.tilefly.add_rms_norm_mx_quantize(a, b, norm.weight.detach(), 1e-6, fmt)
    want_data, want_scales = quantize_rows_ops(norm(a + b).reshape(-1, K), formats.ELEMENTS[fmt])
    assert _same(h, a + b)
    assert data.dtype == scales.dtype == torch.uint8
    assert torch.equal(data, want_data.view(torch.uint8)) and torch.equal(scales, want_scales)
    assert scales[0, 0] == 255      # the NaN's block


@pytest.mark.parametrize("fmt", mx.FORMATS)
def test_fake_outputs_match_the_op(fmt):
    from torch._subclasses.fake_tensor import FakeTensorMode

    a, b = _operands(rows=3)
    w = torch.ones(K, dtype=torch.bfloat16)
    real = torch.ops.tilefly.add_rms_norm_mx_quantize(a, b, w, 1e-5, fmt)
    with FakeTensorMode() as mode:
        fake = torch.ops.tilefly.add_rms_norm_mx_quantize(mode.from_tensor(a), mode.from_tensor(b),
                                                          mode.from_tensor(w), 1e-5, fmt)
    assert [(t.shape, t.dtype) for t in fake] == [(t.shape, t.dtype) for t in real]


def test_kernel_reason_names_what_the_kernel_does_not_take():
    a, b = _operands()
    w = torch.ones(K, dtype=torch.bfloat16)
    assert "cpu tensors" in norm_quant.kernel_reason(a, b, w)
    assert "float32 rows" in norm_quant.shape_reason((4, K), torch.float32)
    assert "row length 100" in norm_quant.shape_reason((4, 100), torch.bfloat16)
    assert "row length 32768" in norm_quant.shape_reason((4, 32768), torch.bfloat16)
    assert norm_quant.shape_reason((4, K), torch.bfloat16) is None


def _layer(norm, fmt="mxfp4", extra_user=False, residual=True):
    """A decoder layer's add + RMSNorm feeding an MX projection's quantization (as MXLinear traces)."""
    def f(a, b):
        h = a + b if residual else a
        x = norm(h)
        data, scales = torch.ops.tilefly.mx_quantize_rows(x.reshape(-1, x.shape[-1]), fmt)
        out = (h * 2, data, scales)
        return out + (x.float().sum(),) if extra_user else out
    return f


@pytest.mark.parametrize("fmt", mx.FORMATS)
def test_the_pass_fuses_add_norm_and_quantization_and_keeps_every_result(compile_fused, fmt):
    norm = _rms_norm()
    a, b = _operands()
    f = _layer(norm, fmt)
    out, code = compile_fused(f, a, b)
    assert code.count(FUSED) == 1 and QUANT not in code
    for got, want in zip(out, f(a, b)):
        assert _same(got, want)


def test_the_option_off_leaves_the_graph_alone(compile_fused):
    out, code = compile_fused(_layer(_rms_norm()), *_operands(), fused=False)
    assert FUSED not in code and code.count(QUANT) == 1


def _weight_after_the_add(a, b, w):
    """The RMSNorm's weight computed from h: the fused op, which goes where h is, could not read it."""
    h = a + b
    hf = h.float()
    x = (w * h[0, 0, 0]) * (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(h.dtype)
    data, scales = torch.ops.tilefly.mx_quantize_rows(x.reshape(-1, x.shape[-1]), "mxfp8")
    return h, data, scales


@pytest.mark.parametrize("case", ["normalised value used elsewhere", "no residual add", "float32 rows",
                                  "weight computed from the sum"])
def test_the_pass_leaves_what_it_does_not_match(compile_fused, case):
    norm = _rms_norm()
    a, b = _operands()
    if case == "float32 rows":
        norm, a, b = norm.float(), a.float(), b.float()
    f = _layer(norm, extra_user=case == "normalised value used elsewhere", residual=case != "no residual add")
    if case == "weight computed from the sum":
        f = functools.partial(_weight_after_the_add, w=norm.weight.detach())
    _, code = compile_fused(f, a, b)
    assert FUSED not in code and code.count(QUANT) == 1


def test_the_option_enters_the_pass_key(monkeypatch):
    monkeypatch.setattr(config, "mx_fused_quant", False)
    off = SharedQuantization().uuid()
    monkeypatch.setattr(config, "mx_fused_quant", True)
    on = SharedQuantization().uuid()
    assert isinstance(on, bytes) and on != off


@pytest.mark.parametrize("name", ["tiny", "tiny-qwen3"])
def test_every_norm_after_a_residual_add_and_every_mlp_product_fuse_in_a_transformers_model(
        monkeypatch, compile_fused, reference, name):
    """Both patterns as transformers' Llama and Qwen3 decoder layers trace them (MXFP4 layers, the CUDA
    path's opaque quantization forced on CPU): every norm but the first layer's input norm, whose input
    is the embedding (no residual add), and every MLP's SiLU product (tilefly.mx.silu_fusion)."""
    from tilefly.bench.e2e import models, picks
    from tilefly.mx import linear

    monkeypatch.setattr(linear, "_quantize_as_op", lambda rows: torch.compiler.is_compiling())
    monkeypatch.setattr(torch._inductor.config, "fx_graph_cache", False)   # the pass must run
    model = models.build_model(name)
    models.apply_precision(model, "mxfp4", backend="scaled_mm", swizzle="none")
    ids = torch.randint(0, model.config.vocab_size, (24, 1))     # 24 tokens: the GEMMs read expanded copies

    def step(ids):
        return model(input_ids=ids).logits

    expected = step(ids)
    out, code = compile_fused(step, ids)
    layers = model.config.num_hidden_layers
    found = picks.picks([code])
    assert (found["mx_fused_norm_calls"], found["mx_fused_silu_calls"]) == (2 * layers - 1, layers)
    # MXFP4: the GEMMs read the fused kernels' expanded copies (tilefly.mx.expanded): q/k/v, gate/up and down
    assert found["mx_expanded_calls"] == 3 * layers - 1 and code.count(EXPANDED) == 2 * layers - 1
    assert code.count("a_expanded_scales=buf") == 3 * layers - 1
    assert code.count(QUANT) == 1 + layers        # that norm's, and the o projections' inputs
    torch.testing.assert_close(out, expected, rtol=0, atol=0.1 * expected.abs().max().item())


def test_only_dead_side_effect_free_nodes_are_dropped_before_matching():
    from tilefly.mx.fusion_graph import drop_dead_pure_nodes

    aten = torch.ops.aten
    graph = torch.fx.Graph()
    x, y = graph.placeholder("x"), graph.placeholder("y")
    view = graph.call_function(aten.view.default, (x, [-1]))                       # dead, pure: dropped
    graph.call_function(aten.mul.Tensor, (view, 2.0))                              # dead, pure: dropped
    graph.call_function(aten.copy_.default, (y, x))                                # mutates y: kept
    graph.call_function(aten._assert_async.msg, (x, "x must hold"))                # a side effect: kept
    graph.output(graph.call_function(aten.add.Tensor, (x, y)))
    drop_dead_pure_nodes(graph)
    assert [n.target for n in graph.nodes if n.op == "call_function"] == [
        aten.copy_.default, aten._assert_async.msg, aten.add.Tensor]

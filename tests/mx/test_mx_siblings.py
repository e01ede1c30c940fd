"""Sibling MX layers as one GEMM (tilefly.mx.siblings and the post-grad pass's second step), on CPU.

ATen has no MX GEMM on CPU, so F.scaled_mm is replaced here by a float64 reference on the dequantized
operands that also counts its calls (conftest.py's ``reference``): one call for a packed set, one per
weight otherwise.
"""
import operator

import pytest
import torch
from torch import nn
from torch._inductor.utils import run_and_get_code

import tilefly
from tilefly.mx import formats, linear, siblings
from tilefly.mx.shared_quant_pass import pack_sibling_gemms

PACKED_CALL = "torch.ops.tilefly.mx_linear_mm_packed.default("


class _Attention(nn.Module):
    """q, k, v of one input (and o of another), as a decoder layer's attention has them."""

    def __init__(self, hidden=256, kv=128, bias=False):
        super().__init__()
        self.q = nn.Linear(hidden, hidden, bias=False)
        self.k = nn.Linear(hidden, kv, bias=bias)
        self.v = nn.Linear(hidden, kv, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x):
        return self.o(self.q(x) * 0.5 + torch.cat([self.k(x), self.v(x)], dim=-1))


def _model(fmt="mxfp8", swizzle="none", pack=True, **kw):
    torch.manual_seed(0)
    model = _Attention(**kw).to(torch.bfloat16)
    linear.swap_linears(model, fmt, swizzle=swizzle, pack_siblings=pack)
    return model


def _layers(model):
    return [model.q, model.k, model.v, model.o]


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4"])
@pytest.mark.parametrize("swizzle", ["none", "32_4_4"])
def test_swap_linears_packs_siblings_back_to_back(fmt, swizzle):
    model, separate = _model(fmt, swizzle), _model(fmt, swizzle, pack=False)
    layers = _layers(model)
    for packed, alone in zip(layers, _layers(separate)):     # packing moves bytes, never changes them
        assert torch.equal(packed.weight_bits, alone.weight_bits)
        assert torch.equal(packed.weight_scale_bits, alone.weight_scale_bits)
    data, scales = siblings.packed_operands([m.weight_bits for m in layers], [m.weight_scale_bits for m in layers],
                                            swizzle)
    assert data.shape == (256 + 128 + 128 + 256, layers[0].weight_bits.shape[1])
    assert torch.equal(data, torch.cat([m.weight_bits for m in layers]))
    assert siblings.packed_operands([m.weight_bits for m in _layers(separate)],
                                    [m.weight_scale_bits for m in _layers(separate)], swizzle) is None


def test_packing_in_the_blocked_layout_stops_after_rows_not_a_multiple_of_128():
    # k and v have 96 rows: nothing can follow either of them in one grid of 128-row scale blocks
    model = _model(swizzle="32_4_4", kv=96, pack=False)
    assert siblings.pack_sibling_weights(model) == 1                                  # q, k
    bits = [m.weight_bits for m in _layers(model)]
    scales = [m.weight_scale_bits for m in _layers(model)]
    assert siblings.packed_operands(bits[:2], scales[:2], "32_4_4") is not None      # q, k
    assert siblings.packed_operands(bits[1:3], scales[1:3], "32_4_4") is None        # k, v
    assert siblings.packed_operands(bits[2:], scales[2:], "32_4_4") is None          # v, o


def test_packed_operands_refuses_mismatched_or_moved_weights():
    model = _model()
    bits = [m.weight_bits for m in _layers(model)]
    scales = [m.weight_scale_bits for m in _layers(model)]
    assert siblings.packed_operands(bits[:1], scales[:1], "none") is None               # nothing to pack
    assert siblings.packed_operands([bits[0], bits[2]], [scales[0], scales[2]], "none") is None   # a gap
    assert siblings.packed_operands(bits[:2], [scales[0], scales[0].clone()], "none") is None
    model.to(torch.float16)               # uint8 buffers stay where they are: still packed
    assert siblings.packed_operands([m.weight_bits for m in _layers(model)],
                                    [m.weight_scale_bits for m in _layers(model)], "none") is not None
    assert siblings.pack_sibling_weights(_model(pack=False)) == 1


@pytest.mark.parametrize("pack", [True, False])
def test_packed_op_matches_separate_calls(reference, pack):
    model = _model(pack=pack)
    x = torch.randn(5, 256, dtype=torch.bfloat16)
    a, sa = linear.quantize_rows(x, formats.ELEMENTS["mxfp8"])
    layers = [model.q, model.k, model.v]
    out = siblings.mx_linear_mm_packed(a.view(torch.uint8), [m.weight_bits for m in layers], sa,
                                       [m.weight_scale_bits for m in layers], "mxfp8", "none", torch.bfloat16)
    assert reference.calls == (1 if pack else 3)
    expected = torch.cat([m(x) for m in layers], dim=1)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_packed_op_in_another_call_order_still_runs_one_gemm(reference):
    model = _model()
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    a, sa = linear.quantize_rows(x, formats.ELEMENTS["mxfp8"])
    layers = [model.v, model.q, model.k]           # back to back as q, k, v: one run in address order
    out = siblings.mx_linear_mm_packed(a.view(torch.uint8), [m.weight_bits for m in layers], sa,
                                       [m.weight_scale_bits for m in layers], "mxfp8", "none", torch.bfloat16)
    assert reference.calls == 1
    torch.testing.assert_close(out, torch.cat([m(x) for m in layers], dim=1), rtol=0, atol=0)
    reference.calls = 0
    layers = [model.q, model.v]                    # a gap (k) between them: two runs
    siblings.mx_linear_mm_packed(a.view(torch.uint8), [m.weight_bits for m in layers], sa,
                                 [m.weight_scale_bits for m in layers], "mxfp8", "none", torch.bfloat16)
    assert reference.calls == 2


def test_value_numbers_tell_constants_of_other_types_apart():
    from tilefly.mx.shared_quant_pass import _value_numbers

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    muls = [graph.call_function(torch.ops.aten.mul.Tensor, (x, c)) for c in (2, 2.0, 2.0, 0.0, -0.0, True, 1)]
    graph.output(tuple(muls))
    n = _value_numbers(graph)
    numbers = [n[m] for m in muls]
    assert numbers[1] == numbers[2]                        # the same call twice: one value
    assert len(set(numbers)) == len(numbers) - 1           # every other constant its own


def _sibling_graph(weights: int, bias_on=None, late_weight=False):
    """An FX graph as the compiled model has it: one quantization, each projection its own getitem and
    dtype view of it, one mx_linear_mm per weight (row counts in the placeholders' values)."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    ws, ss = [], []
    for i in range(weights):
        w, s = graph.placeholder(f"w{i}"), graph.placeholder(f"s{i}")
        w.meta["val"], s.meta["val"] = torch.empty(64 * (i + 1), 256, dtype=torch.uint8), torch.empty(1)
        ws.append(w)
        ss.append(s)
    bias = graph.placeholder("bias")
    quant = graph.call_function(torch.ops.tilefly.mx_quantize_rows.default, (x, "mxfp8"))
    outs = []
    for i in range(weights):
        a = graph.call_function(torch.ops.aten.view.dtype, (graph.call_function(operator.getitem, (quant, 0)),
                                                              torch.uint8))
        sa = graph.call_function(operator.getitem, (quant, 1))
        w = ws[i]
        if late_weight and i == weights - 1:
            w = graph.call_function(torch.ops.aten.clone.default, (ws[i],))
            w.meta["val"] = ws[i].meta["val"]
        outs.append(graph.call_function(torch.ops.tilefly.mx_linear_mm.default,
                                        (a, w, sa, ss[i], "mxfp8", "none", bias if i == bias_on else None,
                                         torch.bfloat16)))
    graph.output(tuple(outs))
    return graph


def _count(graph, target):
    return sum(n.op == "call_function" and n.target is target for n in graph.nodes)


def test_pass_packs_siblings_and_slices_their_columns():
    graph = _sibling_graph(3)
    assert pack_sibling_gemms(graph) == 1
    graph.lint()
    assert _count(graph, torch.ops.tilefly.mx_linear_mm.default) == 0
    assert _count(graph, torch.ops.tilefly.mx_linear_mm_packed.default) == 1
    cuts = [n.args[2:] for n in graph.nodes if n.target is torch.ops.aten.slice.Tensor]
    assert cuts == [(0, 64), (64, 192), (192, 384)]


def test_pass_leaves_a_call_with_bias_or_a_weight_computed_later():
    graph = _sibling_graph(3, bias_on=1)
    assert pack_sibling_gemms(graph) == 1                         # the other two
    assert _count(graph, torch.ops.tilefly.mx_linear_mm.default) == 1
    graph = _sibling_graph(2, late_weight=True)                  # the second weight exists only after the first call
    assert pack_sibling_gemms(graph) == 0
    assert pack_sibling_gemms(_sibling_graph(1)) == 0


def _compiled(model, x, reference, enable=True):
    if enable:
        tilefly.enable("mx_gemm")
    try:
        torch._dynamo.reset()
        reference.calls = 0
        out, (code,) = run_and_get_code(torch.compile(model), x)
    finally:
        tilefly.disable()
        torch._dynamo.reset()
    return out, code.count(PACKED_CALL), reference.calls


def test_compiled_siblings_run_as_one_gemm(reference, monkeypatch):
    monkeypatch.setattr(torch._inductor.config, "fx_graph_cache", False)   # the pass must run
    x = torch.randn(2, 3, 256, dtype=torch.bfloat16)
    out, packed_calls, gemms = _compiled(_model(), x, reference)
    assert packed_calls == 1 and gemms == 2                     # q, k, v in one; o alone
    # weights not back to back: the same graph, one GEMM per weight, the same bits
    alone, packed_calls, gemms = _compiled(_model(pack=False), x, reference)
    assert packed_calls == 1 and gemms == 4
    torch.testing.assert_close(out, alone, rtol=0, atol=0)
    # without tilefly's pass: every projection its own call, the same bits
    plain, packed_calls, gemms = _compiled(_model(), x, reference, enable=False)
    assert packed_calls == 0 and gemms == 4
    torch.testing.assert_close(out, plain, rtol=0, atol=0)

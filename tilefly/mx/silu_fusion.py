"""The post-grad pass's fourth step: an MLP's ``silu(gate) * up`` and the MX quantization of it become one
``tilefly::silu_mul_mx_quantize`` call (``tilefly.mx.silu_quant`` says why). It runs when
``config.mx_fused_quant`` is on, and matches SiLU as transformers' Llama / Qwen3 MLP traces it, in
post-grad ATen ops, ending in the quantization of the down projection's input:

    g  = convert_element_type(gate, float32)               used by the next two only
    s  = div(g, add(exp(neg(g)), 1))
    x  = mul(convert_element_type(s, bfloat16), up)        gate and up BF16 of one shape (either order)
    q  = mx_quantize_rows(reshape(x, [-1, N]), fmt)        (or view / _unsafe_view, or x itself)

Every node between gate and q must have no other user. The op goes where q was. Anything else is
left as it was.
"""
from __future__ import annotations

import logging

import torch

from tilefly.mx import formats, silu_quant
from tilefly.mx.fusion_graph import drop_dead_pure_nodes, expanded_readers, fake_value, hand_expanded, is_call, \
    only_user, quantized_product, replace_quantization

_log = logging.getLogger("tilefly.mx")
aten, prims = torch.ops.aten, torch.ops.prims


def _match(quant: torch.fx.Node):
    """(gate, up, fmt, the nodes from x to g) of a match (module docstring), or None."""
    if (product := quantized_product(quant)) is None:
        return None
    fmt, x2d, x, cs, up = product          # cs: silu(gate) cast back to BF16
    div = cs.args[0]
    if not (is_call(div, aten.div.Tensor, 2) and only_user(div, cs)):
        return None
    g, add_one = div.args
    if not (is_call(add_one, aten.add.Tensor, 2) and add_one.args[1] == 1 and only_user(add_one, div)):
        return None
    exp = add_one.args[0]
    if not (is_call(exp, aten.exp.default, 1) and only_user(exp, add_one)):
        return None
    neg = exp.args[0]
    if not (is_call(neg, aten.neg.default, 1) and only_user(neg, exp) and neg.args[0] is g):
        return None
    if not (is_call(g, prims.convert_element_type.default, 2) and g.args[1] == torch.float32
            and set(g.users) == {div, neg}):
        return None
    gate = g.args[0]
    gv, uv, xv = fake_value(gate), fake_value(up), fake_value(x2d)
    if (gv is None or uv is None or xv is None or silu_quant.shape_reason(gv.shape, gv.dtype) is not None
            or uv.shape != gv.shape or uv.dtype != gv.dtype
            or tuple(xv.shape) != (gv.numel() // gv.shape[-1], gv.shape[-1])):
        return None
    chain = ([x2d] if x2d is not x else []) + [x, cs, div, add_one, exp, neg, g]
    return gate, up, fmt, chain


def fuse_silu_quantization(graph: torch.fx.Graph) -> int:
    """Replace every match (module docstring) by one op call; returns how many. MXFP4 quantizations that MX
    GEMMs read become the op's expanded build under ``config.mx_expanded_activation`` (as in norm_fusion)."""
    drop_dead_pure_nodes(graph)
    done = 0
    for quant in list(graph.nodes):
        if (found := _match(quant)) is None:
            continue
        gate, up, fmt, chain = found
        readers = expanded_readers(quant, fmt)
        with graph.inserting_before(quant):
            if readers:
                fused = graph.call_function(torch.ops.tilefly.silu_mul_mx_quantize_expanded.default, (gate, up))
            else:
                fused = graph.call_function(torch.ops.tilefly.silu_mul_mx_quantize.default, (gate, up, fmt))
        fused.meta["val"] = silu_quant.fake_outputs(fake_value(gate), formats.ELEMENTS[fmt], expand=bool(readers))
        parts = replace_quantization(graph, quant, fused, 0, chain)
        if readers:
            hand_expanded(readers, parts[2], parts[3])
        done += 1
    _log.debug("tilefly.mx: %d SiLU product + quantization sites fused into one op each", done)
    return done

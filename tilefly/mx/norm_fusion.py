"""The post-grad pass's third step: a residual add, the RMSNorm after it and the MX quantization of its
output become one ``tilefly::add_rms_norm_mx_quantize`` call (``tilefly.mx.norm_quant`` says why).

It runs when ``config.mx_fused_quant`` is on. It matches what a transformers RMSNorm (Llama's,
Qwen3's) traces to after a residual add, in post-grad ATen ops, ending in the quantization of an
MX layer's input:

    h  = add(a, b)                           BF16, a and b of h's shape, contiguous
    c0 = convert_element_type(h, float32)    used by the next two only
    v  = mean(pow(c0, 2), [-1], keepdim=True)
    m  = mul(c0, rsqrt(add(v, eps)))
    x  = mul(weight, convert_element_type(m, bfloat16))    weight: 1-D, K elements (either order)
    q  = mx_quantize_rows(reshape(x, [-1, K]), fmt)        (or view / _unsafe_view, or x itself)

Every node between h and q must have no other user (the normalised activation feeds only the
quantization; the shared-quantization step ahead of this one made it a single call). h keeps its
other users, which read the op's first output. Anything else is left as it was.

MXFP4 quantizations read by MX GEMMs take the op's expanded build,
``tilefly::add_rms_norm_mx_quantize_expanded``, under ``config.mx_expanded_activation``: the GEMM calls
get its expanded copy too (tilefly.mx.expanded says why).
"""
from __future__ import annotations

import logging

import torch

from tilefly.mx import formats, norm_quant
from tilefly.mx.fusion_graph import drop_dead_pure_nodes, expanded_readers, fake_value, hand_expanded, is_call, \
    only_user, quantized_product, replace_quantization

_log = logging.getLogger("tilefly.mx")
aten, prims = torch.ops.aten, torch.ops.prims


def _match(quant: torch.fx.Node):
    """The matched nodes (see the module docstring) as a dict, or None."""
    if (product := quantized_product(quant)) is None:
        return None
    fmt, x2d, x, c1, weight = product      # c1: the normalised activation cast back to BF16
    m = c1.args[0]
    if not (is_call(m, aten.mul.Tensor, 2) and only_user(m, c1)):
        return None
    c0, r = m.args if is_call(m.args[1], aten.rsqrt.default, 1) else m.args[::-1]
    if not (is_call(r, aten.rsqrt.default, 1) and only_user(r, m)):
        return None
    add_eps = r.args[0]
    if not (is_call(add_eps, aten.add.Tensor, 2) and isinstance(add_eps.args[1], float) and only_user(add_eps, r)):
        return None
    mean, eps = add_eps.args
    if not (is_call(mean, aten.mean.dim, 3) and mean.args[2] is True and only_user(mean, add_eps)):
        return None
    power = mean.args[0]
    if not (is_call(power, aten.pow.Tensor_Scalar, 2) and power.args[1] == 2 and only_user(power, mean)
            and power.args[0] is c0):
        return None
    if not (is_call(c0, prims.convert_element_type.default, 2) and c0.args[1] == torch.float32
            and set(c0.users) == {power, m}):
        return None
    h = c0.args[0]
    if not is_call(h, aten.add.Tensor, 2):
        return None
    a, b = h.args
    vals = [fake_value(n) for n in (h, a, b, weight, x2d)]
    if any(v is None for v in vals):
        return None
    hv, av, bv, wv, xv = vals
    k = hv.shape[-1]
    dims = [d % hv.dim() for d in mean.args[1]] if isinstance(mean.args[1], (list, tuple)) else None
    if (norm_quant.shape_reason(hv.shape, hv.dtype) is not None or dims != [hv.dim() - 1]
            or any(v.shape != hv.shape or v.dtype != hv.dtype or not v.is_contiguous() for v in (av, bv))
            or wv.dtype != hv.dtype or tuple(wv.shape) != (k,) or not wv.is_contiguous()
            or tuple(xv.shape) != (hv.numel() // k, k)):
        return None
    return dict(h=h, a=a, b=b, weight=weight, eps=eps, fmt=fmt,
                chain=[x2d, x, c1, m, r, add_eps, mean, power, c0] if x2d is not x else [x, c1, m, r, add_eps,
                                                                                           mean, power, c0])


def fuse_norm_quantization(graph: torch.fx.Graph) -> int:
    """Replace every match (module docstring) by one op call; returns how many. MXFP4 quantizations that MX
    GEMMs read become the op's expanded build when ``config.mx_expanded_activation`` is on: the GEMM calls get
    its expanded copy as ``a_expanded`` and ``a_expanded_scales`` (tilefly.mx.expanded)."""
    drop_dead_pure_nodes(graph)
    order = {node: i for i, node in enumerate(graph.nodes)}   # new nodes come after h: old ones keep their order
    done = 0
    for quant in list(graph.nodes):
        found = _match(quant)
        # the op goes where h was, so the weight must exist by then (a and b do: they are h's operands)
        if found is None or order[found["weight"]] > order[found["h"]]:
            continue
        h, fmt = found["h"], found["fmt"]
        readers = expanded_readers(quant, fmt)
        with graph.inserting_after(h):
            if readers:
                fused = graph.call_function(torch.ops.tilefly.add_rms_norm_mx_quantize_expanded.default,
                                            (found["a"], found["b"], found["weight"], found["eps"]))
            else:
                fused = graph.call_function(torch.ops.tilefly.add_rms_norm_mx_quantize.default,
                                            (found["a"], found["b"], found["weight"], found["eps"], fmt))
        fused.meta["val"] = norm_quant.fake_outputs(fake_value(h), formats.ELEMENTS[fmt], expand=bool(readers))
        parts = replace_quantization(graph, quant, fused, 1, found["chain"])
        if readers:
            hand_expanded(readers, parts[3], parts[4])
        h.replace_all_uses_with(parts[0])
        graph.erase_node(h)
        done += 1
    _log.debug("tilefly.mx: %d residual add + RMSNorm + quantization sites fused into one op each", done)
    return done

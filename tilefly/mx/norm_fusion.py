"""The post-grad pass's third step: a residual add, the RMSNorm after it and the MX quantization of its
output become one ``tilefly::add_rms_norm_mx_quantize`` call (``tilefly.mx.norm_quant`` says why).

It runs when ``config.mx_fused_norm_quant`` is on. It matches what a transformers RMSNorm (Llama's,
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
"""
from __future__ import annotations

import logging
import operator

import torch

from tilefly.mx import formats, norm_quant

_log = logging.getLogger("tilefly.mx")

aten, prims = torch.ops.aten, torch.ops.prims
_RESHAPES = (aten.reshape.default, aten.view.default, aten._unsafe_view.default)


def _call(node, target, nargs: int | None = None) -> bool:
    return (isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is target
            and not node.kwargs and (nargs is None or len(node.args) == nargs))


def _only_user(node, user) -> bool:
    return list(node.users) == [user]


def _val(node):
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _match(quant: torch.fx.Node):
    """The matched nodes (see the module docstring) as a dict, or None."""
    x2d, fmt = quant.args[0], quant.args[1] if len(quant.args) > 1 else None
    if fmt not in formats.ELEMENTS:
        return None
    x = x2d
    if isinstance(x, torch.fx.Node) and x.op == "call_function" and x.target in _RESHAPES:
        if not _only_user(x, quant):
            return None
        x = x.args[0]
    if not _call(x, aten.mul.Tensor, 2) or not _only_user(x, x2d if x is not x2d else quant):
        return None
    # the weight is the 1-D operand; the other is the normalised activation cast back to BF16
    weight, c1 = x.args
    if _call(weight, prims.convert_element_type.default, 2):
        weight, c1 = c1, weight
    if not (_call(c1, prims.convert_element_type.default, 2) and c1.args[1] == torch.bfloat16
            and _only_user(c1, x)):
        return None
    m = c1.args[0]
    if not (_call(m, aten.mul.Tensor, 2) and _only_user(m, c1)):
        return None
    c0, r = m.args if _call(m.args[1], aten.rsqrt.default, 1) else m.args[::-1]
    if not (_call(r, aten.rsqrt.default, 1) and _only_user(r, m)):
        return None
    add_eps = r.args[0]
    if not (_call(add_eps, aten.add.Tensor, 2) and isinstance(add_eps.args[1], float) and _only_user(add_eps, r)):
        return None
    mean, eps = add_eps.args
    if not (_call(mean, aten.mean.dim, 3) and mean.args[2] is True and _only_user(mean, add_eps)):
        return None
    power = mean.args[0]
    if not (_call(power, aten.pow.Tensor_Scalar, 2) and power.args[1] == 2 and _only_user(power, mean)
            and power.args[0] is c0):
        return None
    if not (_call(c0, prims.convert_element_type.default, 2) and c0.args[1] == torch.float32
            and set(c0.users) == {power, m}):
        return None
    h = c0.args[0]
    if not _call(h, aten.add.Tensor, 2):
        return None
    a, b = h.args
    vals = [_val(n) for n in (h, a, b, weight, x2d)]
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


def _drop_dead_pure_nodes(graph: torch.fx.Graph) -> None:
    """Erase ATen / prims nodes without users and without side effects: the views that fed the
    quantizations the shared-quantization step removed still count as users of the normalised value."""
    for node in reversed(list(graph.nodes)):
        target = node.target
        if (node.op == "call_function" and not node.users and isinstance(target, torch._ops.OpOverload)
                and target.namespace in ("aten", "prims") and not target._schema.is_mutable
                and torch.Tag.nondeterministic_seeded not in target.tags and not node.is_impure()):
            graph.erase_node(node)


def fuse_norm_quantization(graph: torch.fx.Graph) -> int:
    """Replace every match (module docstring) by one op call; returns how many."""
    target = torch.ops.tilefly.mx_quantize_rows.default
    fused_op = torch.ops.tilefly.add_rms_norm_mx_quantize.default
    _drop_dead_pure_nodes(graph)
    order = {node: i for i, node in enumerate(graph.nodes)}   # new nodes come after h: old ones keep their order
    done = 0
    for quant in list(graph.nodes):
        if quant.op != "call_function" or quant.target is not target:
            continue
        found = _match(quant)
        # the op goes where h was, so the weight must exist by then (a and b do: they are h's operands)
        if (found is None or any(u.target is not operator.getitem for u in quant.users)
                or order[found["weight"]] > order[found["h"]]):
            continue
        h = found["h"]
        with graph.inserting_after(h):
            fused = graph.call_function(fused_op, (found["a"], found["b"], found["weight"], found["eps"], found["fmt"]))
        fused.meta["val"] = norm_quant.fake_outputs(_val(h), formats.ELEMENTS[found["fmt"]])
        with graph.inserting_after(fused):
            parts = [graph.call_function(operator.getitem, (fused, i)) for i in range(3)]
        for i, part in enumerate(parts):
            part.meta["val"] = fused.meta["val"][i]
        for user in list(quant.users):       # getitem(q, 0 or 1) -> the op's data or scale bytes
            user.replace_all_uses_with(parts[1 + user.args[1]])
            graph.erase_node(user)
        graph.erase_node(quant)
        for node in found["chain"]:
            graph.erase_node(node)
        h.replace_all_uses_with(parts[0])
        graph.erase_node(h)
        done += 1
    _log.debug("tilefly.mx: %d residual add + RMSNorm + quantization sites fused into one op each", done)
    return done

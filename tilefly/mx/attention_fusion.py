"""The post-grad pass's fifth step: a masked attention call, the views of its output and their MX quantization
become one ``tilefly::attention_mx_quantize`` call (``tilefly.mx.attention_quant`` says why). It runs when
``config.mx_fused_quant`` is on and matches, in post-grad ATen ops, an o_proj input as transformers' Llama /
Qwen3 attention traces it:

    a   = _scaled_dot_product_{cudnn,efficient}_attention(q, k, v, bias, lse, 0.0, False, [False], scale=s)
          (or, on CPU, _scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=bias, scale=s))
    o   = getitem(a, 0)                       a's other outputs unused
    x2d = view / reshape / transpose / permute / ... (o)      each node used by the next only
    q   = mx_quantize_rows(x2d, fmt)

The views must make o's memory, in order, the quantized rows (checked by replaying them on the element
offsets of o's layout), every 32-element block inside one head's row (D and o's strides multiples of
32), and q, k, v of one head dim. Anything else is left as it was.
"""
from __future__ import annotations

import logging
import operator

import torch

from tilefly.mx import attention_quant, formats
from tilefly.mx.fusion_graph import QUANTIZE, fake_value, only_user, replace_quantization

_log = logging.getLogger("tilefly.mx")
aten = torch.ops.aten
BACKEND_OF = {op: name for name, op in attention_quant.BACKENDS.items()}
# data movement only: replaying them on element offsets says where each quantized element comes from
MOVES = {aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.transpose.int, aten.permute.default,
         aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.default, aten.clone.default, aten.alias.default}


def _arguments(node: torch.fx.Node) -> dict:
    names = [a.name for a in node.target._schema.arguments]
    return {**dict(zip(names, node.args)), **node.kwargs}


def _static(shape) -> bool:
    return all(isinstance(s, int) for s in shape)


def _rows_are_the_memory(chain: list[torch.fx.Node], out, x2d) -> bool:
    """Whether the data movements ``chain`` (from the attention output's getitem to the quantized rows)
    take output ``out`` (a fake value) to rows ``x2d`` holding its memory in order: replayed on a tensor of
    element offsets laid out as ``out``."""
    if not (_static(out.shape) and _static(out.stride()) and _static(x2d.shape)) or out.numel() == 0:
        return False
    extent = 1 + sum((n - 1) * s for n, s in zip(out.shape, out.stride()))
    if extent != out.numel():           # gaps or overlaps in its memory
        return False
    value = torch.arange(extent).as_strided(out.shape, out.stride())
    for node in chain:      # each one's first argument is the one before it (_match follows that link)
        try:
            value = node.target(value, *node.args[1:], **node.kwargs)
        except Exception:  # noqa: BLE001 - an argument the replay cannot take: no fusion
            return False
    return tuple(value.shape) == tuple(x2d.shape) and torch.equal(value.reshape(-1), torch.arange(extent))


def _match(quant: torch.fx.Node):
    """The fused op's arguments and the nodes it replaces (users first), or None."""
    if quant.op != "call_function" or quant.target is not QUANTIZE or len(quant.args) != 2 or quant.kwargs:
        return None
    x2d, fmt = quant.args
    if fmt not in formats.ELEMENTS or any(u.target is not operator.getitem for u in quant.users):
        return None
    moves, node = [], x2d
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in MOVES:
        if not only_user(node, moves[-1] if moves else quant):
            return None
        moves.append(node)
        node = node.args[0]
    got = node
    if not (isinstance(got, torch.fx.Node) and got.op == "call_function" and got.target is operator.getitem
            and got.args[1] == 0 and only_user(got, moves[-1] if moves else quant)):
        return None
    attn = got.args[0]
    backend = BACKEND_OF.get(attn.target) if attn.op == "call_function" else None
    if backend is None:
        return None
    others = [u for u in attn.users if u is not got]
    if any(u.target is not operator.getitem or u.users for u in others):
        return None
    args = _arguments(attn)
    bias = args.get("attn_mask" if backend == "cpu" else "attn_bias")
    if (bias is None or args.get("dropout_p", 0.0) != 0.0 or args.get("is_causal", False)
            or args.get("return_debug_mask", False) or args.get("enable_gqa", False)):
        return None
    q, k, v = args["query"], args["key"], args["value"]
    qv, kv, vv, out, rows = (fake_value(n) for n in (q, k, v, got, x2d))
    if any(t is None for t in (qv, kv, vv, out, rows)) or out.dim() != 4 or out.dtype not in formats.INPUT_DTYPES:
        return None
    if not (qv.shape[-1] == kv.shape[-1] == vv.shape[-1] and tuple(out.shape) == tuple(qv.shape)):
        return None
    from tilefly.ops.attention import decode

    chain = [*reversed(moves)]
    if decode.quant_reason(out.shape[-1], out.stride()) is not None or not _rows_are_the_memory(chain, out, rows):
        return None
    fused_args = (q, k, v, bias, args.get("scale"), bool(args.get("compute_log_sumexp", False)), backend,
                  list(out.stride()), rows.shape[1], fmt)
    return fused_args, [*moves, got, *others, attn]


def fuse_attention_quantization(graph: torch.fx.Graph) -> int:
    """Replace every match (module docstring) by one op call; returns how many."""
    fused_op = torch.ops.tilefly.attention_mx_quantize.default
    done = 0
    for quant in list(graph.nodes):
        if (found := _match(quant)) is None:
            continue
        fused_args, chain = found
        with graph.inserting_before(quant):
            fused = graph.call_function(fused_op, fused_args)
        fused.meta["val"] = attention_quant.fake_outputs(fake_value(fused_args[0]), fused_args[8],
                                                         formats.ELEMENTS[fused_args[9]])
        replace_quantization(graph, quant, fused, 0, chain)
        done += 1
    _log.debug("tilefly.mx: %d attention + quantization sites fused into one op each", done)
    return done

"""A post-grad Inductor pass for compiled MX layers: one activation quantized once, sibling GEMMs as one.

1. One ``tilefly::mx_quantize_rows`` call per (activation, format). Inductor does not deduplicate
   identical calls of an opaque op, so a layer's q, k and v projections (or gate and up) each
   quantized the same activation.
2. Then ``tilefly::mx_linear_mm`` calls of one quantized activation, format, layout and output dtype,
   none with a bias, become one ``tilefly::mx_linear_mm_packed`` call whose output columns the graph
   slices (``tilefly.mx.siblings`` says why and when it runs as one GEMM).
3. With ``config.mx_fused_quant``, a residual add, the RMSNorm after it and the quantization of its
   output become one ``tilefly::add_rms_norm_mx_quantize`` call (``tilefly.mx.norm_fusion``; MXFP4 that
   GEMMs read: its expanded build, whose copy they take, ``tilefly.mx.expanded``),
4. an MLP's ``silu(gate) * up`` and its quantization one ``tilefly::silu_mul_mx_quantize`` call
   (``tilefly.mx.silu_fusion``),
5. and a masked attention call and the quantization of its output (the o_proj input) one
   ``tilefly::attention_mx_quantize`` call (``tilefly.mx.attention_fusion``).

``tilefly.enable()`` puts ``SharedQuantization`` in ``torch._inductor.config.post_grad_custom_pre_pass``
with the ``mx_gemm`` family, chaining the pass it finds there; ``tilefly.disable()`` restores it.
Imported only then: it needs Inductor (seconds).
"""
from __future__ import annotations

import torch

import tilefly.mx.linear  # noqa: F401 - registers tilefly::mx_linear_mm
import tilefly.mx.quant_op  # noqa: F401 - registers tilefly::mx_quantize_rows
from tilefly import _graph_pass, config
from tilefly.mx import attention_fusion, expanded, fusion_graph, norm_fusion, siblings, silu_fusion

SLOT = "post_grad_custom_pre_pass"


class SharedQuantization(_graph_pass.ChainedPass):
    """Keeps the first ``mx_quantize_rows`` node of each value (``_value_numbers``: views of one tensor
    to one shape, or any pure ops of equal inputs, count as one argument) and points later ones' users
    at it; packs sibling GEMMs (``pack_sibling_gemms``); then runs ``then``, the pass it displaced (if any)."""

    def run(self, graph: torch.fx.Graph) -> None:
        target = torch.ops.tilefly.mx_quantize_rows.default
        numbers = _value_numbers(graph)
        first: dict[tuple, torch.fx.Node] = {}
        for node in list(graph.nodes):
            if node.op == "call_function" and node.target is target:
                kept = first.setdefault(numbers[node], node)
                if kept is not node:
                    node.replace_all_uses_with(kept)
                    graph.erase_node(node)
        pack_sibling_gemms(graph, numbers)   # numbers still hold: a kept call has its twins' number
        if config.mx_fused_quant:
            norm_fusion.fuse_norm_quantization(graph)
            silu_fusion.fuse_silu_quantization(graph)
            attention_fusion.fuse_attention_quantization(graph)

    def source_files(self) -> tuple[str, ...]:
        return (__file__, _graph_pass.__file__, siblings.__file__, fusion_graph.__file__, norm_fusion.__file__,
                norm_fusion.norm_quant.__file__, silu_fusion.__file__, silu_fusion.silu_quant.__file__,
                attention_fusion.__file__, attention_fusion.attention_quant.__file__, expanded.__file__)

    def key_suffix(self) -> bytes:
        if not config.mx_fused_quant:
            return b""
        return b":fused-quant" + (b":expanded" if config.mx_expanded_activation else b"")


def _value_numbers(graph: torch.fx.Graph) -> dict[torch.fx.Node, tuple]:
    """``_graph_pass.value_numbers`` with the MX quantization pure too: each projection derives its
    operands from the shared activation with nodes of its own (the 32_4_4 layout's rearrangement, and
    on CPU the quantization's own ops)."""
    return _graph_pass.value_numbers(graph, also_pure=(torch.ops.tilefly.mx_quantize_rows.default,))


def _arguments(node: torch.fx.Node) -> dict:
    names = [a.name for a in node.target._schema.arguments]
    return {**dict(zip(names, node.args)), **node.kwargs}


def _rows(node) -> int | None:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return val.shape[0] if isinstance(val, torch.Tensor) and isinstance(val.shape[0], int) else None


def pack_sibling_gemms(graph: torch.fx.Graph, numbers: dict[torch.fx.Node, tuple] | None = None) -> int:
    """Replace each set of ``mx_linear_mm`` calls sharing one quantized activation (module docstring)
    by one ``mx_linear_mm_packed`` call and column slices of its output; returns how many sets. A set
    needs its weights' row counts (their nodes' fake values) and every weight defined before its
    first call."""
    single, packed_op = torch.ops.tilefly.mx_linear_mm.default, torch.ops.tilefly.mx_linear_mm_packed.default
    order = {node: i for i, node in enumerate(graph.nodes)}
    numbers = _value_numbers(graph) if numbers is None else numbers
    sets: dict[tuple, list[torch.fx.Node]] = {}
    for node in graph.nodes:
        if node.op != "call_function" or node.target is not single:
            continue
        args = _arguments(node)
        if args.get("bias") is not None:
            continue
        key = (numbers.get(args["a_bits"]), numbers.get(args["a_scale_bits"]), args["fmt"], args["swizzle"],
               args["out_dtype"])
        sets.setdefault(key, []).append(node)
    done = 0
    for calls in sets.values():
        first = calls[0]
        args = [_arguments(c) for c in calls]
        weights, scales = [a["w_bits"] for a in args], [a["w_scale_bits"] for a in args]
        rows = [_rows(w) for w in weights]
        if len(calls) < 2 or None in rows or any(
                isinstance(x, torch.fx.Node) and order[x] > order[first] for x in weights + scales):
            continue
        head = args[0]
        with graph.inserting_before(first):
            packed = graph.call_function(packed_op, (head["a_bits"], weights, head["a_scale_bits"], scales,
                                                     head["fmt"], head["swizzle"], head["out_dtype"]))
            val = first.meta.get("val")
            if isinstance(val, torch.Tensor):
                packed.meta["val"] = val.new_empty((val.shape[0], sum(rows)))
            start = 0
            for call, n in zip(calls, rows):
                part = graph.call_function(torch.ops.aten.slice.Tensor, (packed, 1, start, start + n))
                if "val" in packed.meta:
                    part.meta["val"] = torch.ops.aten.slice.Tensor(packed.meta["val"], 1, start, start + n)
                call.replace_all_uses_with(part)
                start += n
        for call in calls:
            graph.erase_node(call)
        done += 1
    return done


def install() -> None:
    """Put ``SharedQuantization`` in the post-grad pre-pass slot, ahead of what is there; idempotent."""
    _graph_pass.install(SLOT, SharedQuantization)


def uninstall() -> None:
    """Give the slot back what ``install`` found there, while the pass is still the one installed."""
    _graph_pass.uninstall(SLOT, SharedQuantization)

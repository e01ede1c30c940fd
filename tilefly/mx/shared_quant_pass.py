"""A post-grad Inductor pass for compiled MX layers: one activation quantized once, sibling GEMMs as one.

1. One ``tilefly::mx_quantize_rows`` call per (activation, format). Inductor does not deduplicate
   identical calls of an opaque op, so a layer's q, k and v projections (or gate and up) each
   quantized the same activation.
2. Then ``tilefly::mx_linear_mm`` calls of one quantized activation, format, layout and output dtype,
   none with a bias, become one ``tilefly::mx_linear_mm_packed`` call whose output columns the graph
   slices (``tilefly.mx.siblings`` says why and when it runs as one GEMM).
3. With ``config.mx_fused_quant``, a residual add, the RMSNorm after it and the quantization of its
   output become one ``tilefly::add_rms_norm_mx_quantize`` call (``tilefly.mx.norm_fusion``),
4. and an MLP's ``silu(gate) * up`` and its quantization one ``tilefly::silu_mul_mx_quantize`` call
   (``tilefly.mx.silu_fusion``).

``tilefly.enable()`` puts ``SharedQuantization`` in ``torch._inductor.config.post_grad_custom_pre_pass``
with the ``mx_gemm`` family, chaining the pass it finds there; ``tilefly.disable()`` restores it.
Imported only then: it needs Inductor (seconds).
"""
from __future__ import annotations

import operator
import threading

import torch
from torch._inductor import config as inductor_config
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

import tilefly.mx.linear  # noqa: F401 - registers tilefly::mx_linear_mm
import tilefly.mx.quant_op  # noqa: F401 - registers tilefly::mx_quantize_rows
from tilefly import config
from tilefly.mx import fusion_graph, norm_fusion, siblings, silu_fusion

_lock = threading.Lock()


class SharedQuantization(CustomGraphPass):
    """Keeps the first ``mx_quantize_rows`` node of each value (``_value_numbers``: views of one tensor
    to one shape, or any pure ops of equal inputs, count as one argument) and points later ones' users
    at it; packs sibling GEMMs (``pack_sibling_gemms``); then runs ``then``, the pass it displaced (if any)."""

    def __init__(self, then=None):
        self.then = then

    def __call__(self, graph: torch.fx.Graph) -> None:
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
        if self.then is not None:
            self.then(graph)

    def uuid(self):
        # The FX graph cache keys on this (the pass's source, so an edited pass misses the cache);
        # a displaced pass without a key of its own keeps the graph out of the cache, as Inductor
        # would have without tilefly.
        fusion = (fusion_graph.__file__, norm_fusion.__file__, norm_fusion.norm_quant.__file__, silu_fusion.__file__,
                  silu_fusion.silu_quant.__file__)
        own = (get_hash_for_files((__file__, siblings.__file__, *fusion))
               + (b":fused-quant" if config.mx_fused_quant else b""))
        if self.then is None:
            return own
        inner = self.then.uuid() if isinstance(self.then, CustomGraphPass) else None
        return None if inner is None else (own, inner)


def _pure(target) -> bool:
    """An op whose output depends only on its arguments: two calls of it on equal arguments are equal."""
    if target is operator.getitem or target is torch.ops.tilefly.mx_quantize_rows.default:
        return True
    return (isinstance(target, torch._ops.OpOverload) and target.namespace in ("aten", "prims")
            and not target._schema.is_mutable and torch.Tag.nondeterministic_seeded not in target.tags)


def _value_numbers(graph: torch.fx.Graph) -> dict[torch.fx.Node, tuple]:
    """A number per node, equal for nodes that compute one value from the same inputs through pure
    ATen/prims ops or the MX quantization (views, getitem of one tuple, the 32_4_4 layout's
    rearrangement, and on CPU the quantization's own ops): each projection derives its operands from
    the shared activation with nodes of its own. Value numbering, one pass in graph order."""
    numbers: dict[torch.fx.Node, tuple] = {}
    table: dict[tuple, tuple] = {}

    def canon(arg):
        if isinstance(arg, torch.fx.Node):
            return numbers[arg]
        if isinstance(arg, (list, tuple)):
            return tuple(canon(a) for a in arg)
        if isinstance(arg, (bool, int, float)):     # 2 and 2.0, 0.0 and -0.0 differ; NaN equals NaN
            return (type(arg).__name__, repr(arg))
        return arg

    for i, node in enumerate(graph.nodes):
        numbers[node] = ("node", i)
        if node.op == "call_function" and _pure(node.target):
            try:
                key = (node.target, canon(node.args), canon(tuple(sorted(node.kwargs.items()))))
                numbers[node] = table.setdefault(key, ("value", len(table)))
            except TypeError:   # an argument that does not hash: a value of its own
                pass
    return numbers


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
    with _lock:
        current = inductor_config.post_grad_custom_pre_pass
        if not isinstance(current, SharedQuantization):
            inductor_config.post_grad_custom_pre_pass = SharedQuantization(then=current)


def uninstall() -> None:
    """Give the slot back what ``install`` found there, while the pass is still the one installed."""
    with _lock:
        current = inductor_config.post_grad_custom_pre_pass
        if isinstance(current, SharedQuantization):
            inductor_config.post_grad_custom_pre_pass = current.then

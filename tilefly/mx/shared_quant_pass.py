"""A post-grad Inductor pass: one ``tilefly::mx_quantize_rows`` call per (activation, format).

Inductor does not deduplicate identical calls of an opaque op, so a layer's q, k and v projections
(or gate and up) each quantized the same activation. ``tilefly.enable()`` puts ``SharedQuantization``
in ``torch._inductor.config.post_grad_custom_pre_pass`` with the ``mx_gemm`` family, chaining the pass
it finds there; ``tilefly.disable()`` restores it. Imported only then: it needs Inductor (seconds).
"""
from __future__ import annotations

import threading

import torch
from torch._inductor import config as inductor_config
from torch._inductor.custom_graph_pass import CustomGraphPass

import tilefly.mx.quant_op  # noqa: F401 - registers the op this pass looks for

_lock = threading.Lock()


class SharedQuantization(CustomGraphPass):
    """Keeps the first ``mx_quantize_rows`` node of each (args, kwargs) and points later ones' users
    at it; then runs ``then``, the pass it displaced (if any)."""

    def __init__(self, then=None):
        self.then = then

    def __call__(self, graph: torch.fx.Graph) -> None:
        target = torch.ops.tilefly.mx_quantize_rows.default
        first: dict[tuple, torch.fx.Node] = {}
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target is not target:
                continue
            key = (node.args, tuple(sorted(node.kwargs.items())))
            if key in first:
                node.replace_all_uses_with(first[key])
                graph.erase_node(node)
            else:
                first[key] = node
        if self.then is not None:
            self.then(graph)

    def uuid(self):
        # The FX graph cache keys on this; a displaced pass without a key of its own keeps
        # the graph out of the cache, as Inductor would have without tilefly.
        if self.then is None:
            return "tilefly-shared-mx-quantization-1"
        inner = self.then.uuid() if isinstance(self.then, CustomGraphPass) else None
        return None if inner is None else ("tilefly-shared-mx-quantization-1", inner)


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

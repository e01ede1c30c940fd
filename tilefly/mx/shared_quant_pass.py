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
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

import tilefly.mx.quant_op  # noqa: F401 - registers the op this pass looks for

_lock = threading.Lock()
_VIEWS = {torch.ops.aten.view.default, torch.ops.aten.reshape.default, torch.ops.aten._unsafe_view.default}


def _value_key(arg):
    """A hashable stand-in for ``arg`` equal for equal values: each projection flattens its activation
    with a view of its own (MXLinear's reshape), so views of one tensor to one shape count as one."""
    if isinstance(arg, torch.fx.Node):
        if arg.op == "call_function" and arg.target in _VIEWS:
            return ("view", _value_key(arg.args), _value_key(tuple(sorted(arg.kwargs.items()))))
        return arg
    if isinstance(arg, (list, tuple)):
        return tuple(_value_key(a) for a in arg)
    return arg


class SharedQuantization(CustomGraphPass):
    """Keeps the first ``mx_quantize_rows`` node of each (args, kwargs), views of one tensor to one
    shape counting as one argument, and points later ones' users at it; then runs ``then``, the
    pass it displaced (if any)."""

    def __init__(self, then=None):
        self.then = then

    def __call__(self, graph: torch.fx.Graph) -> None:
        target = torch.ops.tilefly.mx_quantize_rows.default
        first: dict[tuple, torch.fx.Node] = {}
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target is not target:
                continue
            key = (_value_key(node.args), _value_key(tuple(sorted(node.kwargs.items()))))
            try:
                kept = first.setdefault(key, node)
            except TypeError:   # an argument that does not hash: leave the call as it is
                continue
            if kept is not node:
                node.replace_all_uses_with(kept)
                graph.erase_node(node)
        if self.then is not None:
            self.then(graph)

    def uuid(self):
        # The FX graph cache keys on this (the pass's source, so an edited pass misses the cache);
        # a displaced pass without a key of its own keeps the graph out of the cache, as Inductor
        # would have without tilefly.
        own = get_hash_for_files((__file__,))
        if self.then is None:
            return own
        inner = self.then.uuid() if isinstance(self.then, CustomGraphPass) else None
        return None if inner is None else (own, inner)


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

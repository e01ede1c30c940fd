"""tilefly's Inductor post-grad graph passes: value numbering, and the config slots they share.

Inductor runs one callable from each of ``post_grad_custom_pre_pass`` and
``post_grad_custom_post_pass``. A tilefly pass (a ``ChainedPass``) takes a slot at ``enable()`` and
keeps what was there as ``then``, which it runs after itself; ``disable()`` gives the slot back. The
FX graph cache keys on a pass's ``uuid()``: the hash of the source files the pass names, chained with
the displaced pass's key, or None (no caching) when the displaced pass has no key of its own, as
Inductor would have it without tilefly.
"""
from __future__ import annotations

import operator
import threading
from typing import Iterable

import torch
from torch._inductor import config as inductor_config
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

_lock = threading.Lock()


class ChainedPass(CustomGraphPass):
    """A tilefly pass (``run``) followed by the pass it displaced from its slot (``then``)."""

    def __init__(self, then=None):
        self.then = then

    def run(self, graph: torch.fx.Graph) -> None:
        raise NotImplementedError

    def source_files(self) -> tuple[str, ...]:
        """The files whose contents decide what ``run`` does (the FX graph cache's key)."""
        raise NotImplementedError

    def key_suffix(self) -> bytes:
        """Options that change what ``run`` does, for the cache key."""
        return b""

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.run(graph)
        if self.then is not None:
            self.then(graph)

    def uuid(self):
        own = get_hash_for_files(self.source_files()) + self.key_suffix()
        if self.then is None:
            return own
        inner = self.then.uuid() if isinstance(self.then, CustomGraphPass) else None
        return None if inner is None else (own, inner)


def install(slot: str, kind: type[ChainedPass]) -> None:
    """Put a ``kind`` pass in Inductor's config ``slot``, ahead of what is there; idempotent."""
    with _lock:
        current = getattr(inductor_config, slot)
        if not isinstance(current, kind):
            setattr(inductor_config, slot, kind(then=current))


def uninstall(slot: str, kind: type[ChainedPass]) -> None:
    """Give ``slot`` back what ``install`` found there, while a ``kind`` pass is still the one there."""
    with _lock:
        current = getattr(inductor_config, slot)
        if isinstance(current, kind):
            setattr(inductor_config, slot, current.then)


def _pure(target, also_pure: Iterable) -> bool:
    """An op whose output depends only on its arguments: two calls of it on equal arguments are equal."""
    if target is operator.getitem or target in also_pure:
        return True
    return (isinstance(target, torch._ops.OpOverload) and target.namespace in ("aten", "prims")
            and not target._schema.is_mutable and torch.Tag.nondeterministic_seeded not in target.tags)


def value_numbers(graph: torch.fx.Graph, also_pure: Iterable = ()) -> dict[torch.fx.Node, tuple]:
    """A number per node, equal for nodes that compute one value from the same inputs through pure
    ATen/prims ops (and the ops in ``also_pure``): views of one tensor to one shape, getitem of one
    tuple, one constant made twice. Value numbering, one pass in graph order."""
    also_pure = tuple(also_pure)
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
        if node.op == "call_function" and _pure(node.target, also_pure):
            try:
                key = (node.target, canon(node.args), canon(tuple(sorted(node.kwargs.items()))))
                numbers[node] = table.setdefault(key, ("value", len(table)))
            except TypeError:   # an argument that does not hash: a value of its own
                pass
    return numbers


def erase_unused(graph: torch.fx.Graph, nodes: Iterable[torch.fx.Node], also_pure: Iterable = ()) -> int:
    """Erase each of ``nodes`` that is pure and that nothing uses, then the inputs this leaves unused, and
    so on; returns how many nodes went."""
    also_pure = tuple(also_pure)
    erased: set[torch.fx.Node] = set()
    stack = list(nodes)
    while stack:
        n = stack.pop()
        if n in erased or n.users or n.op != "call_function" or not _pure(n.target, also_pure):
            continue
        inputs = n.all_input_nodes
        graph.erase_node(n)
        erased.add(n)
        stack.extend(inputs)
    return len(erased)

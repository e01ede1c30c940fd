"""``tilefly.explain``: run a function and say, per tilefly-routable aten op it
called, whether tilefly served it and why not otherwise.

The router records its own decisions. A dispatch mode watches the same ops from
above, so calls that never reach the router (CPU tensors, a family that is not
enabled) are reported too instead of silently missing.
"""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tilefly import _dispatch, ops

_log = logging.getLogger("tilefly")


@dataclass
class Explanation:
    result: Any
    decisions: list[_dispatch.Decision] = field(default_factory=list)

    @property
    def served(self) -> list[_dispatch.Decision]:
        return [d for d in self.decisions if d.impl is not None]

    @property
    def fallbacks(self) -> list[_dispatch.Decision]:
        return [d for d in self.decisions if d.impl is None]

    def __str__(self) -> str:
        if not self.decisions:
            return "tilefly.explain: the function called no op that tilefly can serve."
        rows = Counter((d.op, d.impl, d.reason) for d in self.decisions)
        lines = ["tilefly.explain:"]
        for (op, impl, reason), n in rows.items():
            outcome = f"served by tilefly ({impl})" if impl else f"ATen: {reason}"
            lines.append(f"  {op:<34} x{n:<4} {outcome}")
        return "\n".join(lines)

    __repr__ = __str__


class _Watch(TorchDispatchMode):
    def __init__(self, families: dict[str, str], decisions: list[_dispatch.Decision]):
        super().__init__()
        self.families = families  # op name -> owning family
        self.decisions = decisions

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.name()
        family = self.families.get(name)
        if family is None:
            return func(*args, **kwargs)
        before = len(self.decisions)
        out = func(*args, **kwargs)
        if len(self.decisions) == before:  # the router never saw this call
            self.decisions.append(_dispatch.Decision(name, None, _why_unrouted(name, family, args, kwargs)))
        return out


def _why_unrouted(op: str, family: str, args, kwargs) -> str:
    if family not in _dispatch.installed():
        return f"tilefly is not enabled for {family!r}"
    unrouted = _dispatch.unrouted_reason(op)
    if unrouted:
        return f"not routed: {unrouted}"
    tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
    devices = sorted({t.device.type for t in tensors})
    if devices and devices != ["cuda"]:
        return f"inputs on {', '.join(devices)}; tilefly serves CUDA tensors"
    return "the call did not reach tilefly's override"


def explain(fn: Callable[..., Any], *args, **kwargs) -> Explanation:
    """Run ``fn(*args, **kwargs)`` and report what tilefly did with each op it could serve."""
    if not callable(fn):
        raise TypeError(f"tilefly.explain: fn must be callable, got {type(fn).__name__}")
    for name in ops.FAMILIES:
        try:
            ops.load(name)  # registers its ops, so calls of families not enabled are reported too
        except Exception as exc:  # noqa: BLE001 - a broken family must not break explain()
            _log.debug("explain: cannot load %s: %s", name, exc)
    # func.name() spells overloads as the router does: "aten::topk", "aten::topk.values".
    watched = {i.op: i.family for i in _dispatch.registered()}
    # All threads: autograd runs the backward of CUDA tensors on its own device thread.
    with _dispatch.recording(all_threads=True) as decisions, _Watch(watched, decisions):
        result = fn(*args, **kwargs)
    return Explanation(result, list(decisions))


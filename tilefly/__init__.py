"""tilefly: an optional Hopper (sm_90) kernel backend behind PyTorch operators.

    import tilefly
    tilefly.enable()                 # eager overrides (RMSNorm, TopK, ...) on this process
    print(tilefly.explain(f, x))     # which ops tilefly served, and why not otherwise
    tilefly.disable()                # ATen's kernels again

Importing tilefly compiles nothing and needs no GPU; kernels compile on first use.
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import sys
from typing import Iterable, Iterator

from tilefly import _dispatch, config
from tilefly import ops as _ops
from tilefly._dispatch import TileflyKernelError
from tilefly._explain import Explanation, explain

__version__ = "0.1.0"
__all__ = ["enable", "disable", "enabled", "enabled_ops", "explain", "Explanation",
           "TileflyKernelError", "config", "__version__"]

_log = logging.getLogger("tilefly")
if not _log.handlers:
    _log.addHandler(logging.NullHandler())


def _families(ops_arg: Iterable[str] | str | None) -> list[str]:
    if isinstance(ops_arg, str):
        ops_arg = [ops_arg]
    if ops_arg is None:
        ops_arg = config.ops or _ops.defaults()
    try:
        names = list(ops_arg)
    except TypeError:
        raise TypeError(f"tilefly.enable/disable: ops must be a family name or an iterable of names, "
                        f"got {type(ops_arg).__name__}") from None
    if not all(isinstance(n, str) for n in names):
        raise TypeError(f"tilefly.enable/disable: ops must hold family names (str), got {names!r}")
    unknown = [n for n in names if n not in _ops.FAMILIES]
    if unknown:
        raise ValueError(f"tilefly.enable: ops has unknown names {unknown}; known: {', '.join(sorted(_ops.FAMILIES))}")
    return names


_inductor_families: set[str] = set()  # enabled families reached through Inductor's autotuning


def enable(ops: Iterable[str] | str | None = None) -> tuple[str, ...]:
    """Route the given op families (default: ``config.ops``, else every default family) through tilefly.

    Eager families get their aten overrides; Inductor families (GEMMs) offer their
    candidates to ``torch.compile(mode="max-autotune")`` when ``TILEFLY`` is among
    ``max_autotune_gemm_backends``. Idempotent; returns the families now enabled.
    With ``TILEFLY_DISABLE=1`` nothing is installed.
    """
    names = _families(ops)
    if config.disable:
        _log.info("tilefly.enable: TILEFLY_DISABLE is set; nothing installed")
        return enabled_ops()
    families = [_ops.load(name) for name in names]
    _dispatch.install([f.name for f in families if f.reached_by == "eager"])
    for f in families:
        if f.graph_pass:
            importlib.import_module(f.graph_pass).install()
    inductor = {f.name for f in families if f.reached_by == "inductor"}
    if inductor:
        from tilefly import _inductor

        _inductor.install(inductor)
        _inductor_families.update(inductor)
    return enabled_ops()


def disable(ops: Iterable[str] | str | None = None) -> None:
    """Give the named families (default: all) back to ATen and Inductor's own choices."""
    names = None if ops is None else _families(ops)
    _dispatch.uninstall(names)
    _inductor_families.difference_update(_inductor_families if names is None else names)
    if "tilefly._inductor" in sys.modules:  # never import Inductor just to undo nothing
        sys.modules["tilefly._inductor"].uninstall(names)
    for name in _ops.FAMILIES if names is None else names:
        graph_pass = _ops.FAMILIES[name].graph_pass
        if graph_pass in sys.modules:   # never imported: never installed
            sys.modules[graph_pass].uninstall()


def enabled_ops() -> tuple[str, ...]:
    """The op families currently routed through tilefly."""
    return tuple(sorted(set(_dispatch.installed()) | _inductor_families))


@contextlib.contextmanager
def enabled(ops: Iterable[str] | str | None = None) -> Iterator[tuple[str, ...]]:
    """``with tilefly.enabled(): ...`` enables for the block, then restores what was enabled before."""
    before = set(enabled_ops())
    try:
        yield enable(ops)
    finally:
        now = set(enabled_ops())
        if now - before:
            disable(now - before)

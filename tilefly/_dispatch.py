"""The eager router: tilefly's kernels behind aten ops, ATen's kernel as fallback.

Per aten op (``"aten::topk"``, ``"aten::topk.values"``) the router keeps an
ordered list of implementations, each an eligibility predicate and a function.
Installing an op captures the kernel currently registered for the dispatch key
(ATen's, or torch._native's router where that is active) and registers one
handler in its place:

    handler(keyset, *args, **kwargs):
        for each implementation:  predicate(*args, **kwargs) -> None | reason | plan
            None   -> return implementation(*args, **kwargs)
            plan   -> return implementation(plan, *args, **kwargs)   (Impl.takes_plan)
        return original.call_boxed(keyset, *args, **kwargs)

A reason is a ``str``; an implementation with ``takes_plan`` may get anything
else from its predicate (what it worked out about the call: grid, cached launch),
so the op does not redo the predicate's work and no state passes between the two
outside the call.

Calling the captured kernel, not re-dispatching, is what keeps the fallback
from re-entering this handler. Autograd sits above the dispatch key, so
ATen's derivative formulas keep working with tilefly's forward outputs.

Predicates run on every call: no host syncs, no allocation, cached device
facts only. The boxed call passes only the arguments the caller gave (trailing
defaults are dropped), so predicates and implementations declare the op's
defaults in their own signatures.

Install and uninstall are idempotent and serialized by one lock; the handler
reads an immutable tuple, so concurrent calls never see a half-built list.
Dropping a ``torch.library.Library`` unregisters its kernels, so each installed
op keeps its own Library here until uninstalled (``_destroy`` restores ATen).
"""
from __future__ import annotations

import inspect
import logging
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch

from tilefly import config

__all__ = ["Impl", "TileflyKernelError", "register", "install", "uninstall", "installed", "recording"]

_log = logging.getLogger("tilefly.dispatch")

Predicate = Callable[..., Any]  # None (serve), a reason str (decline), or a plan (takes_plan)


class TileflyKernelError(RuntimeError):
    """A tilefly kernel raised while ``tilefly.config.on_error == 'raise'``."""


@dataclass(frozen=True)
class Impl:
    family: str          # op family that owns it, as named in enable(ops=...)
    op: str              # "aten::name[.overload]"
    name: str            # shown by explain() and debug logs, e.g. "triton_rms_norm"
    predicate: Predicate
    fn: Callable[..., Any]
    dispatch_key: str = "CUDA"
    takes_plan: bool = False  # fn(plan, *args, **kwargs) with the predicate's non-str answer
    # Asked whenever the family is installed: a reason leaves this implementation out of its op's
    # route (when no implementation is left, the op keeps ATen's kernel and pays no handler).
    install_reason: Callable[[], str | None] | None = None


@dataclass(frozen=True)
class Decision:
    """One call's outcome: served by ``impl`` or fell back for ``reason``."""

    op: str
    impl: str | None
    reason: str | None


class _Route:
    """One aten op on one dispatch key while installed."""

    def __init__(self, op: str, dispatch_key: str, impls: tuple[Impl, ...]):
        self.op = op
        self.dispatch_key = dispatch_key
        self.impls = impls
        self.original = torch.library.get_kernel(op, dispatch_key)
        self.library = torch.library.Library(op.split("::")[0], "IMPL")
        handler = _make_handler(op, impls, self.original)
        with warnings.catch_warnings():
            # torch warns on every override of an existing kernel: that is the point here.
            warnings.simplefilter("ignore", UserWarning)
            self.library.impl(op.split("::")[1], handler, dispatch_key, with_keyset=True, **_IMPL_KWARGS)

    def remove(self) -> None:
        self.library._destroy()


def _impl_kwargs() -> dict[str, Any]:
    # torch 2.11 refuses a second Python kernel on one op unless asked; 2.13 allows it by default.
    params = inspect.signature(torch.library.Library.impl).parameters
    return {"allow_override": True} if "allow_override" in params else {}


_IMPL_KWARGS = _impl_kwargs()

_lock = threading.RLock()
_registry: dict[str, list[Impl]] = {}       # family -> its implementations, in priority order
_active: set[str] = set()                    # installed families
_routes: dict[tuple[str, str], _Route] = {}  # (op, dispatch key) -> installed route
_unrouted: dict[tuple[str, str], str] = {}   # (op, dispatch key) -> why its implementations stayed out


def register(impl: Impl) -> None:
    """Make ``impl`` known to the router; installed when its family is enabled."""
    with _lock:
        impls = _registry.setdefault(impl.family, [])
        if any(i.op == impl.op and i.name == impl.name and i.dispatch_key == impl.dispatch_key for i in impls):
            return
        impls.append(impl)
        if impl.family in _active:
            _rebuild({(impl.op, impl.dispatch_key)})


def registered(family: str | None = None) -> list[Impl]:
    with _lock:
        if family is not None:
            return list(_registry.get(family, ()))
        return [i for impls in _registry.values() for i in impls]


def install(families: list[str] | tuple[str, ...] | set[str]) -> None:
    """Install the routes of ``families`` (already registered); idempotent."""
    with _lock:
        unknown = [f for f in families if f not in _registry]
        if unknown:
            raise ValueError(f"no implementations registered for {unknown}")
        new = set(families) - _active
        if not new:
            return
        _active.update(new)
        _rebuild(_keys_of(new))


def uninstall(families: list[str] | tuple[str, ...] | set[str] | None = None) -> None:
    """Remove the routes of ``families`` (all when None); ATen's kernels come back."""
    with _lock:
        gone = set(_active) if families is None else set(families) & _active
        if not gone:
            return
        _active.difference_update(gone)
        _rebuild(_keys_of(gone))


def installed() -> tuple[str, ...]:
    with _lock:
        return tuple(sorted(_active))


def unrouted_reason(op: str, dispatch_key: str | None = None) -> str | None:
    """Why an enabled family left ``op`` (on ``dispatch_key``, or any key) on ATen's kernel at
    install (Impl.install_reason), if it did."""
    if dispatch_key is not None:
        return _unrouted.get((op, dispatch_key))
    return next((why for (name, _), why in sorted(_unrouted.items()) if name == op), None)


def original(op: str, dispatch_key: str = "CUDA"):
    """The kernel an installed route falls back to (None when the op is not routed)."""
    route = _routes.get((op, dispatch_key))
    return None if route is None else route.original


def _keys_of(families: set[str]) -> set[tuple[str, str]]:
    return {(i.op, i.dispatch_key) for f in families for i in _registry.get(f, ())}


def _rebuild(keys: set[tuple[str, str]]) -> None:
    for key in sorted(keys):
        route = _routes.pop(key, None)
        if route is not None:
            route.remove()
        impls, left_out = [], []
        for i in (i for f in sorted(_active) for i in _registry[f] if (i.op, i.dispatch_key) == key):
            why = _install_reason(i)
            if why is None:
                impls.append(i)
            else:
                left_out.append(f"{i.name}: {why}")
        impls = tuple(impls)
        if left_out and not impls:
            _unrouted[key] = "; ".join(left_out)
        else:
            _unrouted.pop(key, None)
        if impls:
            try:
                _routes[key] = _Route(key[0], key[1], impls)
            except RuntimeError as exc:  # e.g. a CPU-only torch build has no CUDA kernel for this op
                _log.debug("%s on %s: not routed (%s)", key[0], key[1], exc)
                continue
        _log.debug("%s on %s: %s", key[0], key[1], [i.name for i in impls] or "ATen restored")


def _install_reason(impl: Impl) -> str | None:
    if impl.install_reason is None:
        return None
    try:
        return impl.install_reason()
    except Exception as exc:  # noqa: BLE001 - a broken check installs the route: its predicate still decides
        _log.warning("tilefly: %s's install check on %s raised %s: %s; routing it", impl.name, impl.op,
                     type(exc).__name__, exc)
        return None


# ---- observation: explain() and debug logging ------------------------------------------------

_tls = threading.local()
_recorders = 0  # recording() blocks open anywhere; the handler skips all bookkeeping when 0
_all_thread_sinks: list[list[Decision]] = []  # recording(all_threads=True) lists, under _lock


class recording:
    """Collect dispatch decisions: ``with recording() as decisions: ...``.

    By default only this thread's calls; ``all_threads=True`` also sees calls made
    elsewhere while the block is open, e.g. the backward ops autograd runs for CUDA
    tensors on its own device thread.
    """

    def __init__(self, all_threads: bool = False):
        self.all_threads = all_threads

    def __enter__(self) -> list[Decision]:
        global _recorders
        self.decisions: list[Decision] = []
        with _lock:
            _recorders += 1
            if self.all_threads:
                _all_thread_sinks.append(self.decisions)
                return self.decisions
        self._outer = getattr(_tls, "decisions", None)
        _tls.decisions = self.decisions
        return self.decisions

    def __exit__(self, *exc) -> None:
        global _recorders
        with _lock:
            _recorders -= 1
            if self.all_threads:
                _all_thread_sinks.remove(self.decisions)
                return
        _tls.decisions = self._outer


def _observe(op: str, impl: str | None, reason: str | None) -> None:
    if _recorders:
        decision = Decision(op, impl, reason)
        mine = getattr(_tls, "decisions", None)
        if mine is not None:
            mine.append(decision)
        if _all_thread_sinks:
            with _lock:
                for sink in _all_thread_sinks:
                    if sink is not mine:
                        sink.append(decision)
    if _log.isEnabledFor(logging.DEBUG):
        if impl is not None:
            _log.debug("%s -> tilefly %s", op, impl)
        else:
            _log.debug("%s -> ATen (%s)", op, reason)


_warned: set[tuple[str, type]] = set()


def _failed(impl: Impl, exc: Exception) -> str:
    """Apply the on_error policy; returns the fallback reason."""
    if config.on_error == "raise":
        raise TileflyKernelError(f"tilefly {impl.name} failed on {impl.op}: {exc}") from exc
    key = (impl.name, type(exc))
    if key not in _warned:
        _warned.add(key)
        _log.warning("tilefly %s failed on %s (%s: %s); recomputing with ATen. "
                     "Set TILEFLY_ON_ERROR=raise to see the error.", impl.name, impl.op, type(exc).__name__, exc)
    return f"{impl.name} raised {type(exc).__name__}: {exc}"


def _make_handler(op: str, impls: tuple[Impl, ...], original) -> Callable[..., Any]:
    def handler(keyset, *args, **kwargs):
        reasons = None  # built only when an implementation declines: the served path allocates nothing
        for impl in impls:
            reason = impl.predicate(*args, **kwargs)
            if reason is None or (impl.takes_plan and reason.__class__ is not str):
                try:
                    out = impl.fn(reason, *args, **kwargs) if impl.takes_plan else impl.fn(*args, **kwargs)
                except Exception as exc:  # noqa: BLE001 - policy decides; ATen recomputes all outputs
                    reason = _failed(impl, exc)
                else:
                    if _recorders or _log.isEnabledFor(logging.DEBUG):
                        _observe(op, impl.name, None)
                    return out
            if reasons is None:
                reasons = []
            reasons.append(reason if len(impls) == 1 else f"{impl.name}: {reason}")
        if _recorders or _log.isEnabledFor(logging.DEBUG):
            _observe(op, None, "; ".join(reasons))
        return original.call_boxed(keyset, *args, **kwargs)

    handler.__name__ = f"tilefly_route_{op.replace('::', '_').replace('.', '_')}"
    return handler

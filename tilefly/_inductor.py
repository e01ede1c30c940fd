"""tilefly's candidates in Inductor's max-autotune: an InductorChoices subclass.

Op families that Inductor reaches (dense and grouped GEMM) call
``register_candidates(op_name, provider)`` when imported; a provider's ``name`` is
its family's. ``install(families)`` (called by ``tilefly.enable()``) enables those
families and sets ``torch._inductor.config.inductor_choices_class`` to
``TileflyChoices``; its ``get_template_configs`` appends the enabled providers'
``ExternKernelChoice``s for that op whenever

- max-autotune is on for GEMMs (``max_autotune`` or ``max_autotune_gemm``),
- ``max_autotune_gemm_backends`` names ``TILEFLY`` (Inductor ignores names it does
  not know, so "ATEN,TRITON,TILEFLY" is safe without tilefly), and
- ``TILEFLY_DISABLE`` is not set.

Otherwise the choice list is exactly Inductor's own. Importing a family (``explain()``
imports them all) registers it but offers nothing until it is enabled. The class goes through the
config, not ``V.set_choices_handler``, because the config enters the FX graph
cache key (through ``uuid()``): a cached graph that calls a tilefly kernel is
then never loaded by a process without tilefly installed.

Candidates are ``extern_choice``s, which Inductor's race times as the compiled graph will run
(tilefly._race_timing). A provider implements ``prepare()`` (create its choices and template
heuristics once, so generated code loaded from a cache finds them) and
``candidates(kernel_inputs, op_name)`` (the choices for one call site, after its
own eligibility checks; it must not raise for ineligible inputs).
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Protocol

from tilefly import config
from tilefly import _kernel_timing as kernel_timing
from tilefly._race_timing import extern_choice, hook_race_timing

__all__ = ["BACKEND", "extern_choice", "register_candidates", "registered", "install", "uninstall", "installed",
           "requested"]

BACKEND = "TILEFLY"
_log = logging.getLogger("tilefly.inductor")


class CandidateProvider(Protocol):
    name: str

    def prepare(self) -> None: ...

    def candidates(self, kernel_inputs: Any, op_name: str) -> list[Any]: ...


_lock = threading.RLock()
_providers: dict[str, list[CandidateProvider]] = {}
_saved_choices_class: list[Any] = []   # what inductor_choices_class was before install(); [] when not installed
_enabled: set[str] = set()             # families whose providers offer candidates


def register_candidates(op_name: str, provider: CandidateProvider) -> None:
    """Offer ``provider``'s candidates for Inductor op ``op_name`` ("mm", "addmm", ...)."""
    with _lock:
        providers = _providers.setdefault(op_name, [])
        if provider not in providers:
            providers.append(provider)
        if _saved_choices_class:
            provider.prepare()
            hook_race_timing()


def registered(op_name: str | None = None) -> list[CandidateProvider]:
    with _lock:
        if op_name is not None:
            return list(_providers.get(op_name, ()))
        seen: list[CandidateProvider] = []
        for providers in _providers.values():
            seen.extend(p for p in providers if p not in seen)
        return seen


def enabled(provider: CandidateProvider) -> bool:
    """Is ``provider``'s family enabled (tilefly.enable)?"""
    return provider.name in _enabled


def requested() -> bool:
    """Does the current Inductor config ask for TILEFLY candidates?"""
    from torch._inductor import config as inductor_config

    if config.disable:
        return False
    if not (inductor_config.max_autotune or inductor_config.max_autotune_gemm):
        return False
    names = {name.strip().upper() for name in str(inductor_config.max_autotune_gemm_backends).split(",")}
    return BACKEND in names


def _extra_choices(kernel_inputs: Any, op_name: str) -> list[Any]:
    if not requested():
        return []
    extra: list[Any] = []
    for provider in registered(op_name):
        if not enabled(provider):
            continue
        try:
            extra.extend(provider.candidates(kernel_inputs, op_name))
        except Exception as exc:  # noqa: BLE001 - a broken provider must never break compilation
            _log.warning("tilefly: %s candidates for %s skipped (%s: %s)", provider.name, op_name,
                         type(exc).__name__, exc)
    return extra


_declined_logged: set[str] = set()


def serve_or_fallback(what: str, run: Callable[[], None], unsupported: type[Exception],
                      fallback: Callable[[], None]) -> None:
    """What the generated call of a TILEFLY choice does at run time: ``run()`` the kernel. When it
    declines the real tensors (raises ``unsupported``) the reason is logged once at DEBUG; when it
    fails, ``config.on_error`` decides (raise, or warn). Either way ``fallback()`` then computes
    the result with ATen, so a result is never wrong. ``what`` names the kernel in messages."""
    from tilefly._dispatch import TileflyKernelError

    try:
        run()
        return
    except unsupported as exc:
        reason = str(exc)
        if reason not in _declined_logged:
            _declined_logged.add(reason)
            _log.debug("%s: %s; computing with ATen", what, reason)
    except Exception as exc:  # noqa: BLE001 - policy decides; ATen recomputes everything
        if config.on_error == "raise":
            raise TileflyKernelError(f"{what} failed: {type(exc).__name__}: {exc}") from exc
        _log.warning("%s failed (%s: %s); computing with ATen. Set TILEFLY_ON_ERROR=raise to see it.",
                     what, type(exc).__name__, exc)
    fallback()


def _build_choices_class():
    from torch._inductor.choices import InductorChoices

    class TileflyChoices(InductorChoices):
        """Inductor's choices plus tilefly's registered candidates (see tilefly._inductor)."""

        def get_template_configs(self, kernel_inputs, templates, op_name, kwarg_overrides=None):
            extra = _extra_choices(kernel_inputs, op_name)
            if extra:
                templates = [*templates, *extra]
            return super().get_template_configs(kernel_inputs, templates, op_name, kwarg_overrides)

        def uuid(self) -> str:
            names = ",".join(sorted(p.name for p in registered() if enabled(p)))
            return f"tilefly-choices-2:{config.gemm_autotune}:{config.gemm_race_timing}:{names}"

    # Importable as tilefly._inductor.TileflyChoices, so the config pickles by reference.
    TileflyChoices.__module__ = __name__
    TileflyChoices.__qualname__ = "TileflyChoices"
    return TileflyChoices


def __getattr__(name: str) -> Any:
    # The class is built on first use: importing torch._inductor costs seconds.
    if name == "TileflyChoices":
        with _lock:
            cls = globals().get("_choices_cls")
            if cls is None:
                cls = globals()["_choices_cls"] = _build_choices_class()
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _choices_class():
    return __getattr__("TileflyChoices")


def installed() -> bool:
    return bool(_saved_choices_class)


def install(families=()) -> None:
    """Enable ``families``' candidates and make Inductor consult tilefly's; idempotent."""
    from torch._inductor import config as inductor_config

    with _lock:
        _enabled.update(families)
        kernel_timing.install()
        if _saved_choices_class:
            return
        current = inductor_config.inductor_choices_class
        if current is not None:
            _log.warning("tilefly: torch._inductor.config.inductor_choices_class is already %r; "
                         "TILEFLY candidates are not installed", current)
            return
        for provider in registered():
            provider.prepare()
        hook_race_timing()
        _saved_choices_class.append(current)
        inductor_config.inductor_choices_class = _choices_class()
        _forget_cached_handler()


def uninstall(families=None) -> None:
    """Stop offering ``families``' candidates (default: all); once none is left, give Inductor
    its own choices back. Idempotent."""
    from torch._inductor import config as inductor_config

    with _lock:
        _enabled.difference_update(_enabled if families is None else families)
        if _enabled:
            return
        kernel_timing.uninstall()
        if not _saved_choices_class:
            return
        if inductor_config.inductor_choices_class is _choices_class():
            inductor_config.inductor_choices_class = _saved_choices_class[0]
        _saved_choices_class.clear()
        _forget_cached_handler()


def _forget_cached_handler() -> None:
    """Inductor builds its choices handler once per thread and caches it; drop this
    thread's copy so the next compile builds one from the current config."""
    try:
        from torch._inductor import virtualized
        from torch._inductor.choices import InductorChoices

        key = virtualized._choices._key
        handler = getattr(virtualized.threadlocal, key, None)
        if handler is not None and type(handler) in (InductorChoices, _choices_class()):
            delattr(virtualized.threadlocal, key)
    except Exception as exc:  # noqa: BLE001 - private API moved: the next new thread still picks it up
        _log.debug("tilefly: could not reset Inductor's cached choices handler: %s", exc)

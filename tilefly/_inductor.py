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

A provider implements ``prepare()`` (create its choices with ``extern_choice`` and template
heuristics once, so generated code loaded from a cache finds them) and
``candidates(kernel_inputs, op_name)`` (the choices for one call site, after its
own eligibility checks; it must not raise for ineligible inputs).
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Protocol

from tilefly import config

__all__ = ["BACKEND", "register_candidates", "registered", "install", "uninstall", "installed", "requested"]

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


# ---- how Inductor times tilefly's candidates ---------------------------------------------------
#
# Inductor times a candidate with a pair of events around one call after zeroing an L2-sized
# buffer. The events then also count whatever host time the call spends beyond that zeroing, and
# during a compile Python-launched kernels (ATen's and tilefly's extern calls) spend far more of
# it than alone: on the H200 a 32 x 4096 x 4096 split-K GEMM that takes 18 us on the GPU timed
# 51 us in Inductor's race and lost to a Triton template of 28 (scripts/race_probe.py). A model
# compiled with CUDA graphs spends no host time per kernel, so there the race should compare
# GPU times: tilefly's candidates are timed as a CUDA graph replay of one call, as PyTorch 2.13
# can do for any extern choice (``_benchmark_with_cudagraphs``).

def graph_timed() -> bool:
    """Whether Inductor's race times tilefly's candidates as a CUDA graph replay
    (``config.gemm_race_timing``; 'auto': when Inductor runs its output as CUDA graphs)."""
    if config.gemm_race_timing != "auto":
        return config.gemm_race_timing == "graph"
    from torch._inductor import config as inductor_config

    return bool(inductor_config.triton.cudagraphs)


def replay_ms(call: Callable[[], Any]) -> float:
    """Inductor's benchmarker timing a CUDA graph replay of ``call()``, in ms. ``call`` runs once
    first, outside the capture (its compile and first-use allocations)."""
    import torch
    from torch._inductor.runtime.benchmarking import benchmarker

    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        call()
    return benchmarker.benchmark_gpu(graph.replay)


_choice_class: list[type] = []


def extern_choice(kernel: Callable[..., Any], name: str) -> Any:
    """An ``ExternKernelChoice`` calling ``kernel`` (named ``name`` in generated code) whose bound
    candidates Inductor times as ``graph_timed()`` says; otherwise exactly Inductor's."""
    if not _choice_class:
        from torch._inductor.select_algorithm import ExternKernelCaller, ExternKernelChoice

        class TileflyCaller(ExternKernelCaller):
            def benchmark(self, *args, out):
                if graph_timed() and out.numel() > 0:
                    fn = self.to_callable()
                    try:
                        return replay_ms(lambda: fn(*args, out=out))
                    except Exception as exc:  # noqa: BLE001 - Inductor's own timing still works
                        _log.debug("tilefly: %s timed without a CUDA graph (%s: %s)", self.name,
                                   type(exc).__name__, exc)
                return super().benchmark(*args, out=out)

        class TileflyChoice(ExternKernelChoice):
            def bind(self, input_nodes, layout, ordered_kwargs_for_cpp_kernel=(), **kwargs):
                self.ordered_kwargs_for_cpp_kernel = ordered_kwargs_for_cpp_kernel
                return TileflyCaller(self, input_nodes, layout, kwargs, has_out_variant=self.has_out_variant)

        _choice_class.append(TileflyChoice)
    return _choice_class[0](kernel, name=name)


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
            return f"tilefly-choices-1:{config.gemm_autotune}:{names}"

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
        if _saved_choices_class:
            return
        current = inductor_config.inductor_choices_class
        if current is not None:
            _log.warning("tilefly: torch._inductor.config.inductor_choices_class is already %r; "
                         "TILEFLY candidates are not installed", current)
            return
        for provider in registered():
            provider.prepare()
        _saved_choices_class.append(current)
        inductor_config.inductor_choices_class = _choices_class()
        _forget_cached_handler()


def uninstall(families=None) -> None:
    """Stop offering ``families``' candidates (default: all); once none is left, give Inductor
    its own choices back. Idempotent."""
    from torch._inductor import config as inductor_config

    with _lock:
        _enabled.difference_update(_enabled if families is None else families)
        if _enabled or not _saved_choices_class:
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

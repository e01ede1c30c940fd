"""Run a suite: per case, build inputs, time each provider, derive the rest, collect metrics.

A suite module (``tilefly/bench/suites/<name>.py``) gives the runner a ``Suite``:
its cases, its quick subset, and ``plan()``, called once on the GPU, which
returns a ``Plan``: table notes, comparisons, metric columns and
``bench(case)``, which builds one case's inputs and its ``CaseBench``.

One failing provider (a backend that refuses the case, a Triton template that
does not compile) becomes a note on that provider; a case whose inputs cannot
be built gets a ``setup`` entry saying why; the run goes on.
"""
from __future__ import annotations

import contextlib
import random
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterable

import torch

from tilefly.bench import timing
from tilefly.bench.cases import Case
from tilefly.bench.results import CaseResult, Comparison, ProviderResult, SuiteResult, partial_note, summarize


@dataclass
class Provider:
    """One way of computing the case. ``build`` runs inside ``context`` just before warm-up and
    returns the callable to time (so a compiled provider compiles inside its config patch);
    ``family`` names the eager tilefly family whose dispatch decision is recorded."""

    name: str
    build: Callable[[], Callable[[], Any]] | None
    context: Callable[[], ContextManager[Any]] = contextlib.nullcontext
    family: str | None = None
    error_label: str = "error"   # how a raising provider is shown: "error: ..." or e.g. "n/a: ..."
    note: str | None = None      # shown when build is None (not applicable), or alongside the timing
    inspect: Callable[[], str | None] | None = None  # after timing: a note (e.g. which kernel Inductor picked)


@dataclass
class Derived:
    """A provider computed from others: the faster of ``of`` per case (e.g. best(aten,triton))."""

    name: str
    of: tuple[str, ...]


@dataclass
class CaseBench:
    providers: list[Provider]
    metrics: Callable[[str, float], dict[str, float]]  # (provider, median µs) -> {metric: value}
    derived: list[Derived] = field(default_factory=list)


@dataclass
class Plan:
    bench: Callable[[Case], CaseBench]
    comparisons: list[Comparison]
    metric_columns: list[str]
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Suite:
    name: str
    title: str
    cases: Callable[[], list[Case]]
    quick: tuple[int, ...]            # indices into cases()
    plan: Callable[[], Plan]


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def short(exc: BaseException, limit: int = 160, with_type: bool = True) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    msg = f"{type(exc).__name__}: {first}" if first and with_type else first or type(exc).__name__
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


def _dispatch_outcome(provider: Provider, fn: Callable[[], Any]) -> tuple[bool, str | None]:
    """Call ``fn`` once while recording the router's decisions for ``provider.family``."""
    from tilefly import _dispatch

    ops = {impl.op for impl in _dispatch.registered(provider.family)}
    with _dispatch.recording() as decisions:
        fn()
    _sync()
    mine = [d for d in decisions if d.op in ops]
    if not mine:
        return False, "the call did not reach tilefly's router"
    reasons = list(dict.fromkeys(d.reason for d in mine if d.impl is None))
    if reasons:
        return False, "; ".join(r or "?" for r in reasons)
    return True, None


def run_provider(provider: Provider, policy: timing.Policy) -> ProviderResult:
    if provider.build is None:
        return ProviderResult(note=provider.note or "n/a")
    try:
        with provider.context():
            fn = provider.build()
            t = timing.measure(fn, policy)
            served, reason = _outcome(provider, fn)
            return _timed_result(provider, t, served, reason)
    except Exception as exc:  # noqa: BLE001 - a provider failing is a result, not a crash
        return _failed(provider, exc)
    finally:
        _sync()


def _outcome(provider: Provider, fn: Callable[[], Any]) -> tuple[bool | None, str | None]:
    return _dispatch_outcome(provider, fn) if provider.family is not None else (None, None)


def _timed_result(provider: Provider, t: timing.Timing, served: bool | None, reason: str | None) -> ProviderResult:
    """The provider's result once timed (inside its context: ``inspect`` may ask what ran)."""
    notes = [provider.note] if provider.note else []
    if reason:
        notes.append(f"fallback: {reason}")
    if provider.inspect is not None:
        extra = provider.inspect()
        if extra:
            notes.append(extra)
    return ProviderResult(t.median_us, t.p20_us, t.p80_us, served, "; ".join(notes) or None, t.reps)


def _failed(provider: Provider, exc: BaseException) -> ProviderResult:
    unexpected = provider.error_label == "error"
    if unexpected:
        traceback.print_exc(file=sys.stderr)
    return ProviderResult(note=f"{provider.error_label}: {short(exc, with_type=unexpected)}")


def run_providers_interleaved(providers: list[Provider], policy: timing.Policy) -> dict[str, ProviderResult]:
    """``policy.rounds`` rounds over the providers in turn, each round a 1/rounds share of every
    provider's repetitions inside its context, so that clock drift over a case (boost clocks
    follow power and temperature) reaches every provider alike. After the first round each round
    takes the providers in a shuffled order (seeded by the round): a provider timed right after a
    low-power one gets higher clocks, and any fixed cyclic order, rotated or not, keeps the same
    neighbours every round (an attention bench read PyTorch's default 3-9 % faster than the same
    cuDNN kernel forced, timed each round after the slowest provider). Warm-up and dispatch
    recording once per provider, before the first round. Results in ``providers`` order."""
    results: dict[str, ProviderResult] = {}
    ready: dict[str, tuple[Provider, Callable[[], Any], int, bool | None, str | None]] = {}
    for provider in providers:
        if provider.build is None:
            results[provider.name] = ProviderResult(note=provider.note or "n/a")
            continue
        try:
            with provider.context():
                fn = provider.build()
                reps = -(-timing.warm(fn, policy) // policy.rounds)
                ready[provider.name] = (provider, fn, reps, *_outcome(provider, fn))
        except Exception as exc:  # noqa: BLE001 - a provider failing is a result, not a crash
            results[provider.name] = _failed(provider, exc)
        finally:
            _sync()
    times: dict[str, list[float]] = {name: [] for name in ready}
    for rnd in range(policy.rounds):
        for name in _round_order(list(ready), rnd):
            if name not in ready:
                continue
            provider, fn, reps, _, _ = ready[name]
            try:
                with provider.context():
                    times[name] += timing.sample(fn, reps, headstart_us=policy.headstart_us)
            except Exception as exc:  # noqa: BLE001
                results[name] = _failed(provider, exc)
                del ready[name]
            finally:
                _sync()
    for name, (provider, _, _, served, reason) in ready.items():
        try:
            with provider.context():
                results[name] = _timed_result(provider, timing.summary(times[name]), served, reason)
        except Exception as exc:  # noqa: BLE001
            results[name] = _failed(provider, exc)
    return {p.name: results[p.name] for p in providers}


def _round_order(names: list[str], rnd: int) -> list[str]:
    if rnd == 0:
        return names
    order = list(names)
    random.Random(rnd).shuffle(order)
    return order


def _derive(derived: Derived, results: dict[str, ProviderResult]) -> ProviderResult:
    timed = [(results[n].median_us, n) for n in derived.of if n in results and results[n].median_us]
    if not timed:
        return ProviderResult(note=f"n/a: none of {', '.join(derived.of)} timed")
    _, best = min(timed)
    src = results[best]
    return ProviderResult(src.median_us, src.p20_us, src.p80_us, None, f"= {best}", src.reps)


def run_case(case: Case, plan: Plan, policy: timing.Policy) -> CaseResult:
    result = CaseResult(case=dict(case.columns), id=case.id, index=case.index)
    try:
        bench = plan.bench(case)
    except Exception as exc:  # noqa: BLE001 - e.g. out of memory building inputs
        traceback.print_exc(file=sys.stderr)
        result.providers["setup"] = ProviderResult(note=f"error: {short(exc)}")
        return result
    if policy.rounds > 1:
        result.providers.update(run_providers_interleaved(bench.providers, policy))
    else:
        for provider in bench.providers:
            result.providers[provider.name] = run_provider(provider, policy)
    for derived in bench.derived:
        result.providers[derived.name] = _derive(derived, result.providers)
    for name, res in result.providers.items():
        if res.median_us:
            for metric, value in bench.metrics(name, res.median_us).items():
                result.metrics.setdefault(metric, {})[name] = value
    del bench
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result


def progress(items: list[Case], label: str) -> Iterable[Case]:
    """tqdm on stderr when installed, else one line per item."""
    try:
        from tqdm import tqdm
    except ImportError:
        for i, item in enumerate(items, 1):
            print(f"[{label}] {i}/{len(items)} {item.id}", file=sys.stderr, flush=True)
            yield item
        return
    bar = tqdm(items, desc=label, file=sys.stderr, unit="case", dynamic_ncols=True)
    for item in bar:
        bar.set_postfix_str(item.id, refresh=True)
        yield item


def run_suite(suite: Suite, cases: list[Case], policy: timing.Policy, quick: bool, env: dict[str, str],
              checkpoint: Callable[[SuiteResult], None] | None = None) -> SuiteResult:
    """Time ``cases`` of ``suite`` with tilefly disabled outside its own providers (restored after).

    ``checkpoint`` gets the result of the cases timed so far after each case, so a run stopped
    from outside (a step time limit) still leaves every finished case behind."""
    import tilefly

    before = tilefly.enabled_ops()
    tilefly.disable()
    timing.RUN_HEADSTART_US = policy.headstart_us
    try:
        plan = suite.plan()

        def result_of(results: list[CaseResult]) -> SuiteResult:
            notes = list(plan.notes)
            if len(results) < len(cases):  # a checkpoint: says so in the table's notes if the run stops here
                notes.append(partial_note(len(results), len(cases)))
            return SuiteResult(suite=suite.name, title=suite.title, quick=quick, cases=list(results),
                               summary=summarize(results, plan.comparisons), notes=notes,
                               comparisons=list(plan.comparisons), metric_columns=list(plan.metric_columns),
                               timing=policy.describe(), **env)

        results: list[CaseResult] = []
        for case in progress(cases, suite.name):
            results.append(run_case(case, plan, policy))
            if checkpoint is not None:
                checkpoint(result_of(results))
    finally:
        timing.RUN_HEADSTART_US = 0.0
        tilefly.disable()
        if before:
            tilefly.enable(before)
    return result_of(results)

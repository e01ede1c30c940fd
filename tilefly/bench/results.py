"""What a benchmark run produces, as plain dataclasses that turn into JSON and back.

A ``SuiteResult`` is everything ``report.py`` needs to render a suite again
(``python -m tilefly bench --render FILE.json``): the environment, every case
with each provider's timing, the metrics per provider, and the comparisons
whose per-case ratios and geometric means make the summary.

Ratios read "X/Y = how many times faster X is than Y" = time(Y) / time(X);
above 1 means X wins. Geometric means weight every case equally and include
losses; a case enters a comparison only when both providers were timed.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA_VERSION = 1


@dataclass
class ProviderResult:
    median_us: float | None = None   # None: not timed (n/a, error); ``note`` says why
    p20_us: float | None = None
    p80_us: float | None = None
    served: bool | None = None       # eager tilefly providers: did tilefly's kernel run? None elsewhere
    note: str | None = None          # "n/a: ...", "fallback: ...", "config bm128_bn256", ...
    reps: int | None = None


@dataclass
class CaseResult:
    case: dict[str, Any]             # the columns that define the case
    id: str
    providers: dict[str, ProviderResult] = field(default_factory=dict)
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)  # metric -> provider -> value
    index: int | None = None         # position in the suite's full case list


@dataclass(frozen=True)
class Comparison:
    """``provider`` against ``baseline`` (both provider names), over the cases matching ``where``."""

    name: str
    provider: str
    baseline: str
    where: tuple[tuple[str, Any], ...] = ()

    def matches(self, case: dict[str, Any]) -> bool:
        return all(case.get(key) == value for key, value in self.where)


@dataclass
class SuiteResult:
    suite: str
    gpu: str
    torch: str
    triton: str
    tilefly: str
    commit: str
    date: str
    quick: bool
    cases: list[CaseResult] = field(default_factory=list)
    summary: dict[str, dict[str, float | int]] = field(default_factory=dict)
    title: str = ""
    notes: list[str] = field(default_factory=list)          # table header lines (e.g. "baseline-only: ...")
    comparisons: list[Comparison] = field(default_factory=list)
    metric_columns: list[str] = field(default_factory=list)  # metrics shown in the table, in order
    timing: str = ""                                         # how the numbers were taken, one line

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["schema"] = SCHEMA_VERSION
        out["comparisons"] = [
            {"name": c.name, "provider": c.provider, "baseline": c.baseline, "where": dict(c.where)}
            for c in self.comparisons
        ]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SuiteResult":
        cases = [
            CaseResult(
                case=dict(c["case"]),
                id=c["id"],
                providers={name: ProviderResult(**p) for name, p in c.get("providers", {}).items()},
                metrics={m: dict(v) for m, v in c.get("metrics", {}).items()},
                index=c.get("index"),
            )
            for c in data.get("cases", [])
        ]
        comparisons = [
            Comparison(c["name"], c["provider"], c["baseline"], tuple(c.get("where", {}).items()))
            for c in data.get("comparisons", [])
        ]
        simple = {k: data[k] for k in ("suite", "gpu", "torch", "triton", "tilefly", "commit", "date", "quick")}
        return cls(**simple, cases=cases, summary=dict(data.get("summary", {})), title=data.get("title", ""),
                   notes=list(data.get("notes", [])), comparisons=comparisons,
                   metric_columns=list(data.get("metric_columns", [])), timing=data.get("timing", ""))


def ratio(case: CaseResult, provider: str, baseline: str) -> float | None:
    """time(baseline) / time(provider) for one case, None unless both were timed."""
    p, b = case.providers.get(provider), case.providers.get(baseline)
    if p is None or b is None or not p.median_us or not b.median_us:
        return None
    return b.median_us / p.median_us


def geomean(values: list[float]) -> float:
    if not values:
        raise ValueError("geomean of no values")
    if any(v <= 0 for v in values):
        raise ValueError(f"geomean needs positive values, got {values}")
    return math.exp(sum(math.log(v) for v in values) / len(values))


def summarize(cases: list[CaseResult], comparisons: list[Comparison]) -> dict[str, dict[str, float | int]]:
    """One entry per comparison with at least one timed case: geomean, min, max, n, n_fallback
    (cases where the provider was an eager tilefly route that fell back to ATen: they count,
    since that is what a user gets)."""
    summary: dict[str, dict[str, float | int]] = {}
    for comp in comparisons:
        values, fallbacks = [], 0
        for case in cases:
            if not comp.matches(case.case):
                continue
            r = ratio(case, comp.provider, comp.baseline)
            if r is None:
                continue
            values.append(r)
            fallbacks += case.providers[comp.provider].served is False
        if values:
            summary[comp.name] = {"geomean": geomean(values), "min": min(values), "max": max(values),
                                  "n": len(values), "n_fallback": fallbacks}
    return summary


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 1]) of an already sorted list."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


_PARTIAL = re.compile(r"partial: the run stopped after \d+ of its (\d+) cases \(a checkpoint\)")


def partial_note(done: int, total: int) -> str:
    """The note a checkpoint of a run that has timed ``done`` of its ``total`` cases carries."""
    return f"partial: the run stopped after {done} of its {total} cases (a checkpoint)"


def merge(parts: list[SuiteResult]) -> SuiteResult:
    """One result from several runs of the same suite (e.g. a suite split over two device calls):
    cases by index (a later part wins a case both ran), environment of the latest part, summary
    recomputed. Differing environments are noted in the header; differing timing policies (e.g.
    one run with ``--headstart-us``) are refused."""
    if not parts:
        raise ValueError("nothing to merge")
    suites = {p.suite for p in parts}
    if len(suites) != 1:
        raise ValueError(f"cannot merge different suites: {sorted(suites)}")
    timings = {p.timing for p in parts}
    if len(timings) > 1:  # one header states one policy: a held run and an unheld one measure different things
        raise ValueError(f"cannot merge runs timed differently: {sorted(timings)}")
    parts = sorted(parts, key=lambda p: p.date)
    latest = parts[-1]
    cases: dict[Any, CaseResult] = {}
    for part in parts:
        for case in part.cases:
            cases[case.index if case.index is not None else case.id] = case
    merged = SuiteResult(**{k: getattr(latest, k) for k in ("suite", "gpu", "torch", "triton", "tilefly", "commit",
                                                            "date", "title", "timing")},
                         quick=all(p.quick for p in parts),
                         cases=sorted(cases.values(), key=lambda c: (c.index is None, c.index or 0, c.id)))
    totals = []
    for part in parts:
        for note in part.notes:
            partial = _PARTIAL.fullmatch(note)
            if partial:  # restated below for the merged cases, or dropped once they are all there
                totals.append(int(partial.group(1)))
            elif note not in merged.notes:
                merged.notes.append(note)
        merged.comparisons += [c for c in part.comparisons if c.name not in {m.name for m in merged.comparisons}]
        merged.metric_columns += [m for m in part.metric_columns if m not in merged.metric_columns]
    if totals and len(merged.cases) < max(totals):
        merged.notes.append(partial_note(len(merged.cases), max(totals)))
    envs = {(p.gpu, p.torch, p.triton, p.tilefly, p.commit) for p in parts}
    if len(envs) > 1:
        merged.notes.append(f"merged from {len(parts)} runs with different environments: {sorted(envs)}")
    merged.summary = summarize(merged.cases, merged.comparisons)
    return merged

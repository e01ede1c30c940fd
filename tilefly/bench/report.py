"""Render a ``SuiteResult`` (or its JSON) as Markdown, JSON and a PNG plot.

Everything here works from the result alone, so ``python -m tilefly bench --render FILE.json``
redraws a committed result without a GPU. Provider names may carry a mode after a colon
(``aten:det``, ``tilefly:fwd+bwd``): each mode gets its own table and plot row.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any

from tilefly.bench.results import CaseResult, SuiteResult, geomean, ratio

REASON_WIDTH = 60


def load(path: str) -> SuiteResult:
    with open(path, encoding="utf-8") as f:
        return SuiteResult.from_dict(json.load(f))


def write_json(result: SuiteResult, path: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(result.to_dict(), f, indent=1, allow_nan=False)
        f.write("\n")


def write_partial(result: SuiteResult, path: str) -> None:
    """``write_json`` through a temporary file, so a run killed mid-write leaves the previous
    checkpoint whole (``--merge`` reads it like any result)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_json(result, path + ".tmp")
    os.replace(path + ".tmp", path)


def num(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def times(value: float) -> str:
    return f"{value:.2f}x"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _clip(text: str, width: int = REASON_WIDTH) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def split_mode(provider: str) -> tuple[str, str]:
    base, _, mode = provider.partition(":")
    return base, mode


def modes(result: SuiteResult) -> dict[str, list[str]]:
    """mode -> provider names in first-seen order ("" for providers without a mode)."""
    out: dict[str, list[str]] = {}
    for case in result.cases:
        for name in case.providers:
            group = out.setdefault(split_mode(name)[1], [])
            if name not in group:
                group.append(name)
    return out


def pairs(result: SuiteResult, providers: list[str]) -> list[tuple[str, str]]:
    """(provider, baseline) pairs of the comparisons that live in one mode's table."""
    seen: list[tuple[str, str]] = []
    for comp in result.comparisons:
        pair = (comp.provider, comp.baseline)
        if comp.provider in providers and comp.baseline in providers and pair not in seen:
            seen.append(pair)
    return seen


def _label(pair: tuple[str, str]) -> str:
    return f"{split_mode(pair[0])[0]}/{split_mode(pair[1])[0]}"


def _provider_cell(case: CaseResult, name: str, metrics: list[str]) -> str:
    res = case.providers.get(name)
    if res is None:
        return ""
    if not res.median_us:
        return _clip((res.note or "n/a").split(":")[0], 12)
    values = [num(case.metrics[m][name]) for m in metrics if name in case.metrics.get(m, {})]
    return num(res.median_us) + (f" ({' · '.join(values)})" if values else "")


def _ratio_cell(case: CaseResult, pair: tuple[str, str]) -> str:
    res = case.providers.get(pair[0])
    r = ratio(case, *pair)
    if res is not None and res.served is False:
        reason = (res.note or "").split("fallback: ", 1)[-1]
        return "fallback: " + _clip(reason)
    return times(r) if r is not None else ""


def _notes_cell(case: CaseResult, providers: list[str]) -> str:
    notes = []
    for name in providers:
        res = case.providers.get(name)
        if res is not None and res.note and res.served is not False:
            notes.append(f"{split_mode(name)[0]}: {_clip(res.note, 90)}")
    return "; ".join(notes)


def _table(result: SuiteResult, providers: list[str]) -> list[str]:
    columns = [k for k, v in (result.cases[0].case.items() if result.cases else []) if not isinstance(v, (dict, list))]
    metrics = [m for m in result.metric_columns if any(m in c.metrics for c in result.cases)]
    unit = f"µs ({' · '.join(metrics)})" if metrics else "µs"
    ratio_pairs = pairs(result, providers)
    head = ["#", *columns, *(f"{split_mode(p)[0]} {unit}" for p in providers), *map(_label, ratio_pairs), "notes"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" if h != "notes" else "---" for h in head) + "|"]
    for case in result.cases:
        row = [case.index if case.index is not None else "", *(case.case.get(c, "") for c in columns),
               *(_provider_cell(case, p, metrics) for p in providers),
               *(_ratio_cell(case, pair) for pair in ratio_pairs), _notes_cell(case, providers)]
        lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
    if ratio_pairs:
        means = []
        for pair in ratio_pairs:
            values = [r for r in (ratio(c, *pair) for c in result.cases) if r is not None]
            means.append(f"**{times(geomean(values))}**" if values else "")
        lines.append("| " + " | ".join(["**geomean**", *[""] * (len(columns) + len(providers)), *means, ""]) + " |")
    return lines


def summary_lines(result: SuiteResult) -> list[str]:
    lines = []
    for name, s in result.summary.items():
        fallback = f", {s['n_fallback']} fell back to ATen" if s.get("n_fallback") else ""
        lines.append(f"- `{name}`: geomean **{times(s['geomean'])}** (min {times(s['min'])}, "
                     f"max {times(s['max'])}, n={s['n']}{fallback})")
    return lines


def _short_commit(commit: str) -> str:
    is_sha = len(commit) == 40 and all(c in "0123456789abcdef" for c in commit)
    return commit[:12] if is_sha else commit


def markdown(result: SuiteResult) -> str:
    run = "quick subset" if result.quick else "full"
    lines = [f"## {result.suite}: {result.title}" if result.title else f"## {result.suite}", "",
             f"GPU {result.gpu} · torch {result.torch} · triton {result.triton} · tilefly {result.tilefly} · "
             f"commit {_short_commit(result.commit)} · {result.date} · {run} ({len(result.cases)} cases)"]
    if result.timing:
        lines.append(f"Timing: {result.timing}.")
    if result.notes:
        lines += ["", *(f"> {note}  " for note in result.notes)]
    by_mode = modes(result)
    for mode, providers in by_mode.items():
        lines.append("")
        if mode or len(by_mode) > 1:
            lines += [f"### {mode or 'all'}", ""]
        lines += _table(result, providers)
    if result.summary:
        lines += ["", "Summary (X/Y = time of Y / time of X; above 1x, X is faster):", *summary_lines(result)]
    return "\n".join(lines) + "\n"


def plot(result: SuiteResult, path: str) -> str | None:
    """Write a PNG: per mode, the first metric per provider and the speedups per case.
    Returns None on success, or why no plot was written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return "matplotlib is not installed (pip install 'tilefly[bench]'): no PNG written"
    metric = next((m for m in result.metric_columns if any(m in c.metrics for c in result.cases)), None)
    labels = [c.id for c in result.cases]
    panels = []  # (title, ylabel, series, is_speedup)
    for mode, providers in modes(result).items():
        values = {p: [c.metrics.get(metric, {}).get(p) if metric else None for c in result.cases] for p in providers}
        panels.append((f"{result.suite} {mode}".strip(), metric or "", values, False))
        ratio_pairs = pairs(result, providers)
        if ratio_pairs:
            speedups = {_label(p): [ratio(c, *p) for c in result.cases] for p in ratio_pairs}
            panels.append((f"{result.suite} {mode}".strip() + " speedups (log scale)", "speedup (x)", speedups, True))
    fig, axes = plt.subplots(len(panels), 1, squeeze=False,
                             figsize=(max(8.0, 0.32 * len(labels) + 3), 3.4 * len(panels)))
    for ax, (title, ylabel, series, is_speedup) in zip(axes[:, 0], panels):
        _bars(ax, labels, series, ylabel, title, reference=1.0 if is_speedup else None)
        if is_speedup:
            ax.set_yscale("log")
            for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
                axis(matplotlib.ticker.FormatStrFormatter("%gx"))
    fig.suptitle(f"{result.suite} · {result.gpu} · torch {result.torch} · {result.date[:10]}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def _bars(ax, labels: list[str], series: dict[str, list[float | None]], ylabel: str, title: str,
          reference: float | None = None) -> None:
    series = {k: v for k, v in series.items() if any(x is not None for x in v)}
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(labels))]
        ax.bar(xs, [v if v is not None else math.nan for v in values], width, label=split_mode(name)[0])
    if reference is not None:
        ax.axhline(reference, color="black", linewidth=0.8)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    if series:
        ax.legend(fontsize=7)


def write_all(result: SuiteResult, out_dir: str, png: bool = True, json_too: bool = True) -> list[str]:
    """Write <suite>.json, <suite>.md and <suite>.png into ``out_dir``; returns what was written
    (and why the plot was skipped, if it was)."""
    os.makedirs(out_dir, exist_ok=True)
    base = os.path.join(out_dir, result.suite)
    written = []
    if json_too:
        write_json(result, base + ".json")
        written.append(base + ".json")
    with open(base + ".md", "w", encoding="utf-8") as f:
        f.write(markdown(result))
    written.append(base + ".md")
    if png:
        why_not = plot(result, base + ".png")
        written.append(why_not or base + ".png")
    return written

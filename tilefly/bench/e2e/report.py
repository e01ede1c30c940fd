"""E2E results: merge per-call JSONs into one report (Markdown, JSON, PNG).

A run file (``run_ab``'s record plus the environment) holds one model x precision and its
concurrencies. ``merge`` groups any number of them by (model, precision); a concurrency measured
twice keeps the later run (by ``date``). MX tables show the BF16 model's side-B throughput
beside them when a BF16 run of the same model is among the inputs (the issue's second target).
Single-side runs (``--side``) are first paired by model, precision and concurrency (split.py);
a side without its other half becomes a row with the other side's columns empty and a note.
"""
from __future__ import annotations

import json
import os
import textwrap
from typing import Any

from tilefly.bench.e2e import profile as e2e_profile
from tilefly.bench.e2e import split
from tilefly.bench.report import _short_commit, num, times

KIND = "tilefly-e2e"
MERGED_KIND = "tilefly-e2e-merged"


def load(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if data.get("kind") not in (KIND, MERGED_KIND):
        raise ValueError(f"{path} is not an e2e result (kind={data.get('kind')!r})")
    if data["kind"] == KIND:
        data["source"] = path  # names the file when a pair is refused; the merge drops it
    return data


def _runs(data: dict[str, Any]) -> list[dict[str, Any]]:
    return list(data["runs"]) if data.get("kind") == MERGED_KIND else [data]


def _setup(run: dict[str, Any]) -> tuple[Any, ...]:
    """What a run measured, but for its precision and MX scale layout."""
    return run["model"], run["input_len"], run["output_len"], run.get("compile_mode"), split.attention(run)


def _key(run: dict[str, Any]) -> tuple[Any, ...]:
    """Runs merge into one table only when they measured the same thing."""
    return (*_setup(run), run["precision"], split.mx_swizzle(run), split.options(run))


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One merged record: ``runs`` = one entry per (model, precision), rows sorted by concurrency."""
    if not parts:
        raise ValueError("nothing to merge")
    runs = sorted((run for part in parts for run in _runs(part)), key=lambda r: r.get("date", ""))
    grouped: dict[tuple[str, str], dict[str, Any]] = {}
    for run in sorted(split.pair(runs), key=lambda r: r.get("date", "")):
        key = _key(run)
        meta = {k: v for k, v in run.items() if k not in ("rows", "source", "side")}
        target = grouped.setdefault(key, {**meta, "rows": {}})
        earlier_env = _env(target)
        # the latest run's environment; a side-A-only run must not drop B's description
        target.update({**meta, "sides": {**target.get("sides", {}), **meta.get("sides", {})}})
        for row in run["rows"]:
            c = row["concurrency"]
            target["rows"][c] = _carry_other_side(target["rows"].get(c), earlier_env, row, run)
    merged_runs = []
    for run in grouped.values():
        run["rows"] = [run["rows"][c] for c in sorted(run["rows"])]
        merged_runs.append(run)
    envs = sorted({(r.get("gpu", "?"), r.get("torch", "?"), r.get("commit", "?")) for r in runs})
    return {"kind": MERGED_KIND, "schema": 1, "runs": merged_runs,
            "notes": [f"merged from runs with different environments: {envs}"] if len(envs) > 1 else []}


def _env(run: dict[str, Any]) -> dict[str, Any]:
    """What two sides of one row must share (split.MUST_MATCH: weights, lengths, torch, GPU, ...)."""
    return {k: run.get(k) for k in split.MUST_MATCH}


def _side_commit(row: dict[str, Any], side: str, run_commit: str | None) -> str | None:
    return row.get("commits", {}).get(side, row.get("commit", run_commit))


def _measured(row: dict[str, Any] | None) -> list[str]:
    return [s for s in ("A", "B") if "tok_s" in (row or {}).get(s, {})]


def _carry_other_side(earlier: dict[str, Any] | None, earlier_env: dict[str, Any], row: dict[str, Any],
                      run: dict[str, Any]) -> dict[str, Any]:
    """The row to keep for a concurrency, ``row`` being the later one. Usually ``row`` itself; but
    when it measured one side only and ``earlier`` holds the other, measured in the same environment
    (split.MUST_MATCH, each row keeping its own as ``env``) and on the same prompts, the two together:
    a side-B rerun must not drop the stock path's figure it is compared with. Both sides' commits are
    named, and the logits stay uncompared (merged rows keep no record). A later row that measured
    nothing (an error) does not replace an earlier one that did."""
    stamped = {**row, "commit": row.get("commit", run.get("commit")), "env": row.get("env", _env(run))}
    sides = _measured(row)
    if earlier is not None and _measured(earlier) and not sides:
        return earlier
    if earlier is None or len(sides) != 1:
        return stamped
    side = sides[0]
    other = "B" if side == "A" else "A"
    same = earlier.get("env", earlier_env) == stamped["env"] and earlier.get("prompts_sha") == row.get("prompts_sha")
    if other not in _measured(earlier) or not same:
        return stamped
    both = {k: v for k, v in stamped.items() if k not in ("note", "agreement", "speedup")}
    both[other] = earlier[other]
    both["commits"] = {other: _side_commit(earlier, other, None), side: _side_commit(stamped, side, None)}
    both["speedup"] = both["B"]["tok_s"] / both["A"]["tok_s"]
    both["note"] = f"{other} carried over from an earlier merge; logits not compared"
    return both


def _bf16_b(merged: dict[str, Any], run: dict[str, Any]) -> dict[int, float]:
    """The BF16 model's side-B tok/s per concurrency, from the run that matches ``run`` but for precision
    (tilefly options included)."""
    for other in merged["runs"]:   # a BF16 run with other tilefly options set is an experiment, not the baseline
        if (other["precision"] == "bf16" and _setup(other) == _setup(run)
                and split.options(other) == split.options(run)):
            return {row["concurrency"]: row["B"]["tok_s"] for row in other["rows"] if "tok_s" in row.get("B", {})}
    return {}


def _tok_s(row: dict[str, Any], side: str) -> str:
    res = row.get(side, {})
    return num(res["tok_s"]) if "tok_s" in res else ("error" if "error" in res else "")


def _agreement(row: dict[str, Any]) -> str:
    agree = row.get("agreement")
    if not agree:
        return ""
    err = agree.get("max_rel_err")
    verdict = "ok" if agree.get("ok") else "**MISMATCH**"
    return f"{verdict} ({err:.1e}, tokens {100 * agree['token_match']:.0f}%)" if err is not None else verdict


def run_table(run: dict[str, Any], bf16_b: dict[int, float]) -> list[str]:
    mx = run["precision"] != "bf16" and bool(bf16_b)
    head = ["concurrency", "A tok/s", "B tok/s", "B/A", "A TPOT ms", "B TPOT ms", "A TTFT ms", "B TTFT ms",
            "compile A/B s", *(["BF16 B tok/s", "B/BF16"] if mx else []), "A vs B logits", "notes"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" if h != "notes" else "---" for h in head) + "|"]
    for row in run["rows"]:
        a, b = row.get("A", {}), row.get("B", {})
        speed = times(row["speedup"]) if row.get("speedup") else ""
        compile_s = "/".join(f"{x['compile_s']:.0f}" if "compile_s" in x else "-" for x in (a, b))
        cells = [row["concurrency"], _tok_s(row, "A"), _tok_s(row, "B"), speed,
                 *(f"{x['tpot_ms']:.2f}" if "tpot_ms" in x else "" for x in (a, b)),
                 *(f"{x['ttft_ms']:.0f}" if "ttft_ms" in x else "" for x in (a, b)), compile_s]
        if mx:
            ref = bf16_b.get(row["concurrency"])
            cells += [num(ref) if ref else "", times(b["tok_s"] / ref) if ref and "tok_s" in b else ""]
        notes = [f"{side}: {row[side]['error']}" for side in ("A", "B") if "error" in row.get(side, {})]
        notes += [f"{side}: CUDA graphs skipped {row[side]['cudagraph_skips']}x" for side in ("A", "B")
                  if row.get(side, {}).get("cudagraph_skips")]
        if row.get("winners"):
            notes.append(f"B's GEMMs: {row['winners']}")
        if "profile" in b:
            notes += [f"B's tilefly GEMM kernels a step (profile): {kernels}"
                      for kernels in [e2e_profile.tilefly_gemms(b["profile"])] if kernels]
        notes += [row["note"]] if row.get("note") else ["separate runs"] if row.get("split") else []
        if row.get("commits"):
            notes.append("A at commit {A}, B at {B}".format(**row["commits"]))
        cells += [_agreement(row), "; ".join(notes)]
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return lines


def _title(run: dict[str, Any]) -> str:
    """Model, precision and what else keeps runs apart (the default scale layout goes unsaid)."""
    layout = "" if split.mx_swizzle(run) in (None, "32_4_4") else f" · {split.mx_swizzle(run)} scale layout"
    options = f" · {split.options(run)}" if split.options(run) else ""
    eager = "" if run.get("compile_mode") else " · eager"
    return f"{run['model']} · {run['precision']}{eager} · {split.attention(run)} attention{layout}{options}"


def markdown(merged: dict[str, Any]) -> str:
    lines = ["## e2e: LLM decoding throughput, A (ATEN,TRITON) vs B (ATEN,TRITON,TILEFLY)", ""]
    lines += [f"> {note}" for note in merged.get("notes", [])]
    for run in merged["runs"]:
        sides = run.get("sides", {})
        mx_note = (f"; MX layers: A {sides.get('A', {}).get('mx_backend')}, B {sides.get('B', {}).get('mx_backend')}"
                   if run["precision"] != "bf16" else "")
        lines += ["", f"### {_title(run)}", "",
                  f"GPU {run.get('gpu', '?')} · torch {run.get('torch', '?')} · transformers "
                  f"{run.get('transformers', '?')} · commit {_short_commit(run.get('commit', 'unknown'))} · "
                  f"{run.get('date', '?')}  ",
                  f"{run['input_len']} input + {run['output_len']} output tokens per request, greedy, static KV "
                  f"cache; compile mode {run.get('compile_mode')}; tok/s = output tokens / (prefill + decode), "
                  f"best of {run.get('runs', 1)} run(s); compile and autotuning excluded (column compile){mx_note}.",
                  "", *run_table(run, _bf16_b(merged, run))]
        profiled = [(row["concurrency"], side, row[side]["profile"]) for row in run["rows"]
                    for side in ("A", "B") if "profile" in row.get(side, {})]
        if profiled:
            lines += [""] + [f"- decode profile, {n} requests, side {side}: {e2e_profile.describe(table)}"
                             for n, side, table in profiled]
        if any(row.get("split") for row in run["rows"]):
            lines += ["", f"*separate runs*: A and B ran in separate processes (`--side`); their logits are "
                      f"compared on the top {split.TOPK} of every request and all of request 0's at step "
                      f"{split.FULL_STEP}."]
    return "\n".join(lines) + "\n"


def plot(merged: dict[str, Any], path: str) -> str | None:
    """Throughput vs concurrency, A and B, one panel per (model, precision). None on success,
    else why no PNG was written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'tilefly[bench]'): no PNG written"
    runs = merged["runs"]
    cols = min(3, len(runs))
    rows = -(-len(runs) // cols)
    fig, axes = plt.subplots(rows, cols, squeeze=False, figsize=(4.8 * cols, 3.6 * rows))
    for ax in axes.flat[len(runs):]:
        ax.set_visible(False)
    for ax, run in zip(axes.flat, runs):
        for side, style, color in (("A", "o--", "C0"), ("B", "s-", "C1")):
            pts = [(r["concurrency"], r[side]["tok_s"]) for r in run["rows"] if "tok_s" in r.get(side, {})]
            if pts:
                ax.plot(*zip(*pts), style, color=color,
                        label=f"{side}: {run.get('sides', {}).get(side, {}).get('backends', side)}")
        ref = sorted(_bf16_b(merged, run).items()) if run["precision"] != "bf16" else []
        if ref:
            ax.plot(*zip(*ref), "^:", color="gray", label="B of the BF16 model")
        concurrencies = sorted({r["concurrency"] for r in run["rows"]} | {c for c, _ in ref})
        ax.set_xscale("log", base=2)
        ax.set_xticks(concurrencies, [str(c) for c in concurrencies])
        ax.minorticks_off()
        ax.set_xlabel("concurrency")
        ax.set_ylabel("output tok/s")
        ax.set_ylim(bottom=0)
        ax.set_title("\n".join(textwrap.wrap(_title(run), 64)), fontsize=8)   # long option lists fit the panel
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def write_all(merged: dict[str, Any], out_dir: str, name: str = "e2e", png: bool = True) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    base = os.path.join(out_dir, name)
    with open(base + ".json", "w", encoding="utf-8") as f:
        json.dump(merged, f, indent=1, allow_nan=False)
        f.write("\n")
    with open(base + ".md", "w", encoding="utf-8") as f:
        f.write(markdown(merged))
    written = [base + ".json", base + ".md"]
    if png:
        written.append(plot(merged, base + ".png") or base + ".png")
    return written

"""Time variants of the top-k plans on the topk suite's cases (GPU), to tune configs.py.

    python -m tilefly.ops.topk.sweep --out $OUT/topk_sweep.json            # every case, ~5-8 min
    python -m tilefly.ops.topk.sweep --family register --cases 0,5 --jobs 8
    python -m tilefly.ops.topk.sweep --no-variants                         # default plans only

Per case (FP32 randn, the suite's rows x N and k): ATen's torch.topk with
deterministic algorithms off and on, tilefly through torch.topk (router
included) in both modes, and each plan variant launched directly (``launch.topk_rows(plan=...)``). Every variant's output is checked
against ATen's values and against its own indices before it is timed. Timing
is ``tilefly.bench.timing.measure`` with the QUICK policy, as the benchmark tables (L2 flushed
before each call, median).

Variants are compiled first in ``--jobs`` worker processes (each runs its
variants once on the real shape, so Triton's on-disk cache holds exactly the
specializations the timing process then loads). Prints a Markdown table with
the best variant per case; ``--out`` saves all timings as JSON.
"""
from __future__ import annotations

import argparse
import concurrent.futures as futures
import csv
import dataclasses
import json
import math
import multiprocessing
import sys
from pathlib import Path

CASES_CSV = Path(__file__).resolve().parents[2] / "bench" / "cases" / "topk.csv"


def load_cases(family: str | None = None) -> list[dict]:
    with open(CASES_CSV) as f:
        rows = [dict(r) for r in csv.DictReader(f)]
    cases = [{"index": i, "family": r["family"], "rows": int(r["m"]), "N": int(r["n"]), "k": int(r["k"])}
             for i, r in enumerate(rows)]
    return [c for c in cases if family in (None, "all", c["family"])]


def variants(N: int, k: int) -> list:
    """The default plan first, then neighbours along each tuning axis."""
    from tilefly.ops.topk import configs

    base = configs.plan(N, k)
    out = [base]

    def add(p):
        if p is not None and p not in out:
            out.append(p)

    if base.kind == "sieve":
        for w in (base.num_warps // 2, base.num_warps * 2, base.num_warps * 4):
            if w >= 1:
                add(configs.sieve_plan(N, k, num_warps=w))
        add(dataclasses.replace(base, CAP=base.CAP * 2))
        if base.TEAMS // 2 >= k:
            add(dataclasses.replace(base, TEAMS=base.TEAMS // 2, CAP=base.CAP * 2))
    elif base.kind == "bitmask":
        for S in (base.S // 2, base.S * 2):
            if configs.RADIX_MIN_SAMPLE // 2 <= S <= 2 * configs.RADIX_MAX_SAMPLE and not base.whole_row:
                add(configs.bitmask_plan(N, k, S=S))
        for w in (1, 2, 8):
            add(configs.bitmask_plan(N, k, filter_warps=w))
        add(configs.bitmask_plan(N, k, filter_warps=max(1, base.filter_warps // 2), filter_rows=32))
        for w in (base.threshold_warps // 4, base.threshold_warps // 2):
            if w >= 1:
                add(dataclasses.replace(base, threshold_warps=w))
        add(dataclasses.replace(base, SORT=base.K2 if base.SORT > base.K2 else min(2 * base.K2, base.C)))
        for w in (base.select_warps // 2, base.select_warps * 2):
            if 4 <= w <= 32:
                add(dataclasses.replace(base, select_warps=w, block=256 * w))
    elif base.kind == "full":
        for w in (1, 2, 4, 8):
            add(dataclasses.replace(base, num_warps=w))
    return out


def _make_input(case: dict, seed: int = 0):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed + case["index"])
    return torch.randn(case["rows"], case["N"], device="cuda", generator=g)


def _run_variant(x, k: int, plan):
    import torch

    from tilefly.ops.topk import launch

    values = torch.empty(x.shape[0], k, device=x.device, dtype=x.dtype)
    indices = torch.empty(x.shape[0], k, device=x.device, dtype=torch.int64)
    launch.topk_rows(x, k, True, values, indices, plan)
    return values, indices


def _check(x, k: int, values, indices) -> str | None:
    import torch

    want = torch.topk(x, k).values
    if not torch.equal(values, want):
        return "values differ from torch.topk"
    if not torch.equal(x.gather(1, indices), values):
        return "indices do not point at their values"
    return None


def _compile_worker(job: tuple[dict, list]) -> list[str | None]:
    """Run each variant once on the real shape (compiles into Triton's disk cache); errors per variant."""
    case, plans = job
    x = _make_input(case)
    errors = []
    for plan in plans:
        try:
            errors.append(_check(x, case["k"], *_run_variant(x, case["k"], plan)))
        except Exception as exc:  # noqa: BLE001 - reported in the table
            errors.append(f"{type(exc).__name__}: {exc}"[:300])
    return errors


def _bench(fn) -> float:
    from tilefly.bench.timing import QUICK, measure

    return measure(fn, QUICK).median_us


def _describe(plan, base) -> str:
    if plan == base:
        return "default"
    if plan.kind != base.kind:
        return plan.kind
    diff = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan) if getattr(plan, f.name) != getattr(base, f.name)}
    return ",".join(f"{k}={v}" for k, v in diff.items() if k not in ("sample_stride", "r", "whole_row"))


def _time_case(case: dict, plans: list, errors: list) -> dict:
    import torch

    import tilefly
    x = _make_input(case)
    k = case["k"]
    row = dict(case)
    for det in (False, True):
        torch.use_deterministic_algorithms(det)
        try:
            tilefly.disable()
            row[f"aten_{'det' if det else 'nondet'}_us"] = _bench(lambda: torch.topk(x, k))
            with tilefly.enabled("topk"):
                row[f"tilefly_{'det' if det else 'nondet'}_us"] = _bench(lambda: torch.topk(x, k))
        finally:
            torch.use_deterministic_algorithms(False)
    row["variants"] = []
    for plan, err in zip(plans, errors):
        entry = {"plan": dataclasses.asdict(plan), "kind": plan.kind, "label": _describe(plan, plans[0]),
                 "error": err}
        if err is None:
            values, indices = _run_variant(x, k, plan)
            entry["error"] = _check(x, k, values, indices)
            if entry["error"] is None:
                entry["us"] = _bench(lambda: _run_variant(x, k, plan))
        row["variants"].append(entry)
    del x
    torch.cuda.empty_cache()
    return row


def _select(plans: list, case: dict, defaults_only: bool) -> list:
    """All variants, or (defaults_only) the default plan alone."""
    return plans[:1] if defaults_only else plans


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="all", choices=("all", "register", "radix"))
    parser.add_argument("--cases", default=None, help="comma-separated case numbers (rows of topk.csv, from 0)")
    parser.add_argument("--jobs", type=int, default=8, help="compile worker processes")
    parser.add_argument("--no-variants", action="store_true", help="default plans only")
    parser.add_argument("--out", default=None, help="JSON file for every timing")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("the sweep needs a CUDA GPU")
        return 1
    cases = load_cases(args.family)
    if args.cases:
        wanted = {int(c) for c in args.cases.split(",")}
        cases = [c for c in cases if c["index"] in wanted]
    plans = {c["index"]: _select(variants(c["N"], c["k"]), c, args.no_variants) for c in cases}

    print(f"compiling {sum(len(p) for p in plans.values())} variants in {args.jobs} processes ...", flush=True)
    ctx = multiprocessing.get_context("spawn")
    with futures.ProcessPoolExecutor(max_workers=args.jobs, mp_context=ctx) as pool:
        errors = dict(zip(plans, pool.map(_compile_worker, [(c, plans[c["index"]]) for c in cases])))

    results = []
    print("| # | family | rows | N | k | ATen µs | ATen det µs | tilefly µs | tilefly det µs | speedup | det speedup "
          "| best variant | best µs |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for case in cases:
        row = _time_case(case, plans[case["index"]], errors[case["index"]])
        results.append(row)
        timed = [v for v in row["variants"] if "us" in v]
        best = min(timed, key=lambda v: v["us"]) if timed else {"label": "none", "us": math.nan}
        bad = [f"{v['label']}: {v['error']}" for v in row["variants"] if v["error"]]
        print(f"| {case['index']} | {case['family']} | {case['rows']} | {case['N']} | {case['k']} "
              f"| {row['aten_nondet_us']:.1f} | {row['aten_det_us']:.1f} | {row['tilefly_nondet_us']:.1f} "
              f"| {row['tilefly_det_us']:.1f} | {row['aten_nondet_us'] / row['tilefly_nondet_us']:.2f}x "
              f"| {row['aten_det_us'] / row['tilefly_det_us']:.2f}x | {best['label']} "
              f"| {best['us']:.1f} |"
              + (f" ERRORS: {bad}" if bad else ""), flush=True)
    for family in ("register", "radix"):
        rows = [r for r in results if r["family"] == family]
        if rows:
            for mode in ("nondet", "det"):
                g = math.exp(sum(math.log(r[f"aten_{mode}_us"] / r[f"tilefly_{mode}_us"]) for r in rows) / len(rows))
                worst = min(r[f"aten_{mode}_us"] / r[f"tilefly_{mode}_us"] for r in rows)
                print(f"{family} {mode}: geomean {g:.2f}x, min {worst:.2f}x over {len(rows)} cases")
    if args.out:
        Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                              "cases": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

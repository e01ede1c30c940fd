"""How fast could any kernel run a GEMM suite's shapes on this GPU, timed as the suite times
them? An upper bound on tilefly's speedup over each baseline the suite races: ATen, Triton and
the per-case faster of the two (dense and grouped suites), BF16 `mm` and the faster stock
dequantize + `mm` path (mxfp_gemm, each format apart).

    python scripts/gemm_ceiling.py --suite benchmarks/h200/dense_gemm.json --floor floor.json \
        [--empty-us US] [--peak-tflops 790]
    python scripts/gemm_ceiling.py --suite benchmarks/h200/grouped_gemm.json --floor floor.json ...
    python scripts/gemm_ceiling.py --suite held.json --fill as_defined.json ...   # a partial run, completed
    python scripts/gemm_ceiling.py --suite benchmarks/h200/mxfp_gemm_headstart.json --floor floor.json ...

``--fill`` takes the cases ``--suite`` lacks (a run a step limit stopped) from another run of the
same suite; those rows are marked ``*`` and counted in the geomeans.

A dense case moves A (M x K), B (K x N) and C once; a grouped case A (sum M x K), one K x N
weight matrix per group and C; an MX case A and B at 1 byte (MXFP8) or half a byte (MXFP4) a
value, one E8M0 byte per 32 values of each, and C in BF16.

Per shape the fastest conceivable call is the slower of two floors:
- memory: reading A and B and writing C once, at the speed of the plain streaming read of
  ``scripts/stream_floor_probe.py`` (its best kernel per size, fitted as fixed µs + bytes /
  bandwidth over the sizes it measured: the fixed part is launch, events and the first
  loads' latency);
- compute: the FLOPs at ``--peak-tflops`` (the device notes measured cuBLAS 8192^3 on random
  BF16 data at 769-798 TFLOP/s) plus the probe's time for an empty kernel of 132 programs
  under the same harness (from its JSON, or ``--empty-us`` for JSON written before it kept it).
Both ignore everything a real GEMM adds (pipeline fill, epilogue, split-K reduction, tail
waves), so the bound is loose on purpose: a target above it cannot be met by any kernel.

MX cases take the same compute floor, the 16-bit tensor rate, because on Hopper no exact MX
GEMM runs faster than that. Its MMAs have no block scales, so each 32-K block's product must be
scaled per output element before it joins the FP32 sum. Either the operands are upcast to
16-bit values carrying their scales (then the MMAs are BF16 ones), or FP8 MMAs (32 MACs an
output element a K-block, 4096 MACs a clock an SM) each leave a partial that costs at least two
instructions an element (the scale product sa[m] * sb[n], then an FMA into the sum): 2 x 128
thread instructions a clock an SM against the 128 that an SM's four schedulers issue, i.e. at
most half the FP8 rate, the BF16 rate, with every issue slot spent on it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

from tilefly.bench.results import geomean


def read_floor_fit(floor: dict) -> tuple[float, float]:
    """(fixed µs, µs per byte) of a least-squares line through each size's fastest read."""
    sizes = [row["bytes"] for row in floor["rows"]]
    fastest = [min(r["us"] for r in row["read"]) for row in floor["rows"]]
    slope, intercept = statistics.linear_regression(sizes, fastest)
    return intercept, slope


MX_VALUE_BYTES = {"mxfp8": 1.0, "mxfp4": 0.5}
MX_BLOCK = 32   # values sharing one E8M0 scale byte


def case_size(case: dict) -> tuple[str, float, float]:
    """(name, bytes moved at least, FLOPs) of a dense_gemm or grouped_gemm case (16-bit data) or
    an mxfp_gemm case (MX operands and scales, BF16 out)."""
    if "g" in case:
        g, m, n, k = (case[key] for key in ("g", "m_total", "n", "k"))
        return f"{case['suite']} {case['case']}", 2 * (m * k + g * k * n + m * n), 2.0 * m * n * k
    m, n, k = (case[key] for key in ("m", "n", "k"))
    if "format" in case:
        fmt = case["format"]
        operands = (m + n) * k * (MX_VALUE_BYTES[fmt] + 1 / MX_BLOCK)
        return f"{fmt} {m}x{n}x{k}", operands + 2 * m * n, 2.0 * m * n * k
    return f"{m}x{n}x{k}", 2 * (m * k + n * k + m * n), 2.0 * m * n * k


GEMM_BASELINES = ("aten", "triton", "best(aten,triton)")
MX_BASELINES = ("bf16_mm", "dequant_mm")   # dequant_mm: the faster stock path (eager or compiled)


def baselines(suite: dict) -> tuple[str, ...]:
    return MX_BASELINES if suite.get("suite") == "mxfp_gemm" else GEMM_BASELINES


def geomean_groups(rows: list[dict]) -> dict[str, list[dict]]:
    """Rows per geomean the issue targets: each MX format apart, every case of the other suites."""
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["group"], []).append(row)
    return groups


def bounds(suite: dict, fixed_us: float, us_per_byte: float, empty_us: float, peak_tflops: float) -> list[dict]:
    rows = []
    names = baselines(suite)
    for case in suite["cases"]:
        name, nbytes, flops = case_size(case["case"])
        name = "* " + name if case.get("filled") else name
        times = {key: value["median_us"] for key, value in case["providers"].items()}
        if names == GEMM_BASELINES:
            times["best(aten,triton)"] = min(times["aten"], times["triton"])
        memory_us = fixed_us + nbytes * us_per_byte
        compute_us = empty_us + flops / (peak_tflops * 1e6)
        floor_us = max(memory_us, compute_us)
        group = f"{case['case']['format']} " if "format" in case["case"] else ""   # geomean prefix
        rows.append(dict(shape=name, group=group, times=times, memory_us=memory_us, compute_us=compute_us,
                         bound={b: times[b] / floor_us for b in names},
                         tilefly={b: times[b] / times["tilefly"] for b in names}))
    return rows


def filled(suite: dict, other: dict) -> dict:
    """``suite`` with the cases it lacks (by index) taken from ``other``, flagged ``filled``, in index order."""
    if other.get("suite") != suite.get("suite"):
        raise ValueError(f"--fill is a run of {other.get('suite')}, not of {suite.get('suite')}")
    have = {case["index"] for case in suite["cases"]}
    extra = [dict(case, filled=True) for case in other["cases"] if case["index"] not in have]
    return dict(suite, cases=sorted(suite["cases"] + extra, key=lambda case: case["index"]))


def _ratios(by_baseline: dict, names: tuple[str, ...]) -> str:
    return " / ".join(f"{by_baseline[b]:.2f}x" for b in names)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", required=True,
                        help="dense_gemm, grouped_gemm or mxfp_gemm JSON of python -m tilefly bench")
    parser.add_argument("--floor", required=True, help="JSON of scripts/stream_floor_probe.py --json")
    parser.add_argument("--empty-us", type=float, help="the probe's empty kernel, 132 programs (default: its JSON)")
    parser.add_argument("--peak-tflops", type=float, default=790.0)
    parser.add_argument("--fill", help="another run of the suite (JSON) for the cases --suite lacks, marked *")
    args = parser.parse_args(argv)
    with open(args.suite) as f:
        suite = json.load(f)
    if args.fill:
        with open(args.fill) as f:
            suite = filled(suite, json.load(f))
    with open(args.floor) as f:
        floor = json.load(f)
    empty_us = args.empty_us if args.empty_us is not None else floor.get("empty_us", {}).get("132")
    if empty_us is None:
        parser.error("the floor JSON has no empty-kernel time: pass --empty-us")
    fixed_us, us_per_byte = read_floor_fit(floor)
    print(f"read floor fit: {fixed_us:.2f} us + bytes at {1e-6 / us_per_byte:.2f} TB/s; "
          f"compute floor: {empty_us:.2f} us + FLOPs at {args.peak_tflops:.0f} TFLOP/s")
    print(f"suite commit {suite.get('commit')}, {suite.get('date')}")
    if args.fill:
        print(f"* = case from --fill {args.fill}")
    names = baselines(suite)
    over = " / ".join(names)
    print(f"| case | {' | '.join(f'{b} µs' for b in names)} | tilefly µs | memory floor µs | compute floor µs "
          f"| bound over {over} | tilefly over {over} |")
    print("|---|" + "---:|" * (len(names) + 5))
    rows = bounds(suite, fixed_us, us_per_byte, empty_us, args.peak_tflops)
    for r in rows:
        t = r["times"]
        print(f"| {r['shape']} | {' | '.join(f'{t[b]:.1f}' for b in names)} | {t['tilefly']:.1f} "
              f"| {r['memory_us']:.1f} | {r['compute_us']:.1f} | {_ratios(r['bound'], names)} "
              f"| {_ratios(r['tilefly'], names)} |")
    for group, members in geomean_groups(rows).items():
        for b in names:
            print(f"{group}geomean over {b}: bound {geomean([r['bound'][b] for r in members]):.3f}x, "
                  f"tilefly {geomean([r['tilefly'][b] for r in members]):.3f}x ({len(members)} cases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

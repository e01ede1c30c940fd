"""K-splits of the MX decode builds measured per shape: a tuning database over the split planner.

The launcher plans a staged build's K-splits with a model (``launch.plan_splits``: waves of
``configs.resident`` programs an SM, a cost per split). Decode GEMMs are latency-bound, and on some
shapes the model's count is not the fastest one (BENCHMARKS.md session 35: MXFP4 32 x 6144 x 4096
planned at 2 splits, 21.3 us, runs 17.7 at 4). This database holds, per GPU, build and exact shape,
the split count ``scripts/mx_decode_probe.py --picked`` timed fastest; the launcher takes it where an
entry exists and the model everywhere else. Splits depend on the exact shape (row tiles, K-steps),
so there is no nearest-shape rule: an entry serves only its own shape.

An entry: the format, the build (``build_name``: the config's name with its split limit, PDL flag and
Y fold left out, which do not change the kernel's tile or ring; the fold trims a few instructions a slot
from every program alike; a build reading Y expanded keeps its ``_ey``: where a split pays depends on
the copy's fold groups, e.g. 8 splits of 14 slots straddle the fused SiLU kernel's 16-slot chunks, so a
program cannot fold: MXFP4 32 x 4096 x 14336 runs 29.1 us at 8 splits and 25.6 at 7, BENCHMARKS.md
session 43), the problem as the launcher sees it
(``rows``: the side in the wgmma M slot, ``cols``: the tokens, ``k``), the fastest ``splits``, its
time ``us`` and every timed count (``timed``: splits -> us, the evidence).

    python -m tilefly.ops.mx_gemm.split_tuning PROBE.json [PROBE.json ...] [--out PATH]

writes ``tilefly/tuning/data/mx_decode_splits_<gpu>.json`` (or PATH) from the probe's ``--json`` files.
"""
from __future__ import annotations

import argparse
import functools
import logging
import sys
from dataclasses import replace
from typing import Any

from tilefly.tuning import db as tdb

FAMILY = "mx_decode_splits"
VERSION = 1
_log = logging.getLogger("tilefly.mx_gemm")


def build_name(cfg) -> str:
    """The database's name of ``cfg``'s kernel build."""
    # MXConfig.name says "_ey" only with fold_y set, so an expanded build keeps its fold flag here
    return replace(cfg, max_splits=16, pdl=False, fold_y=cfg.expanded_y).name


def validate_entry(e: dict[str, Any]) -> str | None:
    if e.get("fmt") not in ("mxfp8", "mxfp4"):
        return f"fmt must be mxfp8 or mxfp4, got {e.get('fmt')!r}"
    if not isinstance(e.get("build"), str) or not e["build"]:
        return f"build must name a config, got {e.get('build')!r}"
    for name in ("rows", "cols", "k", "splits"):
        if not isinstance(e.get(name), int) or isinstance(e.get(name), bool) or e[name] < 1:
            return f"{name} must be a positive integer, got {e.get(name)!r}"
    if not isinstance(e.get("us"), (int, float)) or not e["us"] > 0:
        return f"us must be a positive time in microseconds, got {e.get('us')!r}"
    timed = e.get("timed")
    if not isinstance(timed, dict) or str(e["splits"]) not in timed:
        return "timed must map split counts to microseconds, the entry's own count among them"
    return None


def load(path) -> tdb.Database:
    return tdb.load(path, VERSION, validate_entry)


def entries_from_probe(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (fmt, build, rows, cols, k) of the probe's rows of the picked build: the split
    count timed fastest (several timings of one count: the least)."""
    timed: dict[tuple, dict[int, float]] = {}
    for r in rows:
        if not r.get("picked"):
            continue
        key = (r["fmt"], r["build"], r["rows"], r["cols"], r["k"])
        times = timed.setdefault(key, {})
        times[r["splits"]] = min(r["us"], times.get(r["splits"], float("inf")))
    entries = []
    for (fmt, build, rows_, cols, k), times in sorted(timed.items()):
        splits = min(times, key=lambda s: (times[s], s))
        timed_us = {str(s): round(t, 2) for s, t in sorted(times.items())}
        entries.append({"fmt": fmt, "build": build, "rows": rows_, "cols": cols, "k": k, "splits": splits,
                        "us": round(times[splits], 2), "timed": timed_us})
    return entries


def splits_for(device_index: int, fmt: str, cfg, rows: int, cols: int, k: int) -> int | None:
    """The measured K-split count for this build and shape on CUDA device ``device_index``, None where
    the GPU's database has no entry (the launcher's model then plans)."""
    if device_index is None or device_index < 0:
        return None
    return _table(_shipped(device_index)).get((fmt, build_name(cfg), rows, cols, k))


@functools.lru_cache(maxsize=None)
def _shipped(device_index: int) -> str:
    return str(tdb.shipped_path(FAMILY, tdb.device_gpu_key(device_index)))


@functools.lru_cache(maxsize=16)
def _table(path: str) -> dict[tuple, int]:
    """(fmt, build, rows, cols, k) -> splits; empty when the file is missing (quietly) or bad (warned once)."""
    def warn(why: str) -> None:
        _log.warning("tilefly MX GEMM: %s; the split planner's model serves", why)

    entries = tdb.entries_or_none(path, VERSION, validate_entry, warn)
    return {(e["fmt"], e["build"], e["rows"], e["cols"], e["k"]): e["splits"] for e in entries}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("probes", nargs="+", help="JSON files of scripts/mx_decode_probe.py --picked --json")
    ap.add_argument("--out", help="database path (default: the package's file for the probes' GPU)")
    args = ap.parse_args(argv)
    try:
        runs, gpu, capability = tdb.probe_runs(args.probes)
    except tdb.DatabaseError as exc:
        ap.error(str(exc))
    entries = entries_from_probe([row for r in runs for row in r["rows"]])
    if not entries:
        ap.error("no rows of a picked build in the probe files (run the probe with --picked)")
    header = tdb.new_header(VERSION, gpu, runs[0].get("torch", ""),
                            {"probes": [p.rsplit("/", 1)[-1] for p in args.probes],
                             "commits": sorted({r.get("commit", "unknown") for r in runs})})
    path = args.out or tdb.shipped_path(FAMILY, tdb.gpu_key(gpu, capability))
    tdb.write(path, header, entries)
    for e in entries:
        print(f"{e['fmt']} {e['build']:<28} {e['cols']:>3} x {e['rows']:>5} x {e['k']:>5}: {e['splits']:>2} splits "
              f"{e['us']:6.1f} us (timed {e['timed']})")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

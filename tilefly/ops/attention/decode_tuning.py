"""Which DecodeConfig the split-KV decode (decode.py) runs for a shape: a tuning database built from
the probe's sweep, nearest measured shape wins.

The probe (``scripts/decode_attention_probe.py --sweep --json FILE``) times every config on
(batch, valid keys) shapes over a cache of ``cache`` positions. The kernel sees only the cache
length and the (batch x head) program count, not how many keys are valid, so one entry stands for
each (programs, cache) pair of one layout: the config with the smallest geometric mean over the
pair's valid lengths, among those timed at all of them. A layout is the query rows a program holds
(``rows``: the query length; 4 where a grouped decode step folds 4 query heads into it) and the
head dim: each is a different kernel, so entries of one layout say nothing about another. A call
takes the entry of its layout nearest its (programs, keys) in log2 distance; without one,
``decode.DEFAULT``. Under ``config.attention_decode == "auto"`` the same entry decides whether the
decode serves the call at all: only where it took at most ``WIN`` times SDPA's time, and never for a
layout the database does not hold.

    python -m tilefly.ops.attention.decode_tuning PROBE.json [PROBE.json ...] [--out PATH]
                                                  [--rows N --head-dim D]

(``--rows`` and ``--head-dim`` name the layout of probe files written before their rows recorded it.)

writes ``tilefly/tuning/data/attention_decode_<gpu>.json`` (or PATH).
"""
from __future__ import annotations

import argparse
import functools
import logging
import math
import sys
from collections import defaultdict
from typing import Any

from tilefly.bench.results import geomean
from tilefly.tuning import db as tdb

FAMILY = "attention_decode"
VERSION = 2     # 2: entries name their layout (rows, head_dim)
KNOBS = ("block_n", "num_warps", "num_stages", "programs_per_sm")
WIN = 0.9       # config.attention_decode "auto" serves a shape whose nearest entry takes <= WIN x SDPA's time
_log = logging.getLogger("tilefly.attention")


def validate_entry(e: dict[str, Any]) -> str | None:
    for name in ("programs", "keys", "rows", "head_dim", *KNOBS):
        if not isinstance(e.get(name), int) or isinstance(e.get(name), bool) or e[name] < 1:
            return f"{name} must be a positive integer, got {e.get(name)!r}"
    if e["block_n"] < 16 or e["block_n"] & (e["block_n"] - 1):
        return f"block_n must be a power of two >= 16, got {e['block_n']}"
    if e["num_warps"] not in (1, 2, 4, 8):
        return f"num_warps must be 1, 2, 4 or 8, got {e['num_warps']}"
    for name in ("us", "sdpa_us"):
        if not isinstance(e.get(name), (int, float)) or not e[name] > 0:
            return f"{name} must be a positive time in microseconds, got {e.get(name)!r}"
    return None


def load(path) -> tdb.Database:
    return tdb.load(path, VERSION, validate_entry)


def entries_from_probe(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (rows, head_dim, programs, cache) of the probe's rows: the config with the least
    geometric mean time over the shape's valid lengths, among configs timed at every one of them."""
    times: dict[tuple, dict[tuple, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    sdpa: dict[tuple, dict[int, float]] = defaultdict(dict)
    for r in rows:
        shape = (r["rows"], r["head_dim"], r["programs"], r["cache"])
        times[shape][tuple(r[k] for k in KNOBS)][r["valid"]] = r["us"]
        sdpa[shape][r["valid"]] = r["sdpa_us"]
    entries = []
    for shape, by_config in sorted(times.items()):
        valid = set(sdpa[shape])
        complete = {c: t for c, t in by_config.items() if set(t) == valid}
        best = min(complete, key=lambda c: geomean(complete[c].values()))
        entries.append(dict(zip(("rows", "head_dim", "programs", "keys"), shape), **dict(zip(KNOBS, best)),
                            us=round(geomean(complete[best].values()), 2),
                            sdpa_us=round(geomean(sdpa[shape].values()), 2)))
    return entries


def nearest(entries, programs: int, keys: int) -> dict[str, Any]:
    """The entry closest to (programs, keys) in log2 distance (ties: the first in file order)."""
    return min(entries, key=lambda e: abs(math.log2(e["programs"] / programs)) + abs(math.log2(e["keys"] / keys)))


def of_layout(entries, rows: int, head_dim: int) -> list[dict[str, Any]]:
    return [e for e in entries if e["rows"] == rows and e["head_dim"] == head_dim]


def verdict(device_index: int, programs: int, keys: int, rows: int, head_dim: int) -> str | None:
    """Why config.attention_decode "auto" leaves this call to SDPA (None: the decode serves it);
    ``device_index`` as ``Tensor.get_device`` gives it (-1: not a CUDA tensor); ``rows`` the query
    rows of one (batch, head), ``head_dim`` the head dim."""
    if device_index < 0:
        return "no CUDA device to pick a decode tuning database by"
    return _verdict(_shipped(device_index), programs, keys, rows, head_dim)


def install_reason(device_index: int | None) -> str | None:
    """Why "auto" installs no decode overrides on this device: no database, or none of its shapes wins."""
    if device_index is None:
        return "no CUDA device to pick a decode tuning database by"
    path = _shipped(device_index)
    entries = _entries(path)
    if not entries:
        return f"no decode tuning database for this GPU ({path.rsplit('/', 1)[-1]})"
    if not any(e["us"] <= WIN * e["sdpa_us"] for e in entries):
        return f"the decode tuning database has no shape where the kernel takes <= {WIN}x SDPA's time"
    return None


@functools.lru_cache(maxsize=4096)
def _verdict(path: str, programs: int, keys: int, rows: int, head_dim: int) -> str | None:
    entries = _entries(path)
    if not entries:
        return "no decode tuning database for this GPU"
    entries = of_layout(entries, rows, head_dim)
    if not entries:
        return f"the decode tuning database has no entry for {rows} query rows a head at head dim {head_dim}"
    e = nearest(entries, programs, keys)
    if e["us"] <= WIN * e["sdpa_us"]:
        return None
    return (f"decode tuning database: {e['us']:.1f} us against SDPA's {e['sdpa_us']:.1f} at the nearest shape "
            f"(programs {e['programs']}, keys {e['keys']})")


def config_for(device_index: int, programs: int, keys: int, rows: int, head_dim: int):
    """The DecodeConfig for a call on CUDA device ``device_index`` (cached per shape)."""
    return _pick(_shipped(device_index), programs, keys, rows, head_dim)


@functools.lru_cache(maxsize=None)
def _shipped(device_index: int) -> str:
    return str(tdb.shipped_path(FAMILY, tdb.device_gpu_key(device_index)))


@functools.lru_cache(maxsize=4096)
def _pick(path: str, programs: int, keys: int, rows: int, head_dim: int):
    from tilefly.ops.attention.decode import DEFAULT, DecodeConfig

    entries = of_layout(_entries(path), rows, head_dim)
    if not entries:
        return DEFAULT
    e = nearest(entries, programs, keys)
    return DecodeConfig(*(e[k] for k in KNOBS))


@functools.lru_cache(maxsize=16)
def _entries(path: str) -> tuple[dict[str, Any], ...]:
    """The database's entries; none when it is missing (quietly: the default serves) or bad (warned once)."""
    return tdb.entries_or_none(path, VERSION, validate_entry,
                               lambda why: _log.warning("tilefly decode attention: %s; the default config serves", why))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("probes", nargs="+", help="JSON files of scripts/decode_attention_probe.py --json")
    ap.add_argument("--out", help="database path (default: the package's file for the probes' GPU)")
    ap.add_argument("--rows", type=int, help="query rows a head, for probe rows that do not record it")
    ap.add_argument("--head-dim", type=int, help="head dim, for probe rows that do not record it")
    args = ap.parse_args(argv)
    try:
        runs, gpu, capability = tdb.probe_runs(args.probes)
    except tdb.DatabaseError as exc:
        ap.error(str(exc))
    layout = {k: v for k, v in (("rows", args.rows), ("head_dim", args.head_dim)) if v is not None}
    rows = [{**layout, **row} for r in runs for row in r["rows"]]
    missing = sorted({k for row in rows for k in ("rows", "head_dim") if k not in row})
    if missing:
        ap.error(f"probe rows without {' and '.join(missing)}: name the layout they measured with "
                 + " ".join(f"--{k.replace('_', '-')}" for k in missing))
    entries = entries_from_probe(rows)
    header = tdb.new_header(VERSION, gpu, runs[0].get("torch", ""),
                            {"probes": [p.rsplit("/", 1)[-1] for p in args.probes], **layout})
    path = args.out or tdb.shipped_path(FAMILY, tdb.gpu_key(gpu, capability))
    tdb.write(path, header, entries)
    for e in entries:
        print(f"rows {e['rows']} head dim {e['head_dim']} programs {e['programs']:>5} keys {e['keys']:>6}: "
              + ", ".join(f"{k} {e[k]}" for k in KNOBS)
              + f"  {e['us']:.1f} us (SDPA {e['sdpa_us']:.1f})")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How tilefly's own attention kernels compare with cuDNN's, read from a tuning database.

    python -m tilefly.ops.attention.report [--db PATH] [--dtype bf16|fp16]

The issue asks to report tilefly's own kernel against cuDNN wherever cuDNN runs. The tuning
database already holds the native time of every implementation per workload (database.py),
so no GPU is needed: per direction and head dim, the range over workloads of
``cudnn time / fastest tilefly config time`` ("x of cuDNN": above 1, tilefly is faster).
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Iterable

from tilefly.ops.attention import database
from tilefly.tuning import db as tdb

DIRECTION_NAMES = {"fwd": "forward", "bwd": "backward"}
# Named rather than derived from the current device (as database.plan does): the report needs no GPU.
SHIPPED_DB = tdb.shipped_path(database.FAMILY, "sm90_h200")


def cudnn_ratios(entries: Iterable[dict[str, Any]], dtype: str | None = None
                 ) -> dict[tuple[str, int], tuple[float, float, int]]:
    """``{(direction, head_dim): (min ratio, max ratio, workloads)}`` over the entries (of ``dtype``
    when given) that hold both a cuDNN time and a tilefly time; other implementations are ignored."""
    ratios: dict[tuple[str, int], list[float]] = {}
    for e in entries:
        times = e["times_us"]
        tilefly = [us for impl, us in times.items() if database.parse_impl(impl)[0] == database.TILEFLY]
        # cuDNN refuses some workloads (head dim 512) and a tilefly config can fail its check:
        # no pair, nothing to compare.
        if (dtype is not None and e["dtype"] != dtype) or "cudnn" not in times or not tilefly:
            continue
        ratios.setdefault((e["direction"], e["head_dim"]), []).append(times["cudnn"] / min(tilefly))
    return {key: (min(r), max(r), len(r)) for key, r in sorted(ratios.items())}


def format_table(ratios: dict[tuple[str, int], tuple[float, float, int]],
                 head_dims: Iterable[int] | None = None) -> str:
    """A Markdown table, one column per head dim (``head_dims``, default those in ``ratios``);
    "-" where cuDNN has no time to compare with."""
    dims = sorted(set(head_dims) if head_dims is not None else {d for _, d in ratios})
    rows = ["| head dim | " + " | ".join(map(str, dims)) + " |", "|---" * (len(dims) + 1) + "|"]
    for direction, name in DIRECTION_NAMES.items():
        cells = [_cell(ratios.get((direction, d))) for d in dims]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _cell(r: tuple[float, float, int] | None) -> str:
    return f"{r[0]:.2f}-{r[1]:.2f}x ({r[2]})" if r else "-"


def report(db: tdb.Database, dtypes: Iterable[str | None] = (None,) + database.DTYPES) -> str:
    dims = {e["head_dim"] for e in db.entries}
    parts = [f"tilefly vs cuDNN attention on {db.header['gpu']} ({db.path}): x of cuDNN = cuDNN time / fastest "
             "tilefly config (above 1: tilefly faster), min-max over workloads (count); '-': no cuDNN time"]
    for dtype in dtypes:
        parts.append(f"\n### {dtype or 'all'}\n\n" + format_table(cudnn_ratios(db.entries, dtype), dims))
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tilefly.ops.attention.report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", default=str(SHIPPED_DB),
                   help="attention tuning database (default: the shipped H200 one)")
    p.add_argument("--dtype", choices=database.DTYPES, help="only this dtype (default: all, then each)")
    args = p.parse_args(argv)
    try:
        db = database.load(args.db)
    except tdb.DatabaseError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(report(db, (args.dtype,)) if args.dtype else report(db))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""rmsnorm: ``F.rms_norm(x, (n,), w, eps=1e-6)`` on the 22 cases of rmsnorm.csv (x is m x n,
w of x's dtype). ``aten`` runs with tilefly disabled; ``tilefly`` is the same call inside
``tilefly.enabled("rms_norm")``, with the router's decision recorded per case.
Metric: effective bandwidth, (read x + read w + write y) bytes / time."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tilefly.bench import hooks
from tilefly.bench.cases import Case, numbers, read_csv
from tilefly.bench.results import Comparison
from tilefly.bench.runner import CaseBench, Plan, Suite
from tilefly.bench.suites._common import DTYPES, baseline_only, eager_providers, gbps, randn

EPS = 1e-6
METRIC = "GB/s"


def cases() -> list[Case]:
    out = []
    for i, row in enumerate(read_csv("rmsnorm.csv")):
        cols = {"dtype": row["dtype"], "m": int(row["m"]), "n": int(row["n"])}
        out.append(Case(i, f"{cols['dtype']}_{cols['m']}x{cols['n']}", cols, numbers(row, ("aten_us", "flydsl_us"))))
    return out


def norm_bench(dtype: torch.dtype, m: int, n: int, missing: str | None) -> CaseBench:
    x = randn(m, n, dtype=dtype)
    w = randn(n, dtype=dtype).add_(1.0)
    nbytes = (2 * m * n + n) * x.element_size()

    def call():
        return F.rms_norm(x, (n,), w, eps=EPS)

    return CaseBench(eager_providers(call, "rms_norm", missing), lambda _, us: {METRIC: gbps(nbytes, us)})


def norm_plan(missing: str | None, bench) -> Plan:
    notes = [baseline_only(missing)] if missing else []
    comparisons = [] if missing else [Comparison("tilefly/aten", "tilefly", "aten")]
    return Plan(bench, comparisons, [METRIC], notes)


def plan() -> Plan:
    missing = hooks.eager_family_missing("rms_norm")
    return norm_plan(missing, lambda c: norm_bench(DTYPES[c.columns["dtype"]], c.columns["m"], c.columns["n"], missing))


SUITE = Suite(
    name="rmsnorm",
    title="RMSNorm forward, F.rms_norm(x, (n,), w, eps=1e-6), x m x n",
    cases=cases,
    quick=(0, 5, 10, 16),  # fp16 8192x4096, fp16 8192x4097 (unaligned), bf16 8192x4097, fp32 2048x65536
    plan=plan,
)

"""topk: ``torch.topk(x, k, dim=-1, largest=True, sorted=True)`` on FP32 x of m x n, the 10
``register`` and 23 ``radix`` cases of topk.csv, in two modes: deterministic algorithms off
(``nondet``) and on (``det``, ``torch.use_deterministic_algorithms(True)``, restored after).
Providers ``aten`` and ``tilefly`` (inside ``tilefly.enabled("topk")``) per mode; summaries per
family and mode. Metric: input read bandwidth, m * n * 4 bytes / time."""
from __future__ import annotations

import contextlib

import torch

from tilefly.bench import hooks
from tilefly.bench.cases import Case, numbers, read_csv
from tilefly.bench.results import Comparison
from tilefly.bench.runner import CaseBench, Plan, Suite
from tilefly.bench.suites._common import baseline_only, eager_providers, gbps, randn

METRIC = "in GB/s"
MODES = ("nondet", "det")
FAMILIES = ("register", "radix")


@contextlib.contextmanager
def deterministic(on: bool):
    before = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(on)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before, warn_only=warn_only)


def cases() -> list[Case]:
    out = []
    for i, row in enumerate(read_csv("topk.csv")):
        cols = {"family": row["family"], "k_band": row["k_band"], "m": int(row["m"]), "n": int(row["n"]),
                "k": int(row["k"])}
        ref = numbers(row, ("aten_nondet_us", "flydsl_nondet_us", "aten_det_us", "flydsl_det_us"))
        out.append(Case(i, f"{cols['family']}_{cols['m']}x{cols['n']}_k{cols['k']}", cols, ref))
    return out


def plan() -> Plan:
    missing = hooks.eager_family_missing("topk")

    def bench(case: Case) -> CaseBench:
        m, n, k = case.columns["m"], case.columns["n"], case.columns["k"]
        x = randn(m, n, dtype=torch.float32)

        def call():
            return torch.topk(x, k, dim=-1, largest=True, sorted=True)

        providers = []
        for mode in MODES:
            providers += eager_providers(call, "topk", missing, suffix=f":{mode}",
                                         context=lambda mode=mode: deterministic(mode == "det"))
        return CaseBench(providers, lambda _, us: {METRIC: gbps(m * n * 4, us)})

    comparisons = [] if missing else [
        Comparison(f"{family}:{mode} tilefly/aten", f"tilefly:{mode}", f"aten:{mode}", (("family", family),))
        for family in FAMILIES for mode in MODES
    ]
    return Plan(bench, comparisons, [METRIC], [baseline_only(missing)] if missing else [])


SUITE = Suite(
    name="topk",
    title="torch.topk(x, k, dim=-1, largest=True, sorted=True), FP32 x m x n; deterministic algorithms off/on",
    cases=cases,
    quick=(2, 8, 11, 31),  # register 4096x1024 k8, 16384x4096 k8; radix 2048x8192 k64, 256x262144 k1024
    plan=plan,
)

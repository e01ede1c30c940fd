"""grouped_gemm: MoE-style grouped GEMM, BF16, on the 24 cases of grouped_gemm.csv:
``standard`` gG x M-per-group x N x K; ``kn_variants`` 8 groups x 512 rows with K and N as named;
``ragged_m`` the listed rows per group (zeros allowed), K = N = 4096.

Operands: A (sum M) x K row-major; B is G x K x N **column-major per group**: created as
G x N x K (how MoE weights are stored) and passed as ``w.transpose(-2, -1)``; ``offs`` = int32
cumulative row ends, on the GPU. ``aten`` = ``torch._grouped_mm(a, b, offs=offs)`` eager (CUTLASS
on sm_90); ``triton`` = the same call under ``torch.compile`` max-autotune with backends "TRITON"
(Inductor's Triton grouped template; the note says if Inductor put ATen in the graph instead);
``best(aten,triton)`` per case. tilefly: ``tilefly.ops.grouped_gemm.bench.tilefly_providers(a, b, offs)``
-> {config: fn} when it exists. Metric: TFLOP/s counting the actual rows, 2 * sum(M) * N * K."""
from __future__ import annotations

import json
import re
from typing import Callable

import torch

from tilefly.bench import hooks, inductor
from tilefly.bench.cases import Case, numbers, read_csv
from tilefly.bench.results import Comparison
from tilefly.bench.runner import CaseBench, Derived, Plan, Provider, Suite
from tilefly.bench.suites import _common
from tilefly.bench.suites._common import baseline_only, best_config_provider, randn, tflops

BEST = "best(aten,triton)"
B_LAYOUT = "B: G x K x N, column-major per group (G x N x K storage, transposed view)"


def parse(suite: str, name: str) -> tuple[list[int], int, int]:
    """(rows per group, N, K) of one CSV row."""
    if suite == "standard":
        g, m, n, k = (int(v) for v in re.fullmatch(r"g(\d+)x(\d+)x(\d+)x(\d+)", name).groups())
        return [m] * g, n, k
    if suite == "kn_variants":
        k, n = (int(v) for v in re.match(r"K(\d+) x N(\d+)", name).groups())
        return [512] * 8, n, k
    if suite == "ragged_m":
        return [int(v) for v in json.loads(name)], 4096, 4096
    raise ValueError(f"unknown grouped_gemm suite {suite!r}")


def cases() -> list[Case]:
    out = []
    for i, row in enumerate(read_csv("grouped_gemm.csv")):
        rows, n, k = parse(row["suite"], row["case"])
        cols = {"suite": row["suite"], "case": row["case"], "g": len(rows), "m_total": sum(rows), "n": n, "k": k}
        if row["suite"] == "standard":
            ident = f"std_{row['case']}"
        elif row["suite"] == "kn_variants":
            ident = f"kn_K{k}xN{n}"
        else:
            ident = f"ragged_{i}_{sum(rows)}rows"
        out.append(Case(i, ident, cols, numbers(row, ("flydsl_tflops", "triton_tflops", "aten_tflops"))))
    return out


def grouped(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    return torch._grouped_mm(a, b, offs=offs)


def csv_shape(case: Case) -> tuple[list[int], int, int]:
    return parse(case.columns["suite"], case.columns["case"])


def plan(shape: Callable[[Case], tuple[list[int], int, int]] = csv_shape) -> Plan:
    """``shape(case)`` -> (rows per group, N, K): how a suite's case names its problem."""
    hook, missing = hooks.bench_module("tilefly.ops.grouped_gemm.bench")
    notes = [B_LAYOUT]
    if not hasattr(torch, "_grouped_mm"):
        notes.append(f"torch {torch.__version__} has no torch._grouped_mm: nothing to time")

    def bench(case: Case) -> CaseBench:
        rows, n, k = shape(case)
        a = randn(sum(rows), k)
        b = randn(len(rows), n, k).transpose(-2, -1)
        offs = torch.tensor(rows, dtype=torch.int64).cumsum(0).to(device=_common.DEVICE, dtype=torch.int32)
        watch: list[inductor.CodeWatch] = []

        def build_triton():
            compiled = inductor.compile_static(grouped, "max-autotune-no-cudagraphs")
            watch.append(inductor.CodeWatch(compiled, a, b, offs))
            return watch[0]

        def inspect():
            pick = watch[0].pick(("extern_kernels._grouped_mm", "torch.ops.aten._grouped_mm")) if watch else None
            if pick == "ATen":
                return "Inductor fell back to ATen: no Triton grouped template for this case"
            return f"Inductor picked {pick}" if pick else None

        providers = [Provider("aten", lambda: lambda: grouped(a, b, offs)),
                     Provider("triton", build_triton, context=lambda: inductor.autotune("TRITON"), inspect=inspect)]
        if hook is not None:
            providers.append(best_config_provider("tilefly", lambda: hook.tilefly_providers(a, b, offs)))
        flops = 2.0 * sum(rows) * n * k
        return CaseBench(providers, lambda _, us: {"TFLOP/s": tflops(flops, us)}, [Derived(BEST, ("aten", "triton"))])

    comparisons = [Comparison("triton/aten", "triton", "aten")]
    if missing:
        notes.insert(0, baseline_only(missing))
    else:
        comparisons = [Comparison(f"tilefly/{base}", "tilefly", base) for base in ("triton", "aten", BEST)] + comparisons
    return Plan(bench, comparisons, ["TFLOP/s"], notes)


SUITE = Suite(
    name="grouped_gemm",
    title="Grouped GEMM (MoE), BF16: torch._grouped_mm(A, B, offs), A (sum M) x K, B G x K x N",
    cases=cases,
    quick=(2, 21),  # g8x512x4096x4096; ragged [100,333,777,1,500,63,129,250]
    plan=plan,
)

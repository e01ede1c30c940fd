"""dense_gemm: BF16 NT GEMM on the 15 shapes of dense_gemm.csv: A is M x K row-major, B is an
N x K row-major tensor used as ``b.t()``; C = A @ B^T.

Providers: ``aten`` = ``torch.mm`` eager; ``triton`` = ``torch.compile(mode="max-autotune-no-cudagraphs")``
with ``max_autotune_gemm_backends="TRITON"`` (Inductor's Triton templates only, autotuning bounded as
``tilefly/bench/inductor.py`` says; if Inductor still puts ATen in the graph the note says so);
``best(aten,triton)`` = the faster of the two per shape.
tilefly: if ``tilefly.ops.gemm.bench`` exists, its ``tilefly_providers(a, b.t()) -> {config: fn}``
(a M x K, b.t() the K x N column-major view, each fn returns a @ b.t()) gives the ``tilefly`` column (fastest config, as
Inductor would pick, named in the note), and two end-to-end compiled providers run:
``compiled`` (backends "ATEN,TRITON") and ``compiled+TILEFLY`` ("ATEN,TRITON,TILEFLY" after
enabling tilefly's gemm family), each noting which kernel Inductor picked.
Metrics: TFLOP/s, and for M <= 256 the bandwidth of reading B (N * K * 2 bytes / time)."""
from __future__ import annotations

import torch

from tilefly.bench import hooks, inductor
from tilefly.bench.cases import Case, numbers, read_csv
from tilefly.bench.results import Comparison
from tilefly.bench.runner import CaseBench, Derived, Plan, Provider, Suite
from tilefly.bench.suites._common import baseline_only, best_config_provider, randn, tflops

BEST = "best(aten,triton)"
SKINNY_M = 256


def cases() -> list[Case]:
    out = []
    for i, row in enumerate(read_csv("dense_gemm.csv")):
        cols = {"m": int(row["m"]), "n": int(row["n"]), "k": int(row["k"])}
        ref = numbers(row, ("aten_tflops", "triton_tflops", "flydsl_tflops"))
        out.append(Case(i, f"{cols['m']}x{cols['n']}x{cols['k']}", cols, ref))
    return out


def mm_nt(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a @ b.t()


def compiled_provider(name: str, backends: str, a: torch.Tensor, b: torch.Tensor, setup=None) -> Provider:
    watch: list[inductor.CodeWatch] = []

    def build():
        if setup is not None:
            setup()
        watch.append(inductor.CodeWatch(inductor.compile_static(mm_nt, "max-autotune-no-cudagraphs"), a, b))
        return watch[0]

    def inspect():
        pick = watch[0].pick(("extern_kernels.mm",)) if watch else None
        return f"Inductor picked {pick}" if pick else None

    return Provider(name, build, context=lambda: inductor.autotune(backends), inspect=inspect)


def gemm_metrics(m: int, n: int, k: int):
    def metrics(provider: str, us: float) -> dict[str, float]:
        out = {"TFLOP/s": tflops(2.0 * m * n * k, us)}
        if m <= SKINNY_M:
            out["B TB/s"] = n * k * 2 / us / 1e6
        return out

    return metrics


def plan() -> Plan:
    hook, missing = hooks.bench_module("tilefly.ops.gemm.bench")

    def bench(case: Case) -> CaseBench:
        m, n, k = case.columns["m"], case.columns["n"], case.columns["k"]
        a, b = randn(m, k), randn(n, k)
        providers = [Provider("aten", lambda: lambda: torch.mm(a, b.t())),
                     compiled_provider("triton", "TRITON", a, b)]
        if hook is not None:
            providers.append(best_config_provider("tilefly", lambda: hook.tilefly_providers(a, b.t())))
            providers.append(compiled_provider("compiled", "ATEN,TRITON", a, b))
            providers.append(compiled_provider("compiled+TILEFLY", "ATEN,TRITON,TILEFLY", a, b,
                                               setup=lambda: _raise_if(hooks.enable_for_inductor("gemm"))))
        return CaseBench(providers, gemm_metrics(m, n, k), [Derived(BEST, ("aten", "triton"))])

    if missing:
        return Plan(bench, [Comparison("triton/aten", "triton", "aten")], ["TFLOP/s", "B TB/s"],
                    [baseline_only(missing)])
    comparisons = [Comparison(f"tilefly/{base}", "tilefly", base) for base in (BEST, "aten", "triton")]
    comparisons += [Comparison("compiled+TILEFLY/compiled", "compiled+TILEFLY", "compiled"),
                    Comparison("triton/aten", "triton", "aten")]
    return Plan(bench, comparisons, ["TFLOP/s", "B TB/s"])


def _raise_if(reason: str | None) -> None:
    if reason:
        raise RuntimeError(reason)


SUITE = Suite(
    name="dense_gemm",
    title="Dense GEMM, BF16, NT: C = A @ B^T, A M x K row-major, B N x K row-major",
    cases=cases,
    quick=(1, 9),  # 16x4096x4096 (decode, weight-bound), 4096x4096x4096
    plan=plan,
)

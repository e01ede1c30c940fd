"""grouped_gemm_small: many experts with few rows each, BF16, the grouped GEMM issue's small-group
path (its example: 128 experts x 32 rows). Generated here, not from a CSV: the expert GEMMs of a
128-expert MoE with hidden size 2048 and expert width 768 (Qwen3-30B-A3B's), the gate and up
projections fused (N 1536 x K 2048) and the down projection (N 2048 x K 768), at 8, 32 and 128 rows
per expert, every expert the same size. Same operands, providers and metric as ``grouped_gemm``
(B column-major per group, as a model stores its expert weights)."""
from __future__ import annotations

from tilefly.bench.cases import Case
from tilefly.bench.runner import Plan, Suite
from tilefly.bench.suites import grouped_gemm

EXPERTS = 128
ROWS_PER_EXPERT = (8, 32, 128)
PROJECTIONS = (("gate_up", 1536, 2048), ("down", 2048, 768))  # (name, N, K)


def cases() -> list[Case]:
    grid = [(proj, n, k, rows) for proj, n, k in PROJECTIONS for rows in ROWS_PER_EXPERT]
    return [Case(i, f"{proj}_g{EXPERTS}x{rows}",
                 {"suite": proj, "case": f"g{EXPERTS}x{rows}x{n}x{k}", "g": EXPERTS, "m_total": EXPERTS * rows,
                  "n": n, "k": k})
            for i, (proj, n, k, rows) in enumerate(grid)]


def shape(case: Case) -> tuple[list[int], int, int]:
    c = case.columns  # every expert the same size
    return [c["m_total"] // c["g"]] * c["g"], c["n"], c["k"]


def plan() -> Plan:
    return grouped_gemm.plan(shape)


SUITE = Suite(
    name="grouped_gemm_small",
    title="Grouped GEMM, many small experts (128 x 8-128 rows), BF16: torch._grouped_mm(A, B, offs)",
    cases=cases,
    quick=(1,),  # gate_up 128 experts x 32 rows, the example
    plan=plan,
)

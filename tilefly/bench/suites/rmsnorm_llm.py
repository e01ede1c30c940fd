"""rmsnorm_llm: RMSNorm on LLM-shaped inputs, BF16, tokens {1, 16, 128, 1024, 8192, 32768} x
hidden {2048, 4096, 5120, 8192} (generated here, not from a CSV). Same providers and metric as
``rmsnorm``; the point is that tilefly is never slower than ATen beyond noise, including the
launch-bound small-token cases its predicate should leave to ATen."""
from __future__ import annotations

import torch

from tilefly.bench import hooks
from tilefly.bench.cases import Case
from tilefly.bench.runner import Plan, Suite
from tilefly.bench.suites.rmsnorm import norm_bench, norm_plan

TOKENS = (1, 16, 128, 1024, 8192, 32768)
HIDDEN = (2048, 4096, 5120, 8192)


def cases() -> list[Case]:
    grid = [(t, h) for t in TOKENS for h in HIDDEN]
    return [Case(i, f"bf16_{t}x{h}", {"dtype": "bf16", "tokens": t, "hidden": h}) for i, (t, h) in enumerate(grid)]


def plan() -> Plan:
    missing = hooks.eager_family_missing("rms_norm")
    return norm_plan(missing, lambda c: norm_bench(torch.bfloat16, c.columns["tokens"], c.columns["hidden"], missing))


SUITE = Suite(
    name="rmsnorm_llm",
    title="RMSNorm forward on LLM shapes, BF16, tokens x hidden, eps=1e-6",
    cases=cases,
    quick=(1, 9, 17, 23),  # 1x4096, 128x4096, 8192x4096, 32768x8192
    plan=plan,
)

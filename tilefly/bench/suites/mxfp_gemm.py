"""mxfp_gemm: MXFP8 and MXFP4 GEMM, 17 NT shapes per format from mxfp_gemm.csv, BF16 output.

Operands are quantized before timing (``tilefly.mx.quantize``, OCP MX rules, through
``tilefly/bench/mx_operands.py``): A is M x K row-major, B is stored N x K row-major (K x N
column-major as ``F.scaled_mm`` takes it); E8M0 scales per 32 K-elements, (M, K/32) and
(N, K/32), unswizzled. MXFP8 data is ``float8_e4m3fn``; MXFP4 data ``float4_e2m1fn_x2`` (K/2
bytes a row, low nibble first).

ATen has no MX GEMM on sm_90, so the baselines are: ``dequant_mm_eager`` = dequantize both
operands to BF16 (``tilefly.mx.dequantize``, the code ``MXLinear(backend="dequant")`` runs),
then ``torch.mm``; ``dequant_mm_compiled`` = the same function under ``torch.compile``
(default mode); ``dequant_mm`` = the faster of those two per case; ``bf16_mm`` =
plain ``torch.mm`` on BF16 operands of the same shape (what the MX format has to beat).
tilefly: ``tilefly.ops.mx_gemm.bench.tilefly_providers(a, b, scale_a, scale_b, fmt)`` -> {config: fn},
with a (M, K or K/2), b = b_nk.t() (K or K/2, N), scales as above, each fn returning BF16 M x N.
Metrics: TFLOP/s (2MNK), and for M <= 256 the weight bandwidth, bytes of B as that provider
reads it (MX data + scales, or BF16) / time."""
from __future__ import annotations

import torch

from tilefly import mx
from tilefly.bench import hooks, inductor, mx_operands
from tilefly.bench.cases import Case, numbers, read_csv
from tilefly.bench.results import Comparison
from tilefly.bench.runner import CaseBench, Derived, Plan, Provider, Suite
from tilefly.bench.suites._common import baseline_only, best_config_provider, randn, tflops

SKINNY_M = 256
DEQUANT = "dequant_mm"


def cases() -> list[Case]:
    out = []
    for i, row in enumerate(read_csv("mxfp_gemm.csv")):
        cols = {"format": row["format"], "m": int(row["m"]), "n": int(row["n"]), "k": int(row["k"])}
        ref = numbers(row, ("aten_tflops", "flydsl_tflops"))
        out.append(Case(i, f"{cols['format']}_{cols['m']}x{cols['n']}x{cols['k']}", cols, ref))
    return out


def dequant_mm(a_data, a_scale_bits, b_data, b_scale_bits, fmt: str):
    a = mx.dequantize(a_data, a_scale_bits, fmt)
    b = mx.dequantize(b_data, b_scale_bits, fmt)
    return torch.mm(a, b.t())


def plan() -> Plan:
    hook, missing = hooks.bench_module("tilefly.ops.mx_gemm.bench")

    def bench(case: Case) -> CaseBench:
        fmt, m, n, k = (case.columns[key] for key in ("format", "m", "n", "k"))
        a_bf16, b_bf16 = randn(m, k), randn(n, k)
        qa, qb = mx_operands.quantize(a_bf16, fmt), mx_operands.quantize(b_bf16, fmt)
        args = (*qa.plain(), *qb.plain())  # free views; keep FP4/E8M0 dtypes out of the traced graph

        def build_compiled():
            compiled = inductor.compile_static(lambda *xs: dequant_mm(*xs, fmt=fmt))
            return lambda: compiled(*args)

        providers = [Provider("dequant_mm_eager", lambda: lambda: dequant_mm(*args, fmt=fmt)),
                     Provider("dequant_mm_compiled", build_compiled),
                     Provider("bf16_mm", lambda: lambda: torch.mm(a_bf16, b_bf16.t()))]
        if hook is not None:
            providers.append(best_config_provider(
                "tilefly", lambda: hook.tilefly_providers(qa.data, qb.data.t(), qa.scale, qb.scale, fmt)))
        weight_bytes = {"bf16_mm": n * k * 2}

        def metrics(provider: str, us: float) -> dict[str, float]:
            out = {"TFLOP/s": tflops(2.0 * m * n * k, us)}
            if m <= SKINNY_M:
                out["W TB/s"] = weight_bytes.get(provider, qb.nbytes) / us / 1e6
            return out

        return CaseBench(providers, metrics, [Derived(DEQUANT, ("dequant_mm_eager", "dequant_mm_compiled"))])

    formats = mx_operands.FORMATS
    baseline = [Comparison(f"{f} bf16_mm/{DEQUANT}", "bf16_mm", DEQUANT, (("format", f),)) for f in formats]
    if missing:
        return Plan(bench, baseline, ["TFLOP/s", "W TB/s"], [baseline_only(missing)])
    comparisons = [Comparison(f"{f} tilefly/{base}", "tilefly", base, (("format", f),))
                   for f in formats for base in (DEQUANT, "bf16_mm")]
    return Plan(bench, comparisons + baseline, ["TFLOP/s", "W TB/s"])


SUITE = Suite(
    name="mxfp_gemm",
    title="MXFP8 / MXFP4 GEMM (1x32 E8M0 block scales), NT, BF16 out; ATen has none on sm_90",
    cases=cases,
    quick=(0, 14, 18, 31),  # mxfp8 32x4096x4096, mxfp8 4096^3, mxfp4 32x14336x4096, mxfp4 4096^3
    plan=plan,
)

"""Time RMSNorm kernel configs on the GPU and print the best per case.

    python -m tilefly.ops.rms_norm.sweep                  # rmsnorm.csv cases, every candidate
    python -m tilefly.ops.rms_norm.sweep --suite llm      # BF16 tokens x hidden, for the band
    python -m tilefly.ops.rms_norm.sweep --quick          # ATen and the heuristic only
    python -m tilefly.ops.rms_norm.sweep --case fp32,2048 # cases whose label contains the text
    python -m tilefly.ops.rms_norm.sweep --overhead       # eager per-call cost, tiny input

Per case: ATen's ``_fused_rms_norm``, the heuristic's config and the fastest candidate
(``configs.candidates``), each the median of ``triton.testing.do_bench`` with L2 flushed before
every repetition, and effective bandwidth (read x, read w, write y); "op us" is F.rms_norm with
tilefly enabled (router, predicate, wrapper, heuristic config). The last lines are the winners
as ``configs.TUNED`` entries and the geometric-mean speedups over ATen.
"""
from __future__ import annotations

import argparse
import csv
import importlib.resources
import math

import time

import torch
import torch.nn.functional as F

import tilefly
from tilefly.ops.rms_norm import configs, eager

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
LLM_TOKENS = (1, 16, 128, 1024, 8192, 32768)
LLM_HIDDEN = (2048, 4096, 5120, 8192)


def suite_cases(suite: str) -> list[tuple[str, int, int]]:
    cases = []
    if suite in ("rmsnorm", "all"):
        text = (importlib.resources.files("tilefly.bench") / "cases" / "rmsnorm.csv").read_text()
        cases += [(row["dtype"], int(row["m"]), int(row["n"])) for row in csv.DictReader(text.splitlines())]
    if suite in ("llm", "all"):
        cases += [("bf16", m, n) for m in LLM_TOKENS for n in LLM_HIDDEN]
    return cases


def bench_us(fn) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median") * 1e3


def sweep_case(dtype: str, M: int, N: int, quick: bool) -> dict:
    x = torch.randn(M, N, device="cuda").to(DTYPES[dtype])
    w = (torch.rand(N, device="cuda") + 0.5).to(x.dtype)
    y, rstd = torch.empty_like(x), torch.empty(M, 1, device="cuda")
    size = x.element_size()
    layout = configs.row_layout(N, N, x.data_ptr() % 16 == 0, size)
    expected = torch.ops.aten._fused_rms_norm(x, [N], w, 1e-6)[0]
    result = {"aten": bench_us(lambda: torch.ops.aten._fused_rms_norm(x, [N], w, 1e-6))}
    with tilefly.enabled("rms_norm"):
        tilefly.config.force = True
        result["op"] = bench_us(lambda: F.rms_norm(x, (N,), w, 1e-6))
        tilefly.config.force = False
    todo = [configs.heuristic(N, size, layout)] + ([] if quick else configs.candidates(N, size, layout))
    for cfg in dict.fromkeys(todo):
        try:
            eager.launch(x, w, y, rstd, 1e-6, cfg)
            torch.testing.assert_close(y, expected, rtol=2e-2, atol=2e-2)
            result[cfg] = bench_us(lambda: eager.launch(x, w, y, rstd, 1e-6, cfg))
        except Exception as exc:  # noqa: BLE001 - a config that does not fit is skipped, not fatal
            print(f"    skip {cfg}: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
    result["layout"], result["heuristic"] = layout, configs.heuristic(N, size, layout)
    result["bytes"] = (2 * M * N + N) * size
    return result


def per_call_us(fn, calls: int = 2000) -> float:
    """Eager cost of back-to-back calls on a tiny input: the CPU path, not the kernel."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def overhead() -> None:
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    call = lambda: F.rms_norm(x, (4096,), w, 1e-6)  # noqa: E731
    print(f"F.rms_norm on 1x4096 bf16, per call: ATen {per_call_us(call):.1f} us", end="")
    with tilefly.enabled("rms_norm"):
        tilefly.config.force = True
        print(f", tilefly {per_call_us(call):.1f} us", end="")
        tilefly.config.force = False
        print(f", tilefly declining (band) {per_call_us(call):.1f} us")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=("rmsnorm", "llm", "all"), default="rmsnorm")
    parser.add_argument("--case", default="", help="only cases whose 'dtype,m,n' label contains this")
    parser.add_argument("--quick", action="store_true", help="time ATen and the heuristic only")
    parser.add_argument("--overhead", action="store_true", help="only the eager per-call cost")
    args = parser.parse_args(argv)
    if args.overhead:
        overhead()
        return

    tb = lambda nbytes, us: nbytes / us / 1e6  # noqa: E731 - bytes per microsecond -> TB/s
    winners, speed_heur, speed_best = {}, [], []
    print(f"{'case':<20} {'layout':<8} {'aten us':>9} {'TB/s':>5}  {'op us':>7}  {'heuristic us':>12} "
          f"{'TB/s':>5}  {'best us':>8} {'TB/s':>5} {'x aten':>6}  best config")
    for dtype, M, N in suite_cases(args.suite):
        label = f"{dtype},{M},{N}"
        if args.case not in label:
            continue
        r = sweep_case(dtype, M, N, args.quick)
        timed = {k: v for k, v in r.items() if isinstance(k, configs.Config)}
        if not timed:
            print(f"{label:<20} no config ran")
            continue
        best = min(timed, key=timed.get)
        heur_us = timed.get(r["heuristic"], math.nan)
        speed_heur.append(r["aten"] / heur_us)
        speed_best.append(r["aten"] / timed[best])
        size = DTYPES[dtype].itemsize
        block = configs._pow2(max(configs.max_body(N, size, r["layout"]), 1))
        winners[(size, r["layout"], block)] = best
        print(f"{label:<20} {r['layout']:<8} {r['aten']:9.1f} {tb(r['bytes'], r['aten']):5.2f}  "
              f"{r['op']:7.1f}  {heur_us:12.1f} {tb(r['bytes'], heur_us):5.2f}  {timed[best]:8.1f} "
              f"{tb(r['bytes'], timed[best]):5.2f} {r['aten'] / timed[best]:6.2f}  {best}")
    geo = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs)) if xs else math.nan  # noqa: E731
    print(f"\ngeomean speedup over ATen: heuristic {geo(speed_heur):.2f}x, best {geo(speed_best):.2f}x "
          f"(min {min(speed_best, default=math.nan):.2f}x)")
    print("configs.TUNED entries (element size, layout, row body block):")
    for key, cfg in winners.items():
        note = "  # plain loads beat SPLIT: raise configs.SPLIT_MIN_N instead" if not cfg.split else ""
        print(f"    {key!r}: {cfg!r},{note}")


if __name__ == "__main__":
    main()

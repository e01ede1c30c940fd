"""Time RMSNorm kernel configs on the GPU and print the best per case.

    python -m tilefly.ops.rms_norm.sweep                  # rmsnorm.csv cases, every candidate
    python -m tilefly.ops.rms_norm.sweep --suite llm      # BF16 tokens x hidden, for the band
    python -m tilefly.ops.rms_norm.sweep --quick          # ATen and the heuristic only
    python -m tilefly.ops.rms_norm.sweep --case fp32,2048 # cases whose label contains the text
    python -m tilefly.ops.rms_norm.sweep --new --case fp16,8192,4097 --case fp32,2048,16385
                                                          # ATen, the heuristic and configs.new_candidates
                                                          # (not yet measured), for the named cases
    python -m tilefly.ops.rms_norm.sweep --overhead       # eager per-call cost, tiny input
    python -m tilefly.ops.rms_norm.sweep --host           # CPU only: predicate and op host cost

Per case: ATen's ``_fused_rms_norm``, the heuristic's config and the fastest candidate
(``configs.candidates``), each the median of ``tilefly.bench.timing.measure`` (QUICK) with L2 flushed before
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
import types

import torch
import torch.nn.functional as F

import tilefly
from tilefly import _device
from tilefly.ops.rms_norm import configs, eager, launcher

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
    from tilefly.bench.timing import QUICK, measure

    return measure(fn, QUICK).median_us


def sweep_case(dtype: str, M: int, N: int, quick: bool, new: bool = False) -> dict:
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
    if new:
        more = configs.new_candidates(N, size, layout)
    else:
        more = [] if quick else configs.candidates(N, size, layout)
    todo = [configs.heuristic(N, size, layout)] + more
    for cfg in dict.fromkeys(todo):
        try:
            launcher.launch(x, w, y, rstd, 1e-6, cfg)
            torch.testing.assert_close(y, expected, rtol=2e-2, atol=2e-2)
            result[cfg] = bench_us(lambda: launcher.launch(x, w, y, rstd, 1e-6, cfg))
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
    """Back-to-back F.rms_norm on 1 x 4096 BF16: ATen alone, tilefly serving it, and tilefly
    declining it (the band raised above it for the measurement): router + predicate + ATen."""
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    call = lambda: F.rms_norm(x, (4096,), w, 1e-6)  # noqa: E731
    print(f"F.rms_norm on 1x4096 bf16, per call: ATen {per_call_us(call):.1f} us", end="")
    band = eager.MIN_SERVED_BYTES
    with tilefly.enabled("rms_norm"):
        print(f", tilefly {per_call_us(call):.1f} us", end="")
        eager.MIN_SERVED_BYTES = 1 << 40
        eager._plans.clear()
        eager._recent = None
        try:
            print(f", tilefly declining (band) {per_call_us(call):.1f} us")
        finally:
            eager.MIN_SERVED_BYTES = band
            eager._plans.clear()
            eager._recent = None


def host_cost(repeats: int = 5, calls: int = 50000) -> None:
    """Host time per call of the predicate and of the op on a 1 x 4096 BF16 input, with the device
    check answering "sm_90", CPU tensors taking the CUDA branch (device index 0) and a no-op in
    place of Triton's C launcher: what the family's Python costs, on a CPU-only machine (best of
    ``repeats`` loops of ``calls``)."""
    x, x2 = torch.randn(1, 4096, dtype=torch.bfloat16), torch.randn(2, 4096, dtype=torch.bfloat16)
    w = torch.randn(4096, dtype=torch.bfloat16)
    norm = [4096]
    saved = _device.hopper_reason, launcher._raw_stream, launcher._hooks, torch.Tensor.__dict__.get("get_device")
    _device.hopper_reason = lambda t: None
    torch.Tensor.get_device = lambda self: 0
    launcher._raw_stream = lambda index: 0
    launcher._hooks = types.SimpleNamespace(calls=[])
    try:
        for t in (x2, x):  # x last: its metadata is the recent guard's
            plan = eager.rms_norm_plan(t, norm, w, 1e-6)
            assert isinstance(plan, eager.Plan), "BF16 rows of 4096 must be served"
            plan.fast = (lambda *args: None, 1, 0, False, False, (8, 1, 0), plan.M, plan.N, plan.stride,
                         (4096, 2, 8, True, False, True))

        def op():
            eager.rms_norm_served(plan, x, norm, w, 1e-6)

        def served():  # what the router does (Impl.takes_plan)
            answer = eager.rms_norm_plan(x, norm, w, 1e-6)
            if answer.__class__ is not str:
                eager.rms_norm_served(answer, x, norm, w, 1e-6)

        def alternating():  # the recent guard misses every call: the dict lookup decides
            eager.rms_norm_plan(x2, norm, w, 1e-6)
            eager.rms_norm_plan(x, norm, w, 1e-6)

        for label, fn, per in (("predicate", lambda: eager.rms_norm_plan(x, norm, w, 1e-6), 1),
                               ("predicate, shapes alternating", alternating, 2),
                               ("op (launch stubbed)", op, 1),
                               ("predicate + op (launch stubbed)", served, 1)):
            best = math.inf
            for _ in range(repeats):
                start = time.perf_counter()
                for _ in range(calls):
                    fn()
                best = min(best, (time.perf_counter() - start) / calls / per * 1e6)
            print(f"{label:<34} {best:6.2f} us per call")
    finally:
        _device.hopper_reason, launcher._raw_stream, launcher._hooks = saved[:3]
        if saved[3] is None:
            del torch.Tensor.get_device
        else:
            torch.Tensor.get_device = saved[3]
        eager._plans.clear()
        eager._recent = None


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=("rmsnorm", "llm", "all"), default="rmsnorm")
    parser.add_argument("--case", action="append", default=None,
                        help="only cases whose 'dtype,m,n' label contains this (repeat for several)")
    parser.add_argument("--new", action="store_true",
                        help="time ATen, the heuristic and configs.new_candidates only")
    parser.add_argument("--quick", action="store_true", help="time ATen and the heuristic only")
    parser.add_argument("--overhead", action="store_true", help="only the eager per-call cost")
    parser.add_argument("--host", action="store_true", help="CPU only: predicate and op host cost, launch stubbed")
    args = parser.parse_args(argv)
    if args.overhead:
        overhead()
        return
    if args.host:
        host_cost()
        return

    tb = lambda nbytes, us: nbytes / us / 1e6  # noqa: E731 - bytes per microsecond -> TB/s
    winners, speed_heur, speed_best = {}, [], []
    print(f"{'case':<20} {'layout':<8} {'aten us':>9} {'TB/s':>5}  {'op us':>7}  {'heuristic us':>12} "
          f"{'TB/s':>5}  {'best us':>8} {'TB/s':>5} {'x aten':>6}  best config")
    for dtype, M, N in suite_cases(args.suite):
        label = f"{dtype},{M},{N}"
        if args.case and not any(text in label for text in args.case):
            continue
        r = sweep_case(dtype, M, N, args.quick, args.new)
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
        if args.new:  # every config, for the record (few per case)
            for cfg, us in sorted(timed.items(), key=lambda kv: kv[1]):
                print(f"    {us:8.1f} us {tb(r['bytes'], us):5.2f} TB/s  {cfg}")
    geo = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs)) if xs else math.nan  # noqa: E731
    print(f"\ngeomean speedup over ATen: heuristic {geo(speed_heur):.2f}x, best {geo(speed_best):.2f}x "
          f"(min {min(speed_best, default=math.nan):.2f}x)")
    print("configs.TUNED entries (element size, layout, row body block):")
    for key, cfg in winners.items():
        note = "  # plain loads beat SPLIT: raise configs.SPLIT_MIN_N instead" if not cfg.split else ""
        print(f"    {key!r}: {cfg!r},{note}")


if __name__ == "__main__":
    main()

"""Time the skinny MX GEMM (kernels_skinny.py) on the skinny rows of cases/mxfp_gemm.csv (at most
configs.SKINNY_MAX_COLS on the small side): every skinny config ``configs.offered`` races there,
the eager pick (``configs.pick``), the Gluon pick it replaced (``configs.gluon_pick``) and BF16
torch.mm on BF16 operands of the same shape. Per provider three times, so a host-bound call can be
told from a device-bound one:

    us      CUDA events around each call, L2 flushed before each by reading a 256 MiB buffer,
            median of --reps (a call whose host path outlasts the ~65 us flush leaves the GPU idle
            inside the event pair, and that gap is counted);
    dev us  the GPU time of the call's kernels (torch.profiler, CUDA activity: the summed
            durations of every kernel the call launched, flush kernels excluded), per call over
            --prof-calls calls, each after an L2 flush;
    host us perf_counter around 100 back-to-back calls (synchronized before; the clock stops
            before the closing synchronize), per call: the host path alone.

Each tilefly result is first checked against the float64 product of the dequantized operands
(max error / max|C|). Prints one table.

    python scripts/mx_skinny_sweep.py [--cases CSV] [--reps 50] [--prof-calls 10]
                                      [--swizzled] [--json FILE]
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import time

import torch

from tilefly import mx
from tilefly.ops.mx_gemm import configs, eligibility, launch

# The package's copy of ../shared/cases/mxfp_gemm.csv (identical; travels with the repository).
DEFAULT_CASES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tilefly", "bench", "cases",
                             "mxfp_gemm.csv")
FLUSH_BYTES = 256 << 20


def skinny_cases(path: str) -> list[tuple[str, int, int, int]]:
    with open(path) as f:
        rows = [(r["format"], int(r["m"]), int(r["n"]), int(r["k"])) for r in csv.DictReader(f)]
    return [r for r in rows if min(r[1], r[2]) <= configs.SKINNY_MAX_COLS]


class Timer:
    def __init__(self, reps: int):
        self.reps = reps
        self.flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.float32, device="cuda").normal_()

    def median_us(self, fn) -> float:
        for _ in range(3):
            fn()
        times = []
        for _ in range(self.reps):
            self.flush.sum()                      # reads 256 MiB: nothing of the operands stays in L2
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        return statistics.median(times)

    def host_us(self, fn, calls: int = 100) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - start
        torch.cuda.synchronize()
        return elapsed / calls * 1e6

    def device_us(self, fn, calls: int) -> float:
        """Summed kernel durations of ``calls`` calls (each after a flush) over ``calls``; the
        flush's kernels are told apart by name from a profile of flushes alone."""
        flush_names = {e.name for e in self._kernels(lambda: self.flush.sum(), 2)}
        kernels = [e for e in self._kernels(fn, calls) if e.name not in flush_names]
        return sum(e.time_range.elapsed_us() for e in kernels) / calls

    def _kernels(self, fn, calls: int):
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                self.flush.sum()
                fn()
            torch.cuda.synchronize()
        return [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def weight_bytes(fmt: str, m: int, n: int, k: int) -> int:
    rows = max(m, n)
    return rows * k // (1 if fmt == "mxfp8" else 2) + rows * k // 32


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=DEFAULT_CASES)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--prof-calls", type=int, default=10, help="calls profiled for the device time")
    ap.add_argument("--swizzled", action="store_true", help="SWIZZLE_32_4_4 scales (default NO_SWIZZLE)")
    ap.add_argument("--json")
    args = ap.parse_args()
    timer = Timer(args.reps)
    swizzle = "32_4_4" if args.swizzled else "none"
    results = []
    header = (f"{'format':6} {'m':>5} {'n':>6} {'k':>5}  {'provider':30} {'us':>8} {'dev us':>8} {'host us':>8} "
              f"{'W TB/s':>7} {'devTB/s':>7} {'TFLOP/s':>8} {'vs mm':>6} {'err':>8}")
    print(header, flush=True)
    for fmt, m, n, k in skinny_cases(args.cases):
        g = torch.Generator(device="cuda").manual_seed(m + n + k)
        qa, sa = mx.quantize(torch.randn(m, k, device="cuda", generator=g), fmt, swizzle=swizzle)
        qb, sb = mx.quantize(torch.randn(n, k, device="cuda", generator=g), fmt, swizzle=swizzle)
        a, b = qa, qb.t()
        ref = (mx.dequantize(qa, sa, fmt, swizzle=swizzle, dtype=torch.float64)
               @ mx.dequantize(qb, sb, fmt, swizzle=swizzle, dtype=torch.float64).T)
        p = eligibility.parse(a, b, sa, sb, args.swizzled, args.swizzled)
        out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        rows, cols = max(m, n), min(m, n)
        picked, gluon = configs.pick(rows, cols, k, fmt), configs.gluon_pick(rows, cols, k, fmt)
        providers = {}
        for cfg in configs.skinny_configs(rows, cols, k, fmt):
            providers[cfg.name + (" (pick)" if cfg == picked else "")] = cfg
        if picked not in providers.values():
            providers[picked.name + " (pick)"] = picked
        providers[gluon.name + " (gluon pick)"] = gluon
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        flops = 2.0 * m * n * k
        wb = weight_bytes(fmt, m, n, k)

        def timed(fn) -> tuple[float, float, float]:
            return timer.median_us(fn), timer.device_us(fn, args.prof_calls), timer.host_us(fn)

        def report(name, times, err):
            us, dev_us, host_us = times
            row = dict(format=fmt, m=m, n=n, k=k, provider=name, us=us, device_us=dev_us, host_us=host_us,
                       weight_tbps=wb / us / 1e6, device_weight_tbps=wb / dev_us / 1e6 if dev_us else None,
                       tflops=flops / us / 1e6, vs_mm=mm_times[0] / us, err=err)
            results.append(row)
            err_s = "" if err is None else f"{err:.1e}"
            dev_tbps = f"{row['device_weight_tbps']:7.2f}" if dev_us else f"{'-':>7}"
            print(f"{fmt:6} {m:>5} {n:>6} {k:>5}  {name:30} {us:8.2f} {dev_us:8.2f} {host_us:8.2f} "
                  f"{row['weight_tbps']:7.2f} {dev_tbps} {row['tflops']:8.1f} {row['vs_mm']:6.2f} {err_s:>8}",
                  flush=True)

        mm_times = timed(lambda: torch.mm(x, w))
        report("torch.mm bf16", mm_times, None)
        for name, cfg in providers.items():
            try:
                out.fill_(float("nan"))
                launch.run(p, a, b, sa, sb, out, cfg=cfg)
                torch.cuda.synchronize()
                err = ((out.double() - ref).abs().max() / ref.abs().max()).item()   # NaN if anything unwritten
                times = timed(lambda cfg=cfg: launch.run(p, a, b, sa, sb, out, cfg=cfg))
            except Exception as exc:  # noqa: BLE001 - report and keep sweeping
                print(f"{fmt:6} {m:>5} {n:>6} {k:>5}  {name:30} FAILED {type(exc).__name__}: {str(exc)[:160]}",
                      flush=True)
                continue
            report(name, times, err)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

"""Where the MX BF16 route (tilefly.ops.mx_gemm.upcast) beats the exact kernels, and by how much.

Per mxfp_gemm case (or --cases): the upcast pass of both operands alone, the whole route (upcast.run),
the fastest exact config (launch.run over configs.offered), BF16 torch.mm for scale; each timed with
tilefly.bench.timing.measure (L2 flushed, median). Also checks the route's output against the float64
product of the dequantized operands. One line per case; --json keeps the rows. --profile instead
runs 20 back-to-back calls of the route per case under torch.profiler and prints each kernel's GPU
time and the calls' host time (where the route's time goes when it is not the kernels).

    python scripts/mx_upcast_probe.py [--cases 0,14,...] [--json FILE] [--profile]
"""
from __future__ import annotations

import argparse
import json

import torch

from tilefly import mx
from tilefly.bench import mx_operands
from tilefly.bench.suites import mxfp_gemm
from tilefly.bench.timing import QUICK, measure
from tilefly.ops.mx_gemm import configs, eligibility, launch, upcast


def _exact_best(p, a, b, out) -> tuple[float, str]:
    best = (float("inf"), "none")
    for cfg in configs.offered(max(p.m, p.n), min(p.m, p.n), p.k, p.fmt):
        run = lambda cfg=cfg: launch.run(p, a.data, b.data.t(), a.scale, b.scale, out, cfg=cfg)  # noqa: E731
        try:
            run()
            best = min(best, (measure(run, QUICK).median_us, cfg.name))
        except Exception as exc:  # noqa: BLE001 - report and keep probing
            print(f"  {cfg.name} failed: {type(exc).__name__}: {str(exc)[:120]}")
    return best


def _profile(label: str, fn) -> None:
    import time

    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(20):
            fn()
        host = (time.perf_counter() - t0) / 20 * 1e6
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / 20 * 1e6
    print(f"== {label}: host {host:.1f} us a call, wall {wall:.1f} us a call (20 back to back, L2 warm)")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8, max_name_column_width=60))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", help="comma-separated case indices of the mxfp_gemm suite (default: all)")
    ap.add_argument("--json")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    cases = mxfp_gemm.cases()
    if args.cases:
        cases = [cases[int(i)] for i in args.cases.split(",")]
    rows = []
    for case in cases:
        fmt, m, n, k = (case.columns[key] for key in ("format", "m", "n", "k"))
        a = mx_operands.quantize(torch.randn(m, k, device="cuda"), fmt)
        b = mx_operands.quantize(torch.randn(n, k, device="cuda"), fmt)
        p = eligibility.parse(a.data, b.data.t(), a.scale, b.scale, False, False)
        out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        fp4 = fmt == "mxfp4"
        upcast.run(p, a.data, b.data.t(), a.scale, b.scale, out)
        if args.profile:
            _profile(f"{fmt} {m}x{n}x{k}", lambda: upcast.run(p, a.data, b.data.t(), a.scale, b.scale, out))
            continue
        ref = mx.dequantize(a.data, a.scale, fmt).double() @ mx.dequantize(b.data, b.scale, fmt).double().T
        err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
        us = lambda fn: measure(fn, QUICK).median_us  # noqa: E731
        row = {"fmt": fmt, "m": m, "n": n, "k": k, "rel_err": err,
               "upcast_us": us(lambda: upcast.upcast_operands(a.data, a.scale, b.data, b.scale, m, n, k, fp4, False,
                                                              False)),
               "route_us": us(lambda: upcast.run(p, a.data, b.data.t(), a.scale, b.scale, out))}
        row["exact_us"], row["exact_cfg"] = _exact_best(p, a, b, out)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        row["bf16_mm_us"] = us(lambda: x @ w.t())
        rows.append(row)
        tf = 2.0 * m * n * k / row["route_us"] / 1e6
        print(f"{fmt} {m}x{n}x{k}: upcast {row['upcast_us']:.1f} us, route "
              f"{row['route_us']:.1f} us ({tf:.0f} TFLOP/s), exact {row['exact_us']:.1f} us ({row['exact_cfg']}), "
              f"bf16 mm {row['bf16_mm_us']:.1f} us, route/exact {row['exact_us'] / row['route_us']:.2f}x, "
              f"err {err:.1e}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

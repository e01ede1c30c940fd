"""Kernels to read with Nsight Compute: the cases whose speed the open issues still ask for.

Each case is set up and run once outside the profiled range (compile, autotune, cached plans),
then run ``--reps`` times between ``cudaProfilerStart``/``Stop``, so under
``ncu --profile-from-start off`` only those launches are profiled (ncu flushes the caches before
each kernel it measures, as the benchmarks flush L2).

    ncu --clock-control none --profile-from-start off --set full -o /tmp/probe \\
        python scripts/ncu_probe.py --case rmsnorm:fp32:2048x16385 --case gemm:splitk64x16x128_s8_w4_k16:16x4096x4096
    ncu -i /tmp/probe.ncu-rep --page details > probe.txt

Cases:
    rmsnorm:DTYPE:MxN                 F.rms_norm with a weight, tilefly enabled (its shipped config)
    aten-rmsnorm:DTYPE:MxN            the same with tilefly disabled (ATen's kernel)
    gemm:CONFIG:MxNxK                 tilefly's dense GEMM with CONFIG (a configs name), BF16 NT
    aten-gemm:MxNxK                   torch.mm, BF16 NT (cuBLAS)
    mx:FMT:CONFIG:MxNxK               tilefly's MX GEMM (FMT mxfp8/mxfp4) with CONFIG, a name from
                                      mx_gemm.configs.offered or v3_wide_configs on that shape, or "pick"
                                      (the eager choice)
Without --case: the RMSNorm rows under 3.5 TB/s (issue 3) beside their aligned neighbours, and the
decode GEMM 16x4096x4096 with its best config beside cuBLAS (issue 5).
Without ncu it prints each case's median time (CUDA events, L2 flushed), which says whether the
profiled kernels are the ones the benchmarks time.
"""
from __future__ import annotations

import argparse

import torch

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
DEFAULT_CASES = [
    "rmsnorm:fp32:2048x16385", "rmsnorm:fp32:2048x16384",
    "rmsnorm:fp16:2048x16385", "rmsnorm:fp16:2048x16384", "rmsnorm:fp16:2048x65536",
    "gemm:splitk64x16x128_s8_w4_k16:16x4096x4096", "aten-gemm:16x4096x4096",
]


def _dims(text: str) -> list[int]:
    return [int(v) for v in text.lower().split("x")]


def build(case: str):
    """(label, fn) for one case."""
    import torch.nn.functional as F

    import tilefly

    kind, _, rest = case.partition(":")
    if kind in ("rmsnorm", "aten-rmsnorm"):
        dtype, shape = rest.split(":")
        m, n = _dims(shape)
        x = torch.randn(m, n, device="cuda", dtype=DTYPES[dtype])
        w = (torch.rand(n, device="cuda") + 0.5).to(x.dtype)
        on = kind == "rmsnorm"

        def fn():
            if on:
                with tilefly.enabled(["rms_norm"]):
                    return F.rms_norm(x, (n,), w, 1e-6)
            return F.rms_norm(x, (n,), w, 1e-6)
        return f"{case} ({m * n * x.element_size() * 2 / 1e6:.0f} MB moved)", fn
    if kind in ("gemm", "aten-gemm"):
        from tilefly.ops.gemm import configs, launch
        from tilefly.ops.gemm.sweep import _operands

        name, shape = rest.split(":") if kind == "gemm" else (None, rest)
        m, n, k = _dims(shape)
        a, b = _operands(m, n, k, "NT", torch.bfloat16)
        if name is None:
            return f"{case} (B {n * k * 2 / 1e6:.0f} MB)", lambda: torch.mm(a, b)
        cfg = next((c for c in configs.exhaustive() if c.name == name), None)
        if cfg is None:
            raise SystemExit(f"unknown GEMM config {name!r} (see tilefly.ops.gemm.configs)")
        out = torch.empty(m, n, device="cuda", dtype=a.dtype)
        return f"{case} (B {n * k * 2 / 1e6:.0f} MB)", lambda: launch.run(cfg, a, b, out)
    if kind == "mx":
        from tilefly.bench import mx_operands
        from tilefly.ops.mx_gemm import configs as mx_configs, eligibility, launch as mx_launch

        fmt, name, shape = rest.split(":")
        m, n, k = _dims(shape)
        qa = mx_operands.quantize(torch.randn(m, k, device="cuda"), fmt)
        qb = mx_operands.quantize(torch.randn(n, k, device="cuda"), fmt)
        p = eligibility.parse(qa.data, qb.data.t(), qa.scale, qb.scale, False, False)
        rows, cols = max(m, n), min(m, n)
        known = mx_configs.offered(rows, cols, k, fmt) + mx_configs.v3_wide_configs(rows, cols, k, fmt)
        cfg = mx_configs.pick(rows, cols, k, fmt) if name == "pick" else next(
            (c for c in known if c.name == name), None)
        if cfg is None:
            raise SystemExit(f"{name!r} is not offered for {fmt} {shape} (mx_gemm.configs.offered, v3_wide_configs)")
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        return (f"{case} [{cfg.name}] (W {qb.nbytes / 1e6:.1f} MB)",
                lambda: mx_launch.run(p, qa.data, qb.data.t(), qa.scale, qb.scale, out, cfg=cfg))
    raise SystemExit(f"unknown case kind {kind!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", action="append", help="see the module docstring (default: issue 3 and 5 cases)")
    ap.add_argument("--reps", type=int, default=2, help="profiled runs of each case")
    args = ap.parse_args()
    from tilefly.bench.timing import QUICK, measure

    cases = [build(c) for c in (args.case or DEFAULT_CASES)]
    for label, fn in cases:
        fn()
        torch.cuda.synchronize()
        print(f"{label}: {measure(fn, QUICK).median_us:.1f} us (events, L2 flushed)", flush=True)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for label, fn in cases:
        torch.cuda.nvtx.range_push(label)
        for _ in range(args.reps):
            fn()
        torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()

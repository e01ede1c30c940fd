"""How fast can a decode GEMM's weight matrix be read at all, timed as the suites time?

The dense suite's decode shapes stream B (N x K BF16) once; issue 5 asks for 3.3 TB/s there.
This probe times, in one process with tilefly.bench.timing (L2 read flush before every call,
CUDA events, median), a plain read of the same bytes by a Triton kernel over a grid of launch
shapes (the floor any GEMM reading B pays), ``torch.sum`` of it, cuBLAS's ``mm`` with M tokens
and tilefly's split-K configs offered for the shape, so the GEMMs' gap to the floor is visible.

    python scripts/stream_floor_probe.py [--tokens 16] [--shapes 4096x4096,14336x4096] [--json PATH]
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json

import torch
import triton
import triton.language as tl

from tilefly.bench.timing import QUICK, Policy, measure


@triton.jit
def _read_kernel(x_ptr, out_ptr, n, per_prog, BLOCK: tl.constexpr):
    # Each program sums its contiguous slice; the store of one float keeps the loads alive.
    start = tl.program_id(0).to(tl.int64) * per_prog
    acc = tl.zeros([BLOCK], tl.float32)
    for off in tl.range(0, per_prog, BLOCK):
        idx = start + off + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + idx, mask=idx < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc))


@triton.jit
def _empty_kernel(out_ptr):
    tl.store(out_ptr + tl.program_id(0), 1.0)


def read_floor(b: torch.Tensor, policy: Policy, echo) -> list[dict]:
    flat = b.view(-1)
    n = flat.numel()
    sink = torch.empty(1 << 16, device=b.device, dtype=torch.float32)
    rows = []
    for programs, block, warps in itertools.product((132, 264, 528, 1056, 2112, 4224), (2048, 4096, 8192),
                                                    (4, 8)):
        per_prog = -(-n // programs)
        per_prog = -(-per_prog // block) * block
        grid = (-(-n // per_prog),)

        def call(grid=grid, per_prog=per_prog, block=block, warps=warps):
            _read_kernel[grid](flat, sink, n, per_prog, BLOCK=block, num_warps=warps)

        call()
        us = measure(call, policy).median_us
        rows.append({"programs": grid[0], "block": block, "warps": warps, "us": us,
                     "tb_s": n * flat.element_size() / us / 1e6})
    rows.sort(key=lambda r: r["us"])
    for r in rows[:5]:
        echo(f"  read {r['programs']:5d} programs x {r['block']:5d} elems, w{r['warps']}: "
             f"{r['us']:7.2f} us {r['tb_s']:5.2f} TB/s")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="16", help="comma list of M for the GEMM columns")
    ap.add_argument("--shapes", default="4096x4096,1024x4096,14336x4096,28672x4096", help="N x K of B, comma list")
    ap.add_argument("--headstart-us", type=float, default=0.0)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    from tilefly.ops.gemm import configs, launch

    policy = dataclasses.replace(QUICK, headstart_us=args.headstart_us)
    sink = torch.empty(4096, device="cuda", dtype=torch.float32)
    empty = {}
    for programs in (1, 132, 1056):
        us = empty[programs] = measure(lambda programs=programs: _empty_kernel[(programs,)](sink), policy).median_us
        print(f"empty kernel, {programs} programs: {us:6.2f} us (launch and events, no bytes)")
    out_rows = []
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        nbytes = b.numel() * 2
        print(f"\nB {n}x{k} ({nbytes / 2**20:.0f} MiB), headstart {args.headstart_us} us", flush=True)
        row = {"n": n, "k": k, "bytes": nbytes, "read": read_floor(b, policy, print)}
        us = measure(lambda: torch.sum(b, dtype=torch.float32), policy).median_us
        row["torch_sum_us"] = us
        print(f"  torch.sum: {us:7.2f} us {nbytes / us / 1e6:5.2f} TB/s")
        for m in (int(t) for t in args.tokens.split(",")):
            a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            us = measure(lambda: torch.mm(a, b.t()), policy).median_us
            row[f"cublas_m{m}_us"] = us
            print(f"  cuBLAS m={m}: {us:7.2f} us {nbytes / us / 1e6:5.2f} TB/s")
            for cfg in configs.offered(m, n, k):
                try:
                    launch.run(cfg, a, b.t(), out)
                    us = measure(lambda cfg=cfg: launch.run(cfg, a, b.t(), out), policy).median_us
                except launch.Unsupported:
                    continue
                row[f"tilefly_m{m}_{cfg.name}_us"] = us
                print(f"  tilefly m={m} {cfg.name}: {us:7.2f} us {nbytes / us / 1e6:5.2f} TB/s")
        out_rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"headstart_us": args.headstart_us, "empty_us": empty, "rows": out_rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

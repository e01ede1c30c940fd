"""Where the time of the opt-in requantizing MX path goes (tilefly.config.mx_requantize).

Per shape and format: the two requantization passes (A and B), the row-scaled FP8 _scaled_mm alone
on already requantized operands, the whole requantizing call (requant.run, what F.scaled_mm is served by), and BF16 torch.mm for scale; each timed
with tilefly.bench.timing.measure (L2 flushed, median). Prints one line per shape.

    python scripts/mx_requant_probe.py [--json FILE]
"""
from __future__ import annotations

import argparse
import json

import torch
from tilefly import config
from tilefly.bench import mx_operands
from tilefly.bench.timing import QUICK, measure
from tilefly.ops.mx_gemm import eligibility, requant

SHAPES = ((4096, 4096, 4096), (2048, 4096, 4096), (8192, 8192, 8192), (512, 4096, 4096))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json")
    args = p.parse_args()
    rows = []
    for fmt in ("mxfp8", "mxfp4"):
        for m, n, k in SHAPES:
            a = mx_operands.quantize(torch.randn(m, k, device="cuda"), fmt)
            b = mx_operands.quantize(torch.randn(n, k, device="cuda"), fmt)
            fp4 = fmt == "mxfp4"
            ea, eb = a.scale.view(torch.uint8), b.scale.view(torch.uint8)
            qa, ra = requant.requantize_rows(a.data, ea, k, fp4)
            qb, rb = requant.requantize_rows(b.data, eb, k, fp4)
            us = lambda fn: measure(fn, QUICK).median_us  # noqa: E731
            row = {"fmt": fmt, "m": m, "n": n, "k": k,
                   "requant_a_us": us(lambda: requant.requantize_rows(a.data, ea, k, fp4)),
                   "requant_b_us": us(lambda: requant.requantize_rows(b.data, eb, k, fp4)),
                   "scaled_mm_us": us(lambda: torch._scaled_mm(qa, qb.t(), ra[:, None], rb[None, :],
                                                               out_dtype=torch.bfloat16))}
            x, w = torch.randn(m, k, device="cuda", dtype=torch.bfloat16), torch.randn(n, k, device="cuda",
                                                                                      dtype=torch.bfloat16)
            row["bf16_mm_us"] = us(lambda: x @ w.t())
            problem = eligibility.parse(a.data, b.data.t(), a.scale, b.scale, False, False)
            out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            config.mx_requantize = True
            try:
                row["served_us"] = us(lambda: requant.run(problem, a.data, b.data.t(), a.scale, b.scale, out))
            except Exception as exc:  # noqa: BLE001 - report and keep probing
                row["served_error"] = repr(exc)[:200]
            finally:
                config.mx_requantize = False
            rows.append(row)
            flops = 2.0 * m * n * k
            print(f"{fmt} {m}x{n}x{k}: requant A {row['requant_a_us']:.1f} us, B {row['requant_b_us']:.1f} us, "
                  f"scaled_mm {row['scaled_mm_us']:.1f} us ({flops / row['scaled_mm_us'] / 1e6:.0f} TFLOP/s), "
                  f"served {row.get('served_us', float('nan')):.1f} us, bf16 mm {row['bf16_mm_us']:.1f} us"
                  + (f" [{row['served_error']}]" if "served_error" in row else ""), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

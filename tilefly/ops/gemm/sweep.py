"""Time every dense GEMM config on given shapes against ATen (run on the H200).

    python -m tilefly.ops.gemm.sweep                       # dense_gemm's 15 shapes, BF16 NT, default configs
    python -m tilefly.ops.gemm.sweep --search exhaustive --shapes 16x4096x4096,4096x256x4096
    python -m tilefly.ops.gemm.sweep --layouts NN,NT,TN,TT --dtype fp16 --out /tmp/sweep.json
    python -m tilefly.ops.gemm.sweep --search exhaustive --match splitk128x16,splitk64x16 --shapes 16x4096x4096
    python -m tilefly.ops.gemm.sweep --offered --layouts NN,TN,TT --shapes 16x4096x4096   # what Inductor races
    python -m tilefly.ops.gemm.sweep --table a.json b.json   # saved --out files as one Markdown table (no GPU)

Per shape: ATen's time, each config's time (median of tilefly.bench.timing.measure,
which flushes L2 before every call), TFLOP/s, for M <= 256 the achieved bandwidth
on B, and the max error against ATen; then the best config and a geomean of
best/ATen over the shapes. Configs ``offered`` for a shape are marked with *;
with --search exhaustive every config that fits is timed, offered or not, which
is how the default list and ``configs.offered`` are re-tuned.
"""
from __future__ import annotations

import argparse
import json
import sys

from tilefly.bench.results import geomean


def _shapes(text: str | None) -> list[tuple[int, int, int]]:
    if text:
        return [tuple(int(v) for v in s.lower().split("x")) for s in text.split(",") if s]
    from tilefly.bench.cases import read_csv

    return [(int(r["m"]), int(r["n"]), int(r["k"])) for r in read_csv("dense_gemm.csv")]


def _operands(m, n, k, layout, dtype):
    import torch

    a = torch.randn(m, k, device="cuda", dtype=dtype) if layout[0] == "N" else \
        torch.randn(k, m, device="cuda", dtype=dtype).t()
    b = torch.randn(n, k, device="cuda", dtype=dtype).t() if layout[1] == "T" else \
        torch.randn(k, n, device="cuda", dtype=dtype)
    return a, b


def sweep_shape(m, n, k, layout, dtype, search, match=None, echo=print, only_offered=False) -> dict:
    import torch

    from tilefly.bench.timing import QUICK, measure
    from tilefly.ops.gemm import configs, launch

    a, b = _operands(m, n, k, layout, dtype)
    ref = a @ b
    flops = 2.0 * m * n * k
    t_aten = measure(lambda: torch.mm(a, b), QUICK).median_us
    row = {"m": m, "n": n, "k": k, "layout": layout, "aten_us": t_aten, "configs": {}}
    echo(f"\n{m}x{n}x{k} {layout}: ATen {t_aten:8.1f} us {flops / t_aten / 1e6:7.1f} TFLOP/s")
    offered = set(configs.offered(m, n, k, search))
    candidates = configs.exhaustive() if search == "exhaustive" else configs.DEFAULT
    if match:
        candidates = [c for c in candidates if any(token in c.name for token in match.split(","))]
    if only_offered:
        candidates = [c for c in candidates if c in offered]
    out = torch.empty(m, n, device="cuda", dtype=dtype)
    for cfg in candidates:
        try:
            out.fill_(float("nan"))
            launch.run(cfg, a, b, out)
            err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-6)).item()
            t = measure(lambda cfg=cfg: launch.run(cfg, a, b, out), QUICK).median_us
        except launch.Unsupported as exc:
            echo(f"  {cfg.name:<34} unsupported: {exc}")
            continue
        except Exception as exc:  # noqa: BLE001 - report and go on
            echo(f"  {cfg.name:<34} FAILED {type(exc).__name__}: {str(exc)[:200]}")
            continue
        bw = f"  B {n * k * a.element_size() / t / 1e3:6.0f} GB/s" if m <= 256 else ""
        mark = "*" if cfg in offered else " "
        echo(f" {mark}{cfg.name:<34} {t:8.1f} us {flops / t / 1e6:7.1f} TFLOP/s  x{t_aten / t:5.2f}  "
             f"err {err:.1e}{bw}")
        row["configs"][cfg.name] = {"us": t, "err": err, "offered": cfg in offered}
    timed = {name: c for name, c in row["configs"].items() if c["err"] < 2e-2}
    if timed:
        best = min(timed, key=lambda name: timed[name]["us"])
        row["best"], row["best_us"] = best, timed[best]["us"]
        echo(f"  best {best}: x{t_aten / timed[best]['us']:.2f} vs ATen")
    return row


def table(paths: list[str], echo=print) -> None:
    """Saved sweeps (``--out``) as one Markdown table: ATen against the fastest config per row."""
    echo("| shape | layout | dtype | ATen µs | best config | µs | best/ATen |")
    echo("|---|---|---|---:|---|---:|---:|")
    ratios = []
    for path in paths:
        with open(path) as f:
            saved = json.load(f)
        for row in saved["rows"]:
            if "best_us" not in row:
                continue
            ratios.append(row["aten_us"] / row["best_us"])
            echo(f"| {row['m']}x{row['n']}x{row['k']} | {row['layout']} | {saved['dtype']} | {row['aten_us']:.1f} "
                 f"| {row['best']} | {row['best_us']:.1f} | {ratios[-1]:.2f}x |")
    if ratios:
        echo(f"\ngeomean x{geomean(ratios):.3f}, min x{min(ratios):.2f}, max x{max(ratios):.2f} over "
             f"{len(ratios)} rows")


def main(argv=None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", help="MxNxK,... (default: the dense_gemm suite)")
    parser.add_argument("--layouts", default="NT", help="comma list of NN,NT,TN,TT (A then B; T = transposed)")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    parser.add_argument("--search", default="default", choices=("default", "exhaustive"))
    parser.add_argument("--match", help="only configs whose name contains one of these comma-separated strings "
                                        "(e.g. splitk128x16,tile128x256); each config compiles once, ~1-2 s")
    parser.add_argument("--offered", action="store_true",
                        help="only the configs offered for each shape (what Inductor's race would time)")
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument("--table", nargs="+", metavar="FILE.json", help="print saved --out files as one table")
    args = parser.parse_args(argv)
    if args.table:
        table(args.table)
        return 0
    if not torch.cuda.is_available():
        print("sweep needs a CUDA GPU (Hopper)", file=sys.stderr)
        return 2
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    rows = []
    for layout in args.layouts.split(","):
        for m, n, k in _shapes(args.shapes):
            rows.append(sweep_shape(m, n, k, layout.strip().upper(), dtype, args.search, args.match,
                                    only_offered=args.offered))
    ratios = [r["aten_us"] / r["best_us"] for r in rows if "best_us" in r]
    if ratios:
        print(f"\nbest config vs ATen: geomean x{geomean(ratios):.3f}, min x{min(ratios):.2f} "
              f"over {len(ratios)} shapes")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"dtype": args.dtype, "search": args.search, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

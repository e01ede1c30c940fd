"""MX GEMM where both sides of the product exceed 64 (issue 6): v3's wide tiles against the BF16 route.

From 128 tokens up the eager path upcasts both operands to BF16 in one kernel, runs ``torch.mm`` and
rescales (upcast.py): three launches and the whole weight written and read again in BF16, 0.41-0.87x of
BF16 ``mm`` on the mxfp_gemm suite's shapes at b575154. v3 (kernels_v3.py) upcasts inside the CTA
instead. This script times, per shape of the suite with both sides above 64 (or ``--shape``):

- BF16 ``torch.mm`` on BF16 operands of the same shape (what the MX format has to beat);
- the BF16 route (``upcast.run``);
- every ``configs.v3_wide_configs`` build at the launcher's K-split count (``--splits`` forces others),

each with CUDA events around the call, L2 flushed before it (tilefly.bench.timing, QUICK policy), and
checks every build's output against the BF16 route's (both are exact up to summation order: the
largest difference relative to the largest output is printed, and a build above 2^-6 is flagged).

    python scripts/mx_wide_probe.py [--fmt mxfp8,mxfp4] [--shape 256x4096x4096 ...] [--splits auto,1,2,4]
                                    [--headstart-us 300] [--json FILE --commit SHA]
    python scripts/mx_wide_probe.py --render FILE [FILE ...]    # Markdown: the fastest wide build per shape
    python scripts/mx_wide_probe.py --compare BASE OTHER         # one build's time in two runs

``--render`` needs no GPU: one row per format and shape of the first file, the BF16 ``mm`` and BF16-route
times of each file and the fastest wide build of each (its time, name and ratio to BF16 ``mm``).
``--compare`` (no GPU either): per shape, BASE's fastest build and the same build's time in OTHER (a run of
another kernel variant), their ratio and its geometric mean.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace

import torch

TOLERANCE = 2.0 ** -6


def suite_shapes() -> list[str]:
    from tilefly.bench.cases import read_csv

    seen = []
    for row in read_csv("mxfp_gemm.csv"):
        m, n, k = int(row["m"]), int(row["n"]), int(row["k"])
        if min(m, n) > 64 and f"{m}x{n}x{k}" not in seen:
            seen.append(f"{m}x{n}x{k}")
    return seen


def fastest_per_shape(rows: list[dict]) -> dict[tuple, dict]:
    """The fastest row of each (format, m, n, k), in the rows' order of shapes."""
    best: dict[tuple, dict] = {}
    for r in rows:
        key = (r["fmt"], r["m"], r["n"], r["k"])
        if key not in best or r["us"] < best[key]["us"]:
            best[key] = r
    return best


def render(paths: list[str]) -> str:
    runs = []
    for path in paths:
        with open(path) as f:
            runs.append(json.load(f))
    head = "| case | " + " | ".join(f"BF16 `mm` ({r['commit']}) | BF16 route | fastest wide v3 | x BF16 `mm`"
                                     for r in runs) + " |"
    lines = [head, "|---|" + "---:|---:|---|---:|" * len(runs)]
    fastest = [fastest_per_shape(run["rows"]) for run in runs]
    for key in fastest[0]:
        cells = [f"{key[0].upper()} {key[1]}x{key[2]}x{key[3]}"]
        for run_fastest in fastest:
            best = run_fastest.get(key)
            if best is None:
                cells += ["", "", "", ""]
                continue
            cells += [f"{best['bf16_mm_us']:.1f}", f"{best['upcast_us']:.1f}",
                      f"{best['us']:.1f} ({best['build']}, {best['splits']} split{'s' if best['splits'] != 1 else ''})",
                      f"{best['bf16_mm_us'] / best['us']:.2f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def compare(base_path: str, other_path: str) -> str:
    from tilefly.bench.results import geomean

    with open(base_path) as f:
        base = json.load(f)
    with open(other_path) as f:
        other = json.load(f)
    times = {(r["fmt"], r["m"], r["n"], r["k"], r["build"]): r["us"] for r in other["rows"]}
    lines = [f"| case | fastest build at {base['commit']} | µs at {base['commit']} | µs at {other['commit']} | ratio |",
             "|---|---|---:|---:|---:|"]
    ratios = []
    for key, best in fastest_per_shape(base["rows"]).items():
        theirs = times.get((*key, best["build"]))
        if theirs is None:
            continue
        ratios.append(theirs / best["us"])
        lines.append(f"| {key[0].upper()} {key[1]}x{key[2]}x{key[3]} | {best['build']} | {best['us']:.1f} | "
                     f"{theirs:.1f} | {ratios[-1]:.2f}x |")
    if not ratios:
        return "\n".join(lines + ["", "No build of the base run was timed in the other."])
    geo = geomean(ratios)
    lines.append(f"\nTime at {other['commit']} over time at {base['commit']}: geomean {geo:.3f}x (min {min(ratios):.2f}x, "
                 f"max {max(ratios):.2f}x, n={len(ratios)})")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fmt", default="mxfp8,mxfp4")
    ap.add_argument("--shape", action="append", help="MxNxK (default: the suite's shapes with both sides > 64)")
    ap.add_argument("--splits", default="auto", help="K-split counts to force ('auto': the launcher's)")
    ap.add_argument("--headstart-us", type=float, default=0.0, help="hold the GPU this long after each flush")
    ap.add_argument("--json", help="also write every timed row here")
    ap.add_argument("--commit", default="unknown", help="the commit measured, recorded in --json")
    ap.add_argument("--render", nargs="+", metavar="FILE", help="print the Markdown table of these --json files")
    ap.add_argument("--compare", nargs=2, metavar=("BASE", "OTHER"), help="print BASE's fastest build per shape "
                    "beside the same build's time in OTHER")
    args = ap.parse_args()
    if args.compare:
        print(compare(*args.compare))
        return
    if args.render:
        print(render(args.render))
        return

    import tilefly
    from tilefly.bench import mx_operands
    from tilefly.bench.timing import QUICK, measure
    from tilefly.ops.mx_gemm import configs, eligibility, launch, upcast

    from mx_decode_probe import steer_splits   # this script's directory leads sys.path when run

    tilefly.enable()
    policy = replace(QUICK, headstart_us=args.headstart_us)
    forced: list[int | None] = [None]
    chosen: list[int] = []
    steer_splits(forced, chosen)
    rows_out: list[dict] = []
    for fmt in args.fmt.split(","):
        for shape in args.shape or suite_shapes():
            m, n, k = (int(v) for v in shape.split("x"))
            torch.manual_seed(m + 7 * n + 13 * k)
            a16, b16 = torch.randn(m, k, device="cuda", dtype=torch.bfloat16), torch.randn(n, k, device="cuda",
                                                                                            dtype=torch.bfloat16)
            qa, qb = mx_operands.quantize(a16, fmt), mx_operands.quantize(b16, fmt)
            p = eligibility.parse(qa.data, qb.data.t(), qa.scale, qb.scale, False, False)
            ref = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            upcast.run(p, qa.data, qb.data.t(), qa.scale, qb.scale, ref)
            scale = ref.float().abs().max().item()
            flops = 2.0 * m * n * k
            bf16_us = measure(lambda: torch.mm(a16, b16.t()), policy).median_us
            up_us = measure(lambda: upcast.run(p, qa.data, qb.data.t(), qa.scale, qb.scale, ref), policy).median_us
            print(f"\n{fmt} {shape}: bf16 mm {bf16_us:.1f} us ({flops / bf16_us / 1e6:.0f} TFLOP/s); "
                  f"BF16 route {up_us:.1f} us (x bf16 {bf16_us / up_us:.2f})", flush=True)
            base = {"fmt": fmt, "m": m, "n": n, "k": k, "bf16_mm_us": round(bf16_us, 3), "upcast_us": round(up_us, 3)}
            rows, cols = max(m, n), min(m, n)
            for cfg in configs.v3_wide_configs(rows, cols, k, fmt):
                for splits in [None if v == "auto" else int(v) for v in args.splits.split(",")]:
                    forced[0] = splits
                    launch._plans.clear()
                    chosen.clear()
                    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                    fn = (lambda cfg=cfg, out=out: launch.run(p, qa.data, qb.data.t(), qa.scale, qb.scale, out,
                                                               cfg=cfg))
                    try:
                        fn()
                        torch.cuda.synchronize()
                        err = (out.float() - ref.float()).abs().max().item() / scale
                        us = measure(fn, policy).median_us
                    except Exception as exc:  # noqa: BLE001 - report and go on
                        print(f"  {cfg.name} splits={splits}: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
                        continue
                    s = chosen[-1] if chosen else "?"
                    flag = "" if err <= TOLERANCE else "  WRONG"
                    print(f"  {us:8.1f} us  {flops / us / 1e6:5.0f} TFLOP/s  x bf16 {bf16_us / us:4.2f}  "
                          f"x route {up_us / us:4.2f}  err {err:.1e}  {cfg.name:<26} splits={s}"
                          f"{' auto' if splits is None else ''}{flag}", flush=True)
                    rows_out.append({**base, "build": cfg.name, "splits": s, "auto": splits is None,
                                     "us": round(us, 3), "rel_err": err})
            forced[0] = None
    if args.json:
        props = torch.cuda.get_device_properties(0)
        with open(args.json, "w") as f:
            json.dump({"gpu": props.name, "torch": torch.__version__, "commit": args.commit,
                       "headstart_us": args.headstart_us, "rows": rows_out}, f, indent=1)


if __name__ == "__main__":
    main()

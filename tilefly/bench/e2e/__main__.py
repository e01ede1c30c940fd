r"""``python -m tilefly.bench.e2e``: end-to-end A/B of LLM decoding throughput (see ab.py).

    python -m tilefly.bench.e2e --model tiny --concurrency 8 16                 # GPU smoke, seconds
    python -m tilefly.bench.e2e --model llama-3.1-8b --precision bf16 --concurrency 8 16 32 --out bench_out/e2e
    python -m tilefly.bench.e2e --merge bench_out/e2e/run_*.json --out bench_out/e2e   # one report
    python -m tilefly.bench.e2e --model tiny --device cpu --eager --input-len 8 --output-len 4  # CPU dry run

Graphs loaded from Inductor's FX graph cache carry no generated code, so which GEMMs won shows
only for fresh compiles: set TORCHINDUCTOR_FX_GRAPH_CACHE=0 to always see it.

Each run writes ``run_<model>_<precision>_c<concurrencies>.json`` (and its .md) into --out;
``--merge`` joins any number of them into e2e.json / e2e.md / e2e.png. ``--save-code`` also keeps
each side's generated wrapper code (``code_<model>_<precision>_c<N>_<side>.py``): which kernel every
GEMM call site got.

Split run, one side per process (for device calls too short to compile both sides):

    python -m tilefly.bench.e2e --model llama-3.1-8b --precision bf16 --concurrency 32 --side A \
        --eager-prefill --out DIR              # one device call: compile, autotune and time side A
    python -m tilefly.bench.e2e --model llama-3.1-8b --precision bf16 --concurrency 32 --side B \
        --eager-prefill --out DIR              # another call (same seed and lengths)
    python -m tilefly.bench.e2e --merge DIR/run_*.json --out DIR

Each side writes ``run_<model>_<precision>_c<N>_<side>.json`` with its results, environment, weight
and prompt hashes and a logits record (top 16 of every request, one whole row; 0.35 MB per
concurrency for Llama-8B at 32 requests). The merge pairs A and B of equal model, precision and
concurrency, compares their logits (split.py says how, and what that misses), and refuses, naming
the files, a pair whose hashes, lengths, torch, GPU or compile mode differ (so give both the same
--seed, --input-len, --output-len and --eager-prefill); a side without a partner is a row of its
own with a note. The merged report keeps no logits records: pair sides from their run files.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import sys

from tilefly.bench.e2e import models

DEFAULT_OUT = os.path.join("bench_out", "e2e")


def parse_args(argv: list[str]) -> argparse.Namespace:
    from tilefly.bench.e2e.ab import DEFAULT_CONCURRENCIES

    p = argparse.ArgumentParser(prog="python -m tilefly.bench.e2e", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", choices=list(models.MODELS))
    p.add_argument("--precision", default="bf16", choices=list(models.PRECISIONS))
    p.add_argument("--concurrency", type=int, nargs="+", default=list(DEFAULT_CONCURRENCIES))
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=512)
    p.add_argument("--runs", type=int, default=3,
                   help="timed generations per side, the fastest kept (a Llama-8B run at 8 requests is ~4 s)")
    p.add_argument("--compare-steps", type=int, default=4, help="steps whose logits A and B must agree on")
    p.add_argument("--tol", type=float, help="max |B - A| / max |A| of those logits (default per precision: "
                   "0.05, MXFP8 0.5, whose on-the-fly requantization amplifies summation-order differences)")
    p.add_argument("--side", default="both", choices=("A", "B", "both"),
                   help="measure one side only (write run_..._<side>.json; pair them with --merge)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--eager", action="store_true", help="no torch.compile (CPU dry runs)")
    p.add_argument("--eager-prefill", action="store_true",
                   help="compile only the decode step (halves compile and autotuning time)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--b-ops", nargs="+", metavar="FAMILY",
                   help="tilefly families enabled on side B (default: those tilefly.enable() installs); the run "
                        "file records them and the report keeps such runs apart")
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--merge", nargs="+", metavar="FILE.json", help="merge run files into --out/e2e.*")
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--save-code", action="store_true",
                   help="also write each side's Inductor wrapper code (which kernel every GEMM got) into --out")
    p.add_argument("--attention", choices=("grouped", "hf"), default="grouped",
                   help="decode attention of both sides: grouped (KV cache read uncopied, as a serving engine "
                        "does) or hf (transformers' SDPA path, which copies K and V per query head)")
    p.add_argument("--mx-swizzle", choices=("none", "32_4_4"), default="none",
                   help="layout of the MX scales, weights' and activations' (MX precisions, both sides). "
                        "tilefly's MX GEMM reads both; 32_4_4 (SWIZZLE_32_4_4, the only layout ATen's CUDA "
                        "F.scaled_mm takes) costs a scale-rearranging kernel per MX layer every step")
    p.add_argument("--profile", type=int, default=0, metavar="STEPS",
                   help="after each side's timed runs, profile STEPS decode steps: GPU time per kernel "
                        "and family (CUDA only)")
    p.add_argument("--exact-casts", action="store_true",
                   help="both sides compile with Inductor's emulate_precision_casts (fused kernels round to BF16 "
                        "where eager mode does): for the MX logits check, not for throughput")
    p.add_argument("--commit", help="commit to record (default: git rev-parse HEAD)")
    args = p.parse_args(argv)
    if min(args.concurrency) < 1 or args.input_len < 1 or args.output_len < 1:
        p.error("--concurrency, --input-len and --output-len must be positive")
    return args


def environment(device: str, commit: str | None) -> dict[str, str]:
    import torch
    import transformers

    import tilefly
    from tilefly.bench.cli import git_commit

    gpu = torch.cuda.get_device_name() if device.startswith("cuda") and torch.cuda.is_available() else device
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    return {"gpu": gpu, "torch": torch.__version__, "triton": triton_version,
            "transformers": transformers.__version__, "tilefly": tilefly.__version__,
            "commit": commit or git_commit(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def run(args: argparse.Namespace) -> int:
    import json

    from tilefly.bench.e2e import report
    from tilefly.bench.e2e.ab import SIDE_A, SIDE_B, run_ab

    side_b = dataclasses.replace(SIDE_B, tilefly_ops=tuple(args.b_ops)) if args.b_ops else SIDE_B
    sides = {"A": (SIDE_A,), "B": (side_b,), "both": (SIDE_A, side_b)}[args.side]

    env = environment(args.device, args.commit)
    os.makedirs(args.out, exist_ok=True)
    record = run_ab(args.model, args.precision, args.concurrency, input_len=args.input_len,
                    output_len=args.output_len, device=args.device,
                    compile_mode=None if args.eager else "max-autotune", runs=args.runs,
                    compare_steps=args.compare_steps, tol=args.tol, seed=args.seed,
                    compile_prefill=not args.eager_prefill,
                    sides=sides, code_dir=args.out if args.save_code else None, profile_steps=args.profile,
                    attention=args.attention, mx_swizzle=args.mx_swizzle, exact_casts=args.exact_casts)
    record.update(env)
    if args.b_ops:     # kept apart from runs of B's default families (split.options)
        record["b_ops"] = sorted(args.b_ops)
    name = f"run_{args.model}_{args.precision}_c{'-'.join(map(str, args.concurrency))}"
    name += "" if args.side == "both" else f"_{args.side}"
    path = os.path.join(args.out, name + ".json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1, allow_nan=False)
        f.write("\n")
    merged = report.merge([record])
    text = report.markdown(merged)
    with open(os.path.join(args.out, name + ".md"), "w", encoding="utf-8") as f:
        f.write(text)
    print(text)
    print(f"  {path}", file=sys.stderr)
    if args.side != "both":
        failed = [row["concurrency"] for row in record["rows"] if "error" in row[args.side]]
        if failed:
            print(f"side {args.side} failed at concurrency {failed}", file=sys.stderr)
        return 1 if failed else 0
    bad = [row["concurrency"] for row in record["rows"] if not row.get("agreement", {}).get("ok")]
    if bad:
        print(f"A and B disagree or a side failed at concurrency {bad}", file=sys.stderr)
        return 1
    return 0


def merge(paths: list[str], out: str, png: bool) -> int:
    from tilefly.bench.e2e import report

    try:
        merged = report.merge([report.load(p) for p in paths])
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report.markdown(merged))
    for line in report.write_all(merged, out, png=png):
        print(f"  {line}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.merge:
        return merge(args.merge, args.out, png=not args.no_plot)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())

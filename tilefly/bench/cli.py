"""``python -m tilefly bench``: speed tables of tilefly against PyTorch's own kernels.

    python -m tilefly bench                          # quick subset of every suite (a few minutes)
    python -m tilefly bench --suite all              # every case of every suite
    python -m tilefly bench --suite dense_gemm --cases 16x4096 7
    python -m tilefly bench --render bench_out/topk.json   # redraw a saved result, no GPU needed
    python -m tilefly bench --merge a/grouped_gemm.json b/grouped_gemm.json --out all  # join split runs
    python -m tilefly bench --list                   # suites and their cases

Without an sm_90 GPU it prints the environment and runs the CPU self-check instead.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import subprocess
import sys
import traceback

from tilefly.bench import suites

DEFAULT_OUT = "bench_out"
HOPPER_NEEDED = "The speed tables need an NVIDIA Hopper GPU (sm_90, e.g. H100/H200)"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tilefly bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", nargs="+", metavar="S", choices=[*suites.NAMES, "all"],
                   help=f"suites to run: {', '.join(suites.NAMES)} or all (default: all, quick subset)")
    p.add_argument("--cases", nargs="+", metavar="SUBSTR_OR_INDEX",
                   help="only cases whose id contains SUBSTR, or whose index is N (see --list)")
    p.add_argument("--quick", action="store_true",
                   help="each suite's quick subset (the default when neither --suite nor --cases is given)")
    p.add_argument("--out", metavar="DIR", help="where <suite>.json/.md/.png go (default ./bench_out; "
                                              "with --render, beside each JSON)")
    p.add_argument("--rep", type=int, metavar="N", help="time exactly N repetitions per provider")
    p.add_argument("--rounds", type=int, default=1, metavar="N",
                   help="time a case's providers in turn, N rounds of a share of the repetitions each, "
                        "so clock drift reaches all alike (default 1: one provider after another)")
    p.add_argument("--headstart-us", type=float, default=0.0, metavar="US",
                   help="hold the GPU US microseconds after each L2 flush, so host launch time is not timed "
                        "(tilefly.bench.timing: 'Launch overhead'; default 0)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG plots")
    p.add_argument("--render", nargs="+", metavar="FILE.json",
                   help="re-render saved results (Markdown to stdout, .md/.png beside the JSON or into --out)")
    p.add_argument("--merge", nargs="+", metavar="FILE.json",
                   help="join results of one suite run in parts (e.g. --cases halves) into --out")
    p.add_argument("--list", action="store_true", help="list suites and cases, then exit")
    p.add_argument("--commit", help="commit to record (default: git rev-parse HEAD of the source tree, else 'unknown')")
    args = p.parse_args(argv)
    if args.rep is not None and args.rep < 1:
        p.error("--rep must be at least 1")
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if not 0 <= args.headstart_us <= 10_000:
        p.error("--headstart-us must be within 0..10000")
    return args


def selected_suites(names: list[str] | None) -> list[str]:
    if not names or "all" in names:
        return list(suites.NAMES)
    return list(dict.fromkeys(names))


def hopper_missing() -> str | None:
    """None on an sm_90 GPU, else what this machine has instead."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.device_count() > 0):
        return "this machine has no CUDA GPU"
    cap = torch.cuda.get_device_capability()
    if cap != (9, 0):
        return f"this machine's GPU is {torch.cuda.get_device_name()} (sm_{cap[0]}{cap[1]})"
    return None


def git_commit() -> str:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        out = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def run_environment(commit: str | None) -> dict[str, str]:
    import torch

    import tilefly
    from tilefly.doctor import environment

    env = environment()
    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": env["triton"],
            "tilefly": tilefly.__version__, "commit": commit or git_commit(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def no_gpu(reason: str) -> int:
    from tilefly import doctor

    print("tilefly bench")
    for key, value in doctor.environment().items():
        print(f"  {key:<13} {value}")
    print(f"\n{HOPPER_NEEDED}; {reason}. Running the CPU self-check instead.\n", flush=True)
    try:
        return doctor.selfcheck()
    except Exception:  # noqa: BLE001 - report, never crash on a CPU machine
        traceback.print_exc()
        print("self-check could not run (see above)")
        return 1


def list_cases() -> int:
    for name in suites.NAMES:
        suite = suites.get(name)
        cases = suite.cases()
        print(f"{name}: {suite.title} ({len(cases)} cases; * = quick subset)")
        for case in cases:
            print(f"  {'*' if case.index in suite.quick else ' '}{case.index:>3}  {case.id}")
    return 0


def render(paths: list[str], out: str | None, png: bool) -> int:
    from tilefly.bench import report

    for path in paths:
        result = report.load(path)
        print(report.markdown(result))
        for line in report.write_all(result, out or os.path.dirname(os.path.abspath(path)), png=png, json_too=False):
            print(f"  {line}", file=sys.stderr)
    return 0


def merge(paths: list[str], out: str, png: bool) -> int:
    from tilefly.bench import report
    from tilefly.bench.results import merge as merge_results

    result = merge_results([report.load(path) for path in paths])
    print(report.markdown(result))
    for line in report.write_all(result, out, png=png):
        print(f"  {line}", file=sys.stderr)
    return 0


def e2e_argv(argv: list[str]) -> list[str] | None:
    """The e2e engine's own arguments when ``argv`` asks for ``--suite e2e`` (or ``--suite=e2e``),
    else None. The e2e suite has its own options (model, precision, concurrency:
    tilefly/bench/e2e), so it runs alone."""
    for i, arg in enumerate(argv):
        if arg == "--suite=e2e":
            return argv[:i] + argv[i + 1:]
        if arg == "--suite" and i + 1 < len(argv) and argv[i + 1] == "e2e":
            rest = argv[:i] + argv[i + 2:]
            if rest and not rest[0].startswith("-"):
                raise SystemExit(f"--suite e2e runs alone, not with {rest[0]!r} "
                                 "(python -m tilefly bench --suite e2e --help lists its options)")
            return rest
    if "--suite" in argv and "e2e" in argv:   # --suite rmsnorm e2e
        raise SystemExit("--suite e2e runs alone, not with other suites "
                         "(python -m tilefly bench --suite e2e --help lists its options)")
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    e2e = e2e_argv(argv)
    if e2e is not None:
        from tilefly.bench.e2e.__main__ import main as e2e_main

        return e2e_main(e2e)
    args = parse_args(argv)
    if args.render:
        return render(args.render, args.out, png=not args.no_plot)
    if args.merge:
        return merge(args.merge, args.out or DEFAULT_OUT, png=not args.no_plot)
    if args.list:
        return list_cases()
    reason = hopper_missing()
    if reason:
        return no_gpu(reason)
    return run(args)


def run(args: argparse.Namespace) -> int:
    from tilefly.bench import report, timing
    from tilefly.bench.cases import select
    from tilefly.bench.runner import run_suite

    quick = args.quick or (not args.suite and not args.cases)
    policy = timing.QUICK if quick else timing.FULL
    if args.rep:
        policy = dataclasses.replace(policy, fixed_reps=args.rep)
    if args.rounds > 1:
        policy = dataclasses.replace(policy, rounds=args.rounds)
    if args.headstart_us > 0:
        policy = dataclasses.replace(policy, headstart_us=args.headstart_us)
    env = run_environment(args.commit)
    status = 0
    for name in selected_suites(args.suite):
        suite = suites.get(name)
        cases = suite.cases()
        if quick:
            cases = [c for c in cases if c.index in suite.quick]
        cases = select(cases, args.cases)
        if not cases:
            print(f"{name}: no case matches --cases {' '.join(args.cases or [])}; skipped", file=sys.stderr)
            continue
        print(f"== {name}: {len(cases)} cases ({'quick' if quick else 'full'}) ==", file=sys.stderr, flush=True)
        partial = os.path.join(args.out or DEFAULT_OUT, f"{name}.partial.json")
        try:
            result = run_suite(suite, cases, policy, quick, env,
                               checkpoint=lambda so_far: report.write_partial(so_far, partial))
        except Exception:  # noqa: BLE001 - one broken suite must not stop the others
            traceback.print_exc()
            print(f"{name}: FAILED, see the traceback above", file=sys.stderr)
            status = 1
            continue
        print(report.markdown(result), flush=True)
        for line in report.write_all(result, args.out or DEFAULT_OUT, png=not args.no_plot):
            print(f"  {line}", file=sys.stderr)
        if os.path.exists(partial):
            os.remove(partial)  # the full result is written; only a stopped run leaves its partial
    return status

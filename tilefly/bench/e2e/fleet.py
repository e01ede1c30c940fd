r"""Run many one-side e2e measurements at once, one per GPU of the machine, and merge them.

An e2e side is a process of its own (``python -m tilefly.bench.e2e --side A|B``) that spends most
of its minutes compiling and autotuning. On a machine with several GPUs, sides on different GPUs do
not share a GPU, so each is timed as if alone; this runs a queue of them, one process per GPU
(``CUDA_VISIBLE_DEVICES``), a job starting as soon as a GPU frees:

    python -m tilefly.bench.e2e.fleet --model llama-3.1-8b --jobs bf16:16:A bf16:16:B mxfp8:8:B \
        --deadline 560 --profile 8 --commit SHA --out DIR

A job is ``PRECISION:CONCURRENCY:SIDE``. Each may run until ``--deadline`` (counted from the start; a
job is not started with less than ``--min-start`` left), or ``--timeout`` seconds if that is less (without
a deadline, ``--timeout`` or NO_DEADLINE_TIMEOUT). A stock MX side (A) spends 210-230 s compiling on the
H200, and a 290-second cap per job cut one off before it finished (session 32).
Each process writes its run file into ``--out`` and its output into ``log_<job>.txt`` there; the
fleet prints each job's ``[e2e]`` lines and, at the end, merges every run file of ``--out`` (and
``--merge-with`` files) into ``--out/merged``. Sides of one pair may run on different GPUs of one
kind; the merge pairs them by their hashes as it pairs runs of separate device calls.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable

from tilefly.bench.e2e import models

NO_DEADLINE_TIMEOUT = 600    # a job's limit when neither --timeout nor --deadline is given


@dataclass(frozen=True)
class Job:
    precision: str
    concurrency: int
    side: str

    @property
    def name(self) -> str:
        return f"{self.precision}_c{self.concurrency}_{self.side}"


def parse_job(text: str) -> Job:
    parts = text.split(":")
    if len(parts) != 3 or parts[0] not in models.PRECISIONS or parts[2] not in ("A", "B") or not parts[1].isdigit():
        raise argparse.ArgumentTypeError(
            f"a job is PRECISION:CONCURRENCY:SIDE with PRECISION in {models.PRECISIONS} and SIDE A or B, got {text!r}")
    return Job(parts[0], int(parts[1]), parts[2])


def command(job: Job, args: argparse.Namespace) -> list[str]:
    cmd = [sys.executable, "-m", "tilefly.bench.e2e", "--model", args.model, "--precision", job.precision,
           "--concurrency", str(job.concurrency), "--side", job.side, "--out", args.out, "--no-plot"]
    if not args.compile_prefill:
        cmd.append("--eager-prefill")
    if args.profile:
        cmd += ["--profile", str(args.profile)]
    if args.commit:
        cmd += ["--commit", args.commit]
    return cmd + list(args.extra)


def run(jobs: list[Job], args: argparse.Namespace, gpus: int,
        launch: Callable[..., subprocess.Popen] = subprocess.Popen, clock: Callable[[], float] = time.monotonic,
        poll_s: float = 1.0) -> dict[str, str]:
    """Each job's outcome ("rc 0", "rc N", "timed out", "not started: ..."), jobs in queue order.
    GPU i is the i-th device this process sees (its own CUDA_VISIBLE_DEVICES, if set, is honoured).
    Jobs still running when this is interrupted are stopped."""
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    start = clock()
    queue = list(jobs)
    running: dict[int, tuple[Job, subprocess.Popen, object, str]] = {}
    outcome: dict[str, str] = {}
    try:
        while queue or running:
            for gpu in range(gpus):
                if gpu in running or not queue:
                    continue
                left = args.deadline - (clock() - start) if args.deadline else None
                job = queue.pop(0)
                if left is not None and left < args.min_start:
                    outcome[job.name] = f"not started: {left:.0f} s left of the deadline"
                    continue
                limit = job_limit(args.timeout, left)
                for stale in _run_files(job, args):    # a failed job must not leave an older run to merge
                    if os.path.exists(stale):
                        os.remove(stale)
                device = visible[gpu] if gpu < len(visible) else str(gpu)
                env = {**os.environ, "CUDA_VISIBLE_DEVICES": device, "TORCHINDUCTOR_FX_GRAPH_CACHE": "0"}
                log = open(os.path.join(args.out, f"log_{job.name}.txt"), "w")
                proc = launch(["timeout", "--kill-after=10", str(limit), *command(job, args)], env=env, stdout=log,
                              stderr=subprocess.STDOUT)
                print(f"[fleet] GPU {device}: {job.name} ({limit} s)", flush=True)
                running[gpu] = (job, proc, log, device)
            for gpu, (job, proc, log, device) in list(running.items()):
                rc = proc.poll()
                if rc is None:
                    continue
                log.close()
                outcome[job.name] = "timed out" if rc in (124, 137) else f"rc {rc}"
                print(f"[fleet] GPU {device}: {job.name} ended, {outcome[job.name]}", flush=True)
                _echo(os.path.join(args.out, f"log_{job.name}.txt"))
                del running[gpu]
            if running:
                time.sleep(poll_s)
    finally:
        for job, proc, log, _ in running.values():   # interrupted: no job outlives the fleet
            proc.terminate()
            proc.wait()
            log.close()
    return {job.name: outcome[job.name] for job in jobs}


def job_limit(timeout: int | None, left: float | None) -> int:
    """Seconds a job starting now may run: the least of --timeout and what the deadline leaves."""
    limits = [int(x) for x in (timeout, left) if x is not None]
    return min(limits) if limits else NO_DEADLINE_TIMEOUT


def _run_files(job: Job, args: argparse.Namespace) -> list[str]:
    base = os.path.join(args.out, f"run_{args.model}_{job.precision}_c{job.concurrency}_{job.side}")
    return [base + ".json", base + ".md"]


def _echo(path: str) -> None:
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith("[e2e]"):
                print("   " + line.rstrip(), flush=True)


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tilefly.bench.e2e.fleet", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-3.1-8b", choices=list(models.MODELS))
    p.add_argument("--jobs", type=parse_job, nargs="+", required=True, metavar="PRECISION:CONCURRENCY:SIDE")
    p.add_argument("--out", required=True)
    p.add_argument("--gpus", type=int, help="GPUs to use (default: all that CUDA sees)")
    p.add_argument("--timeout", type=int, help="seconds a job may run at most (default: until the deadline, "
                                               f"or {NO_DEADLINE_TIMEOUT} s without one)")
    p.add_argument("--deadline", type=int, help="seconds from the start after which no job runs on")
    p.add_argument("--min-start", type=int, default=120, help="start no job with fewer seconds left")
    p.add_argument("--profile", type=int, default=0, help="decode steps to profile after each side's timing")
    p.add_argument("--compile-prefill", action="store_true", help="compile the prefill too (default: eager)")
    p.add_argument("--commit", help="commit to record in each run file")
    p.add_argument("--merge-with", nargs="*", default=[], help="earlier run or merged files to merge with")
    p.add_argument("extra", nargs="*", help="more arguments for every e2e process (after --)")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    gpus = args.gpus or gpu_count()
    if gpus < 1:
        p.error("no CUDA GPU to run on")
    if len(set(args.jobs)) != len(args.jobs):
        p.error("a job is named twice: each writes one run file and one log")
    outcome = run(args.jobs, args, gpus)
    for name, what in outcome.items():
        print(f"[fleet] {name}: {what}")
    files = sorted(os.path.join(args.out, f) for f in os.listdir(args.out)
                   if f.startswith("run_") and f.endswith(".json"))
    if files or args.merge_with:
        from tilefly.bench.e2e import report

        try:
            merged = report.merge([report.load(f) for f in [*args.merge_with, *files]])
        except ValueError as exc:     # e.g. a pair the merge refuses: the run files stay for a manual merge
            print(f"[fleet] merge failed: {exc}")
            return 1
        report.write_all(merged, os.path.join(args.out, "merged"))
        print(report.markdown(merged))
    return 0 if all(what == "rc 0" for what in outcome.values()) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Steady-state GPU timing of one call, in microseconds.

How a provider is timed (``measure``):

1. Warm-up: a few untimed calls. The first call of a compiled provider runs
   Dynamo, Inductor and its max-autotune search, and a tilefly kernel compiles
   and picks its config on first use; all of that stays out of the numbers.
2. Estimate: a handful of timed calls give the per-call time, from which the
   number of repetitions follows: at least ``min_reps`` and enough for about
   ``target_ms`` of measured GPU time, at most ``max_reps`` (``--rep N`` fixes it).
3. Each repetition: flush L2 by reading a 256 MiB buffer (>5x L2), record a
   CUDA event, call the op, record a second event. All repetitions are queued,
   then one synchronize; per-call time = elapsed time between the two events.
4. Report the median and the 20th/80th percentiles over the repetitions.

Pitfalls, for whoever reads or changes these numbers:

- **L2 state.** H200's L2 holds 50 MB, so an op whose inputs fit there runs
  from L2 when called back to back and looks faster than it ever is inside a
  model. Every repetition starts with a cold L2: the flush reads 256 MiB, which
  evicts everything (the previous output's dirty lines are written back during
  the flush, before the start event) and leaves L2 holding clean lines of the
  flush buffer only. A flush by *writing* (``zero_()``, as triton's do_bench and
  this harness before 2026-11-30 session 12 did) leaves ~50 MB of dirty lines
  whose write-back the timed op pays with its first misses, for every provider
  alike. H200, ATen, write flush against read flush (scripts/flush_probe.py,
  2026-11-30): fp16 8192 x 4096 RMSNorm 45.9 against 42.5 µs, a 16 x 4096 x
  4096 mm (33.5 MB of weights) 18.9 against 15.5 µs, a 256 MiB copy 129.8
  against 127.1 µs; a 1 x 4096 RMSNorm 10.3 against 10.8 µs (its ~10 µs is not
  write-back). ``TILEFLY_BENCH_FLUSH=write``
  restores the old flush, to compare against tables measured with it.
  Inductor's own autotuning benchmark does not flush, so its pick can differ
  from ours.
- **Launch overhead of tiny ops.** Events time the GPU, not the host. The
  flush kernel (~60 µs at ~4 TB/s) is queued before the start event, so the host
  normally has the op launched before the GPU reaches it and launch cost stays
  hidden, as it would in a busy model. If an op's host path (Python dispatch,
  guards of a compiled function, a router predicate) costs more than the flush,
  the GPU idles between the events and that gap is counted: a tiny op's time
  then includes host overhead. Reps are queued without syncing, so a long queue
  can also fill the launch queue and stall the host: harmless for the numbers.
  Providers that launch several kernels from Python (tilefly's BF16 MX route, the
  eager dequantize + ``mm``) can take 100 µs of host time a call, and the host's
  speed differs between machines: on 2026-12-01 the same MX cases read up to 3x
  apart on two H200 machines of different host speed (BENCHMARKS.md, session 23).
  ``Policy.headstart_us`` (``--headstart-us``) holds the GPU that long after each
  flush (``torch.cuda._sleep``, before the start event), so the host has queued
  the call's launches before the GPU reaches them and the events time the GPU
  work alone, as in a busy model or a CUDA graph; report such runs as such.
- **Clocks are not touched.** We do not lock GPU or memory clocks (that needs
  root and changes the machine for others). Boost clocks drift with power and
  temperature, so compare providers measured in the same run, side by side, not
  against numbers from another day; medians and p20/p80 show the spread. Within
  a run, providers timed one after another still see different clocks (session 16
  read two identical cuDNN calls 5% apart); ``--rounds N`` (``Policy.rounds``)
  times a case's providers in turn, N rounds of a share of the repetitions each.
- **Compilation and autotuning** are excluded by the warm-up; a compiled
  provider that recompiles during timing (a guard failure) would show up as a
  huge p80: look at p20/p80 before trusting a median.
- **Allocation.** Providers allocate their outputs through PyTorch's caching
  allocator, which is warm after the first call, as in a model.
- **Determinism mode** (topk suite) makes ``torch.empty`` fill new memory with
  NaN, an extra kernel charged to ATen and tilefly alike, as a user would see.
"""
from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from tilefly.bench.results import percentile

FLUSH_BYTES = 256 * 2**20
FLUSH_MODES = ("read", "write")


def flush_mode() -> str:
    """How L2 is flushed before each timed call: ``read`` (default) or ``write`` (the old flush)."""
    mode = os.environ.get("TILEFLY_BENCH_FLUSH", "read")
    if mode not in FLUSH_MODES:
        raise ValueError(f"TILEFLY_BENCH_FLUSH={mode!r}: expected one of {', '.join(FLUSH_MODES)}")
    return mode


@dataclass(frozen=True)
class Policy:
    """How many repetitions: at least ``min_reps`` and about ``target_ms`` of op time, at most
    ``max_reps``; ``fixed_reps`` overrides all of that (``--rep N``)."""

    warmup_calls: int = 3
    min_reps: int = 50
    target_ms: float = 200.0
    max_reps: int = 1000
    fixed_reps: int | None = None
    # > 1: the runner times a case's providers in turn, this many rounds, each round a share of
    # every provider's repetitions, so that clock drift during a case reaches all of them alike.
    rounds: int = 1
    # > 0: microseconds the GPU is held after each flush so the host's launches of the call are
    # queued before its start event (module docstring, "Launch overhead").
    headstart_us: float = 0.0

    def reps_for(self, estimate_us: float) -> int:
        if self.fixed_reps is not None:
            return max(1, self.fixed_reps)
        wanted = math.ceil(self.target_ms * 1000.0 / max(estimate_us, 1e-3))
        return int(min(self.max_reps, max(self.min_reps, wanted)))

    def describe(self) -> str:
        reps = f"{self.fixed_reps} reps" if self.fixed_reps is not None else \
            f"max({self.min_reps} reps, ~{self.target_ms:g} ms of op time), at most {self.max_reps} reps"
        rounds = f", in {self.rounds} rounds interleaving the providers" if self.rounds > 1 else ""
        held = (f"; the GPU held {self.headstart_us:g} µs after each flush, so host time is excluded"
                if self.headstart_us > 0 else "")
        return (f"median of {reps}{rounds}; CUDA events around each call; L2 flushed ({FLUSH_BYTES >> 20} MiB "
                f"{flush_mode()}) before each{held}; {self.warmup_calls} warm-up calls first (compile and "
                "autotuning excluded); clocks not locked")


FULL = Policy()
QUICK = Policy(min_reps=20, target_ms=50.0, max_reps=300)

# The running suite's ``headstart_us`` (set by runner.run_suite), for the timings a provider makes on
# its own, e.g. the screen that picks a family's fastest config: timed without the hold, a config of
# several launches would be screened by its host time and lose to one it beats on the GPU.
RUN_HEADSTART_US = 0.0


@dataclass(frozen=True)
class Timing:
    median_us: float
    p20_us: float
    p80_us: float
    reps: int


_flush_buffers: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def _flusher(device: torch.device) -> Callable[[], Any]:
    """A call that leaves L2 cold (see the module docstring): a read of the whole flush buffer
    into one element, or, with TILEFLY_BENCH_FLUSH=write, a write of it."""
    pair = _flush_buffers.get(device)
    if pair is None:
        buf = torch.zeros(FLUSH_BYTES // 4, dtype=torch.float32, device=device)
        pair = _flush_buffers[device] = (buf, torch.empty((), dtype=torch.float32, device=device))
    buf, sink = pair
    if flush_mode() == "write":
        return buf.zero_
    return lambda: torch.sum(buf, dim=0, out=sink)


# GPU clock cycles a microsecond of ``torch.cuda._sleep`` takes at most: H200's highest SM clock
# (1.98 GHz). A lower clock makes the hold longer, never shorter.
SLEEP_CYCLES_PER_US = 1980


def _timed_calls(fn: Callable[[], Any], reps: int, device: torch.device, headstart_us: float = 0.0) -> list[float]:
    flush = _flusher(device)
    hold = int(headstart_us * SLEEP_CYCLES_PER_US)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, end in zip(starts, ends):
        flush()
        if hold:
            torch.cuda._sleep(hold)
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize(device)
    return sorted(s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends))


def warm(fn: Callable[[], Any], policy: Policy = FULL, device: torch.device | None = None) -> int:
    """Steps 1 and 2 of the module docstring: the warm-up calls, then the repetitions ``policy``
    asks for at fn's estimated time."""
    device = device or torch.device("cuda", torch.cuda.current_device())
    for _ in range(policy.warmup_calls):
        fn()
    torch.cuda.synchronize(device)
    return policy.reps_for(percentile(_timed_calls(fn, 5, device, policy.headstart_us), 0.5))


def sample(fn: Callable[[], Any], reps: int, device: torch.device | None = None,
           headstart_us: float = 0.0) -> list[float]:
    """Step 3: ``reps`` timed calls, each after an L2 flush (and ``headstart_us`` of GPU hold), µs, sorted."""
    return _timed_calls(fn, reps, device or torch.device("cuda", torch.cuda.current_device()), headstart_us)


def summary(times: list[float]) -> Timing:
    """Step 4: median and 20th/80th percentiles of ``times``."""
    times = sorted(times)
    return Timing(percentile(times, 0.5), percentile(times, 0.2), percentile(times, 0.8), len(times))


def measure(fn: Callable[[], Any], policy: Policy = FULL, device: torch.device | None = None) -> Timing:
    """Time ``fn()`` on the current CUDA device as described in the module docstring."""
    return summary(sample(fn, warm(fn, policy, device), device, policy.headstart_us))


def graph_us(calls: Callable[[], Any], replays: int = 30) -> float:
    """Median GPU µs of one replay of a CUDA graph holding ``calls()``, as a model's CUDA-graphed step
    runs it: host cost left out, launch gaps inside the graph kept. ``calls`` runs once first on a
    side stream (compiles, first-use allocations) outside the capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        calls()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    return statistics.median(times)


def back_to_back_us(fn: Callable[[], Any], warmup: int, calls: int) -> tuple[float, float]:
    """Host and wall µs a call of ``calls`` back-to-back calls of ``fn`` (after ``warmup``): host until
    the last call returns, wall until the GPU has finished it too (the host cost of a launch path)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return host, (time.perf_counter() - t0) / calls * 1e6

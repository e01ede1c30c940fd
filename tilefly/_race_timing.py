"""How Inductor's autotuning race times a GEMM that tilefly takes part in.

Inductor times a candidate with a pair of CUDA events around one call after zeroing an L2-sized
buffer, and keeps the fastest of many such calls. The events count whatever host time the call
spends beyond that zeroing too, and during a compile the kernels called from Python spend far more
of it than alone. On the H200, for the 32-row decode GEMMs of Llama-3.1-8B
(``scripts/race_probe.py``, 555d4e8):

| 32 x N x K | tilefly: race alone / in a compile | ATen: alone / in a compile | Triton in a compile |
|---|---:|---:|---:|
| 1024 x 4096 | 11.3 / 30.0 | 10.0 / 50.3 | 23.3 |
| 4096 x 4096 | 17.6 / 51.1 | 31.5 / 49.8 | 27.9 |
| 14336 x 4096 | 38.8 / 71.6 | 39.2 / 61.8 | 40.4 |
| 4096 x 14336 | 40.5 / 79.2 | 41.2 / 46.1 | 47.5 |

Alone, tilefly's race time equals the GPU time of a CUDA graph replay of the call; in a compile the
race measures host overhead as much as the kernels, and picks by it. A model compiled with CUDA
graphs (``mode="max-autotune"``) spends no host time per kernel, so there the race should compare
GPU times. When ``graph_timed()`` (option ``gemm_race_timing``; 'auto': when Inductor runs its
output as CUDA graphs):

- tilefly's candidates (``extern_choice``) are timed as a CUDA graph replay of one call;
- in a race that has a tilefly candidate, so are ATen's extern candidates and Triton's templates
  (``time_race_on_gpu``, a preprocessing function of Inductor's algorithm selector), so that every
  candidate is timed the same way. Races without tilefly keep Inductor's timing;
- every candidate so timed has ``:graph-timed`` appended to its hash key, under which Inductor's
  autotune cache keeps its time: a stock compile on the same machine (side A of an e2e run, say)
  never reuses a graph-timed time, nor a graph-timed race an Inductor-timed one.

PyTorch 2.13 can time any candidate so (``ChoiceCaller._benchmark_with_cudagraphs``); this does it
the same way on 2.11. A candidate whose graph cannot be captured keeps Inductor's timing, and so do
Triton's templates under ``autotune_in_subproc`` (Inductor times them in its subprocess, from their
benchmark requests).
"""
from __future__ import annotations

import functools
import logging
from typing import Any, Callable

from tilefly import config

_log = logging.getLogger("tilefly.inductor")


def graph_timed() -> bool:
    """Whether races with tilefly in them are timed as CUDA graph replays (``config.gemm_race_timing``)."""
    if config.gemm_race_timing != "auto":
        return config.gemm_race_timing == "graph"
    from torch._inductor import config as inductor_config

    return bool(inductor_config.triton.cudagraphs)


def replay_ms(call: Callable[[], Any]) -> float:
    """Inductor's benchmarker timing a CUDA graph replay of ``call()``, in ms. ``call`` runs once
    first, outside the capture (its compile and first-use allocations)."""
    import torch
    from torch._inductor.runtime.benchmarking import benchmarker

    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        call()
    return benchmarker.benchmark_gpu(graph.replay)


GRAPH_TIMED_KEY = ":graph-timed"


def _timed_key(key: str) -> str:
    # Inductor's autotune cache keeps each candidate's time under its hash key: graph-timed ones
    # get keys of their own, so a race timed one way never reuses times taken the other way (a
    # stock compile on the same machine keeps finding only Inductor-timed ones).
    return key + GRAPH_TIMED_KEY if graph_timed() else key


def _replayed_or(name: str, call: Callable[[], Any], inductors: Callable[[], float]) -> float:
    try:
        return replay_ms(call)
    except Exception as exc:  # noqa: BLE001 - Inductor's own timing still works
        _log.debug("tilefly: %s timed without a CUDA graph (%s: %s)", name, type(exc).__name__, exc)
        return inductors()


def _replay_extern(choice: Any, args: tuple, out: Any, inductors: Callable[[], float]) -> float:
    """An extern candidate (tilefly's or ATen's) timed as a graph replay of its call."""
    if out.numel() == 0:
        return inductors()
    fn = choice.to_callable()
    if choice.has_out_variant:
        return _replayed_or(choice.name, lambda: fn(*args, out=out), inductors)
    out.copy_(fn(*args))   # as Inductor's timing leaves it, for its optional result check
    return _replayed_or(choice.name, lambda: fn(*args), inductors)


_classes: dict[str, type] = {}


def _tilefly_classes() -> dict[str, type]:
    if not _classes:
        from torch._inductor.select_algorithm import ExternKernelCaller, ExternKernelChoice

        class TileflyCaller(ExternKernelCaller):
            """One of tilefly's candidates at one call site."""

            def hash_key(self):
                return _timed_key(super().hash_key())

            def benchmark(self, *args, out):
                inductors = functools.partial(super().benchmark, *args, out=out)
                return _replay_extern(self, args, out, inductors) if graph_timed() else inductors()

        class TileflyChoice(ExternKernelChoice):
            def bind(self, input_nodes, layout, ordered_kwargs_for_cpp_kernel=(), **kwargs):
                self.ordered_kwargs_for_cpp_kernel = ordered_kwargs_for_cpp_kernel
                return TileflyCaller(self, input_nodes, layout, kwargs, has_out_variant=self.has_out_variant)

        _classes.update(choice=TileflyChoice, caller=TileflyCaller)
    return _classes


def extern_choice(kernel: Callable[..., Any], name: str) -> Any:
    """An ``ExternKernelChoice`` calling ``kernel`` (named ``name`` in generated code) whose bound
    candidates Inductor times as ``graph_timed()`` says; otherwise exactly Inductor's."""
    return _tilefly_classes()["choice"](kernel, name=name)


def _graph_benchmark(choice: Any) -> Callable[..., float] | None:
    """A ``benchmark(*args, out)`` for one of Inductor's own candidates that times a graph replay
    of its call, else None (a kind of candidate this does not know how to call)."""
    from torch._inductor.select_algorithm import ExternKernelCaller, TritonTemplateCaller

    inductors = choice.benchmark
    if type(choice) is ExternKernelCaller:
        return lambda *args, out: _replay_extern(choice, args, out, functools.partial(inductors, *args, out=out))
    if type(choice) is TritonTemplateCaller and getattr(choice, "bmreq", None) is not None:
        def template(*args, out):
            # made per call: the run function binds the current stream, the capture's inside it
            def call():
                choice.bmreq.make_run_fn(*args, out=out)()
            try:
                return _replayed_or(choice.name, call, lambda: inductors(*args, out=out))
            finally:
                choice.bmreq.cleanup_run_fn()
        return template
    return None


def _suffixed(hash_key: Callable[[], str]) -> Callable[[], str]:
    return lambda: hash_key() + GRAPH_TIMED_KEY


def time_race_on_gpu(choices: list[Any]) -> list[Any]:
    """Preprocessing function: when ``graph_timed()``, a race with a tilefly candidate times ATen's
    and Triton's candidates as graph replays too. Returns ``choices`` itself."""
    try:
        caller = _tilefly_classes()["caller"]
        if not graph_timed() or not any(isinstance(c, caller) for c in choices):
            return choices
        for choice in choices:
            if isinstance(choice, caller) or "benchmark" in vars(choice):
                continue
            timed = _graph_benchmark(choice)
            if timed is not None:
                choice.benchmark = timed
                choice.hash_key = _suffixed(choice.hash_key)
    except Exception as exc:  # noqa: BLE001 - never break a compile over how it is timed
        _log.warning("tilefly: race timing left as Inductor's (%s: %s)", type(exc).__name__, exc)
    return choices


def hook_race_timing() -> None:
    """Put ``time_race_on_gpu`` last among the selector's preprocessing functions (after any that
    add tilefly's candidates, e.g. the grouped GEMM's). Idempotent."""
    try:
        from torch._inductor import select_algorithm

        fns = select_algorithm.get_algorithm_selector_cache().preprocessing_fns
    except Exception as exc:  # noqa: BLE001 - another torch: its races keep Inductor's timing
        _log.debug("tilefly: race timing not hooked (%s: %s)", type(exc).__name__, exc)
        return
    if time_race_on_gpu in fns:
        fns.remove(time_race_on_gpu)
    fns.append(time_race_on_gpu)

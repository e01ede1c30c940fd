"""How Inductor times the configs of its own Triton kernels while tilefly is installed (option
``triton_autotune_timing``).

Inductor picks a config for each pointwise and reduction kernel at the first run of a compiled graph
and, under ``mode="max-autotune"``, refines it by coordinate descent. Every trial goes through
``CachingAutotuner.bench``: one launch between two CUDA events after an L2 flush, with the clones of
the buffers the kernel writes in place made inside the events, and the launch issued from Python.
For the few-µs kernels of a decode step that measures host time and copies more than the kernel:

- session 37: Inductor's log timed every config of the small RMSNorm reductions at 10-100x their
  time in the graph, and two compiles of one model kept a 79-130 µs config of a kernel whose
  siblings take 2-3 µs;
- session 38: BF16 Llama-3.1-8B at 32 requests kept its rope + KV-cache write kernel at 16
  programs, 11.5 µs a call, 31 calls a step, where the MXFP4 compile's pick of the same kind of
  kernel took 1.5 µs.

``queued`` times a config the way a CUDA graph runs it. The buffers the kernel mutates are cloned
once, before the timing; a spin kernel (``torch.cuda._sleep``) holds the GPU while the host queues
``LAUNCHES`` launches, which then run back to back; a trial is the events' time around them over
``LAUNCHES``, and the median of ``BATCHES`` trials is the config's time. The spin doubles until it
outlasts the host's queueing (each batch checks; the next config starts from the spin that sufficed). A launch of ``LONG_MS`` or more (one launch from
an idle GPU, host time included) is long enough for Inductor's timing and keeps it, and so does a
config Inductor would skip (too many spilled registers) or one that fails to launch: Inductor's
timing reports it.

Inductor keeps each kernel's pick in its autotune cache (beside the kernel's source, keyed by the
source's hash and ``torch.compiler.config.cache_key_tag``). While ``queued`` is on, tilefly appends
``TAG`` to that tag, so a stock compile on the same machine (side A of an e2e run) never reuses a
queued pick, nor a queued compile a stock one. The tag is in the FX graph cache's key too: the two
never share compiled graphs either.
"""
from __future__ import annotations

import functools
import logging
import statistics
import time
from typing import Any, Callable

from tilefly import config

_log = logging.getLogger("tilefly.inductor")

LAUNCHES = 20
BATCHES = 5
SPIN_CYCLES = 1 << 20       # about 0.5 ms at the H200's clock; doubled while the host is slower
MAX_SPIN_CYCLES = 1 << 26
LONG_MS = 0.2               # a launch this long outlasts its host time: Inductor's timing measures it well
TAG = ":tilefly-queued-timing"

# "original": CachingAutotuner.bench before the hook; "queued": the option as the last install() read it;
# "spin": the spin the last queued_ms ended with
_state: dict[str, Any] = {}


def queued() -> bool:
    """Whether tilefly times Inductor's Triton kernels now: installed, with the option at 'queued'."""
    return bool(_state.get("queued"))


def one_launch_ms(launch: Callable[[], Any]) -> float:
    """Events around one ``launch()`` from an idle GPU, host time included (after a first launch)."""
    import torch

    launch()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    launch()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def queued_ms(launch: Callable[[], Any], launches: int = LAUNCHES, batches: int = BATCHES) -> float:
    """GPU time of one ``launch()`` in ms: the median over ``batches`` of ``launches`` back-to-back
    launches queued behind a spin kernel (see the module docstring)."""
    import torch

    spin = _state.get("spin", SPIN_CYCLES)     # the last call's spin: one host, one launcher cost
    trials = []
    while len(trials) < batches:
        before, start, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        before.record()
        torch.cuda._sleep(spin)
        start.record()
        queueing = time.perf_counter()
        for _ in range(launches):
            launch()
        queueing = time.perf_counter() - queueing
        end.record()
        end.synchronize()
        if queueing * 1e3 >= 0.8 * before.elapsed_time(start) and spin < MAX_SPIN_CYCLES:
            spin *= 2       # the GPU may have caught up with the host: this batch does not count
            continue
        trials.append(start.elapsed_time(end) / launches)
    _state["spin"] = spin
    return statistics.median(trials)


def _capturing() -> bool:
    """A CUDA graph capture is on: a spin kernel and events would join it (Inductor's timing fails there too)."""
    import torch

    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _spills_too_much(autotuner: Any, launcher: Any) -> bool:
    """Inductor's own test for skipping a config (``CachingAutotuner.bench``)."""
    import torch

    n_spills = getattr(launcher, "n_spills", None)
    threshold = autotuner.inductor_meta.get("spill_threshold", 32 if torch.version.hip else 16)
    return not autotuner.custom_kernel and n_spills is not None and n_spills > threshold


def _queued_bench(autotuner: Any, launcher: Any, args: tuple, kwargs: dict) -> float | None:
    """``queued_ms`` of ``launcher`` on ``args`` (None for a launch of ``LONG_MS`` or more), leaving the
    arguments as Inductor's bench leaves them: buffers written in place untouched (the launches write
    clones, or copies restored from the CPU) and the buffers Inductor zeroes before a launch zeroed."""
    device = autotuner.get_device_interface()
    stream = device.get_raw_stream(device.current_device())
    cpu_copies = autotuner.copy_args_to_cpu_if_needed(*args, **kwargs)
    try:
        cloned_args, cloned_kwargs = autotuner.maybe_clone_args(cpu_copies, *args, **kwargs)
        autotuner.reset_to_zero_args(*args, **kwargs)

        def launch():
            launcher(*cloned_args, **cloned_kwargs, stream=stream)

        return None if one_launch_ms(launch) >= LONG_MS else queued_ms(launch)
    finally:
        autotuner.reset_to_zero_args(*args, **kwargs)
        autotuner.restore_args_from_cpu(cpu_copies)


def _bench(original: Callable[..., float]) -> Callable[..., float]:
    @functools.wraps(original)
    def bench(self, launcher, *args, with_profiler=False, **kwargs):
        if not queued() or with_profiler or self.device_props.type != "cuda" or _capturing() \
                or _spills_too_much(self, launcher):
            return original(self, launcher, *args, with_profiler=with_profiler, **kwargs)
        try:
            ms = _queued_bench(self, launcher, args, kwargs)
        except Exception as exc:  # noqa: BLE001 - Inductor's timing reports (or skips) what fails
            _log.debug("tilefly: queued timing of %s failed (%s: %s); Inductor times it",
                       self.inductor_meta.get("kernel_name", "a Triton kernel"), type(exc).__name__, exc)
            ms = None
        return original(self, launcher, *args, with_profiler=with_profiler, **kwargs) if ms is None else ms

    bench.tilefly_hook = True
    return bench


def _set_tag(on: bool) -> None:
    from torch.compiler import config as compiler_config

    tag = compiler_config.cache_key_tag
    if on and not tag.endswith(TAG):
        compiler_config.cache_key_tag = tag + TAG
    elif not on and tag.endswith(TAG):
        compiler_config.cache_key_tag = tag[: -len(TAG)]


def install() -> None:
    """Read the option; when 'queued', hook ``CachingAutotuner.bench`` (once) and tag the caches, else
    leave or give both back. tilefly's Inductor install calls it at every ``enable()``."""
    _state["queued"] = False
    try:
        from torch._inductor.runtime.triton_heuristics import CachingAutotuner

        on = config.triton_autotune_timing == "queued"
        if on and not getattr(CachingAutotuner.bench, "tilefly_hook", False):
            _state["original"] = CachingAutotuner.bench
            CachingAutotuner.bench = _bench(CachingAutotuner.bench)
        _set_tag(on)
        _state["queued"] = on
    except Exception as exc:  # noqa: BLE001 - another torch: its kernels keep Inductor's timing
        _log.debug("tilefly: Triton kernel timing not hooked (%s: %s)", type(exc).__name__, exc)


def uninstall() -> None:
    """Inductor's timing again for kernels tuned from now on, and its cache tag back."""
    _state["queued"] = False
    try:
        _set_tag(False)
    except Exception as exc:  # noqa: BLE001
        _log.debug("tilefly: cache tag not restored (%s: %s)", type(exc).__name__, exc)

"""Pieces several suites share: dtypes, eager ATen/tilefly provider pairs, the "best config"
tilefly provider for GEMM-like families, and unit helpers."""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable

import torch

from tilefly.bench import timing
from tilefly.bench.runner import Provider

DEVICE = "cuda"  # tests point this at "cpu" to dry-run a suite's eager providers
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
# A short screen per config, like Inductor's own autotuning pass; the winner is then timed in full.
SCREEN = timing.Policy(warmup_calls=2, min_reps=10, target_ms=10.0, max_reps=50)


def baseline_only(reason: str) -> str:
    return f"baseline-only: tilefly has nothing to time here yet ({reason})"


def eager_providers(call: Callable[[], Any], family: str, missing: str | None, suffix: str = "",
                    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
                    ) -> list[Provider]:
    """``aten`` (tilefly disabled) and, when the family exists, ``tilefly`` (the same call inside
    ``tilefly.enabled(family)``, with the router's decision recorded)."""

    def tilefly_context():
        import tilefly

        stack = contextlib.ExitStack()
        stack.enter_context(context())
        stack.enter_context(tilefly.enabled(family))
        return stack

    providers = [Provider("aten" + suffix, lambda: call, context=context)]
    if missing is None:
        providers.append(Provider("tilefly" + suffix, lambda: call, context=tilefly_context, family=family))
    return providers


def best_config_provider(name: str, configs: Callable[[], dict[str, Callable[[], Any]]]) -> Provider:
    """A provider timing the fastest of a family's kernel configs (as Inductor would pick).
    Each config gets a short screen; a config that raises is skipped and named in the note."""
    provider = Provider(name, None)

    def build() -> Callable[[], Any]:
        screened, failed = [], []
        for label, fn in configs().items():
            try:
                screen = dataclasses.replace(SCREEN, headstart_us=timing.RUN_HEADSTART_US)
                screened.append((timing.measure(fn, screen).median_us, label, fn))
            except Exception as exc:  # noqa: BLE001 - one bad config must not hide the others
                failed.append(f"{label} ({type(exc).__name__})")
        if not screened:
            raise RuntimeError("no tilefly config ran: " + ", ".join(failed) if failed else "no configs offered")
        screened.sort(key=lambda item: item[0])
        _, label, fn = screened[0]
        provider.note = f"config {label} (fastest of {len(screened)})"
        if failed:
            provider.note += "; failed: " + ", ".join(failed)
        return fn

    provider.build = build
    return provider


def tflops(flops: float, us: float) -> float:
    return flops / us / 1e6


def gbps(nbytes: float, us: float) -> float:
    return nbytes / us / 1e3


def randn(*shape: int, dtype: torch.dtype = torch.bfloat16, scale: float = 1.0) -> torch.Tensor:
    """Fresh random normal data on the GPU (never zeros: zeros make some kernels look faster)."""
    return torch.randn(*shape, device=DEVICE, dtype=torch.float32).mul_(scale).to(dtype)

"""Cached facts about CUDA devices, cheap enough for an eligibility predicate, and the one way
tilefly allocates device tensors it keeps across calls (``kept``).

``torch.cuda.get_device_capability`` costs a few microseconds a call; the
dispatch path asks once per device index and keeps the answer.
"""
from __future__ import annotations

import concurrent.futures
import functools

import torch

HOPPER = (9, 0)


@functools.lru_cache(maxsize=None)
def capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


@functools.lru_cache(maxsize=None)
def properties(index: int):
    return torch.cuda.get_device_properties(index)


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def hopper_reason(t: torch.Tensor) -> str | None:
    """None when ``t`` lives on an sm_90 GPU, else why tilefly cannot serve it."""
    device = t.device
    if device.type != "cuda":
        return f"tensor is on {device.type}, tilefly serves CUDA tensors"
    cap = capability(_index(device))
    if cap != HOPPER:
        return f"GPU is sm_{cap[0]}{cap[1]}, tilefly's kernels target sm_90 (Hopper)"
    return None


def sm_count(t: torch.Tensor) -> int:
    return properties(_index(t.device)).multi_processor_count


def cuda_available() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def has_hopper() -> bool:
    """True when the current CUDA device is sm_90."""
    return cuda_available() and capability(torch.cuda.current_device()) == HOPPER


def kept(make, device: torch.device):
    """``make()``, which allocates CUDA tensors that a cache keeps across calls, run on a helper
    thread. CUDA graph trees route every allocation of the thread that warms a graph up into the
    graph's private pool (torch._C._cuda_beginAllocateCurrentThreadToPool); a pool tensor that
    outlives the call fails their check ("tensors in the cudagraph pool not tracked as outputs")
    and the graph's replays would overwrite it. Another thread allocates from the ordinary pool,
    on its own stream, whose work (a fill) is waited for here. Not under stream capture (the
    wait is illegal there): callers make per-capture tensors instead."""
    def on_device():
        with torch.cuda.device(device):
            return make()

    with concurrent.futures.ThreadPoolExecutor(1) as helper:
        result = helper.submit(on_device).result()
    torch.cuda.synchronize(device)
    return result

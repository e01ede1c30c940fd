"""``aten::topk`` and ``aten::topk.values`` (out=) on tilefly's kernels: eligibility and wrappers.

Eligibility (``topk_reason``; None = served), each rejection a one-line reason:

| condition                                   | otherwise                                  |
|---------------------------------------------|--------------------------------------------|
| CUDA tensor on an sm_90 GPU                 | ATen (``_device.hopper_reason``)           |
| float32, float16 or bfloat16                | ATen                                       |
| at least 1-D, no zero-size dimension        | ATen (its empty/0-d behaviour)             |
| ``dim`` is the last dimension               | ATen: another dim needs a transposing copy |
| last dimension has stride 1                 | ATen: same copy cost                       |
| 1 <= k <= N (ATen raises or returns empty)  | ATen (so its errors stay its own)          |
| a kernel plan exists (configs.plan:         | ATen                                       |
|   k <= N                                    |                                            |
|   for N <= 2048, else k <= 1024 and C fits) |                                            |
| band: not k > 512 on rows <= 2048 (a sort), | ATen                                       |
|   skipped with config.force                 |                                            |
| out=: right dtype/device, and contiguous of | ATen (it resizes, warns, or copies)        |
|   the output shape, or empty (resized here);|                                            |
|   not sharing the input's memory            |                                            |

Kernels (configs.plan): the sieve for k <= 16 (kernels_sieve.py), a whole-row bitonic sort
for short rows (kernels_full.py), and sample threshold / bitmask filter / counting select up
to k = 1024 (kernels_bitmask.py). They replaced a register filter and an atomic radix filter
after the H200 sweep at ad87ca3 (BENCHMARKS.md), which were then deleted.

Host path (``torch.topk``): ``topk_plan`` keeps a ``Served`` per (device, dtype, shape,
strides, k, dim, largest), holding the verdict, the performance band and, after the first
launch, a ``launch.Replay`` of its launches; the router hands it to ``topk_served``
(Impl.takes_plan), which allocates the outputs and replays. H200 machine (torch 2.11,
scripts/router_overhead.py --ops, 256 x 1024 FP32, k=8, per call, host clock): 61.2 us before
this cache (ATen 29.3 in that run), 25.2 us with it (ATen 25.6).

Leading dimensions are flattened into rows (a view when their strides allow,
else a copy). Outputs are contiguous, values in the input dtype, indices int64,
sorted descending (ascending for largest=False) even for sorted=False. Every
kernel is deterministic, so ``torch.use_deterministic_algorithms`` needs no
other path: among equal values the smaller index comes first, every run. NaN is
the largest value (as in ATen); -0.0 and +0.0 tie (keys.py).
"""
from __future__ import annotations

import torch

from tilefly import _device, config
# launch.py imports only torch and configs; the kernel modules load on first launch.
from tilefly.ops.topk import configs, launch

SERVED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# Performance band, a first guess to be tuned on the H200 (sweep.py): short rows with a large k
# are a whole-row sort in the full kernel (a bitonic network of ~55 passes for k=1024), where
# ATen's segmented sort is expected to be as fast.
BAND_FULL_MAX_K = 512


MAX_PLANS = 4096  # Served entries kept; the cache is cleared when full (shapes churn)


class Served:
    """What ``topk_plan`` worked out for one input metadata key: the output shape, the device,
    the performance-band reason (None inside the band) and the launches' replay once recorded
    (False when the first call could not be recorded: it is not tried again for this key)."""

    __slots__ = ("out_shape", "band", "replay", "index")

    def __init__(self, out_shape, band, index):
        self.out_shape, self.band, self.replay, self.index = out_shape, band, None, index


_plans: dict = {}


def topk_plan(self, k, dim=-1, largest=True, sorted=True):
    """The router's predicate for ``aten::topk``: a reason string, or the ``Served`` plan."""
    index = self.get_device()
    if index < 0:  # not CUDA (or a mocked device in tests): nothing worth caching
        return topk_reason(self, k, dim, largest, sorted)
    key = (index, self.dtype, self.shape, self.stride(), k, dim, largest)
    plan = _plans.get(key)
    if plan is None:
        reason = _eligibility(self, k, dim)
        if reason is None:
            band = _band(self.shape[-1], k)
            plan = Served((*self.shape[:-1], k), band, index)
        else:
            plan = reason
        if len(_plans) >= MAX_PLANS:
            _plans.clear()
        _plans[key] = plan
    if plan.__class__ is str:
        return plan
    if plan.band is not None and not config.force:
        return plan.band
    return plan


def topk_served(plan, self, k, dim=-1, largest=True, sorted=True):
    """``aten::topk`` for a ``Served`` plan: outputs allocated, launches replayed (recorded on
    the first call, and whenever a replay cannot serve this call)."""
    if plan is None:  # the predicate answered without a plan (CPU stand-ins in tests)
        return topk(self, k, dim, largest, sorted)
    values, indices = launch.empty_outputs(plan.out_shape, self.dtype, self.device)
    replay = plan.replay
    x_ptr = self.data_ptr()
    if replay and replay.usable(x_ptr) and plan.index == torch.cuda.current_device():
        replay(x_ptr, values.data_ptr(), indices.data_ptr(), plan.index, self.device)
        return values, indices
    N = self.shape[-1]
    rows = self.reshape(-1, N)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    if plan.index != torch.cuda.current_device():
        with torch.cuda.device(plan.index):
            launch.topk_rows(rows, k, largest, values.view(-1, k), indices.view(-1, k))
    elif replay is None:
        plan.replay = launch.trace(self, rows, k, largest, values, indices) or False
    else:
        launch.topk_rows(rows, k, largest, values.view(-1, k), indices.view(-1, k))
    return values, indices


def topk_reason(self, k, dim=-1, largest=True, sorted=True) -> str | None:
    """Why ``torch.topk(self, k, dim, largest, sorted)`` stays on ATen, or None when served."""
    reason = _eligibility(self, k, dim)
    if reason is not None:
        return reason
    return None if config.force else _band(self.shape[-1], k)


def _band(N: int, k: int) -> str | None:
    plan = configs.plan(N, k)
    if plan.kind == "full" and k > BAND_FULL_MAX_K:
        return f"k={k} > {BAND_FULL_MAX_K} on a row of {N}: a whole-row sort, ATen's is as fast (force=True serves it)"
    return None


def _eligibility(self, k, dim) -> str | None:
    reason = _device.hopper_reason(self)
    if reason is not None:
        return reason
    if self.dtype not in SERVED_DTYPES:
        return f"dtype {self.dtype} is not served (float32, float16, bfloat16)"
    ndim = self.dim()
    if ndim == 0:
        return "0-d input"
    if dim != -1 and dim != ndim - 1:
        return f"dim={dim} is not the last dimension (a transposing copy; left to ATen)"
    N = self.shape[-1]
    if self.numel() == 0:
        return "empty input"
    if not 1 <= k <= N:
        return f"k={k} outside 1..{N} (ATen's behaviour)"
    if self.stride(-1) != 1:
        return "last dimension is strided (a copy; left to ATen)"
    if configs.plan(N, k) is None:
        return f"no kernel for N={N}, k={k} (k > {configs.RADIX_MAX_K} on rows > {configs.FULL_MAX_N}, or too long)"
    return None


def topk_values_reason(self, k, dim=-1, largest=True, sorted=True, *, values, indices) -> str | None:
    reason = topk_reason(self, k, dim, largest, sorted)
    if reason is not None:
        return reason
    if values.dtype != self.dtype or indices.dtype != torch.int64:
        return "out= dtypes differ from (input dtype, int64)"
    if values.device != self.device or indices.device != self.device:
        return "out= tensors on another device"
    shape = (*self.shape[:-1], k)
    storage = self.untyped_storage().data_ptr()
    for out in (values, indices):
        if out.numel() != 0 and (tuple(out.shape) != shape or not out.is_contiguous()):
            return "out= tensor of another shape or non-contiguous (ATen resizes or copies)"
        if out.numel() != 0 and out.untyped_storage().data_ptr() == storage:
            return "out= tensor shares memory with the input"
    return None


def topk(self, k, dim=-1, largest=True, sorted=True):
    values, indices = launch.empty_outputs((*self.shape[:-1], k), self.dtype, self.device)
    _run(self, k, largest, values, indices)
    return values, indices


def topk_values(self, k, dim=-1, largest=True, sorted=True, *, values, indices):
    shape = (*self.shape[:-1], k)
    for out in (values, indices):
        if out.numel() == 0:
            out.resize_(shape)
    _run(self, k, largest, values, indices)
    return values, indices


def _run(x, k, largest, values, indices):
    N = x.shape[-1]
    rows = x.reshape(-1, N)  # a view when the leading strides allow it
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    device = x.device.index
    if device is not None and device != torch.cuda.current_device():
        with torch.cuda.device(device):
            launch.topk_rows(rows, k, largest, values.view(-1, k), indices.view(-1, k))
    else:
        launch.topk_rows(rows, k, largest, values.view(-1, k), indices.view(-1, k))

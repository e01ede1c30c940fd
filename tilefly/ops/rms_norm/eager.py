"""``aten::_fused_rms_norm`` (what ``F.rms_norm`` calls on CUDA) on tilefly's kernels.

Eligibility (``rms_norm_reason``; None = served, else a one-line reason and ATen runs):

| condition                                                  | otherwise                              |
|------------------------------------------------------------|----------------------------------------|
| CUDA tensor on an sm_90 GPU                                | ATen (``_device.hopper_reason``)       |
| input float16, bfloat16 or float32                         | ATen                                   |
| ``normalized_shape`` = the input's trailing dims (>= 1)     | ATen (it raises the error)             |
| weight None, or same dtype, device and shape as normalized | ATen (F.rms_norm already keeps mixed   |
|   dims, contiguous                                         |   dtypes off this op)                  |
| 1 <= N <= 2**24 elements per row (N = prod(normalized))    | ATen                                   |
| rows: the normalized dims one contiguous block, the        | ATen (it copies to contiguous first)   |
|   leading dims one uniform row stride < 2**31 (contiguous, |                                        |
|   row slices ``x[..., :k]`` of a wider buffer, expanded    |                                        |
|   rows); M < 2**31 rows                                    |                                        |
| performance band: input >= MIN_SERVED_BYTES                | ATen (skipped with                     |
|                                                            |   ``tilefly.config.force``)            |

Outputs are ATen's: ``y`` contiguous in the input's dtype and shape, ``rstd`` FP32 contiguous,
shaped ``input.shape[:-n] + [1] * n``; ``eps=None`` means FP32 epsilon (ATen's choice for every
served dtype, whose accumulation type is FP32); an input with no rows returns empty outputs.
The backward is ATen's: autograd calls ``_fused_rms_norm_backward`` with this ``rstd``.

Non-finite inputs follow the float64 reference: a row holding NaN gives NaN rstd and y; a row
holding +-inf (no NaN) gives rstd = rsqrt(inf) = 0, so y is NaN where x is infinite (inf * 0)
and 0 elsewhere in the row; every kernel and row layout here computes it the same way. ATen
does not answer consistently: on the H200 (torch 2.11) it agreed with this for N = 4096 and
disagreed on the +-inf rows for N = 4097 and 65537 (one side NaN), which points at its kernel
for N off the vector width (a Welford-style update can form inf - inf). So tests check +-inf
rows against float64 and compare with ATen only on the other rows.

Eager only: under ``torch.compile`` Inductor decomposes ``_fused_rms_norm`` into its own fused
kernel and never reaches this override (a compiled model with tilefly enabled runs unchanged).

Host path. Everything the predicate and the launch derive from the input's metadata is kept in
a ``Plan`` per (shape, strides, dtype, device, weight shape/strides/dtype/device). The last new
CUDA key also gets a C++ tensor guard (the one Dynamo uses: dtype, device, sizes, strides,
dispatch keys), so a call repeating it (every RMSNorm of a decode step) costs one guard check;
other calls build the key and look it up. A served predicate hands its plan to the op through the
router (Impl.takes_plan), and the op does two empty_like allocations and one call of
Triton's C launcher (launcher.run_plan).
Per call on the 2-core CPU box, CPU tensors taking the CUDA branch, launch stubbed
(``python -m tilefly.ops.rms_norm.sweep --host``; before: the first version of this file):
predicate 2.69 -> 0.38 us (0.74 when the guard misses), op 6.4 -> 2.96 us (1.75 of it the two
allocations), predicate + op 9.1 -> 3.4-3.7 us. The router's own cost (torch boxing the call into
Python and back, ~4 us there) comes on top, served or declined.
"""
from __future__ import annotations

import math

import torch

from tilefly import _device, config
from tilefly.ops.rms_norm import launcher

SERVED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_N = 1 << 24                  # FP32 holds N exactly, so sum/N is ATen's mean
MAX_INT32 = (1 << 31) - 1        # rows and row stride stay 32-bit kernel arguments
FLOAT32_EPS = launcher.FLOAT32_EPS

# Performance band, from the H200 sweep of the LLM shapes (BF16, tokens 1..32768 x hidden
# 2048..8192, L2 flushed): tilefly's device time is below ATen's at every one, down to the
# smallest, 1 x 2048 (4 KB: 4.9 vs 8.1 us). So the band is not about device time: it is the
# smallest input measured, and smaller inputs (no data) stay on ATen. What a decode loop that
# is bound by host time pays is mostly the router (torch boxing the call into Python), paid
# whether the predicate serves or declines, so a wider band would not help it; what helps is
# a cheap predicate and op (see Host path above), and CUDA graphs for such loops.
MIN_SERVED_BYTES = 4096
MAX_PLANS = 4096                 # plans kept; the cache is cleared when full (shapes churn)


class Plan:
    """What one (shape, strides, dtype, device, weight) key needs: the eligibility verdict and,
    when served, the [M, N] row view, output templates and the launcher's cached entry."""

    __slots__ = ("reason", "band", "norm", "M", "N", "stride", "index", "guard", "y_like",
                 "rstd_like", "rstd_shape", "fast")

    def __init__(self, reason=None):
        self.reason, self.band, self.fast, self.norm = reason, None, None, None


_plans: dict = {}
_recent = None    # (guard, weight is None, plan) of the last CUDA call served from a new key


def _guard_of(*tensors):
    """A C++ check that tensors have these tensors' dtype, device, sizes, strides and dispatch
    keys (what Dynamo guards with), ~0.15 us for two; None where this torch lacks it."""
    try:
        from torch._C._dynamo.guards import TensorGuards

        return TensorGuards(*tensors, dynamic_dims_sizes=None, dynamic_dims_strides=None)
    except Exception:  # noqa: BLE001 - a private torch API: without it the dict lookup serves
        return None


def rms_norm_plan(input, normalized_shape, weight=None, eps=None):
    """The router's predicate for ``aten::_fused_rms_norm``: a reason string, or the served
    ``Plan``, which the router hands to ``rms_norm_served`` (Impl.takes_plan)."""
    global _recent
    recent = _recent
    if (recent is not None and (weight is None) is recent[1]
            and (recent[0].check(input) if weight is None else recent[0].check(input, weight))
            and (normalized_shape == recent[2].norm or list(normalized_shape) == recent[2].norm)):
        plan = recent[2]  # the metadata of the last new CUDA key again: decode loops stay here
    else:
        index = input.get_device()
        if index < 0:  # not CUDA: the device check answers (tests mock it to reach the rest on meta)
            reason = _device.hopper_reason(input)
            if reason is not None:
                return reason
            index = (input.device, None if weight is None else weight.device)
        if weight is None:
            key = (input.shape, input.stride(), input.dtype, index)
        else:  # weight.get_device(): -1 for CPU and meta alike (either declined beside a CUDA input)
            key = (input.shape, input.stride(), input.dtype, index, weight.shape, weight.stride(),
                   weight.dtype, weight.get_device())
        plan = _plans.get(key)
        if plan is None or (normalized_shape != plan.norm and list(normalized_shape) != plan.norm):
            plan = _new_plan(key, input, normalized_shape, weight)  # the key leaves normalized_shape out
            if plan.reason is None and index.__class__ is int:
                guard = _guard_of(input) if weight is None else _guard_of(input, weight)
                _recent = None if guard is None else (guard, weight is None, plan)
    if plan.reason is not None:
        return plan.reason
    if plan.band is not None and not config.force:
        return plan.band
    return plan


def rms_norm_reason(input, normalized_shape, weight=None, eps=None) -> str | None:
    """Why ``F.rms_norm`` with these arguments stays on ATen, or None when tilefly serves it."""
    plan = rms_norm_plan(input, normalized_shape, weight, eps)
    return plan if plan.__class__ is str else None


def rms_norm_served(plan, input, normalized_shape, weight=None, eps=None):
    """``aten::_fused_rms_norm`` for the ``Plan`` the predicate returned: returns (y, rstd)."""
    if plan is None:  # the predicate answered without a plan (CPU stand-ins in tests)
        return rms_norm_forward(input, normalized_shape, weight, eps)
    return _run(plan, input, weight, eps)


def rms_norm_forward(input, normalized_shape, weight=None, eps=None, *, kernel_config=None):
    """``aten::_fused_rms_norm`` for inputs ``rms_norm_reason`` accepts, called directly (tests,
    sweeps): returns (y, rstd). ``kernel_config`` (a configs.Config) overrides the heuristic."""
    plan = _build_plan(input, normalized_shape, weight)
    if plan.reason is not None:
        raise ValueError(f"rms_norm_forward: {plan.reason}")
    return _run(plan, input, weight, eps, kernel_config)


def _run(plan, input, weight, eps, kernel_config=None):
    if plan.M == 0:
        return (torch.empty_like(input, memory_format=torch.contiguous_format),
                torch.empty(plan.rstd_shape, dtype=torch.float32, device=input.device))
    y = torch.empty_like(input) if plan.y_like else torch.empty_like(input, memory_format=torch.contiguous_format)
    rstd = torch.empty_like(plan.rstd_like)
    eps = FLOAT32_EPS if eps is None else eps
    if kernel_config is None:
        launcher.run_plan(plan, input, weight, y, rstd, eps)
    else:
        launcher.launch_rows(input, weight, y, rstd, plan.M, plan.N, plan.stride, eps, kernel_config)
    return y, rstd


def _new_plan(key, input, normalized_shape, weight) -> Plan:
    if len(_plans) >= MAX_PLANS:
        _plans.clear()
    plan = _plans[key] = _build_plan(input, normalized_shape, weight)
    return plan


def _build_plan(input, normalized_shape, weight) -> Plan:
    """Every check of the eligibility table (the device's for CUDA inputs; rms_norm_reason checks
    other devices before any key is built), and the launch facts."""
    plan = _check(input, normalized_shape, weight)
    plan.norm = list(normalized_shape)
    return plan


def _check(input, normalized_shape, weight) -> Plan:
    if input.get_device() >= 0:  # CUDA: which GPU (cached in the plan, whose key holds the device)
        reason = _device.hopper_reason(input)
        if reason is not None:
            return Plan(reason)
    dtype = input.dtype
    if dtype not in SERVED_DTYPES:
        return Plan(f"dtype {dtype} is not served (float16, bfloat16, float32)")
    norm = list(normalized_shape)
    n = len(norm)
    shape = input.shape
    if n == 0 or n > len(shape) or list(shape[len(shape) - n:]) != norm:
        return Plan(f"normalized_shape {norm} is not the trailing dims of input {list(shape)}")
    if weight is not None:
        if weight.dtype != dtype:
            return Plan(f"weight dtype {weight.dtype} differs from input dtype {dtype}")
        if weight.device != input.device:
            return Plan(f"weight is on {weight.device}, input on {input.device}")
        if list(weight.shape) != norm:
            return Plan(f"weight shape {list(weight.shape)} is not normalized_shape {norm}")
        if not weight.is_contiguous():
            return Plan("weight is not contiguous")
    N = math.prod(norm)
    if not 1 <= N <= MAX_N:
        return Plan(f"row length N={N} outside 1..{MAX_N}")
    stride = N if input.is_contiguous() else row_stride(input, n)
    if stride is None:
        return Plan("input rows are not one contiguous block at a uniform row stride (ATen copies first)")
    numel = input.numel()
    if numel // N > MAX_INT32 or stride > MAX_INT32:
        return Plan("more than 2**31 rows or a row stride beyond 2**31 elements")

    plan = Plan()
    nbytes = numel * input.element_size()
    if nbytes < MIN_SERVED_BYTES:
        plan.band = f"input of {nbytes} bytes < {MIN_SERVED_BYTES}: launch-bound, ATen is as fast"
    plan.M, plan.N, plan.stride = numel // N, N, stride
    plan.index = input.get_device()
    plan.guard = plan.index >= 0 and torch.cuda.device_count() > 1
    plan.y_like = input.stride() == _contiguous_strides(shape)
    plan.rstd_shape = tuple(shape[:len(shape) - n]) + (1,) * n
    if plan.M:
        # empty_like of a one-element tensor expanded to rstd's shape allocates it contiguous,
        # without parsing a shape (about half the host time of torch.empty(shape, ...)).
        plan.rstd_like = torch.empty(1, dtype=torch.float32, device=input.device).expand(plan.rstd_shape)
    return plan


def _contiguous_strides(shape) -> tuple:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def row_stride(x: torch.Tensor, n: int) -> int | None:
    """Elements between consecutive rows of ``x`` viewed as [M, N] (N = its last n dims), or None
    when the last n dims are not one contiguous block or the leading dims not one stride."""
    shape, strides = x.shape, x.stride()
    lead = len(shape) - n
    n_elems = 1
    for size, stride in zip(reversed(shape[lead:]), reversed(strides[lead:])):
        if size != 1 and stride != n_elems:
            return None
        n_elems *= size
    row, rows_inside = None, 1
    for size, stride in zip(reversed(shape[:lead]), reversed(strides[:lead])):
        if size == 1:
            continue
        if row is None:
            row = stride
        elif stride != row * rows_inside:
            return None
        rows_inside *= size
    return n_elems if row is None else row

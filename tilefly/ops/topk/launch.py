"""Launch the top-k kernels on a [rows, N] view: plan -> grid -> compiled kernel.

Launch cost: Triton's ``kernel[grid](...)`` binds and specializes every argument
on each call (several microseconds of Python). ``_Kernel`` does that once per
specialization: the first call goes through Triton (compiling if needed) and
keeps the ``CompiledKernel``; later calls with the same specialization key
call its C launcher directly. The key is at least as fine as Triton's own
(dtype and 16-byte alignment of each pointer; for each int whether it is 1,
a multiple of 16, and 32-bit), so a cached kernel never runs on arguments it
was not specialized for. Under TRITON_INTERPRET=1 every call goes through Triton.

Replay (the op's hot path, eager.py): ``trace`` runs one ``topk_rows`` call while
recording every launch (compiled kernel, grid, arguments) and the scratch it
allocated, and maps each pointer argument to an offset from the input, the two
outputs or the scratch. A later call with the same input metadata (eager.py's
cache key) then allocates the scratch and makes the same launches through
Triton's C launcher (tilefly._triton_launch), its pointers rebased: no plan
lookup, no views, no argument specialization.
"""
from __future__ import annotations

import importlib
import threading

import torch

from tilefly import _triton_launch
from tilefly.ops.topk import configs

_tracing = threading.local()  # .launches [(compiled, grid, args)] and .scratch [tensor] while trace() runs

_KERNEL_MODULES = {"full": "tilefly.ops.topk.kernels_full", "sieve": "tilefly.ops.topk.kernels_sieve",
                   "bitmask": "tilefly.ops.topk.kernels_bitmask"}


class _Kernel:
    def __init__(self, module: str, name: str):
        self.module, self.name = module, name
        self.fn = None
        self.compiled: dict[tuple, object] = {}

    def __call__(self, grid: tuple[int, ...], args: tuple, constexprs: dict, num_warps: int) -> None:
        if self.fn is None:
            self.fn = getattr(importlib.import_module(_KERNEL_MODULES[self.module]), self.name)
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        if device.type != "cuda":  # the interpreter: CPU tensors
            self.fn[grid](*args, **constexprs, num_warps=num_warps)
            return
        key = (device.index, num_warps, tuple(constexprs.values()), tuple(_spec(a) for a in args))
        kernel = self.compiled.get(key)
        full = (*args, *constexprs.values())
        if kernel is None:
            kernel = self.fn[grid](*args, **constexprs, num_warps=num_warps)
            self.compiled[key] = kernel
            _record(kernel, grid, full)
            return
        _record(kernel, grid, full)
        _triton_launch.run_compiled(kernel, grid, _triton_launch.current_stream(device.index), full)


def _spec(arg) -> tuple:
    if isinstance(arg, torch.Tensor):
        return (arg.dtype, arg.data_ptr() % 16 == 0)
    if isinstance(arg, bool):
        return (bool, arg)
    if isinstance(arg, int):
        return (arg == 1, arg % 16 == 0, -(2**31) <= arg < 2**31)
    return (type(arg),)


_full = _Kernel("full", "topk_full_kernel")
_sieve = _Kernel("sieve", "sieve_kernel")
_bitmask_threshold = _Kernel("bitmask", "sample_threshold_kernel")
_bitmask_filter = _Kernel("bitmask", "bitmask_filter_kernel")
_bitmask_select = _Kernel("bitmask", "counting_select_kernel")


def topk_rows(x: torch.Tensor, k: int, largest: bool, values: torch.Tensor, indices: torch.Tensor,
              plan: configs.Plan | None = None) -> None:
    """Top-k of each row of ``x`` ([rows, N], unit column stride) into contiguous [rows, k] outputs."""
    rows, N = x.shape
    plan = plan or configs.plan(N, k)
    if plan is None:
        raise ValueError(f"no top-k kernel serves N={N}, k={k}")
    stride = x.stride(0)
    largest = bool(largest)
    if plan.kind == "sieve":
        scratch = _scratch((rows * plan.CAP,), torch.int64, x.device)
        _record_scratch(scratch)
        _sieve((rows,), (x, values, indices, scratch, N, stride, k),
               dict(LARGEST=largest, E=plan.E, G=plan.G, TEAMS=plan.TEAMS, CAP=plan.CAP, EVEN=plan.even,
                    BLOCK=plan.block), plan.num_warps)
    elif plan.kind == "full":
        _full((_cdiv(rows, plan.ROWS),), (x, values, indices, rows, N, stride, k),
              dict(LARGEST=largest, ROWS=plan.ROWS, NP=plan.NP, K2=plan.K2), plan.num_warps)
    else:
        _sample_filter_select(x, k, largest, values, indices, plan)


def _sample_filter_select(x, k, largest, values, indices, plan) -> None:
    """The three launches of a bitmask plan, in batches of rows sharing one scratch."""
    rows, N = x.shape
    batch = min(rows, plan.batch_rows())
    scratch = _scratch((batch * (plan.C + 1),), torch.int64, x.device)  # one allocation for all three
    _record_scratch(scratch)
    cand = scratch[:batch * plan.C]
    tau, count = scratch[batch * plan.C:].view(torch.int32).split(batch)
    chunks = _cdiv(N, plan.chunk)
    filter_meta = dict(LARGEST=largest, E=plan.E, G=plan.G, C=plan.C, EVEN=plan.even)
    select_meta = dict(LARGEST=largest, C=plan.C, SORT=plan.SORT, BLOCK=plan.block)
    for start in range(0, rows, batch):
        n = min(batch, rows - start)
        xb, vb, ib = x[start:start + n], values[start:start + n], indices[start:start + n]
        stride = xb.stride(0)
        _bitmask_threshold((n,), (xb, tau, count, N, stride, plan.r, plan.r_max, plan.sample_stride),
                           dict(LARGEST=largest, S=plan.S, WHOLE_ROW=plan.whole_row), plan.threshold_warps)
        _bitmask_filter((n * chunks,), (xb, tau, count, cand, N, stride, chunks), filter_meta, plan.filter_warps)
        _bitmask_select((n,), (xb, tau, count, cand, vb, ib, N, stride, k), select_meta, plan.select_warps)


class Replay:
    """The launches of one traced ``topk_rows`` call, ready to repeat on new buffers."""

    __slots__ = ("steps", "scratch_numel", "x_mod16", "hooks")

    def usable(self, x_ptr: int) -> bool:
        """Whether this call may replay: x at the same address modulo 16 as when traced (every
        pointer into x, batch offsets included, then keeps the alignment its kernel was
        specialized on), and no profiler hook (Triton 3.6's HookChain fills ``calls``)."""
        return x_ptr & 15 == self.x_mod16 and not self.hooks.calls

    def __call__(self, x_ptr: int, values_ptr: int, indices_ptr: int, index: int, device) -> None:
        scratch = _scratch((self.scratch_numel,), torch.int64, device) if self.scratch_numel else None
        bases = (x_ptr, values_ptr, indices_ptr, 0 if scratch is None else scratch.data_ptr())
        stream = _triton_launch.current_stream(index)
        for direct, g0, g1, spec in self.steps:
            direct(g0, g1, stream, tuple(v if b < 0 else bases[b] + v for b, v in spec))


def trace(x: torch.Tensor, rows: torch.Tensor, k: int, largest: bool, values: torch.Tensor,
          indices: torch.Tensor) -> Replay | None:
    """Run ``topk_rows(rows, ...)`` (``rows``: a view of ``x``) and return its Replay, or None
    when a launch cannot be replayed (a copy of the input, Triton launch hooks, another Triton)."""
    _tracing.launches, _tracing.scratch = [], []
    try:
        topk_rows(rows, k, largest, values.view(-1, k), indices.view(-1, k))
        launches, scratches = _tracing.launches, _tracing.scratch
    finally:
        _tracing.launches = _tracing.scratch = None
    if not launches or rows.data_ptr() != x.data_ptr() or len(scratches) > 1:  # CPU: none recorded
        return None
    if _triton_launch.hooks_active():
        return None
    scratch = scratches[0] if scratches else None
    regions = [_region(x), _region(values), _region(indices),
               _region(scratch) if scratch is not None else (0, 0)]
    steps = []
    for kernel, grid, args in launches:
        direct = _triton_launch.direct(kernel)
        if direct is None:
            return None
        spec = []
        for a in args:
            if isinstance(a, torch.Tensor):
                ptr = a.data_ptr()
                base = next((i for i, (lo, hi) in enumerate(regions) if lo <= ptr < hi), None)
                if base is None:
                    return None
                spec.append((base, ptr - regions[base][0]))
            else:
                spec.append((-1, a))
        steps.append((direct, grid[0], grid[1] if len(grid) > 1 else 1, tuple(spec)))
    replay = Replay()
    replay.steps, replay.scratch_numel = tuple(steps), 0 if scratch is None else scratch.numel()
    replay.x_mod16 = x.data_ptr() & 15
    from triton import knobs

    replay.hooks = knobs.runtime.launch_enter_hook
    return replay


def _region(t: torch.Tensor) -> tuple[int, int]:
    """[first byte, one past the last byte) that ``t`` can address."""
    lo = t.data_ptr()
    extent = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if n > 0)
    return lo, lo + extent * t.element_size()


def _record(kernel, grid, args) -> None:
    launches = getattr(_tracing, "launches", None)
    if launches is not None:
        launches.append((kernel, grid, args))


def _record_scratch(t: torch.Tensor) -> None:
    scratch = getattr(_tracing, "scratch", None)
    if scratch is not None:
        scratch.append(t)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _scratch(shape, dtype, device) -> torch.Tensor:
    """Uninitialized memory even under torch.use_deterministic_algorithms (every word read is
    written first), so determinism mode adds no fill kernels."""
    if torch._C._get_deterministic_fill_uninitialized_memory() and torch.are_deterministic_algorithms_enabled():
        torch._C._set_deterministic_fill_uninitialized_memory(False)
        try:
            t = torch.empty(shape, dtype=dtype, device=device)
        finally:
            torch._C._set_deterministic_fill_uninitialized_memory(True)
    else:
        t = torch.empty(shape, dtype=dtype, device=device)
    return t


def empty_outputs(shape, dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    return _scratch(shape, dtype, device), _scratch(shape, torch.int64, device)

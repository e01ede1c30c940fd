"""From (x, w, y, rstd) to an RMSNorm kernel launch, and the caches that make a repeated launch
one call into Triton's C launcher.

Two ways in:
- ``launch`` (2-D x, any config; sweep.py, tests, interpreter checks) and ``launch_rows`` (the
  op's [M, N] view) find the compiled kernel for the call's specialization in ``_entries``, or
  let Triton's JIT bind, compile and launch it the first time (also whenever Triton launch
  hooks are set, so profilers see every launch).
- ``run_plan`` (the op's hot path, eager.py): the op's plan for a (shape, strides, dtype,
  weight) key keeps, from its first 16-byte-aligned launch, everything Triton's C launcher takes
  besides pointers, eps and stream, so a repeat call is four ``data_ptr`` reads and one call of
  it; anything else (unaligned pointers, another current device, hooks, the segments kernel,
  whose workspace is allocated per call) goes the ``launch_rows`` way.

Host cost, measured on the 2-core CPU box with a no-op standing in for Triton's C launcher
(sweep.py --host): see eager.py.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from tilefly import _device, _triton_launch
from tilefly.ops.rms_norm import configs

FLOAT32_EPS = torch.finfo(torch.float32).eps
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # absent from CPU-only builds


class Entry:
    """One compiled kernel, ready for Triton's C launcher."""

    __slots__ = ("compiled", "direct", "function", "meta", "coop", "pdl", "consts", "kernel",
                 "rows_per_program", "phases", "programs", "segments", "shift")

    def __init__(self):
        self.shift = None  # W_SHIFT: the Entry of the kernel writing w's shifted copies first
        self.phases = 1    # SAME_PHASE: V, each group of V * rows rows served by V tiles

    def grid(self, M: int) -> int:
        if self.kernel == "chunked":
            return min(M, self.programs)
        if self.kernel == "segments":
            return M * self.segments
        tiles = -(-M // (self.rows_per_program * self.phases)) * self.phases
        return min(tiles, self.programs) if self.programs else tiles  # programs: a persistent rows grid


# Compiled kernels by everything Triton specialized them on (pointer alignment, N and the row
# stride's divisibility by 16 and equality to 1) plus layout and config. M is never specialized.
_entries: dict = {}
_hooks = None           # triton.knobs.runtime.launch_enter_hook once Triton is imported
# Calling Triton's C launch function directly (skipping CompiledKernel.run's scratch handling)
# saves host time; tests/ops/rms_norm passed on the H200 with it on (5cf9730). False keeps
# CompiledKernel.run.
DIRECT_C_LAUNCH = True


def launch(x: torch.Tensor, weight, y: torch.Tensor, rstd: torch.Tensor, eps, config=None):
    """Normalize the rows of a 2-D ``x`` ([M, N], unit column stride) into contiguous ``y`` and
    ``rstd`` (M floats). ``config`` overrides the heuristic (sweep.py, tests). Returns
    ``launch_rows``'s Entry (None for no rows or a launch through the JIT)."""
    M, N = x.shape
    if x.stride(1) != 1 and N > 1:
        raise ValueError("launch: x needs unit column stride")
    if not M:
        return None
    return launch_rows(x, weight, y, rstd, M, N, x.stride(0) if M > 1 else N,
                       FLOAT32_EPS if eps is None else eps, config)


def launch_rows(x, w, y, rstd, M, N, stride, eps, cfg=None):
    """Launch on x viewed as M rows of N at ``stride``; returns the Entry used (None when it
    went through Triton's JIT)."""
    x_ptr = x.data_ptr()
    w_ptr = x_ptr if w is None else w.data_ptr()
    y_ptr, rstd_ptr = y.data_ptr(), rstd.data_ptr()
    size = x.element_size()
    layout = configs.row_layout(N, stride, x_ptr % 16 == 0, size, cfg is None or cfg.split)
    index = x.get_device()
    if index >= 0 and index != torch._C._cuda_getDevice():
        # A Python kernel gets no device guard from the dispatcher; Triton launches on the current one.
        with torch.cuda.device(index):
            return launch_rows(x, w, y, rstd, M, N, stride, eps, cfg)
    device = x.device
    key = (device, x.dtype, N, layout, stride % 16 == 0, stride == 1, w is None, w_ptr % 16 == 0,
           (y_ptr | rstd_ptr) % 16 == 0, cfg)
    entry = _entries.get(key)
    if entry is None or _hooks.calls:
        return _jit_launch(key, layout, x, w, y, rstd, M, N, stride, float(eps), cfg)
    if entry.shift is not None:  # W_SHIFT: w's shifted copies first, then the kernel reads them
        w_shifted = _shifted_weight(w, N, entry.shift.consts[1])
        _call(entry.shift, entry.shift.programs, index, (w_ptr, w_shifted.data_ptr(), N))
        w_ptr = w_shifted.data_ptr()
    args = (x_ptr, w_ptr, y_ptr, rstd_ptr, M, N, stride, eps)
    if entry.segments:
        sync, partial = _workspace(x, M, entry.segments)  # freed after the launch: stream-ordered reuse
        args += (sync.data_ptr(), partial.data_ptr())
    _call(entry, entry.grid(M), index, args)
    return entry


def run_plan(plan, x, w, y, rstd, eps) -> None:
    """The op's launch: ``plan`` (eager.Plan) holds M, N, the row stride and, once a launch with
    16-byte-aligned x and w went through ``launch_rows``, everything the C launcher takes besides
    the pointers, eps and the stream (``plan.fast``; rows and chunked kernels under triton 3.6)."""
    x_ptr = x.data_ptr()
    w_ptr = x_ptr if w is None else w.data_ptr()
    fast = plan.fast
    if fast is None or (x_ptr | w_ptr) & 15 or _hooks.calls or (
            plan.guard and plan.index != torch._C._cuda_getDevice()):
        entry = launch_rows(x, w, y, rstd, plan.M, plan.N, plan.stride, eps)
        if (entry is not None and entry.direct and not entry.segments and entry.shift is None
                and not (x_ptr | w_ptr) & 15):
            plan.fast = (entry.direct, entry.grid(plan.M), entry.function, entry.coop, entry.pdl,
                         entry.meta, plan.M, plan.N, plan.stride, entry.consts)
        return
    c_launch, grid, function, coop, pdl, meta, M, N, stride, consts = fast
    c_launch(grid, 1, 1, _raw_stream(plan.index), function, coop, pdl, None, None,
             meta, None, None, None, x_ptr, w_ptr, y.data_ptr(), rstd.data_ptr(), M, N, stride, eps, *consts)


def _call(entry: Entry, grid: int, index: int, args: tuple) -> None:
    stream = _raw_stream(index)
    if entry.direct:
        entry.direct(grid, 1, 1, stream, entry.function, entry.coop, entry.pdl, None, None, entry.meta,
                     None, None, None, *args, *entry.consts)
    else:
        entry.compiled.run(grid, 1, 1, stream, entry.function, entry.meta, None, None, None, *args, *entry.consts)


def _workspace(x: torch.Tensor, M: int, segments: int) -> tuple:
    """The segments kernel's SYNC (zeroed: ticket counter, then one arrival counter per row) and
    PARTIAL (M x segments FP32) buffers."""
    return (torch.zeros(M + 1, dtype=torch.int32, device=x.device),
            torch.empty(M * segments, dtype=torch.float32, device=x.device))


def _shifted_weight(w: torch.Tensor, N: int, v: int) -> torch.Tensor:
    """Storage for the V shifted copies of w that W_SHIFT reads (kernels.py): V rows of N rounded
    up to V. Freed after the launch like the segments workspace (stream-ordered reuse)."""
    return torch.empty(v * (-(-N // v) * v), dtype=w.dtype, device=w.device)


def _jit_launch(key, layout, x, w, y, rstd, M, N, stride, eps, cfg):
    """First launch of a key (or a launch with Triton hooks set): Triton's JIT binds, compiles and
    launches; the compiled kernel is kept for later launches."""
    global _hooks
    import triton

    from tilefly.ops.rms_norm import kernels

    _hooks = triton.knobs.runtime.launch_enter_hook
    size = x.element_size()
    cfg_ = cfg or configs.heuristic(N, size, layout)
    configs.validate(cfg_, N, size, layout)
    if cfg_.w_realign and (w is None or w.data_ptr() % 16):  # its vector loads of w need alignment
        cfg_ = replace(cfg_, w_realign=False)  # and with it w_branch (kernel_constexprs)
    constexprs = configs.kernel_constexprs(cfg_, N, size, layout, w is not None)
    entry = Entry()
    entry.kernel, entry.rows_per_program, entry.programs, entry.segments = cfg_.kernel, cfg_.rows, 0, 0
    if constexprs.get("SAME_PHASE"):
        entry.phases = constexprs["V"]
    args = [x, x if w is None else w, y, rstd, M, N, stride, eps]
    if constexprs["W_SHIFT"]:
        v = constexprs["V"]
        args[1] = _shifted_weight(w, N, v)
        shift = Entry()
        shift.programs = -(-args[1].numel() // v // configs.SHIFT_BLOCK)
        pdl = bool(constexprs.get("W_PDL", False))
        compiled_shift = kernels.rms_norm_shift_weight_kernel[(shift.programs,)](
            w, args[1], N, BLOCK=configs.SHIFT_BLOCK, V=v, PDL=pdl, num_warps=4)
        if x.is_cuda and hasattr(compiled_shift, "packed_metadata"):
            _fill(shift, compiled_shift, (configs.SHIFT_BLOCK, v, pdl))
            entry.shift = shift
    if cfg_.kernel == "rows":
        kernel = kernels.rms_norm_rows_kernel
        if cfg_.persistent:
            entry.programs = (_device.sm_count(x) if x.is_cuda else 4) * cfg_.programs_per_sm
    elif cfg_.kernel == "chunked":
        kernel = kernels.rms_norm_chunked_kernel
        entry.programs = (_device.sm_count(x) if x.is_cuda else 4) * cfg_.programs_per_sm
    else:
        kernel = kernels.rms_norm_segments_kernel
        entry.segments = constexprs["SEGMENTS"]
        args += _workspace(x, M, entry.segments)
    launch = kernel[(entry.grid(M),)]
    options = dict(num_warps=cfg_.num_warps, num_stages=cfg_.stages, **constexprs)
    if constexprs.get("W_PDL") and x.is_cuda:  # a programmatic dependent of the copies' kernel
        options["launch_pdl"] = True
    if cfg_.kernel == "segments" and not x.is_cuda:
        # The interpreter runs programs one after another; this kernel's programs wait for each other.
        from tilefly.ops.rms_norm.concurrent_interpreter import concurrent_programs

        with concurrent_programs():
            compiled = launch(*args, **options)
    else:
        compiled = launch(*args, **options)
    if not x.is_cuda or not hasattr(compiled, "packed_metadata"):  # TRITON_INTERPRET
        return None
    if constexprs["W_SHIFT"] and entry.shift is None:  # a cached entry would skip the copies
        return None
    _fill(entry, compiled, tuple(constexprs.values()))
    _entries[key] = entry
    return entry


def _fill(entry: Entry, compiled, consts: tuple) -> None:
    """What ``_call`` needs of a compiled kernel."""
    entry.compiled, entry.function, entry.meta = compiled, compiled.function, compiled.packed_metadata
    entry.consts = consts
    # Triton 3.6's C launch function, called directly (tilefly._triton_launch); None elsewhere,
    # and then _call keeps CompiledKernel.run.
    direct = _triton_launch.direct(compiled) if DIRECT_C_LAUNCH else None
    entry.direct = None if direct is None else direct.launch
    entry.coop, entry.pdl = (False, False) if direct is None else (direct.coop, direct.pdl)

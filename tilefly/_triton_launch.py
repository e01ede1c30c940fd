"""Launching an already compiled Triton kernel without Triton's Python launch path.

``kernel[grid](...)`` binds and specializes every argument on each call, and even
``CompiledKernel.run`` goes through a Python wrapper that looks for scratch buffers:
together tens of microseconds on a busy host. For a kernel with no global or profile
scratch, Triton 3.6's launcher is one C function taking the grid, the stream, the
kernel handle, its packed metadata and the arguments (pointers may be passed as
ints). ``Direct`` keeps everything but the per-call values, so a launch is one call.

Only Triton 3.6's launcher layout is known here; with another Triton, or a kernel
that needs scratch, ``direct`` answers None and callers keep ``CompiledKernel.run``.
Launch hooks (profilers) are the caller's to check with ``hooks_active()``: a direct launch
skips them. In Triton 3.6 ``knobs.runtime.launch_enter_hook`` is a ``HookChain`` that is never
None (its ``calls`` list is empty when no profiler listens), so "is not None" is always true.
"""
from __future__ import annotations

import os

_raw_stream = None


def current_stream(index: int) -> int:
    """The raw handle of the current CUDA stream of device ``index``."""
    global _raw_stream
    if _raw_stream is None:
        import torch

        _raw_stream = torch._C._cuda_getCurrentRawStream
    return _raw_stream(index)


def hooks_active() -> bool:
    """Whether a Triton launch-enter hook is set (a profiler wants to see every launch)."""
    from triton import knobs

    hook = knobs.runtime.launch_enter_hook
    return bool(getattr(hook, "calls", hook))  # HookChain (3.6) or a plain callable/None (older)


def run_compiled(compiled, grid, stream: int, args) -> None:
    """Launch a ``CompiledKernel`` through ``CompiledKernel.run`` (any Triton version), building
    the launch metadata only when a hook will read it: ``launch_metadata`` tests the hook
    against None, which Triton 3.6's HookChain never is, so it would be built on every call."""
    from triton import knobs

    grid = (*grid, 1, 1)[:3]
    meta = compiled.launch_metadata(grid, stream, *args) if hooks_active() else None
    compiled.run(grid[0], grid[1], grid[2], stream, compiled.function, compiled.packed_metadata, meta,
                 knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *args)


class Address:
    """A device address standing in for a tensor in a cached launch, so a cached plan keeps no
    tensor alive; Triton's launcher asks it only for ``data_ptr()`` (a descriptor's base also
    for its dtype)."""

    __slots__ = ("ptr", "dtype")

    def __init__(self, ptr: int, dtype):
        self.ptr, self.dtype = ptr, dtype

    def data_ptr(self) -> int:
        return self.ptr


def detached(value):
    """A launch argument as a cached plan keeps it: tensors as addresses, Gluon TMA descriptors
    rebuilt over an ``Address``, anything else as is."""
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    if isinstance(value, torch.Tensor):
        return value.data_ptr()
    if isinstance(value, TensorDescriptor):
        return TensorDescriptor(Address(value.base.data_ptr(), value.base.dtype), value.shape, value.strides,
                                value.block_shape, value.layout, padding=value.padding)
    return value


def args_key(grid, args, constexprs: dict) -> tuple:
    """A key naming everything a launch passes: tensors by address and dtype, TMA descriptors by
    their base, shape, strides, box, layout and padding, other values by type and value (Triton
    specializes 1 and multiples of 16, so the value decides the binary too)."""
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    def one(value):
        if isinstance(value, torch.Tensor):
            return ("t", value.data_ptr(), value.dtype)
        if isinstance(value, TensorDescriptor):
            return ("d", value.base.data_ptr(), value.base.dtype, tuple(value.shape), tuple(value.strides),
                    tuple(value.block_shape), value.layout, value.padding)
        return (type(value), value)

    return (tuple(grid), tuple(one(a) for a in args), tuple(sorted(constexprs.items())))


class CachedLaunch:
    """A compiled kernel with every parameter in signature order (what the JIT passes after
    binding; tensors as addresses, so the cache keeps no tensor alive), launched on the current
    stream of its device. ``replace=((i, value), ...)`` swaps parameter i for one call (per-call
    buffers); ``stream=`` passes the current stream when the caller has it.

    With FLAT_LAUNCH, where ``flat_launch`` can (Triton 3.6, no scratch), the launch is one call
    of Triton's C launcher with the arguments flattened once, TMA descriptors encoded once:
    Triton's own path re-encodes every descriptor on every call (``fill_tma_descriptor``) and
    rebuilds the argument list in Python. The plan's key names every descriptor's base, shape
    and box, so its encoding stays valid for as long as the plan is replayed. With a launch hook
    set (a profiler) it goes through ``run_compiled``, which calls the hooks."""

    __slots__ = ("compiled", "grid", "args", "index", "flat")

    def __init__(self, compiled, arg_names, args, constexprs: dict, grid, index: int):
        values = dict(zip(arg_names, args))
        values.update(constexprs)
        self.args = [detached(values[name]) for name in arg_names]
        self.compiled, self.grid, self.index = compiled, tuple((*grid, 1, 1)[:3]), index
        self.flat = flat_launch(compiled, self.args) if FLAT_LAUNCH else None

    def __call__(self, stream=None, replace=()) -> None:
        if stream is None:
            stream = current_stream(self.index)
        flat = self.flat
        if flat is not None and not hooks_active():
            args = flat.args
            if replace:
                args = list(args)
                for i, value in replace:
                    args[flat.at[i]] = value
            grid, d = self.grid, flat.direct
            d.launch(grid[0], grid[1], grid[2], stream, d.function, d.coop, d.pdl, None, None, d.meta,
                     None, None, None, *args)
            return
        args = self.args
        if replace:
            args = list(args)
            for i, value in replace:
                args[i] = value
        run_compiled(self.compiled, self.grid, stream, args)


# Off: no measured gain. The GEMM GPU tests pass with it on (session 20, 565 passed), but host time of
# an eager MXFP8 F.scaled_mm of 32x4096x4096 (scripts/mx_decode_probe.py --host-profile, on and off
# alternating in one device call, two rounds) was 66.5 and 74.4 us a call with it against 52.6 and
# 63.8 without. Under cProfile it halves the time spent launching (59 against 104 ms over 2000
# calls), so whatever it saves is below the host's run-to-run noise.
# TILEFLY_FLAT_LAUNCH=1 turns it on; False sends every CachedLaunch through run_compiled (Triton's
# own launch path).
FLAT_LAUNCH = os.environ.get("TILEFLY_FLAT_LAUNCH") == "1"


class Flat:
    """A kernel's arguments as Triton 3.6's C launcher takes them: ``args`` flattened (each TMA
    descriptor as its encoded tensor map, shape and strides), ``at[i]`` where parameter i went,
    and ``direct`` the ``Direct`` of the C launcher itself."""

    __slots__ = ("direct", "args", "at")


def c_launcher(run):
    """Triton 3.6's C launch function behind ``CompiledKernel.run``: ``run.launch`` itself, or,
    for a kernel with TMA descriptor parameters, the ``launcher`` that
    ``wrap_handle_tensordesc``'s wrapper closes over. None where it is not found."""
    launch = getattr(run, "launch", None)
    closure = getattr(launch, "__closure__", None)
    if not closure:
        return launch
    cells = dict(zip(launch.__code__.co_freevars, (cell.cell_contents for cell in closure)))
    return cells.get("launcher")


def flat_launch(compiled, args) -> Flat | None:
    """A ``Flat`` for a ``CompiledKernel`` and its parameters (as ``CachedLaunch`` keeps them), or
    None where ``direct`` would be (another Triton, scratch) or the C launcher is not found."""
    run = _direct_run(compiled)
    launch = None if run is None else c_launcher(run)
    if launch is None:
        return None
    from triton.backends.nvidia import driver
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    descriptor_meta = list(getattr(compiled.metadata, "tensordesc_meta", None) or [])
    flat = Flat()
    flat.args, flat.at = [], []
    for value in args:
        flat.at.append(len(flat.args))
        if isinstance(value, TensorDescriptor):
            if not descriptor_meta:
                return None  # the launcher would want the frontend's decomposition instead
            flat.args.extend(driver.make_tensordesc_arg(value, descriptor_meta.pop(0)))
        else:
            flat.args.append(value)
    flat.direct = _make_direct(compiled, run, launch)
    return flat


def replay_or_keep(plans: dict, key, capturing, max_plans: int, first, *first_args) -> None:
    """The replay cache every cached launch goes through (dense, grouped and MX GEMMs,
    ``launch_cached``): replay ``plans[key]`` unless ``capturing()``, else ``first(*first_args)``
    launches through the JIT and returns the plan to keep for the next call, or None under CUDA
    graph capture (a capture's arguments, its split-K buffers say, belong to its graph) or when
    there is nothing to keep. ``plans`` starts over once it holds ``max_plans`` entries."""
    plan = plans.get(key)
    if plan is not None and not capturing():
        plan()
        return
    plan = first(*first_args)
    if plan is not None:
        if len(plans) >= max_plans:
            plans.clear()
        plans[key] = plan


def capturing() -> bool:
    """Whether the current CUDA stream is being captured (False where torch has no CUDA)."""
    import torch

    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def launch_cached(plans: dict, key: tuple | None, kernel, build, index: int, max_plans: int = 256) -> None:
    """Replay ``plans[key]`` (a ``CachedLaunch`` of an earlier launch), else launch
    ``kernel[grid](*args, **constexprs)`` with ``(grid, args, constexprs) = build()`` through the
    JIT and keep its plan (``replay_or_keep``). ``key`` must name everything the arguments hold
    (addresses, sizes, scalars); None derives it from what ``build()`` returns (``args_key``: safe
    by construction, at the price of building the arguments on every call). A launch that returns
    no compiled kernel (a CPU test's stand-in) is not kept."""
    built = None
    if key is None:
        built = build()
        key = (kernel, *args_key(*built))
    replay_or_keep(plans, key, capturing, max_plans, _jit_launch, kernel, built, build, index)


def _jit_launch(kernel, built, build, index: int) -> "CachedLaunch | None":
    grid, args, constexprs = built or build()
    compiled = kernel[grid](*args, **constexprs)
    if compiled is None or capturing():
        return None
    return CachedLaunch(compiled, kernel.arg_names, args, constexprs, grid, index)


def launch_direct(cache: dict, kernel_of, grid: tuple[int, int], tensors: tuple, ints: tuple, constexprs: dict,
                  num_warps: int, num_stages: int | None = None, launch_pdl: bool = False) -> None:
    """``kernel_of()[grid](*tensors, *ints, **constexprs, num_warps=num_warps)`` for a plain Triton kernel
    whose parameters are exactly ``tensors`` (pointers), then ``ints``, then ``constexprs``, in that
    order. The first call of a specialization (what Triton specializes on: the pointers' dtypes and
    16-byte alignment, integers' 16-byte divisibility and equality to 1, the constexprs) goes through
    the JIT; later calls go straight to Triton's C launcher (``direct``), a few microseconds instead of
    the JIT's tens. Where ``direct`` cannot serve (another Triton, a launch hook, CPU tensors) every
    call takes the JIT."""
    index = tensors[0].get_device()
    ptrs = tuple(t.data_ptr() for t in tensors)
    key = (kernel_of, index, tuple(t.dtype for t in tensors), tuple(p % 16 == 0 for p in ptrs),
           tuple((i % 16 == 0, i == 1) for i in ints),
           tuple(constexprs.items()), num_warps, num_stages, launch_pdl)
    launch = cache.get(key)
    if launch is not None and not hooks_active():
        launch(grid[0], grid[1], current_stream(index), (*ptrs, *ints, *constexprs.values()))
        return
    options = {"num_warps": num_warps} if num_stages is None else {"num_warps": num_warps, "num_stages": num_stages}
    if launch_pdl:   # programmatic dependent launch: the kernel must wait for the one ahead itself
        options["launch_pdl"] = True
    compiled = kernel_of()[grid](*tensors, *ints, **constexprs, **options)
    launch = direct(compiled) if tensors[0].is_cuda else None
    if launch is not None:
        cache[key] = launch


class Direct:
    """One compiled kernel, launched through Triton 3.6's C launch function."""

    __slots__ = ("launch", "function", "meta", "coop", "pdl")

    def __call__(self, grid0: int, grid1: int, stream: int, args: tuple) -> None:
        self.launch(grid0, grid1, 1, stream, self.function, self.coop, self.pdl, None, None,
                    self.meta, None, None, None, *args)


def direct(compiled) -> Direct | None:
    """A ``Direct`` for a ``CompiledKernel`` (its handles loaded), or None where unsupported."""
    run = _direct_run(compiled)
    return None if run is None else _make_direct(compiled, run, run.launch)


def _direct_run(compiled):
    """``compiled.run`` (loading the module and building the launcher on first access) where its
    C launcher may be called directly: Triton 3.6, a ``CompiledKernel`` (not the interpreter's
    launches), no global or profile scratch. None elsewhere."""
    import triton

    if not triton.__version__.startswith("3.6.") or not hasattr(compiled, "packed_metadata"):
        return None
    run = compiled.run
    if getattr(run, "launch", None) is None or getattr(run, "global_scratch_size", 1) or \
            getattr(run, "profile_scratch_size", 1):
        return None
    return run


def _make_direct(compiled, run, launch) -> Direct:
    d = Direct()
    d.launch, d.function, d.meta = launch, compiled.function, compiled.packed_metadata
    d.coop, d.pdl = getattr(run, "launch_cooperative_grid", False), getattr(run, "launch_pdl", False)
    return d

"""Triton's interpreter with one thread per program, for kernels whose programs wait on each
other (``rms_norm_segments_kernel``). Interpreter runs only (TRITON_INTERPRET=1, CPU tensors).

The interpreter runs a launch's programs one after another, so a program that spins until
another one arrives never returns. Inside ``concurrent_programs()`` every program of a launch
starts in its own thread as the interpreter reaches it, the last one joins them all, and
``tl.program_id`` reads the calling thread's index. Python threads interleave at the
interpreter's op granularity with sequentially consistent memory: this checks a protocol's
logic (who waits for whom, which slots are read), not the GPU memory model.

Not re-entrant across threads: one interpreter launch at a time, as the interpreter itself.
"""
from __future__ import annotations

import contextlib
import inspect
import sys
import threading

JOIN_TIMEOUT_S = 300.0   # a launch whose programs are still running after this is stuck
_active = False


@contextlib.contextmanager
def concurrent_programs():
    global _active
    if _active:
        yield
        return
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    builder_type = type(builder)
    per_thread = threading.local()
    sequential_executor = interpreter.GridExecutor

    def executor(fn, *args, **kwargs):  # a launch (device-function calls do not come here)
        return sequential_executor(_ProgramStarter(fn, builder, per_thread), *args, **kwargs)

    builder_type.grid_idx = property(lambda self: getattr(per_thread, "grid_idx", None),
                                     lambda self, value: setattr(per_thread, "grid_idx", value))
    interpreter.GridExecutor = executor
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)   # spinning programs hand the GIL over sooner
    _active = True
    try:
        yield
    finally:
        _active = False
        sys.setswitchinterval(switch)
        interpreter.GridExecutor = sequential_executor
        del builder_type.grid_idx


class _ProgramStarter:
    """Stands in for a rewritten kernel in the interpreter's program loop: each call starts the
    program in a thread; the call for the last program joins them all. The interpreter inspects
    what it calls (signature, annotations, ``__globals__`` for triton.language): the kernel's."""

    def __init__(self, program, builder, per_thread):
        self.program, self.builder, self.per_thread = program, builder, per_thread
        self.threads, self.errors = [], []
        self.__signature__ = inspect.signature(program)
        for name in ("__globals__", "__annotations__", "__name__", "__qualname__", "__module__"):
            setattr(self, name, getattr(program, name))

    def __call__(self, **args):
        index = self.builder.grid_idx          # set by the interpreter's loop, in this thread
        thread = threading.Thread(target=self._run, args=(index, args), name=f"triton-program-{index}",
                                  daemon=True)
        self.threads.append(thread)
        thread.start()
        if index == tuple(n - 1 for n in self.builder.grid_dim):
            for t in self.threads:
                t.join(JOIN_TIMEOUT_S)
                if t.is_alive():
                    raise TimeoutError(f"{t.name} still running after {JOIN_TIMEOUT_S} s: programs deadlocked?")
            if self.errors:
                raise self.errors[0]

    def _run(self, index, args):
        self.per_thread.grid_idx = index
        try:
            self.program(**args)
        except BaseException as exc:  # noqa: BLE001 - re-raised by the joining call
            self.errors.append(exc)

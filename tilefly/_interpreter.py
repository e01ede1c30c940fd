"""Support for running plain-Triton kernels under TRITON_INTERPRET=1 (CPU checks only).

``run_checks`` runs families' ``configs.interpreter_checks()`` in a child process: TRITON_INTERPRET
must be set before kernels are defined, so it cannot be switched on inside a process that already
imported them. The child prints ``ok   <family>.<check>`` or ``FAIL <family>.<check>: ...`` a line,
then a count, and exits non-zero when a check failed.
"""
from __future__ import annotations

import os
import subprocess
import sys


def numpy_compat() -> None:
    """triton 3.6's interpreter turns loop bounds into ints with int() of a 1-element array,
    which NumPy >= 2.4 rejects; convert through the element instead (interpreter runs only)."""
    import numpy as np

    try:
        int(np.ones(1))
        return
    except TypeError:
        pass
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "tilefly_compat", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched.tilefly_compat = True
    interpreter._patch_lang_tensor = patched


def run_checks(families: list[str] | None = None, timeout: float | None = None) -> subprocess.CompletedProcess:
    """Run the interpreter checks of ``families`` (names of tilefly.ops.FAMILIES; None: all) in a
    child process; returns the finished process (stdout holds the report)."""
    code = "import sys; from tilefly._interpreter import _child_main; sys.exit(_child_main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *(families or [])], env=dict(os.environ, TRITON_INTERPRET="1"),
                          capture_output=True, text=True, timeout=timeout)


def _child_main(families: list[str]) -> int:
    import importlib

    from tilefly import ops

    numpy_compat()
    failures = count = 0
    for name, family in ops.FAMILIES.items():
        if families and name not in families:
            continue
        try:
            configs = importlib.import_module(f"{family.module}.configs")
        except ModuleNotFoundError:
            continue
        for check_name, fn in getattr(configs, "interpreter_checks", lambda: [])():
            count += 1
            try:
                fn()
                print(f"ok   {name}.{check_name}", flush=True)
            except Exception as exc:  # noqa: BLE001 - every check reports
                failures += 1
                print(f"FAIL {name}.{check_name}: {type(exc).__name__}: {exc}", flush=True)
    print(f"{count - failures} of {count} interpreter checks passed")
    return 1 if failures else 0

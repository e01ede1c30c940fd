"""Every top-k kernel and branch under the Triton interpreter on CPU (configs.interpreter_checks),
in a child process because TRITON_INTERPRET must be set before the kernels are defined."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

_CHILD = """
import sys
from tilefly.ops.topk import configs
failed = 0
for name, fn in configs.interpreter_checks():
    try:
        fn()
        print("ok", name)
    except Exception as exc:
        failed += 1
        print("FAIL", name, type(exc).__name__, exc)
sys.exit(1 if failed else 0)
"""


def test_interpreter_checks_pass():
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("ok ") >= 10, proc.stdout

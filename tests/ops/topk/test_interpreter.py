"""Every top-k kernel and branch under the Triton interpreter on CPU (configs.interpreter_checks),
in a child process because TRITON_INTERPRET must be set before the kernels are defined."""
import pytest

from tilefly._interpreter import run_checks

pytest.importorskip("triton")


def test_interpreter_checks_pass():
    proc = run_checks(["topk"], timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("ok ") >= 10, proc.stdout

"""Fixtures of the MX GEMM tests."""
import pytest


@pytest.fixture
def launch_cpu(monkeypatch):
    """tilefly.ops.mx_gemm.launch with a 132-SM device assumed, so plans build without a GPU."""
    from tilefly import _device
    from tilefly.ops.mx_gemm import launch

    monkeypatch.setattr(_device, "sm_count", lambda t: 132)
    return launch

"""Fixtures of the tilefly.mx CPU tests."""
import pytest
import torch

import tilefly
from tilefly import config
from tilefly.mx import formats, linear
from tilefly.mx.layout import from_blocked
from tilefly.mx.quant import dequantize_rows


class ReferenceScaledMM:
    """F.scaled_mm's MX call (linear._scaled_mm's arguments) in float64; ``calls`` counts GEMMs."""

    def __init__(self):
        self.calls = 0

    def __call__(self, a, b, scale_a, scale_b, swizzle, bias, out_dtype):
        self.calls += 1
        spec = formats.ELEMENTS["mxfp4" if a.dtype == torch.float4_e2m1fn_x2 else "mxfp8"]
        w = b.t()
        sa, sw = scale_a.view(torch.uint8), scale_b.view(torch.uint8)
        if swizzle == "32_4_4":
            k_blocks = a.shape[1] * spec.per_byte // formats.BLOCK
            sa, sw = from_blocked(sa, a.shape[0], k_blocks), from_blocked(sw, w.shape[0], k_blocks)
        out = dequantize_rows(a, sa, spec, torch.float64) @ dequantize_rows(w, sw, spec, torch.float64).t()
        return (out if bias is None else out + bias.double()).to(out_dtype)


@pytest.fixture
def reference(monkeypatch):
    """ATen has no MX GEMM on CPU: MXLinear's F.scaled_mm call becomes ``ReferenceScaledMM``."""
    ref = ReferenceScaledMM()
    monkeypatch.setattr(linear, "_scaled_mm", ref)
    return ref


@pytest.fixture
def compile_fused(monkeypatch):
    """``run(f, *args, fused=True)``: ``f`` compiled on ``args`` with tilefly enabled and
    ``config.mx_fused_quant`` set to ``fused``; returns (outputs, Inductor's code)."""
    from torch._inductor.utils import run_and_get_code

    def run(f, *args, fused=True):
        monkeypatch.setattr(config, "mx_fused_quant", fused)
        with tilefly.enabled(), torch.no_grad():
            torch._dynamo.reset()
            out, (code,) = run_and_get_code(torch.compile(f), *args)
        return out, code
    return run

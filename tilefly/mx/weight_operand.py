"""MXLinear's word to tilefly's MX GEMM about the F.scaled_mm call it is making: operand B is the
layer's quantized weight, which no kernel writes while the model runs, and operand A was quantized
just before (by a tilefly kernel that lets dependents launch early, or after a kernel that finished).

With ``config.mx_pdl``, a decode GEMM given that word streams B's first ring slots in before it waits
for the kernel ahead (kernels_v2's ``PREFETCH_X``, set by ops/mx_gemm/launch.py), so the weight reads
overlap the activation's quantization. Without the word (any other caller of F.scaled_mm, whose B the
kernel ahead may be writing) the GEMM reads nothing before that wait.
"""
from __future__ import annotations

import threading

_local = threading.local()


def constant() -> bool:
    """Whether the F.scaled_mm call now being served runs on an MXLinear's weight."""
    return getattr(_local, "constant", False)


def call_on_constant_weight(fn, *args):
    """``fn(*args)`` with ``constant()`` true inside (restored after, nested calls included)."""
    before = constant()
    _local.constant = True
    try:
        return fn(*args)
    finally:
        _local.constant = before

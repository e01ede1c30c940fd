"""Host time of the MX predicate (``eligibility.scaled_mm_v2_plan``) per call, CPU only: the
device check answers "sm_90" and CPU tensors take the CUDA path, once with every verdict
computed afresh and once with verdicts kept per call metadata (what CUDA calls get). MXFP8
32 x 4096 x 4096, NO_SWIZZLE scales, best of 5 loops of 20000 calls.

    python scripts/mx_predicate_host.py
"""
import time

import torch

from tilefly import _device, mx
from tilefly.ops.mx_gemm import eligibility


def per_call_us(args, loops: int = 5, calls: int = 20000) -> float:
    plan = eligibility.scaled_mm_v2_plan
    for _ in range(1000):
        plan(*args)
    best = float("inf")
    for _ in range(loops):
        start = time.perf_counter()
        for _ in range(calls):
            plan(*args)
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def main() -> None:
    _device.hopper_reason = lambda t: None
    g = torch.Generator().manual_seed(0)
    a, sa = mx.quantize(torch.randn(32, 4096, generator=g), "mxfp8", swizzle="none")
    b, sb = mx.quantize(torch.randn(4096, 4096, generator=g), "mxfp8", swizzle="none")
    mx_recipe = [eligibility.BLOCKWISE_1X32]
    args = (a, b.t(), [sa], mx_recipe, [], [sb], mx_recipe, [], None, torch.bfloat16)
    for label, keeps in (("computed", False), ("kept", True)):
        eligibility._keeps_plans = lambda t, keeps=keeps: keeps
        eligibility._plans.clear()
        print(f"scaled_mm_v2_plan, verdict {label}: {per_call_us(args):.2f} us/call")


if __name__ == "__main__":
    main()

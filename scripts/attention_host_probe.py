"""Host cost of SDPA with tilefly's attention routing, and the kernels each path launches.

For each shape: host microseconds per call (forward, and forward+backward through autograd) with
tilefly disabled, with a bare pass-through Python kernel on the cuDNN ops (what any Python override
costs, routing logic aside), and with tilefly enabled, timed on the host clock over short batches with the device
synchronized around them (as router_overhead.py does), so the figure is what the Python side and
launches cost, not the kernels. Then the CUDA kernels one forward+backward launches in each mode
(torch.profiler), which shows whether a fallback reaches the same kernels.

    python scripts/attention_host_probe.py [--db FILE] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

import tilefly

SHAPES = ((8, 8, 1024, 32, False), (16, 16, 1024, 64, True), (1, 1, 128, 64, False))


def per_call_us(fn, calls: int = 50, batches: int = 21) -> float:
    for _ in range(5):
        fn()
    samples = []
    for _ in range(batches):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    return statistics.median(samples)


def kernels(fn) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [f"{e.key[:90]} x{e.count} {e.device_time_total:.0f}us" for e in prof.key_averages()
            if e.device_time_total > 0]


def passthrough() -> list:
    """Python kernels on the cuDNN forward and backward ops that only call the captured originals."""
    import warnings

    libs = []
    for op in ("_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward"):
        original = torch.library.get_kernel(f"aten::{op}", "CUDA")

        def handler(keyset, *args, original=original, **kwargs):
            return original.call_boxed(keyset, *args, **kwargs)

        lib = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            lib.impl(op, handler, "CUDA", with_keyset=True, allow_override=True)
        libs.append(lib)
    return libs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json")
    args = p.parse_args()
    report = []
    for b, h, s, d, causal in SHAPES:
        q, k, v, dout = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))

        def fwd():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        def fwd_bwd():
            out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
            return torch.autograd.grad(out, (qg, kg, vg), dout)

        row = {"shape": [b, h, s, d, causal]}
        for mode in ("disabled", "passthrough", "enabled"):
            libs = passthrough() if mode == "passthrough" else []
            if mode == "enabled":
                tilefly.enable(["attention"])
            row[mode] = {"fwd_host_us": per_call_us(fwd), "fwd_bwd_host_us": per_call_us(fwd_bwd),
                         "fwd_bwd_kernels": kernels(fwd_bwd)}
            for lib in libs:
                lib._destroy()
            if mode == "enabled":
                row[mode]["explain"] = str(tilefly.explain(fwd_bwd))[:600]
                tilefly.disable()
        report.append(row)
        print(f"{row['shape']}: host us/call fwd " + " / ".join(
            f"{m} {row[m]['fwd_host_us']:.1f}" for m in ("disabled", "passthrough", "enabled")) + "; fwd+bwd " +
            " / ".join(f"{m} {row[m]['fwd_bwd_host_us']:.1f}" for m in ("disabled", "passthrough", "enabled")))
        for mode in ("disabled", "enabled"):
            print(f"  {mode} kernels:")
            for line in row[mode]["fwd_bwd_kernels"]:
                print(f"    {line}")
        print(f"  explain: {row['enabled']['explain']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()

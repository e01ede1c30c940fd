"""Host time the eager router adds per call, fallback path and served path.

A stand-in family routes ``aten::topk`` on the given dispatch key: its served
implementation calls ATen's captured kernel directly, so 'served' minus 'ATen'
is the router's own cost (predicate + handler + one extra Python frame), and
'fallback' minus 'ATen' is what an ineligible call pays. Each figure is the
median over batches of back-to-back calls on a tiny input, timed on the host
clock only: the device is synchronized before each batch and after the clock
stops, and batches are short enough (200 calls) that the launch queue never
fills, so device time stays out of the figure.

With ``--ops`` (CUDA) it also times the real served paths the same way: each
family's op on a small input with tilefly disabled (ATen) and enabled (router,
predicate, wrapper and kernel launch), so the figure is the host cost a user's
eager call pays.

    python scripts/router_overhead.py [--device cuda|cpu] [--ops] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from tilefly import _dispatch


def _per_call_us(fn, calls: int, batches: int, sync) -> float:
    for _ in range(calls):
        fn()
    samples = []
    for _ in range(batches):
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    sync()
    return statistics.median(samples)


def measure(device: str, calls: int = 200, batches: int = 51) -> dict[str, float]:
    key = "CUDA" if device == "cuda" else "CPU"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    original = torch.library.get_kernel("aten::topk", key)
    keyset = torch._C.DispatchKeySet(key)

    def predicate(x, k, dim=-1, largest=True, sorted=True):
        return None if k == 1 else "stand-in serves k == 1 only"

    def served(x, k, dim=-1, largest=True, sorted=True):
        return original.call_boxed(keyset, x, k, dim, largest, sorted)

    x = torch.randn(4, 64, device=device)
    result = {"aten_us": _per_call_us(lambda: torch.topk(x, 1), calls, batches, sync)}
    _dispatch.register(_dispatch.Impl("overhead_probe", "aten::topk", "probe", predicate, served, dispatch_key=key))
    _dispatch.install(["overhead_probe"])
    try:
        result["served_us"] = _per_call_us(lambda: torch.topk(x, 1), calls, batches, sync)
        result["fallback_us"] = _per_call_us(lambda: torch.topk(x, 2), calls, batches, sync)
    finally:
        _dispatch.uninstall(["overhead_probe"])
    result["aten_k2_us"] = _per_call_us(lambda: torch.topk(x, 2), calls, batches, sync)
    result["served_added_us"] = result["served_us"] - result["aten_us"]
    result["fallback_added_us"] = result["fallback_us"] - result["aten_k2_us"]
    return result


def op_costs(calls: int = 200, batches: int = 31) -> dict[str, dict[str, float]]:
    """Host µs per call of each served family op, ATen vs tilefly, on inputs tilefly serves."""
    import tilefly
    import torch.nn.functional as F

    sync = torch.cuda.synchronize
    x_norm = torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16)
    w_norm = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    x_small = torch.randn(256, 1024, device="cuda")
    x_radix = torch.randn(256, 8192, device="cuda")
    ops = {
        "rms_norm bf16 8x4096": lambda: F.rms_norm(x_norm, (4096,), w_norm, 1e-6),
        "topk fp32 256x1024 k=8": lambda: torch.topk(x_small, 8),
        "topk fp32 256x8192 k=64": lambda: torch.topk(x_radix, 64),
    }
    out = {}
    for name, fn in ops.items():
        aten = _per_call_us(fn, calls, batches, sync)
        with tilefly.enabled(["rms_norm", "topk"]):
            report = tilefly.explain(fn)
            served = _per_call_us(fn, calls, batches, sync)
        out[name] = {"aten_us": aten, "tilefly_us": served, "served": bool(report.served)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--ops", action="store_true", help="also time the real served ops (CUDA)")
    parser.add_argument("--json")
    args = parser.parse_args()
    result = measure(args.device)
    result["device"] = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    result["torch"] = torch.__version__
    print(f"router overhead on {result['device']} (torch {result['torch']}), host µs per call:")
    print(f"  ATen topk                 {result['aten_us']:6.2f}")
    print(f"  served (router + wrapper) {result['served_us']:6.2f}  (+{result['served_added_us']:.2f})")
    print(f"  fallback (router, ATen)   {result['fallback_us']:6.2f}  (+{result['fallback_added_us']:.2f})")
    if args.ops:
        result["ops"] = op_costs()
        for name, r in result["ops"].items():
            print(f"  {name:<26} ATen {r['aten_us']:6.2f}  tilefly {r['tilefly_us']:6.2f}"
                  f"{'' if r['served'] else '  (not served!)'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

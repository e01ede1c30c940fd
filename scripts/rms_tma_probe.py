"""Time the TMA-staged RMSNorm kernel (tilefly/ops/rms_norm/tma_rows.py, Gluon) against ATen and
the shipped Triton configs on the rmsnorm suite's rows of 4097-16385, and check it against a
float64 reference first (y poisoned with NaN, so an unwritten element fails).

    python scripts/rms_tma_probe.py [--case fp32,2048,16385 ...] [--json out.json]

Descriptors are built once per case and variant (kernel time, not host cost: the timing is CUDA
events around each launch with L2 flushed before it, FULL policy).
"""
from __future__ import annotations

import argparse
import json
import math

import torch

from tilefly.bench.timing import FULL, measure
from tilefly.ops.rms_norm import configs, launcher

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
CASES = ["fp32,2048,16385", "fp32,2048,16384", "fp16,2048,16385", "bf16,2048,16385", "fp16,2048,16384",
         "fp16,4096,8193", "fp32,4096,8193", "fp16,8192,4097", "fp32,8192,4097", "fp32,2048,32769",
         "fp16,8192,4096", "fp32,8192,4096"]


def tma_launcher(x, w, y, rstd, eps, chunk, warps, view2d):
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from tilefly.gluon.layouts import gl_dtype
    from tilefly.ops.rms_norm import tma_rows

    M, N = x.shape
    box = tma_rows.BOX
    el = gl_dtype(x.dtype)
    flat = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=el.primitive_bitwidth, rank=1)
    slab = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=el.primitive_bitwidth, rank=2)
    xf, yf = x.view(-1), y.view(-1)
    x_desc = TensorDescriptor(xf, [M * N], [1], [box], flat)
    y_desc = TensorDescriptor(yf, [M * N], [1], [box], flat)
    # Rows of BOX elements BOX apart, each 2 * BOX long: overlapping, so a [CHUNK, BOX] box at
    # (f // BOX, f % BOX) is the CHUNK * BOX elements from flat index f. view_rows keeps every
    # addressable element inside the tensor.
    view_rows = max((M * N - 2 * box) // box + 1, 1)
    xv = TensorDescriptor(xf, [view_rows, 2 * box], [box, 1], [chunk, box], slab)
    yv = TensorDescriptor(yf, [view_rows, 2 * box], [box, 1], [chunk, box], slab)
    boxes = -(-N // box)

    def run():
        tma_rows.rms_norm_tma_kernel[(M,)](x_desc, y_desc, xv, yv, w, y, rstd, N, view_rows if view2d else 0, eps,
                                           BOXES=boxes, CHUNK=chunk, HAS_W=True, VIEW2D=view2d, num_warps=warps)
    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", action="append")
    parser.add_argument("--json")
    args = parser.parse_args()
    rows = []
    for case in args.case or CASES:
        dtype, M, N = case.split(",")
        M, N = int(M), int(N)
        gen = torch.Generator(device="cuda").manual_seed(M + N)
        x = torch.randn(M, N, device="cuda", generator=gen).to(DTYPES[dtype])
        x[0, 5], x[1, N - 1] = float("nan"), float("inf")
        w = (torch.rand(N, device="cuda", generator=gen) + 0.5).to(x.dtype)
        ref_rstd = torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6)
        ref = (x.double() * ref_rstd * w.double())
        size = x.element_size()
        gbytes = (2 * M * N + N) * size / 1e9
        result = {"case": case}
        aten = lambda: torch.ops.aten._fused_rms_norm(x, [N], w, 1e-6)  # noqa: E731
        result["aten"] = measure(aten, FULL).median_us
        y, rstd = torch.empty_like(x), torch.empty(M, 1, device="cuda")
        shipped = lambda: launcher.launch(x, w, y, rstd, 1e-6)  # noqa: E731
        layout = configs.row_layout(N, N, True, size)
        result["shipped " + str(configs.heuristic(N, size, layout))] = measure(shipped, FULL).median_us
        tol = {"fp16": 2e-3, "bf16": 1.6e-2, "fp32": 1e-5}[dtype]
        for view2d in (False, True):
            for chunk in (4, 8, 16):
                for warps in (4, 8):
                    if chunk * 256 // (32 * warps) > 32 or chunk * 256 // (32 * warps) < 4:
                        continue
                    label = f"tma[chunk={chunk},w={warps}{',view2d' if view2d else ''}]"
                    y.fill_(float("nan"))
                    rstd.fill_(float("nan"))
                    try:
                        run = tma_launcher(x, w, y, rstd, 1e-6, chunk, warps, view2d)
                        run()
                        torch.cuda.synchronize()
                        torch.testing.assert_close(rstd.double(), ref_rstd, rtol=1e-5, atol=0, equal_nan=True)
                        torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol, equal_nan=True)
                        result[label] = measure(run, FULL).median_us
                    except Exception as exc:  # noqa: BLE001 - report and go on
                        result[label] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        best = min((v for k, v in result.items() if k.startswith("tma") and isinstance(v, float)), default=math.nan)
        print(f"{case:18} aten {result['aten']:7.1f}  " + "  ".join(
            f"{k} {v:.1f} ({gbytes / v * 1e3:.2f} TB/s)" if isinstance(v, float) else f"{k} {v}"
            for k, v in result.items() if k not in ("case", "aten")), flush=True)
        print(f"{'':18} best tma {best:.1f} us = {gbytes / best * 1e3:.2f} TB/s", flush=True)
        rows.append(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

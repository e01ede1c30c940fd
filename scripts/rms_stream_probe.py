"""Time the persistent streaming RMSNorm (tilefly/ops/rms_norm/stream_rows.py, Gluon, not routed) against
ATen and the shipped Triton configs on the suite's long 16-bit rows, after checking it against a float64
reference (y and rstd poisoned with NaN first, a NaN and an Inf planted in two rows).

    python scripts/rms_stream_probe.py [--case fp16,2048,16385 ...] [--json out.json]
    python scripts/rms_stream_probe.py --compile      # CPU: compile every variant for sm_90a, print registers

Variants: CHUNK boxes a step (8, 16), STAGES ring slots (2, 3), warps (4, 8), programs an SM (2, 3)
where shared memory allows. Kernel time only (CUDA events, L2 flushed, tilefly.bench.timing.FULL).
"""
from __future__ import annotations

import argparse
import itertools
import json

CASES = ["fp16,2048,16385", "bf16,2048,16385", "fp16,2048,16384", "fp16,4096,8193", "fp16,8192,4097",
         "bf16,4096,8192"]
SMEM = 232448
VARIANTS = [dict(chunk=c, stages=s, warps=w, per_sm=p)
            for c, s, w, p in itertools.product((8, 16), (2, 3), (4, 8), (2, 3))]


def boxes(n: int) -> int:
    """TMA boxes of a row window: N elements plus up to 7 before the row, in boxes of 256."""
    return -(-(n + 7) // 256)


def smem_bytes(n: int, chunk: int, stages: int) -> int:
    pad = -(-boxes(n) // chunk) * chunk
    return stages * pad * 256 * 2 + 64


def fits(n: int, v: dict) -> bool:
    return smem_bytes(n, v["chunk"], v["stages"]) * v["per_sm"] <= SMEM - 1024 * v["per_sm"]


def compile_all() -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    from tilefly import compile_check
    from tilefly.ops.rms_norm import stream_rows

    flat = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=1)
    for dtype in ("fp16", "bf16"):
        for n in (16385, 4097):
            for v in VARIANTS:
                if not fits(n, v) or v["per_sm"] == 3:
                    continue
                slab = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)
                sig = {"x_desc": f"tensordesc<{dtype}[256],{flat!r}>",
                       "xv_desc": f"tensordesc<{dtype}[{v['chunk']}, 256],{slab!r}>", "view_rows": "i32", "x_ptr": f"*{dtype}", "w_ptr": f"*{dtype}", "ws_ptr": f"*{dtype}",
                       "y_ptr": f"*{dtype}", "rstd_ptr": "*fp32", "M": "i32", "N": "i32", "eps": "fp32"}
                consts = dict(BOXES=boxes(n), CHUNK=v["chunk"], STAGES=v["stages"], HAS_W=True)
                sig.update({k: "constexpr" for k in consts})
                src = GluonASTSource(stream_rows.rms_norm_stream_kernel, sig, constexprs=consts,
                                     attrs={(i,): [["tt.divisibility", 16]] for i in (3, 4, 5, 6, 7)})
                k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": v["warps"]})
                usage = compile_check._cuobjdump(k.asm["cubin"], "-res-usage")
                code = compile_check._cuobjdump(k.asm["cubin"], "-sass")
                print(f"{dtype} N={n} {v}: {compile_check._RES.search(usage).group(0)} smem {k.metadata.shared}, "
                      f"STG.E.128 {code.count('STG.E.128')}, LDG.E.128 {code.count('LDG.E.128')}, UTMALDG {code.count('UTMALDG')}", flush=True)


def launcher(x, w, y, rstd, eps, v: dict):
    import torch
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from tilefly.ops.rms_norm import kernels, stream_rows

    M, N = x.shape
    flat = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=1)
    box = stream_rows.BOX
    slab = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)
    desc = TensorDescriptor(x.view(-1), [M * N], [1], [box], flat)
    # rows of 2 * BOX elements BOX apart: a [CHUNK, BOX] box at (f // BOX, f % BOX) is the CHUNK * BOX
    # elements from flat index f; view_rows keeps every addressable element inside x
    view_rows = max((M * N - 2 * box) // box + 1, 1)
    view = TensorDescriptor(x.view(-1), [view_rows, 2 * box], [box, 1], [v["chunk"], box], slab)
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    grid = min(M, sms * v["per_sm"])
    if grid < M:
        grid = grid // 8 * 8   # every row of a program at the same 16-byte phase
    rstd_flat = rstd.view(-1)
    np_ = -(-N // 8) * 8
    shifted = torch.empty(8 * np_, dtype=w.dtype, device=w.device)

    def run():
        # w's shifted copies, per call as the shipped W_SHIFT configs write them
        kernels.rms_norm_shift_weight_kernel[(-(-np_ // 256),)](w, shifted, N, BLOCK=256, V=8, PDL=False, num_warps=4)
        stream_rows.rms_norm_stream_kernel[(grid,)](desc, view, view_rows, x, w, shifted, y, rstd_flat, M, N, eps, BOXES=boxes(N),
                                                    CHUNK=v["chunk"], STAGES=v["stages"], HAS_W=True,
                                                    num_warps=v["warps"])
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append")
    parser.add_argument("--json")
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()
    if args.compile:
        compile_all()
        return
    import torch

    from tilefly.bench.timing import FULL, measure
    from tilefly.ops.rms_norm import configs, launcher as shipped_launcher

    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16}
    rows = []
    for case in args.case or CASES:
        dtype, M, N = case.split(",")
        M, N = int(M), int(N)
        gen = torch.Generator(device="cuda").manual_seed(M + N)
        x = torch.randn(M, N, device="cuda", generator=gen).to(dtypes[dtype])
        x[3, 5], x[M - 2, N - 1] = float("nan"), float("inf")
        w = (torch.rand(N, device="cuda", generator=gen) + 0.5).to(x.dtype)
        ref_rstd = torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6)
        ref = x.double() * ref_rstd * w.double()
        tb = (2 * M * N + N) * x.element_size() / 1e6
        result = {"case": case, "aten": measure(lambda: torch.ops.aten._fused_rms_norm(x, [N], w, 1e-6), FULL).median_us}
        y, rstd = torch.empty_like(x), torch.empty(M, 1, device="cuda")
        layout = configs.row_layout(N, N, True, x.element_size())
        result["shipped"] = measure(lambda: shipped_launcher.launch(x, w, y, rstd, 1e-6), FULL).median_us
        result["shipped_config"] = str(configs.heuristic(N, x.element_size(), layout))
        tol = {"fp16": 2e-3, "bf16": 1.6e-2}[dtype]
        for v in VARIANTS:
            if not fits(N, v):
                continue
            label = "stream[chunk={chunk},stages={stages},w={warps},per_sm={per_sm}]".format(**v)
            y.fill_(float("nan"))
            rstd.fill_(float("nan"))
            try:
                run = launcher(x, w, y, rstd, 1e-6, v)
                run()
                torch.cuda.synchronize()
                torch.testing.assert_close(rstd.double(), ref_rstd, rtol=1e-5, atol=0, equal_nan=True)
                torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol, equal_nan=True)
                result[label] = measure(run, FULL).median_us
            except Exception as exc:  # noqa: BLE001 - report and go on
                result[label] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        timed = {k: t for k, t in result.items() if k.startswith("stream") and isinstance(t, float)}
        best = min(timed, key=timed.get, default=None)
        print(f"{case:16} aten {result['aten']:6.1f}  shipped {result['shipped']:6.1f} ({tb / result['shipped']:.2f} TB/s)"
              + (f"  best stream {timed[best]:6.1f} ({tb / timed[best]:.2f} TB/s) {best}" if best else ""), flush=True)
        for k, t in result.items():
            if k.startswith("stream"):
                print(f"    {k:48} " + (f"{t:7.1f} us {tb / t:.2f} TB/s" if isinstance(t, float) else t), flush=True)
        rows.append(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

"""Launch shapes of the fused MX quantization kernels on decode rows: which warps (and chunk) are fastest?

A Llama-3.1-8B MXFP4 decode step at 32 requests runs ``tilefly::add_rms_norm_mx_quantize`` 63 times at
3.25 µs and ``tilefly::silu_mul_mx_quantize`` 32 times at 2.83 µs (BENCHMARKS.md session 39): 296 µs of a
4717 µs step. The norm kernel takes one program a row, so at 32 rows it runs on 32 SMs, and its
instruction stream per thread shortens with more warps; the SiLU kernel's programs take CHUNK_BLOCKS
scale blocks of a row each.

Per format and token count, each build's µs a call: 32 calls on distinct rows (as a step's layers),
captured in one CUDA graph, the median replay over 32 (``tilefly.bench.timing.graph_us``), and whether
its outputs are bit-identical to the shipped build's.

    python scripts/mx_fused_quant_probe.py [--fmt mxfp4,mxfp8] [--tokens 8,16,32] [--expand] [--json FILE]

``--expand`` (MXFP4) times the builds that also write the expanded copy (tilefly.mx.expanded), as the
post-grad pass runs them where the GEMM reads it (17-32 tokens).
"""
from __future__ import annotations

import argparse
import json

import torch

HIDDEN, INTER, CALLS = 4096, 14336, 32
NORM_WARPS = (4, 8, 16)          # 32 warps lose the 16-byte loads
SILU_SHAPES = ((64, 4), (64, 8), (32, 4), (32, 2), (16, 2), (16, 1))   # (CHUNK_BLOCKS, num_warps)


def time_calls(run, replays: int = 32):
    """``graph_us`` of ``run()`` over CALLS, and the last call's outputs."""
    from tilefly.bench import timing

    outputs = []
    us = timing.graph_us(lambda: outputs.append(run()), replays)
    return us / CALLS, [t.clone() for t in outputs[-1]]


def _against_shipped(rows, outs):
    """Each row's ``same_bits``: its outputs against the shipped build's (the row marked ``shipped``)."""
    reference = next(out for row, out in zip(rows, outs) if row["shipped"])
    for row, out in zip(rows, outs):
        row["same_bits"] = all(torch.equal(x, y) for x, y in zip(out, reference))
    return rows


def norm_rows(fmt: str, tokens: int, expand: bool = False):
    from tilefly.mx import formats, norm_quant

    spec = formats.ELEMENTS[fmt]
    ops = [tuple(torch.randn(tokens, HIDDEN, device="cuda", dtype=torch.bfloat16) for _ in range(3))
           for _ in range(CALLS)]

    def run():
        out = None
        for a, b, w in ops:
            out = norm_quant.add_rms_norm_quantize_kernel(a, b, w[0], 1e-5, spec, expand=expand)
        return out

    shipped = norm_quant.num_warps
    rows, outs = [], []
    try:
        for warps in NORM_WARPS:
            norm_quant.num_warps = lambda block_k, w=warps: w
            us, out = time_calls(run)
            outs.append(out)
            rows.append(dict(kernel="add_rms_norm_mx_quantize", fmt=fmt, tokens=tokens, num_warps=warps,
                             expand=expand,
                             shipped=warps == shipped(norm_quant.block_k_of(HIDDEN)), us=us))
    finally:
        norm_quant.num_warps = shipped
    return _against_shipped(rows, outs)


def silu_rows(fmt: str, tokens: int, expand: bool = False):
    from tilefly.mx import formats, silu_quant

    spec = formats.ELEMENTS[fmt]
    packed = [torch.randn(tokens, 2 * INTER, device="cuda", dtype=torch.bfloat16) for _ in range(CALLS)]

    def run():
        out = None
        for p in packed:
            out = silu_quant.silu_mul_quantize_kernel(p[:, :INTER], p[:, INTER:], spec, expand=expand)
        return out

    shipped = (silu_quant.CHUNK_BLOCKS, silu_quant.NUM_WARPS)
    rows, outs = [], []
    try:
        for chunk, warps in SILU_SHAPES:
            silu_quant.CHUNK_BLOCKS, silu_quant.NUM_WARPS = chunk, warps
            us, out = time_calls(run)
            outs.append(out)
            rows.append(dict(kernel="silu_mul_mx_quantize", fmt=fmt, tokens=tokens, chunk_blocks=chunk,
                             expand=expand,
                             num_warps=warps, shipped=(chunk, warps) == shipped, us=us))
    finally:
        silu_quant.CHUNK_BLOCKS, silu_quant.NUM_WARPS = shipped
    return _against_shipped(rows, outs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fmt", default="mxfp4,mxfp8")
    parser.add_argument("--tokens", default="8,16,32")
    parser.add_argument("--expand", action="store_true", help="MXFP4: the builds writing the expanded copy too")
    parser.add_argument("--json")
    args = parser.parse_args()

    rows = []
    with torch.no_grad():
        for fmt in args.fmt.split(","):
            for tokens in (int(t) for t in args.tokens.split(",")):
                expand = args.expand and fmt == "mxfp4"
                for row in norm_rows(fmt, tokens, expand) + silu_rows(fmt, tokens, expand):
                    rows.append(row)
                    shape = (f"warps {row['num_warps']:2d}" if "chunk_blocks" not in row
                             else f"chunk {row['chunk_blocks']:2d} warps {row['num_warps']}")
                    print(f"{row['kernel']:26s} {fmt} {tokens:3d} tokens  {shape:18s} {row['us']:6.2f} µs"
                          f"{'  expanded' if row['expand'] else ''}{'  (shipped)' if row['shipped'] else ''}"
                          f"  same bits: {row['same_bits']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

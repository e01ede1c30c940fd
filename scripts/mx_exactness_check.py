"""Are tilefly's MX builds bit-identical to the stock path (dequantize to BF16, ``torch.mm``)?

The e2e logits check expects MXFP4 sides A and B to agree bit for bit (FP4 products and their
per-block sums are exact in FP32). This times nothing: for each decode shape it runs every offered
build on the same quantized operands and prints, per build, how many output elements differ from the
stock path's BF16 result, the largest difference in units of the float64 reference's max, and whether
a second run gives the same bits.

    python scripts/mx_exactness_check.py [--fmt mxfp4] [--shape 8x6144x4096 ...]
"""
from __future__ import annotations

import argparse

import torch

SHAPES = ("8x6144x4096", "8x4096x4096", "8x28672x4096", "8x4096x14336", "32x4096x14336")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fmt", default="mxfp4")
    ap.add_argument("--shape", action="append")
    args = ap.parse_args()

    import tilefly
    from tilefly.bench import mx_operands
    from tilefly.mx import dequantize
    from tilefly.ops.mx_gemm import configs, eligibility, launch

    tilefly.enable()
    torch.manual_seed(0)
    for shape in args.shape or SHAPES:
        m, n, k = (int(v) for v in shape.split("x"))
        a = mx_operands.quantize(torch.randn(m, k, device="cuda"), args.fmt)
        b = mx_operands.quantize(torch.randn(n, k, device="cuda"), args.fmt)
        a_dq = dequantize(a.data, a.scale, args.fmt).to(torch.bfloat16)
        b_dq = dequantize(b.data, b.scale, args.fmt).to(torch.bfloat16)
        stock = torch.mm(a_dq, b_dq.t())
        exact = torch.mm(a_dq.double(), b_dq.double().t())
        scale = exact.abs().max().item()
        rows, cols = max(m, n), min(m, n)
        print(f"\n{args.fmt} {shape}: stock vs float64 {((stock.double() - exact).abs().max().item() / scale):.2e}; "
              f"pick {configs.pick(rows, cols, k, args.fmt).name}", flush=True)
        p = eligibility.parse(a.data, b.data.t(), a.scale, b.scale, False, False)
        for cfg in [None] + configs.offered(rows, cols, k, args.fmt):
            outs = []
            for _ in range(2):
                out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                launch._plans.clear()
                launch.run(p, a.data, b.data.t(), a.scale, b.scale, out, cfg=cfg)
                outs.append(out)
            torch.cuda.synchronize()
            o = outs[0]
            differ = (o != stock).sum().item()
            err = (o.double() - exact).abs().max().item() / scale
            same = torch.equal(outs[0], outs[1])
            name = "pick" if cfg is None else cfg.name
            print(f"  {name:34s} differs from stock in {differ:7d} of {o.numel()}; vs float64 {err:.2e}; "
                  f"rerun {'same' if same else 'DIFFERENT'}; nan {torch.isnan(o).sum().item()}", flush=True)


if __name__ == "__main__":
    main()

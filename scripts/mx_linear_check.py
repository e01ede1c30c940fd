"""MXLinear's two backends on one layer, eager and compiled with CUDA graphs: where does tilefly's
F.scaled_mm (backend "scaled_mm") leave the stock path's result (backend "dequant")? For the e2e
A/B, whose MXFP8 logits split at the first compiled decode step. Prints max |diff| / max |ref|
against the stock path run eagerly, for tilefly's backend eager and compiled (CUDA graphs) and for the
stock path compiled with max-autotune (the e2e's side A), and how many elements differ at all.

    python scripts/mx_linear_check.py [--tokens 8 2048] [--formats mxfp4]
"""
from __future__ import annotations

import argparse
import copy

import torch
from torch import nn

import tilefly
from tilefly.mx.linear import MXLinear

SHAPES = ((4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336))  # Llama-3.1-8B's (N, K)


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[8, 32, 2048])
    parser.add_argument("--formats", nargs="+", default=["mxfp8", "mxfp4"])
    parser.add_argument("--shapes", nargs="+", default=[f"{n}x{k}" for n, k in SHAPES], help="N x K of each layer")
    parser.add_argument("--swizzle", default="none", help="scale layout (the e2e's default: none)")
    args = parser.parse_args()
    tilefly.enable()
    torch.manual_seed(0)
    for fmt in args.formats:
        for n, k in (tuple(int(v) for v in shape.split("x")) for shape in args.shapes):
            layer = MXLinear.from_linear(nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16), fmt=fmt,
                                         swizzle=args.swizzle)
            stock = copy.deepcopy(layer)
            stock.backend = "dequant"
            compiled = torch.compile(layer, mode="reduce-overhead")
            compiled_stock = torch.compile(stock, mode="max-autotune")   # the e2e's side A
            for m in args.tokens:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                layer.backend = "dequant"
                ref = layer(x)
                layer.backend = "scaled_mm"
                eager = layer(x)
                runs = [compiled(x).clone() for _ in range(3)]  # warm-up, record, replay
                stock_runs = [compiled_stock(x).clone() for _ in range(2)]
                differ = " ".join(str((r != ref).sum().item()) for r in runs + stock_runs)
                print(f"{fmt} M={m:5d} N={n:5d} K={k:5d}  eager {rel(eager, ref):.2e}  "
                      f"compiled {' '.join(f'{rel(r, ref):.2e}' for r in runs)}  "
                      f"stock compiled {' '.join(f'{rel(r, ref):.2e}' for r in stock_runs)}  "
                      f"elements off eager stock: {differ}", flush=True)


if __name__ == "__main__":
    main()

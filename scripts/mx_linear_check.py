"""MXLinear's two backends on one layer, eager and compiled with CUDA graphs: where does tilefly's
F.scaled_mm (backend "scaled_mm") leave the stock path's result (backend "dequant")? For the e2e
A/B, whose MXFP8 logits split at the first compiled decode step. Prints max |diff| / max |ref|.

    python scripts/mx_linear_check.py [--tokens 8 2048]
"""
from __future__ import annotations

import argparse

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
    args = parser.parse_args()
    tilefly.enable()
    torch.manual_seed(0)
    for fmt in ("mxfp8", "mxfp4"):
        for n, k in SHAPES:
            layer = MXLinear.from_linear(nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16), fmt=fmt)
            compiled = torch.compile(layer, mode="reduce-overhead")
            for m in args.tokens:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                layer.backend = "dequant"
                ref = layer(x)
                layer.backend = "scaled_mm"
                eager = layer(x)
                runs = [compiled(x).clone() for _ in range(3)]  # warm-up, record, replay
                print(f"{fmt} M={m:5d} N={n:5d} K={k:5d}  eager {rel(eager, ref):.2e}  "
                      f"compiled {' '.join(f'{rel(r, ref):.2e}' for r in runs)}", flush=True)


if __name__ == "__main__":
    main()

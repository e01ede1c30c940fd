"""Decode GEMMs of a Llama-3.1-8B-shaped model as a CUDA graph replays them: cuBLAS against each
tilefly config Inductor would be offered, weights streaming from DRAM (one weight per layer).

Why: the e2e A/B (BENCHMARKS.md, session 14) measured side B (tilefly candidates) 9 % slower per
decode step at concurrency 8, with tilefly's split-K kernel picked for some GEMMs. Inductor's
autotuning times one candidate on one weight; a decode step runs 32 layers' weights back to
back inside a CUDA graph (each split-K launch capturing its own zeroed tickets). This times that.

    python scripts/decode_gemm_probe.py [--tokens 8] [--layers 32] [--json FILE]
"""
from __future__ import annotations

import argparse
import json

import torch

from tilefly.bench.timing import graph_us
from tilefly.ops.gemm import configs, launch

# (name, N, K) of y = x @ W.T with W [N, K]: Llama-3.1-8B's q, k/v, o, gate/up, down, lm_head
SHAPES = (("q/o", 4096, 4096), ("k/v", 1024, 4096), ("gate/up", 14336, 4096), ("down", 4096, 14336),
          ("lm_head", 128256, 4096))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--json")
    args = p.parse_args()
    torch.manual_seed(0)
    rows = []
    for name, n, k in SHAPES:
        layers = 2 if name == "lm_head" else args.layers
        x = torch.randn(args.tokens, k, device="cuda", dtype=torch.bfloat16)
        weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(layers)]
        outs = [torch.empty(args.tokens, n, device="cuda", dtype=torch.bfloat16) for _ in range(layers)]
        ref = [x @ w.T for w in weights[:1]]

        def cublas():
            for w, o in zip(weights, outs):
                torch.mm(x, w.T, out=o)

        row = {"shape": name, "m": args.tokens, "n": n, "k": k, "layers": layers,
               "cublas_us": graph_us(cublas) / layers}
        for cfg in configs.offered(args.tokens, n, k):
            def tilefly(cfg=cfg):
                for w, o in zip(weights, outs):
                    launch.run(cfg, x, w.T, o)
            try:
                us = graph_us(tilefly) / layers
                torch.testing.assert_close(outs[0], ref[0], rtol=2e-2, atol=2e-2)
                row[cfg.name] = us
            except Exception as exc:  # noqa: BLE001 - a config that fails is a result
                row[cfg.name] = f"error: {type(exc).__name__}: {str(exc)[:120]}"
        rows.append(row)
        gb = n * k * 2 / 1e9
        parts = [f"{key} {val:.1f}" if isinstance(val, float) else f"{key} {val}"
                 for key, val in row.items() if key.endswith("_us") or key.startswith(("splitk", "tile"))]
        print(f"{name:8s} {args.tokens}x{n}x{k} ({gb * 1e3:.0f} MB/weight, cuBLAS "
              f"{gb / row['cublas_us'] * 1e6 / 1e3:.2f} TB/s): " + ", ".join(parts), flush=True)
        del weights, outs
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

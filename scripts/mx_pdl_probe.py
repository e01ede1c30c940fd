"""Does ``config.mx_pdl`` (programmatic dependent launch with the weight prefetch) shorten an MX decode
MLP? The chain a compiled Llama-3.1-8B layer runs with ``mx_fused_quant``, ``--layers`` times with
distinct weights, captured in one CUDA graph, timed with and without PDL.

Per layer: ``tilefly::add_rms_norm_mx_quantize`` (residual add, RMSNorm, quantization) -> the packed
gate/up GEMM (``tilefly::mx_linear_mm``, 4096 -> 2 x 14336) -> ``tilefly::silu_mul_mx_quantize`` on its
two halves -> the down GEMM (14336 -> 4096). The ops are the ones the compiled graph calls, so the
GEMMs run with MXLinear's word that B is a weight (``tilefly.mx.weight_operand``) and, with PDL, stream
their weights in before they wait for the quantizing kernel ahead.

Prints, per format and token count, µs a layer (median of the graph's replays over ``--layers``) with
PDL off and on, and checks that both give the same bits.

    python scripts/mx_pdl_probe.py [--fmt mxfp4,mxfp8] [--tokens 8,32] [--layers 16] [--replays 20] [--json FILE]
"""
from __future__ import annotations

import argparse
import json

import torch

HIDDEN, INTER = 4096, 14336


def layer_weights(fmt: str, layers: int):
    from tilefly import mx

    weights = []
    for _ in range(layers):
        gate_up = mx.MXLinear.from_linear(torch.nn.Linear(HIDDEN, 2 * INTER, bias=False, device="cuda",
                                                          dtype=torch.bfloat16), fmt, swizzle="none")
        down = mx.MXLinear.from_linear(torch.nn.Linear(INTER, HIDDEN, bias=False, device="cuda",
                                                       dtype=torch.bfloat16), fmt, swizzle="none")
        norm = torch.randn(HIDDEN, device="cuda", dtype=torch.bfloat16)
        weights.append((norm, gate_up, down))
    return weights


def mlp_chain(weights, fmt: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    ops = torch.ops.tilefly
    h = a
    for norm, gate_up, down in weights:
        h, data, scales = ops.add_rms_norm_mx_quantize(h, b, norm, 1e-5, fmt)
        packed = ops.mx_linear_mm(data, gate_up.weight_bits, scales, gate_up.weight_scale_bits, fmt, "none", None,
                                  torch.bfloat16)
        data, scales = ops.silu_mul_mx_quantize(packed[:, :INTER], packed[:, INTER:], fmt)
        b = ops.mx_linear_mm(data, down.weight_bits, scales, down.weight_scale_bits, fmt, "none", None,
                             torch.bfloat16)
    return b


def time_graph(run, replays: int) -> tuple[float, torch.Tensor]:
    """``timing.graph_us`` of ``run()`` and the output of the graph's last replay."""
    from tilefly.bench import timing

    outputs = []
    us = timing.graph_us(lambda: outputs.append(run()), replays)
    return us, outputs[-1].clone()      # the captured call's output, which every replay rewrites


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fmt", default="mxfp4,mxfp8")
    parser.add_argument("--tokens", default="8,32")
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--json")
    args = parser.parse_args()

    import tilefly
    from tilefly import config

    rows = []
    with tilefly.enabled(), torch.no_grad():
        for fmt in args.fmt.split(","):
            weights = layer_weights(fmt, args.layers)
            for tokens in (int(t) for t in args.tokens.split(",")):
                a, b = (torch.randn(tokens, HIDDEN, device="cuda", dtype=torch.bfloat16) for _ in range(2))
                result = {}
                for pdl in (False, True):
                    config.mx_pdl = pdl
                    result[pdl] = time_graph(lambda: mlp_chain(weights, fmt, a, b), args.replays)
                config.mx_pdl = False
                same = torch.equal(result[False][1], result[True][1])
                off, on = result[False][0] / args.layers, result[True][0] / args.layers
                rows.append(dict(fmt=fmt, tokens=tokens, layers=args.layers, us_per_layer_off=off,
                                 us_per_layer_pdl=on, same_bits=same))
                print(f"{fmt} {tokens:3d} tokens: {off:7.1f} µs a layer without PDL, {on:7.1f} with "
                      f"({off / on:.3f}x), same bits: {same}", flush=True)
            weights = None                       # the next format's weights replace these
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

"""Attention forward, head dims 32-256: every tilefly forward config (the tuner's and the
ping-pong ones it does not time yet) against cuDNN and flash, BF16, on the attention suite's
shapes below head dim 512.

    PYTHONPATH=. python scripts/attn_fwd_sweep.py [--configs m128n64w,m128n128] [--cases 4,5] [--json PATH]

Why: issue #7 aims at >= 0.9x cuDNN forward at head dims 64-256; the serial and overlapped
kernels reach 0.59-0.98x (BENCHMARKS.md, session 13). This says where the warp-specialized
ping-pong kernels (kernels_fwd_ws) stand before the tuner times them. Each config's output is
checked against cuDNN's (max |diff| / max |ref|), so a fast but wrong config shows as such.
Timing: tilefly.bench.timing.measure (CUDA events, L2 flushed before each call, median).
"""
import argparse
import json
import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from tilefly.bench import timing
from tilefly.bench.suites.attention import cases as attention_cases
from tilefly.ops.attention import configs as attn_configs, kernels

POLICY = timing.Policy(min_reps=20, target_ms=60.0, max_reps=200)
BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}


def suite_cases():
    """(index, B, H, S, D, causal) of attention.csv below head dim 512."""
    out = []
    for i, case in enumerate(attention_cases()):
        c = case.columns
        if c["head_dim"] < 512:
            out.append((i, c["batch"], c["heads"], c["seqlen"], c["head_dim"], bool(c["causal"])))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", help="comma-separated forward configs (default: all, ping-pong included)")
    ap.add_argument("--cases", help="comma-separated attention.csv indices (default: all below head dim 512)")
    ap.add_argument("--json")
    args = ap.parse_args()
    every = attn_configs.FWD_CONFIGS
    names = args.configs.split(",") if args.configs else list(every)
    wanted = {int(x) for x in args.cases.split(",")} if args.cases else None
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  {POLICY.describe()}", flush=True)
    rows = []
    for index, b, h, s, d, causal in suite_cases():
        if wanted is not None and index not in wanted:
            continue
        g = torch.Generator(device="cuda").manual_seed(index)
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)
        case = f"#{index} B{b} H{h} S{s} D{d} {'causal' if causal else 'full'}"
        times = {}
        ref = None
        for name, backend in BACKENDS.items():
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                ref = out if ref is None else ref
                times[name] = (timing.measure(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                                              POLICY), 0.0)
        out = torch.empty_like(q)
        lse = torch.empty(b, h, s, device="cuda")
        for name in names:
            if not every[name].serves(d):
                continue

            def run(name=name):
                return kernels.forward(q, k, v, causal, None, True, name, out=out, lse=lse)
            out.fill_(float("nan"))
            run()
            torch.cuda.synchronize()
            err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
            times[name] = (timing.measure(run, POLICY), err)
        cudnn_us = times["cudnn"][0].median_us
        for name, (t, err) in times.items():
            row = dict(case=case, config=name, median_us=t.median_us, tflops=flops / t.median_us / 1e6,
                       vs_cudnn=cudnn_us / t.median_us, rel_err=err)
            rows.append(row)
            bad = "  WRONG" if not math.isfinite(err) or err > 3e-2 else ""
            print(f"{case:<34} {name:<12} {t.median_us:8.1f} us  {row['tflops']:6.1f} TFLOP/s  "
                  f"x{row['vs_cudnn']:4.2f} of cuDNN  err {err:.1e}{bad}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(rows=rows, policy=POLICY.describe()), f, indent=1)


if __name__ == "__main__":
    main()

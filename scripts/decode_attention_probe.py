"""Masked decode attention on the e2e benchmark's shapes: SDPA as the e2e model calls it (a boolean
(B, 1, 1, L) mask; PyTorch picks the backend, cuDNN on the H200) against tilefly's split-KV decode
(tilefly/ops/attention/decode.py, the mask as an additive bias), µs per call with L2 flushed.

The query heads of a KV group are query rows (Llama-3.1-8B: 8 KV heads, 4 query rows each, head dim
128); the cache holds ``--cache`` positions of which the first ``valid`` are unmasked. GB/s counts
the K and V bytes of the valid positions only (what a kernel that skips the masked tail must read).

    python scripts/decode_attention_probe.py [--batch 8 16 32] [--valid 256 512 767] [--cache 768]
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--valid", type=int, nargs="+", default=[256, 512, 767])
    ap.add_argument("--cache", type=int, default=768)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--splits", type=int, nargs="*", default=[1, 2, 4, 8],
                    help="key split counts to race beside the plan's (decode.plan_splits)")
    args = ap.parse_args()

    from tilefly.bench.timing import QUICK, measure
    from tilefly.ops.attention import decode

    dt = torch.bfloat16
    print(f"{'batch':>5} {'valid':>5} {'SDPA us':>8} {'tilefly us':>10} {'splits':>6} {'ratio':>6} "
          f"{'SDPA GB/s':>9} {'tilefly GB/s':>12} {'max err':>8}")
    for b in args.batch:
        for valid in args.valid:
            q = torch.randn(b, args.kv_heads, args.group, args.head_dim, device="cuda", dtype=dt)
            k = torch.randn(b, args.kv_heads, args.cache, args.head_dim, device="cuda", dtype=dt)
            v = torch.randn_like(k)
            mask = (torch.arange(args.cache, device="cuda") < valid).expand(b, 1, 1, args.cache)
            bias = torch.zeros(mask.shape, device="cuda", dtype=dt).masked_fill(~mask, float("-inf"))
            sdpa_us = measure(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask), QUICK).median_us
            ours_us = measure(lambda: decode.decode_attention(q, k, v, bias), QUICK).median_us
            ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).float()
            err = (decode.decode_attention(q, k, v, bias)[0].float() - ref).abs().max().item()
            splits, _ = decode.plan_splits(b * args.kv_heads, args.cache,
                                           torch.cuda.get_device_properties(0).multi_processor_count)
            gb = 2 * b * args.kv_heads * valid * args.head_dim * 2 / 1e9
            print(f"{b:>5} {valid:>5} {sdpa_us:>8.1f} {ours_us:>10.1f} {splits:>6} {sdpa_us / ours_us:>6.2f} "
                  f"{gb / sdpa_us * 1e6:>9.0f} {gb / ours_us * 1e6:>12.0f} {err:>8.1e}", flush=True)
            for forced in args.splits:
                us = measure(lambda: decode.decode_attention(q, k, v, bias, splits=forced), QUICK).median_us
                print(f"{'':>5} {'':>5} {'':>8} {us:>10.1f} {forced:>6} {sdpa_us / us:>6.2f} {'':>9} "
                      f"{gb / us * 1e6:>12.0f}", flush=True)


if __name__ == "__main__":
    main()

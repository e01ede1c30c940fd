"""Masked decode attention on the e2e benchmark's shapes: SDPA as the compiled e2e step calls it against
tilefly's split-KV decode (tilefly/ops/attention/decode.py), GPU µs per call. Both get the additive
(B, 1, 1, L) bias that PyTorch's cuDNN path makes of the model's boolean mask: 0 where a key is seen,
-65504 where it is hidden. PyTorch picks SDPA's backend: cuDNN on the H200.

Each provider's calls are captured in one CUDA graph (``--reps`` calls a replay, cycling through
copies of the inputs that together exceed 100 MB, so no call finds its cache in L2), as the e2e
decode steps run: host overhead is left out, launch gaps inside the graph are in. The median replay
over ``--replays`` is divided by ``--reps``.

The query heads of a KV group are query rows (Llama-3.1-8B: 8 KV heads, 4 query rows each, head dim
128); the cache holds ``--cache`` positions of which the first ``valid`` are unmasked. GB/s counts
the K and V bytes of the valid positions only (what a kernel that skips the masked tail must read).
``--sweep`` races every DecodeConfig of the grid below (configs that do not fit are skipped);
``--config B,W,S,P`` (repeatable) races named ones: block_n, num_warps, num_stages, programs/SM.

    python scripts/decode_attention_probe.py [--batch 8 ... 256] [--valid 256 512 767] [--cache 768] [--sweep]
                                             [--json FILE]
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math

import torch
import torch.nn.functional as F

from tilefly.bench.timing import graph_us

SWEEP = dict(block_n=(32, 64, 128), num_warps=(2, 4, 8), num_stages=(2, 3), programs_per_sm=(1, 2, 4, 8, 16))
SPILLS = {(128, 2)}     # (block_n, num_warps) pairs that spill registers (sm_90a compile): not swept


def per_call_us(call, sets: list, reps: int, replays: int) -> float:
    """GPU µs a call: ``reps`` calls cycling over ``sets`` in one CUDA graph (timing.graph_us)."""
    def calls():
        for i in range(reps):
            call(*sets[i % len(sets)])
    return graph_us(calls, replays) / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[8, 16, 32, 64, 128, 256])
    ap.add_argument("--valid", type=int, nargs="+", default=[256, 512, 767])
    ap.add_argument("--cache", type=int, default=768)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--replays", type=int, default=15)
    ap.add_argument("--sweep", action="store_true", help="race the DecodeConfig grid, not the default only")
    ap.add_argument("--config", action="append", default=[], metavar="B,W,S,P",
                    help="a DecodeConfig to race beside the default: block_n,num_warps,num_stages,programs_per_sm")
    ap.add_argument("--json", help="write every (shape, config) time here (python -m "
                                    "tilefly.ops.attention.decode_tuning builds the tuning database from it)")
    args = ap.parse_args()

    from tilefly.ops.attention import decode

    configs = [decode.DEFAULT] + [decode.DecodeConfig(*map(int, c.split(","))) for c in args.config]
    if args.sweep:
        configs += [decode.DecodeConfig(*c) for c in itertools.product(*SWEEP.values()) if c[:2] not in SPILLS]
    configs = list(dict.fromkeys(configs))
    dt = torch.bfloat16
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{'batch':>5} {'valid':>5} {'SDPA us':>8} {'default us':>10} {'best us':>8} {'SDPA/best':>9} "
          f"{'SDPA GB/s':>9} {'best GB/s':>9} {'max err':>8}  best config")
    wins: dict = {}
    rows: list[dict] = []
    for b in args.batch:
        for valid in args.valid:
            kv_bytes = 2 * b * args.kv_heads * args.cache * args.head_dim * 2
            sets = []
            for _ in range(max(2, math.ceil(100e6 / kv_bytes))):
                q = torch.randn(b, args.kv_heads, args.group, args.head_dim, device="cuda", dtype=dt)
                k = torch.randn(b, args.kv_heads, args.cache, args.head_dim, device="cuda", dtype=dt)
                v = torch.randn_like(k)
                seen = (torch.arange(args.cache, device="cuda") < valid).expand(b, 1, 1, args.cache)
                bias = torch.zeros(seen.shape, device="cuda", dtype=dt).masked_fill(~seen, -65504.0)
                sets.append((q, k, v, bias))
            sdpa_us = per_call_us(lambda q, k, v, bias: F.scaled_dot_product_attention(q, k, v, attn_mask=bias),
                               sets, args.reps, args.replays)
            q, k, v, bias = sets[0]
            ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias).float()
            timed = {}
            for cfg in configs:
                try:
                    err = (decode.decode_attention(q, k, v, bias, cfg=cfg)[0].float() - ref).abs().max().item()
                    us = per_call_us(lambda q, k, v, bias, cfg=cfg: decode.decode_attention(q, k, v, bias, cfg=cfg),
                                  sets, args.reps, args.replays)
                except Exception as e:  # noqa: BLE001 - a config that does not fit the SM is skipped
                    if cfg == decode.DEFAULT:
                        raise
                    print(f"      skipped {cfg}: {type(e).__name__}", flush=True)
                    continue
                timed[cfg] = (us, err)
                splits, _ = decode.plan_splits(b * args.kv_heads, args.cache, sms, cfg)
                rows.append(dict(batch=b, programs=b * args.kv_heads, rows=args.group, head_dim=args.head_dim,
                                 valid=valid, cache=args.cache,
                                 sdpa_us=sdpa_us, us=us, max_err=err, splits=splits, **dataclasses.asdict(cfg)))
            best = min(timed, key=lambda c: timed[c][0])
            wins.setdefault(best, []).append((b, valid))
            gb = 2 * b * args.kv_heads * valid * args.head_dim * 2 / 1e9
            best_us, best_err = timed[best]
            print(f"{b:>5} {valid:>5} {sdpa_us:>8.1f} {timed[decode.DEFAULT][0]:>10.1f} {best_us:>8.1f} "
                  f"{sdpa_us / best_us:>9.2f} {gb / sdpa_us * 1e6:>9.0f} {gb / best_us * 1e6:>9.0f} "
                  f"{max(e for _, e in timed.values()):>8.1e}  {best}", flush=True)
            if args.json:      # after every shape: a call stopped by its time limit keeps what it measured
                with open(args.json, "w") as f:
                    json.dump(dict(gpu=torch.cuda.get_device_name(),
                                   capability=list(torch.cuda.get_device_capability()),
                                   torch=torch.__version__, rows=rows), f, indent=1)
    if len(configs) > 1:
        print("configs that won a shape:")
        for cfg, shapes in wins.items():
            print(f"  {cfg}: {shapes}")


if __name__ == "__main__":
    main()

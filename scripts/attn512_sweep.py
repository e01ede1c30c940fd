"""Head-dim-512 attention forward: every d512 config against PyTorch's memory-efficient kernel
(what SDPA runs at 512), BF16, on the shapes of issue #7's targets, causal and not.

    PYTHONPATH=. python scripts/attn512_sweep.py [--configs d512n64p] [--json PATH]

Timing: tilefly.bench.timing.measure (CUDA events around each call, L2 flushed before each,
median; p20/p80 shown). tilefly's kernels run with the log-sum-exp stored (as training needs).
Each config's output is checked against PyTorch's (max |diff| / max |ref|), so a fast but wrong
config shows up as such. "KV TB/s" is the K and V bytes all programs read (one 64-row query tile
each reads every key tile it needs, from L2 after the first) over the time: the kernel cannot
beat the L2's read bandwidth, which the last line estimates (plain-Triton programs summing 1 MiB
chunks of a 16 MiB buffer: a lower bound of what the L2 delivers; checked on CPU with
TRITON_INTERPRET=1 python -c "import runpy; runpy.run_path('scripts/attn512_sweep.py')['l2_read_tbs'](64)").
"""
import argparse
import json
import math
import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.nn.attention import SDPBackend, sdpa_kernel

from tilefly.bench import timing
from tilefly.ops.attention import kernels_fwd512

SHAPES = ((4, 8, 2048), (2, 8, 4096))      # (B, H, S); both causal and not
POLICY = timing.Policy(min_reps=20, target_ms=60.0, max_reps=200)
ROWS = kernels_fwd512.BLOCK_M
DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"    # the L2 probe's CPU check


def flops(b, h, s, causal):
    pairs = s * (s + 1) / 2 if causal else s * s       # (query, key) pairs that are computed
    return 4 * b * h * pairs * 512


def kv_bytes(b, h, s, causal):
    keys = sum(min(s, m + ROWS) if causal else s for m in range(0, s, ROWS))
    return b * h * keys * 512 * 2 * 2


@triton.jit
def _l2_read_kernel(src, sink, CHUNKS: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """Program p sums chunk p % CHUNKS of src (CHUNK floats), BLOCK at a time: every chunk is read
    by many programs, as every key tile is by many query tiles, so all but the first come from L2."""
    base = src + (tl.program_id(0) % CHUNKS) * CHUNK
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(0, CHUNK, BLOCK):
        acc += tl.load(base + i + tl.arange(0, BLOCK))
    tl.store(sink + tl.program_id(0), tl.sum(acc))


def l2_read_tbs(programs=4224, chunk_bytes=2**20, l2_bytes=16 * 2**20):
    """Read bandwidth from L2 (TB/s): ``programs`` programs each read one 1 MiB chunk of a 16 MiB
    buffer (L2-resident after the warm-up), one launch of ~4 GB of reads."""
    chunk = chunk_bytes // 4
    src = torch.randn(l2_bytes // 4, device=DEVICE)
    sink = torch.empty(programs, device=DEVICE)

    def run():
        _l2_read_kernel[(programs,)](src, sink, CHUNKS=l2_bytes // chunk_bytes, CHUNK=chunk, BLOCK=4096,
                                     num_warps=8)
    run()
    want = src.view(-1, chunk).sum(1).repeat(programs // (l2_bytes // chunk_bytes))
    if not torch.allclose(sink, want, rtol=1e-3, atol=1e-2):
        raise AssertionError("L2 probe summed the wrong bytes")
    if DEVICE == "cpu":
        return float("nan")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        run()
    end.record()
    torch.cuda.synchronize()
    return 5 * programs * chunk_bytes / (start.elapsed_time(end) * 1e-3) / 1e12


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", help="comma-separated d512 configs (default: all)")
    ap.add_argument("--json")
    args = ap.parse_args()
    configs = args.configs.split(",") if args.configs else list(kernels_fwd512.CONFIGS)
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  {POLICY.describe()}", flush=True)
    rows = []
    for b, h, s in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(b, h, s, 512, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        for causal in (False, True):
            case = f"B{b} H{h} S{s} {'causal' if causal else 'full'}"
            with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
                ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                base = timing.measure(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), POLICY)
            out = torch.empty_like(q)
            lse = torch.empty(b, h, s, device="cuda")
            results = [("pytorch-efficient", base, 0.0)]
            for name in configs:
                def run(name=name):
                    return kernels_fwd512.forward512(q, k, v, causal, None, True, name, out=out, lse=lse)
                out.fill_(float("nan"))
                run()
                err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
                results.append((name, timing.measure(run, POLICY), err))
            for name, t, err in results:
                row = dict(case=case, config=name, median_us=t.median_us, p20_us=t.p20_us, p80_us=t.p80_us,
                           tflops=flops(b, h, s, causal) / t.median_us / 1e6,
                           kv_tbs=kv_bytes(b, h, s, causal) / t.median_us / 1e6,
                           speedup=base.median_us / t.median_us, rel_err=err)
                rows.append(row)
                bad = "  WRONG" if not math.isfinite(err) or err > 3e-2 else ""   # bf16 rounding: ~1e-2
                print(f"{case:<22} {name:<18} {t.median_us:8.1f} us  (p20 {t.p20_us:7.1f} p80 {t.p80_us:7.1f})  "
                      f"{row['tflops']:6.1f} TFLOP/s  KV {row['kv_tbs']:5.2f} TB/s  x{row['speedup']:4.2f}  "
                      f"err {err:.1e}{bad}", flush=True)
    l2 = l2_read_tbs()
    print(f"L2 read bandwidth (1 MiB chunks of a 16 MiB buffer, each read by 264 programs): {l2:.2f} TB/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(rows=rows, l2_read_tbs=l2, policy=POLICY.describe()), f, indent=1)


if __name__ == "__main__":
    main()

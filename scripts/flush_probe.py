"""How the L2 flush before each timed call changes the numbers: the same ops timed with the
write flush (dirty L2) and the read flush (clean L2), side by side in one process.

    python scripts/flush_probe.py [--json PATH]
"""
import argparse
import json
import os

import torch
import torch.nn.functional as F

from tilefly.bench import timing


def cases():
    dev = "cuda"
    x1 = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)
    w = torch.randn(4096, device=dev, dtype=torch.bfloat16)
    xb = torch.randn(8192, 4096, device=dev, dtype=torch.float16)
    wb = torch.randn(4096, device=dev, dtype=torch.float16)
    a = torch.randn(16, 4096, device=dev, dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    src = torch.randn(64 * 2**20, device=dev)          # 256 MiB fp32
    dst = torch.empty_like(src)
    yield "rms_norm bf16 1x4096", 2 * 4096 * 2 * 2, lambda: F.rms_norm(x1, (4096,), w, 1e-6)
    yield "rms_norm fp16 8192x4096", (2 * 8192 + 1) * 4096 * 2, lambda: F.rms_norm(xb, (4096,), wb, 1e-6)
    yield "mm bf16 16x4096x4096", 4096 * 4096 * 2, lambda: torch.mm(a, b.t())
    yield "copy 256 MiB", 2 * src.numel() * 4, lambda: dst.copy_(src)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    for name, nbytes, fn in cases():
        row = {"case": name, "bytes": nbytes}
        for mode in timing.FLUSH_MODES:
            os.environ["TILEFLY_BENCH_FLUSH"] = mode
            t = timing.measure(fn, timing.QUICK)
            row[mode] = {"median_us": t.median_us, "p20_us": t.p20_us, "p80_us": t.p80_us,
                         "tb_s": nbytes / t.median_us / 1e6}
        rows.append(row)
        print(f"{name:26s} write flush {row['write']['median_us']:8.2f} us ({row['write']['tb_s']:.2f} TB/s)   "
              f"read flush {row['read']['median_us']:8.2f} us ({row['read']['tb_s']:.2f} TB/s)", flush=True)
    os.environ.pop("TILEFLY_BENCH_FLUSH", None)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

"""Where SPLIT rows lose against aligned ones: one row length (any dtype), the shipped config with and
without a weight (no weight: no shifted copies, no w loads), without pdl, without copies (scalar w
loads), and the aligned row one element shorter; rounds interleaved, L2 flushed, median us.

    python scripts/rms_split_probe.py [--dtype fp16] [--m 2048] [--n 16385] [--rounds 3]
"""
from __future__ import annotations

import argparse
from dataclasses import replace

import torch

from tilefly.bench.timing import QUICK, measure
from tilefly.ops.rms_norm import configs, launcher
from tilefly.ops.rms_norm.sweep import DTYPES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="fp16", choices=DTYPES)
    parser.add_argument("--m", type=int, default=2048)
    parser.add_argument("--n", type=int, default=16385)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    dtype, M, N = DTYPES[args.dtype], args.m, args.n
    size = dtype.itemsize
    x = torch.randn(M, N, device="cuda").to(dtype)
    xa = torch.randn(M, N - 1, device="cuda").to(dtype)
    w, wa = (torch.rand(N, device="cuda") + 0.5).to(dtype), (torch.rand(N - 1, device="cuda") + 0.5).to(dtype)
    y, ya, rstd = torch.empty_like(x), torch.empty_like(xa), torch.empty(M, 1, device="cuda")
    split = configs.heuristic(N, size, configs.SPLIT)
    aligned = configs.heuristic(N - 1, size, configs.row_layout(N - 1, N - 1, True, size))
    cases = {
        f"split {split}": lambda: launcher.launch(x, w, y, rstd, 1e-6, split),
        "split, no weight": lambda: launcher.launch(x, None, y, rstd, 1e-6, split),
        "split, no pdl": lambda: launcher.launch(x, w, y, rstd, 1e-6, replace(split, pdl=False)),
        "split, scalar w (no copies)": lambda: launcher.launch(
            x, w, y, rstd, 1e-6, replace(split, w_shift=False, pdl=False, w_realign=False)),
        f"aligned N-1 {aligned}": lambda: launcher.launch(xa, wa, ya, rstd, 1e-6, aligned),
        "aligned N-1, no weight": lambda: launcher.launch(xa, None, ya, rstd, 1e-6, aligned),
        "aten": lambda: torch.ops.aten._fused_rms_norm(x, [N], w, 1e-6),
    }
    times = {k: [] for k in cases}
    for _ in range(args.rounds):
        for name, fn in cases.items():
            times[name].append(measure(fn, QUICK).median_us)
    nbytes = 2 * M * N * size
    print(f"{args.dtype} {M}x{N}: median us per round (TB/s of x read + y written, best round)")
    for name, ts in times.items():
        print(f"  {' '.join(f'{t:7.1f}' for t in ts)}  {nbytes / min(ts) / 1e6:5.2f}  {name}")


if __name__ == "__main__":
    main()

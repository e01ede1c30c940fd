"""Find the (layout, shape, config) of the dense GEMM tests that faults on the GPU.

Run once per layout in its own process with CUDA_LAUNCH_BLOCKING=1: the line printed last before
a fault names the launch that faulted (a fault poisons the CUDA context, so the process stops)."""
import sys

import torch

sys.path.insert(0, "tests/ops/gemm")
from test_gemm_cuda import SAMPLED, check, eligible, operands  # noqa: E402

from tilefly.ops.gemm import configs, launch  # noqa: E402

layout = sys.argv[1]
shapes = SAMPLED if len(sys.argv) < 3 else [tuple(map(int, s.split("x"))) for s in sys.argv[2:]]
bad = 0
for m, n, k in shapes:
    a, b = operands(m, n, k, layout)
    if not eligible(a, b):
        continue
    for cfg in configs.offered(m, n, k):
        print(f"{layout} {m}x{n}x{k} {cfg.name}", flush=True)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=a.dtype)
        try:
            launch.run(cfg, a, b, out)
            torch.cuda.synchronize()
        except launch.Unsupported:
            continue
        try:
            check(out, a, b)
        except AssertionError as e:
            bad += 1
            print("  MISMATCH", str(e).splitlines()[:3], flush=True)
print(f"{layout}: done, {bad} mismatches", flush=True)

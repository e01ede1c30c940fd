"""What Inductor's autotuning race sees of a decode GEMM, against what the GPU spends on it.

Inductor times each GEMM candidate with a pair of events around one call after zeroing an
L2-sized buffer, and keeps the fastest of ~100 such calls. When a candidate's host path is
slower than that zeroing, the events also time the host, and the race can pick a kernel that
is slower on the GPU, where a CUDA-graphed decode step spends nothing on the host.

For each M=32 decode shape (B as a Linear weight, column-major) this prints, per candidate:
- race: Inductor's own benchmarker, as in autotuning (µs);
- graph: the same benchmarker timing a CUDA graph replay of one call (GPU time, L2 cold), as a
  graph-timed race does (tilefly._race_timing.replay_ms);
- host: host µs per call, back to back;
for tilefly's offered configs (through the very callable Inductor's generated code calls),
ATen ``torch.mm``, and (``--compiled``) what Inductor's own race recorded for each family when
compiling the GEMM alone with ATEN,TRITON,TILEFLY, the race timed both ways
(``TILEFLY_GEMM_RACE_TIMING`` inductor, and graph: every candidate as a CUDA graph replay), with
the GPU time of the pick, and the GPU time of the Triton template a TRITON-only compile picks.

    python3 scripts/race_probe.py [--compiled] [--json FILE]
"""
from __future__ import annotations

import argparse
import json

import torch

SHAPES = [(32, 1024, 4096), (32, 4096, 4096), (32, 14336, 4096), (32, 4096, 14336)]


def _graph_us(fn) -> float:
    from tilefly._race_timing import replay_ms

    return replay_ms(fn) * 1000.0


def _row(name: str, fn) -> dict:
    from torch._inductor.runtime.benchmarking import benchmarker

    from tilefly import _triton_launch
    from tilefly.bench.timing import back_to_back_us

    fn()
    row = {"name": name, "race": benchmarker.benchmark_gpu(fn) * 1000.0, "graph": _graph_us(fn),
           "host": back_to_back_us(fn, 20, 300)[0], "hooks": _triton_launch.hooks_active()}
    print(f"  {name:<44} race {row['race']:7.1f}  graph {row['graph']:7.1f}  host {row['host']:6.1f} us"
          f"{'  (launch hook set)' if row['hooks'] else ''}", flush=True)
    return row


def probe_shape(m: int, n: int, k: int) -> list[dict]:
    from tilefly.ops.gemm import configs
    from tilefly.ops.gemm.inductor import _mm_kernel

    a = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, k, dtype=torch.bfloat16, device="cuda").t()
    out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    ref = (a.double() @ b.double()).float()
    rows = [_row("aten mm", lambda: torch.mm(a, b, out=out))]
    for cfg in configs.offered(m, n, k, "default"):
        fn = _mm_kernel(cfg)
        out.fill_(float("nan"))
        fn(a, b, out=out)
        err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
        if not err < 2e-2:
            print(f"  {cfg.name}: WRONG (rel err {err:.3g})")
            continue
        rows.append(_row(f"tilefly {cfg.name}", lambda fn=fn: fn(a, b, out=out)))
    return rows


def compiled_race(m: int, n: int, k: int, timing: str) -> list[dict]:
    """Inductor's race for this GEMM alone (timed as ``timing`` says), and the
    GPU time of what it picked; then the same for a TRITON-only compile (the template alone)."""
    from torch._inductor import config as inductor_config

    import tilefly
    from tilefly import config
    from tilefly.bench.e2e import picks
    from tilefly.bench.inductor import autotune, compile_static

    a = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda")
    rows = []
    for backends in ("ATEN,TRITON,TILEFLY", "TRITON"):
        config.gemm_race_timing = timing
        # caches off: the second timing's compile must race again, not reuse the first one's picks
        with tilefly.enabled(), autotune(backends), inductor_config.patch(force_disable_caches=True), \
                picks.record_races() as races:
            fn = compile_static(lambda x: torch.nn.functional.linear(x, w), mode="max-autotune-no-cudagraphs")
            fn(a)
        config.reload()
        gpu = _graph_us(lambda: fn(a))
        for r in races:
            print(f"  {backends} race ({timing}) {r.get('shapes')}: {r.get('us')} -> {r.get('winner_choice')}, "
                  f"its graph {gpu:.1f} us", flush=True)
            rows.append({"backends": backends, "timing": timing, "race": r, "picked_graph_us": gpu})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compiled", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.manual_seed(0)
    result = {}
    for m, n, k in SHAPES:
        print(f"{m}x{n}x{k}", flush=True)
        entry = {"rows": probe_shape(m, n, k)}
        if args.compiled:
            entry["compiled"] = [row for timing in ("inductor", "graph") for row in compiled_race(m, n, k, timing)]
        result[f"{m}x{n}x{k}"] = entry
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

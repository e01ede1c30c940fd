"""Where a decode step's GPU time goes: the kernels of a few compiled decode steps, by name.

``--profile`` runs this after a side's timed generations: one prefill (untimed), then
``steps`` decode steps under ``torch.profiler`` (kernels launched from a CUDA graph replay are
recorded one by one). Kernel times are summed per name and divided by the step count; families
group the names (tilefly's GEMM kernels, other GEMMs, Inductor's Triton kernels, attention).
The step's wall time minus its GPU-busy time is what launch gaps and the host cost.
``launches`` splits the busiest names by grid (from the profiler's trace): one kernel serving
projections of different shapes (the q, k, v, o, gate, up and down GEMMs) shows each shape's time.
The steps profiled are the first decode steps after a prefill (the shortest KV cache of the run).
"""
from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections import defaultdict
from typing import Any, Iterable

import torch

# Family of a kernel name, the first pattern that matches (kernel names: tilefly's Gluon/Triton
# functions, cuBLAS's nvjet/cutlass/xmma, Inductor's triton_poi/red/per/tem, FlashAttention's flash_*).
FAMILIES = (
    ("tilefly GEMM", re.compile(r"^(gemm_|mx_gemm|mx_upcast|mx_rescale|mx_requant|grouped_gemm)")),
    ("tilefly attention", re.compile(r"^(attention_|decode_split_kernel)")),
    ("tilefly other", re.compile(r"^(rms_norm_|topk_|mx_quantize_kernel|add_rms_norm_mx_quantize|"
                                 r"silu_mul_mx_quantize)")),
    ("cuBLAS / CUTLASS GEMM", re.compile(r"nvjet|cutlass|xmma|gemm|gemv|splitKreduce", re.IGNORECASE)),
    ("Triton template (Inductor)", re.compile(r"^triton_tem")),
    ("Triton fused (Inductor)", re.compile(r"^triton_")),
    ("attention", re.compile(r"flash|fmha|attention|sdpa", re.IGNORECASE)),
    ("copy / fill", re.compile(r"^(Memcpy|Memset)|elementwise_kernel|vectorized_elementwise|copy", re.IGNORECASE)),
)


def family(name: str) -> str:
    for label, pattern in FAMILIES:
        if pattern.search(name):
            return label
    return "other"


def kernel_table(kernels: Iterable[tuple[str, float, int]], steps: int, top: int = 25) -> dict[str, Any]:
    """Per-step totals of ``(name, device µs, calls)`` records (one per name or per call) measured
    over ``steps`` decode steps: the busiest ``top`` names and every family."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for name, us, calls in kernels:
        by_name[name][0] += us
        by_name[name][1] += calls
    busy = sum(us for us, _ in by_name.values())
    families: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for name, (us, calls) in by_name.items():
        total = families[family(name)]
        total[0] += us
        total[1] += calls
    ranked = sorted(by_name.items(), key=lambda item: -item[1][0])
    return {"steps": steps, "busy_us_per_step": busy / steps,
            "kernels_per_step": sum(calls for _, calls in by_name.values()) / steps,
            "families": [{"family": f, "us_per_step": us / steps, "calls_per_step": calls / steps}
                         for f, (us, calls) in sorted(families.items(), key=lambda item: -item[1][0])],
            "top": [{"name": name[:120], "us_per_step": us / steps, "calls_per_step": calls / steps}
                    for name, (us, calls) in ranked[:top]]}


def launch_table(trace_events: Iterable[dict], steps: int, top: int = 25) -> list[dict[str, Any]]:
    """Per-step time of each (kernel name, grid) among a Chrome trace's kernel events, busiest first."""
    by_launch: dict[tuple[str, tuple], list[float]] = defaultdict(lambda: [0.0, 0])
    for event in trace_events:
        if event.get("cat") != "kernel" or "dur" not in event:
            continue
        grid = tuple((event.get("args") or {}).get("grid") or ())
        total = by_launch[(event["name"], grid)]
        total[0] += float(event["dur"])
        total[1] += 1
    ranked = sorted(by_launch.items(), key=lambda item: -item[1][0])
    return [{"name": name[:120], "grid": list(grid), "us_per_step": us / steps, "calls_per_step": calls / steps,
             "us_per_call": us / calls} for (name, grid), (us, calls) in ranked[:top]]


def _trace_events(prof) -> list[dict]:
    """The profiler's Chrome trace events (kineto's kernel records carry the grid)."""
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            return json.load(f).get("traceEvents", [])
    finally:
        os.unlink(path)


def profile_decode(eng, prompts: torch.Tensor, steps: int = 16, top: int = 25) -> dict[str, Any]:
    """``kernel_table`` of ``steps`` decode steps of ``eng`` (an ``engine.Engine`` that has already
    compiled and run), with the steps' wall time per step beside it. On a CPU model the table
    is empty (no kernels): the CPU tests run the path, not the numbers."""
    from torch.profiler import ProfilerActivity, profile

    from tilefly.bench.e2e.engine import _sync

    steps = max(1, min(steps, eng.output_len - 1))
    eng.generate(prompts, steps=1)  # reset the cache and prefill: the decode steps continue from here
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if eng.device.type == "cuda" else [])
    with profile(activities=activities) as prof, torch.inference_mode():
        start = time.perf_counter()
        for _ in range(steps):
            eng.decode_once()
        _sync(eng.device)
        wall = time.perf_counter() - start
    kernels = [(e.key, e.device_time_total, e.count) for e in prof.key_averages()
               if e.device_type == torch.autograd.DeviceType.CUDA]
    table = kernel_table(kernels, steps, top)
    table["wall_us_per_step"] = wall / steps * 1e6  # profiled: a little above the timed TPOT
    if eng.device.type == "cuda":
        table["launches"] = launch_table(_trace_events(prof), steps, top)
    return table


SLOW_FUSED_US = 50.0       # a call at least this long ...
SLOW_FUSED_SHARE = 0.02    # ... and at least this share of the step's GPU time


def slow_fused(table: dict[str, Any]) -> list[dict[str, Any]]:
    """Inductor's fused reductions (``triton_red_*``, ``triton_per_*``) that take SLOW_FUSED_US a call and
    SLOW_FUSED_SHARE of the step. A decode step's reductions (RMSNorms, the sampling argmax) read well
    under a MB a call and take 1-15 µs, but a config that puts several rows in each program makes them
    latency-bound, and a compile's runtime autotuning can pick one (the 32-request fused RMSNorm: 200 µs
    a call in one program, session 35; 130 µs in one and 79 µs in 16 programs, session 37; 2-4 µs in 32
    programs in other compiles). Such a step is not the model's usual speed. Pointwise kernels are not
    counted: the stock MX path's weight dequantization is legitimately long."""
    floor = SLOW_FUSED_SHARE * table.get("busy_us_per_step", 0.0)
    return [launch for launch in table.get("launches", [])
            if launch["name"].startswith(("triton_red_", "triton_per_"))
            and launch["us_per_call"] >= SLOW_FUSED_US and launch["us_per_step"] >= floor]


def describe(table: dict[str, Any], families: int = 6) -> str:
    """One line: wall and GPU-busy time per step and the largest families (and any ``slow_fused``)."""
    parts = [f"{f['family']} {f['us_per_step']:.0f}" for f in table["families"][:families]]
    slow = slow_fused(table)
    warn = ("; SUSPECT COMPILE, slow Inductor fused kernels (profile.slow_fused): "
            + ", ".join(f"{k['name'][:60]} grid {k['grid']} {k['us_per_call']:.0f} µs a call "
                        f"x{k['calls_per_step']:.0f}" for k in slow)) if slow else ""
    return (f"profiled step {table['wall_us_per_step']:.0f} µs, GPU busy {table['busy_us_per_step']:.0f} µs "
            f"in {table['kernels_per_step']:.0f} kernels: " + ", ".join(parts) + warn)


# how Inductor's wrapper code defines a Triton kernel: name = async_compile.triton('name', '''source''', ...)
_KERNEL_DEF = re.compile(r"async_compile\.triton\('(?P<name>[^']+)', '''(?P<source>.*?)'''", re.DOTALL)


def kernel_sources(codes: Iterable[str], names: Iterable[str]) -> dict[str, list[str]]:
    """The Triton source of each kernel named, from Inductor's captured wrapper code: every distinct
    definition (kernel names restart in each graph), a prefix matching (a profile cuts names to 120
    characters). Kept with a suspect profile, so that a slow kernel can be read without another run."""
    names = list(names)
    found: dict[str, list[str]] = {name: [] for name in names}
    for code in codes:
        for m in _KERNEL_DEF.finditer(code):
            for name in names:
                if m["name"].startswith(name) and m["source"] not in found[name]:
                    found[name].append(m["source"])
    return {name: sources for name, sources in found.items() if sources}


def tilefly_gemms(table: dict[str, Any]) -> str:
    """tilefly's GEMM kernels among the profile's busiest names, with their calls a step."""
    return ", ".join(f"{k['name']} x{k['calls_per_step']:.0f}" for k in table["top"]
                     if family(k["name"]) == "tilefly GEMM")

"""MX GEMM on decode shapes (issue 6): every MX config and K-split count against BF16 ``torch.mm``.

The mxfp_gemm suite read the best MX config of 32 x 4096 x 4096 at 22 µs where BF16 ``mm`` took
16 (b2c9824), though MXFP8 weights are half the bytes. This script says where that time goes:

- per shape, BF16 ``torch.mm`` on the same shape (events, L2 flushed, as the suite times it);
- per MX config (v1 and v2 builds, 64 and 128 rows, ring depths) and forced K-split count, the
  same timing, and the weight bandwidth it reaches;
- the host cost of one eager ``F.scaled_mm`` call (back to back, L2 warm: the wall time per
  call when the host is slower than the GPU) against ``torch.mm``'s.

    python scripts/mx_decode_probe.py [--fmt mxfp8,mxfp4] [--shape 32x4096x4096 ...] [--kernels 2,3] [--profile]
                                      [--picked [--expanded] --splits auto,2,4,8 --json FILE --commit SHA]
                                      [--only _xr_fy]

``--json`` writes every timed row; ``python -m tilefly.ops.mx_gemm.split_tuning FILE`` turns the picked
build's rows into the GPU's split tuning database (the fastest count per shape).

``--profile`` then runs each shape's picked and fastest builds once more between
``cudaProfilerStart``/``Stop`` for ``ncu --profile-from-start off``. ``--host-profile`` instead
profiles only the eager call's host path: cProfile over 2000 back-to-back calls of the first shape
and format (first timed without the profiler), top entries by own and by cumulative time.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import torch

SHAPES = ["8x4096x4096", "32x4096x4096", "32x1024x4096", "32x14336x4096", "32x4096x14336", "64x4096x4096"]  # 1024: K / V


def operands(m: int, n: int, k: int, fmt: str):
    from tilefly.bench import mx_operands

    a = mx_operands.quantize(torch.randn(m, k, device="cuda"), fmt)
    b = mx_operands.quantize(torch.randn(n, k, device="cuda"), fmt)
    return a, b


def variants(rows: int, cols: int, k: int, fmt: str, kernels=(1, 2, 3)):
    from tilefly.ops.mx_gemm import configs

    base = [c for c in configs.offered(rows, cols, k, fmt) if c.kernel in kernels]
    more = []
    for cfg in (c for c in base if c.kernel in (2, 3, 4)):
        warps = cfg.num_warps
        if cfg.kernel == 3:
            alts = [(st, sets, 0, warps) for st in (2, 3, 4) for sets in (1, 2)]
        elif cfg.kernel == 4:
            alts = [(st, 2, cfg.scale_slots, warps) for st in (2, 3, 6)]
        elif cfg.scale_slots:   # shallower rings fit more programs an SM; two warpgroups share a tile's work
            alts = [(st, 2, cfg.scale_slots, w) for st in (3, 4) for w in (4, 8)] + [(cfg.stages, 2, cfg.scale_slots, 8)]
        else:
            alts = [(4, 2, 0, warps), (8, 2, 0, warps)]
        for stages, sets, slots, w in alts:
            alt = replace(cfg, stages=stages, max_splits=32, bf16_sets=sets, scale_slots=slots, num_warps=w)
            if alt not in base and alt not in more and configs.static_reason(alt, fmt) is None:
                more.append(alt)
    return [replace(c, max_splits=32) for c in base], more


def steer_splits(forced: list, chosen: list) -> None:
    """Route the MX launcher's K-split count through ``forced[0]`` (None: the launcher's own, from its model
    or the split tuning database) and append every count it runs to ``chosen``."""
    from tilefly.ops.mx_gemm import launch, split_tuning

    real_choose, real_measured = launch.choose_splits, split_tuning.splits_for

    def choose(cfg, tiles, k_steps, slots, split_cost=0.0):
        s = real_choose(cfg, tiles, k_steps, slots, split_cost) if forced[0] is None else min(forced[0], k_steps)
        chosen.append(s)
        return s

    def measured(device_index, fmt, cfg, rows, cols, k):
        """The tuning database's count ('auto' runs what the launcher runs); none while a count is forced."""
        s = None if forced[0] is not None else real_measured(device_index, fmt, cfg, rows, cols, k)
        if s is not None:
            chosen.append(s)
        return s

    launch.choose_splits = choose
    split_tuning.splits_for = measured


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fmt", default="mxfp8,mxfp4")
    ap.add_argument("--shape", action="append")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--kernels", default="1,2,3", help="kernel versions to race (configs.MXConfig.kernel; 4: the "
                    "MXFP4 fold, with and without X from registers; pick runs the latter at 33-64 tokens)")
    ap.add_argument("--splits", default="auto,1,2,4,8,16,32", help="K-split counts to force ('auto': the launcher's)")
    ap.add_argument("--picked", action="store_true",
                    help="time only the pick's build (over --splits): a quick sweep for the split planner")
    ap.add_argument("--host-profile", action="store_true")
    ap.add_argument("--expanded", action="store_true", help="with --picked: also time the MXFP4 fold pick reading "
                    "the activation expanded (tilefly.mx.expanded)")
    ap.add_argument("--group-blocks", type=int, default=None, help="with --expanded: the copy's fold groups in "
                    "scale blocks (64: the fused SiLU kernel's chunks; default whole rows, the fused RMSNorm's)")
    ap.add_argument("--headstart-us", type=float, default=0.0, help="hold the GPU this long after each flush "
                    "(tilefly.bench.timing, Policy.headstart_us): the GPU time alone, as in a CUDA graph")
    ap.add_argument("--only", help="time only the builds whose name contains this (e.g. _xr_fy)")
    ap.add_argument("--json", help="also write every timed row here (the split tuning database's input: "
                    "python -m tilefly.ops.mx_gemm.split_tuning FILE)")
    ap.add_argument("--commit", default="unknown", help="the commit measured, recorded in --json")
    args = ap.parse_args()
    if args.host_profile:
        return host_profile(args.fmt.split(",")[0], (args.shape or SHAPES)[0])

    import tilefly
    from tilefly.bench.timing import QUICK, back_to_back_us, measure
    from tilefly.ops.mx_gemm import configs, eligibility, launch, split_tuning

    tilefly.enable()
    policy = replace(QUICK, headstart_us=args.headstart_us)
    chosen_splits: list[int] = []
    forced: list[int | None] = [None]
    timed_rows: list[dict] = []
    steer_splits(forced, chosen_splits)
    profile: list = []
    for fmt in args.fmt.split(","):
        for shape in args.shape or SHAPES:
            m, n, k = (int(v) for v in shape.split("x"))
            a, b = operands(m, n, k, fmt)
            ref = torch.randn(m, k, device="cuda", dtype=torch.bfloat16), torch.randn(n, k, device="cuda",
                                                                                     dtype=torch.bfloat16)
            bf16_us = measure(lambda: torch.mm(ref[0], ref[1].t()), QUICK).median_us
            w_bytes = b.nbytes
            p = eligibility.parse(a.data, b.data.t(), a.scale, b.scale, False, False)
            out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            rows, cols = max(m, n), min(m, n)
            picked = configs.pick(rows, cols, k, fmt)
            print(f"\n{fmt} {shape}: bf16 mm {bf16_us:.1f} us ({n * k * 2 / bf16_us / 1e6:.2f} TB/s); "
                  f"MX weight {w_bytes / 1e6:.1f} MB; pick {picked.name}", flush=True)
            if args.picked:
                base, more = [replace(picked, max_splits=32)], []
                if args.expanded and picked.fold_y:
                    more = [replace(picked, max_splits=32, expanded_y=1)]
            else:
                base, more = variants(rows, cols, k, fmt, tuple(int(v) for v in args.kernels.split(",")))
                if args.only:
                    base, more = [c for c in base if args.only in c.name], [c for c in more if args.only in c.name]
            best = None
            for cfg in base + more:
                least = cfg.min_splits(k)
                for splits in [None if v == "auto" else int(v) for v in args.splits.split(",")]:
                    if splits is not None and splits < least:
                        continue    # the launcher raises it to ``least``: a staged program holds scale_slots slots
                    forced[0] = splits
                    launch._plans.clear()
                    chosen_splits.clear()
                    try:
                        fn = (lambda cfg=cfg: launch.run(p, a.data, b.data.t(), a.scale, b.scale, out, cfg=cfg))
                        if cfg.expanded_y:
                            fn = _with_expanded(fn, a, args.group_blocks)
                        fn()
                        torch.cuda.synchronize()
                        if cfg.expanded_y and splits is None:
                            host, _ = back_to_back_us(fn, 20, 300)
                            print(f"  {cfg.name}: host {host:.1f} us/call (back to back)")
                        if cfg.expanded_y:   # the same bits as the picked build's
                            launch.run(p, a.data, b.data.t(), a.scale, b.scale, ref_out := torch.empty_like(out))
                            torch.cuda.synchronize()
                            print(f"  {cfg.name}: output {'equals' if torch.equal(out, ref_out) else 'DIFFERS FROM'} "
                                  f"the picked build's")
                        us = measure(fn, policy).median_us
                    except Exception as exc:  # noqa: BLE001 - report and go on
                        print(f"  {cfg.name} splits={splits}: {type(exc).__name__}: {str(exc)[:120]}")
                        continue
                    s = max(chosen_splits[-1], least) if chosen_splits else "?"
                    tag = "auto" if splits is None else "    "
                    if s != "?":
                        timed_rows.append({"fmt": fmt, "build": split_tuning.build_name(cfg), "rows": rows,
                                           "cols": cols, "k": k, "splits": s, "us": round(us, 3),
                                           "auto": splits is None,
                                           "picked": split_tuning.build_name(replace(cfg, expanded_y=0))
                                           == split_tuning.build_name(picked)})
                    print(f"  {us:7.1f} us  {w_bytes / us / 1e6:5.2f} TB/s  x bf16 {bf16_us / us:4.2f}  "
                          f"{cfg.name:<24} splits={s} {tag}", flush=True)
                    if best is None or us < best[0]:
                        best = (us, cfg, splits)
                    if splits is not None and splits >= k // cfg.block_k:
                        break
            forced[0] = None
            print(f"  best {best[0]:.1f} us {best[1].name} splits={best[2]}")
            # host cost per eager call: back to back, L2 warm
            eager = _eager_call(a, b)
            launch._plans.clear()
            for f, name in ((eager, "F.scaled_mm"), (lambda: torch.mm(ref[0], ref[1].t()), "torch.mm")):
                host, wall = back_to_back_us(f, 20, 500)
                print(f"  {name:<12} host {host:6.1f} us/call, wall {wall:6.1f} us/call (back to back, L2 warm)")
            profile.append((f"{fmt} {shape} pick", lambda picked=picked, p=p, a=a, b=b, out=out:
                            launch.run(p, a.data, b.data.t(), a.scale, b.scale, out, cfg=picked)))
            profile.append((f"{fmt} {shape} best", lambda best=best, p=p, a=a, b=b, out=out:
                            _forced_run(launch, forced, p, a, b, out, best)))
    if args.json:
        props = torch.cuda.get_device_properties(0)
        with open(args.json, "w") as f:
            json.dump({"gpu": props.name, "capability": [props.major, props.minor], "torch": torch.__version__,
                       "commit": args.commit, "rows": timed_rows}, f, indent=1)
    if args.profile:
        launch._plans.clear()
        for _, fn in profile:
            fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        for label, fn in profile:
            torch.cuda.nvtx.range_push(label)
            fn()
            torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


def _with_expanded(fn, a, group_blocks=None):
    """``fn`` run with the activation's expanded copy (fold groups of ``group_blocks``) on offer
    (tilefly.mx.expanded)."""
    from tilefly.mx import expanded

    bits = a.data.view(torch.uint8)
    copy = expanded.expand_rows_ops(bits, a.scale.view(torch.uint8), group_blocks)
    return lambda: expanded.offering(fn, bits, *copy)


def _eager_call(a, b):
    import torch.nn.functional as F

    blockwise, layout = F.ScalingType.BlockWise1x32, F.SwizzleType.NO_SWIZZLE
    return lambda: F.scaled_mm(a.data, b.data.t(), a.scale, blockwise, b.scale, blockwise, swizzle_a=layout,
                               swizzle_b=layout, output_dtype=torch.bfloat16)


def host_profile(fmt: str, shape: str) -> None:
    import cProfile
    import pstats

    import tilefly
    from tilefly.bench.timing import back_to_back_us

    tilefly.enable()
    m, n, k = (int(v) for v in shape.split("x"))
    call = _eager_call(*operands(m, n, k, fmt))
    print(f"{fmt} {shape}: F.scaled_mm host {back_to_back_us(call, 50, 2000)[0]:.1f} us/call")
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for _ in range(2000):
        call()
    prof.disable()
    host = (time.perf_counter() - t0) / 2000 * 1e6
    torch.cuda.synchronize()
    print(f"{fmt} {shape}: F.scaled_mm host {host:.1f} us/call under cProfile")
    pstats.Stats(prof).sort_stats("tottime").print_stats(30)
    pstats.Stats(prof).sort_stats("cumulative").print_stats(40)


def _forced_run(launch, forced, p, a, b, out, best):
    forced[0] = best[2]
    try:
        return launch.run(p, a.data, b.data.t(), a.scale, b.scale, out, cfg=best[1])
    finally:
        forced[0] = None


if __name__ == "__main__":
    main()

"""Head-dim-512 attention backward: bwd512 (cuBLAS batched GEMMs around a Triton kernel) against
bwd512g (all Gluon: the scores kernel and tilefly's grouped GEMM, kernels_bwd512g), BF16, on the
attention suite's head-dim-512 cases (tilefly/bench/cases/attention.csv), plus a GQA variant.

    PYTHONPATH=. python scripts/attn512_bwd_sweep.py [--cases 15,16] [--gqa 2] [--dtype fp16] [--json PATH]

Why: the tuner times both configs per workload; this says where bwd512g is right and what its
parts cost (``--extra`` adds shapes off the suite, e.g. lengths off the tile; ``--kmajor-copy
torch,triton`` times bwd512g with each K-major copy there). Both configs run
on the same forward output and lse (tilefly's d512 forward). bwd512g's gradients are checked
against bwd512's (relative norm of the difference, per gradient), so a fast but wrong run shows as
such; a case bwd512g does not serve prints kernels_bwd512g.unserved's reason (kernels.backward
then runs bwd512 under the bwd512g name). ``--parts`` also times the scores kernel and the three
grouped GEMMs of the first chunk on their own. ``--causal-blocks 1,2,4,8`` also times bwd512g
with each forced causal block count (causal, one q head per kv head; 1: the full products) next to
the count its wave model picks (kernels_bwd512g.causal_edges), to refit SM_TFLOPS and LAUNCH_US.
Timing: tilefly.bench.timing.measure (CUDA events, L2 flushed before each call, median).
"""
import argparse
import json
import math

import torch

from tilefly.bench import timing
from tilefly.bench.suites.attention import cases as attention_cases
from tilefly.ops.attention import kernels, kernels_bwd512, kernels_bwd512g

POLICY = timing.Policy(min_reps=10, target_ms=60.0, max_reps=100)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def suite_cases():
    """(index, B, H, S, causal) of attention.csv at head dim 512."""
    return [(case.index, c["batch"], c["heads"], c["seqlen"], bool(c["causal"]))
            for case in attention_cases() for c in (case.columns,) if c["head_dim"] == 512]


def bwd_flops(b, hq, s, causal):
    """Five products of 2 * S * S * 512 per (batch, q head), halved when causal (useful work)."""
    return 5 * 2 * b * hq * s * s * 512 * (0.5 if causal else 1.0)


def parts(grad_out, q, k, v, out, lse, causal):
    """([(name, Timing)] of the first chunk's scores kernel, its three grouped GEMMs and the K-major
    copies of B (inner sizes off BLOCK_K only)], the whole call's host time in us (no sync))."""
    import time

    pb = kernels_bwd512.prepare(grad_out, q, k, v, out, lse, None, None)
    n, rows = kernels_bwd512g.chunks(pb.groups, pb.group_rows, pb.sk, kernels_bwd512.WORKSPACE_BYTES)
    sk, d = pb.sk, 512
    ws = torch.empty(3, n * max(sk * kernels_bwd512g._padded(rows), rows * kernels_bwd512g._padded(sk)),
                     dtype=q.dtype, device=q.device)
    pt, dst, ds = kernels_bwd512g._workspace(ws, n, rows, sk)
    q_blk, do_blk, k_blk, v_blk = pb.qs[:n, :rows], pb.dos[:n, :rows], pb.ks[:n], pb.vs[:n]
    do_b, q_b, k_b = (kernels_bwd512g._b_operand(t) for t in (do_blk, q_blk, k_blk))
    dq = torch.empty(n * rows, d, dtype=q.dtype, device=q.device)
    dkv = torch.empty(n * sk, d, dtype=q.dtype, device=q.device)
    steps = {
        "scores": lambda: kernels_bwd512g._launch_scores(pb, 0, 0, q_blk, do_blk, k_blk, v_blk, pt, dst, ds, causal),
        "dV=P^T dO": lambda: kernels_bwd512g._gemm(pt.view(n * sk, rows), do_b, n, dkv),
        "dK=dS^T Q": lambda: kernels_bwd512g._gemm(dst.view(n * sk, rows), q_b, n, dkv),
        "dQ=dS K": lambda: kernels_bwd512g._gemm(ds.view(n * rows, sk), k_b, n, dq),
    }
    if rows % 64 or sk % 64:
        steps["K-major copies"] = lambda: [kernels_bwd512g._b_operand(t) for t in (do_blk, q_blk, k_blk)]
    results = [(name, timing.measure(fn, POLICY)) for name, fn in steps.items()]
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(20):
        kernels.backward(grad_out, q, k, v, out, lse, causal, None, "bwd512g")
    host_us = (time.perf_counter() - start) / 20 * 1e6
    torch.cuda.synchronize()
    return results, host_us


def forced_blocks(grad_out, q, k, v, out, lse, counts, want):
    """(name, Timing) of bwd512g's causal backward at each forced block count (checked against
    ``want``, bwd512's gradients); the name marks the count the wave model picks for the first chunk."""
    n = kernels_bwd512g.chunks(q.shape[0] * k.shape[1], q.shape[2], k.shape[2], kernels_bwd512.WORKSPACE_BYTES)[0]
    edges = kernels_bwd512g.causal_edges(n, q.shape[2], k.shape[2], torch.cuda.get_device_properties(q.device)
                                         .multi_processor_count)
    picked = 1 if edges is None else len(edges) - 1
    results = []
    for count in (int(c) for c in counts.split(",")):
        def run(count=count):
            return kernels_bwd512g.backward512g(grad_out, q, k, v, out, lse, True, None, causal_blocks=count)
        worst = max(((g.double() - w.double()).norm() / w.double().norm()).item() for g, w in zip(run(), want))
        torch.cuda.synchronize()
        name = f"blocks {count}{' (model)' if count == picked else ''} vs bwd512 {worst:.1e}"
        results.append((name, timing.measure(run, POLICY)))
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", help="comma-separated attention.csv indices (default: all at head dim 512)")
    ap.add_argument("--gqa", type=int, default=2, help="also run each case with H / GQA kv heads (1: no GQA runs)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--parts", action="store_true", help="time bwd512g's scores kernel and GEMMs on their own")
    ap.add_argument("--causal-blocks", help="comma-separated forced causal block counts to time bwd512g with")
    ap.add_argument("--extra", action="append", default=[], metavar="B,H,S,CAUSAL",
                    help="also time this shape (e.g. 2,8,1000,1: lengths off the tile, K-major B copies)")
    ap.add_argument("--kmajor-copy", default=kernels_bwd512g.KMAJOR_COPY,
                    help="comma-separated K-major copies to time bwd512g with where lengths are off 64 "
                         "(kernels_bwd512g.KMAJOR_COPY: torch, triton)")
    ap.add_argument("--json")
    args = ap.parse_args()
    copies = args.kmajor_copy.split(",")
    configs = [("bwd512", "bwd512", None)] + [(f"bwd512g/{c}" if len(copies) > 1 else "bwd512g", "bwd512g", c)
                                               for c in copies]
    dtype = DTYPES[args.dtype]
    wanted = {int(x) for x in args.cases.split(",")} if args.cases else None
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  {POLICY.describe()}", flush=True)
    rows = []
    extra = [("x",) + tuple(int(x) for x in spec.split(",")) for spec in args.extra]
    for index, b, h, s, causal in suite_cases() + [(i, b, h, s, bool(c)) for i, b, h, s, c in extra]:
        if wanted is not None and index not in wanted and index != "x":
            continue
        for hk in dict.fromkeys((h, h // max(1, args.gqa))):
            g = torch.Generator(device="cuda").manual_seed(index if index != "x" else b * 1000003 + s)
            q = torch.randn(b, h, s, 512, device="cuda", dtype=dtype, generator=g)
            k, v = (torch.randn(b, hk, s, 512, device="cuda", dtype=dtype, generator=g) for _ in range(2))
            out, lse = kernels.forward(q, k, v, causal, None, True)
            grad_out = torch.randn_like(q)
            case = f"#{index} B{b} Hq{h} Hk{hk} S{s} {args.dtype} {'causal' if causal else 'full'}"
            reason = kernels_bwd512g.unserved(q, k)
            if reason:
                print(f"{case:<40} bwd512g not served: {reason}", flush=True)
            grads = {}
            times = {}
            for label, name, copy in configs:
                if copy is not None:
                    kernels_bwd512g.KMAJOR_COPY = copy

                def run(name=name):
                    return kernels.backward(grad_out, q, k, v, out, lse, causal, None, name)
                grads[label] = run()
                torch.cuda.synchronize()
                times[label] = timing.measure(run, POLICY)
            kernels_bwd512g.KMAJOR_COPY = copies[0]
            base = times["bwd512"].median_us
            for name, t in times.items():
                errs = {n: ((a.double() - w.double()).norm() / w.double().norm()).item()
                        for n, a, w in zip(("dq", "dk", "dv"), grads[name], grads["bwd512"])}
                row = dict(case=case, config=name, served=reason is None, median_us=t.median_us, p20_us=t.p20_us,
                           p80_us=t.p80_us, tflops=bwd_flops(b, h, s, causal) / t.median_us / 1e6,
                           speedup=base / t.median_us, **({"vs_bwd512": errs} if name != "bwd512" else {}))
                rows.append(row)
                worst = max(errs.values())
                note = ""
                if name != "bwd512":
                    bad = not math.isfinite(worst) or worst > (2e-2 if dtype == torch.bfloat16 else 5e-3)
                    note = f"  vs bwd512 {' '.join(f'{n} {e:.1e}' for n, e in errs.items())}{'  WRONG' if bad else ''}"
                print(f"{case:<40} {name:<14} {t.median_us:9.1f} us  (p20 {t.p20_us:8.1f} p80 {t.p80_us:8.1f})  "
                      f"{row['tflops']:6.1f} TFLOP/s  x{row['speedup']:4.2f}{note}", flush=True)
            if args.parts and reason is None:
                timed, host_us = parts(grad_out, q, k, v, out, lse, causal)
                for name, t in timed:
                    rows.append(dict(case=case, part=name, median_us=t.median_us))
                    print(f"{'':<40}   {name:<14} {t.median_us:9.1f} us (first chunk)", flush=True)
                rows.append(dict(case=case, part="host enqueue", median_us=host_us))
                print(f"{'':<40}   {'host enqueue':<14} {host_us:9.1f} us (whole call, no sync)", flush=True)
            if args.causal_blocks and reason is None and causal and hk == h:
                for name, t in forced_blocks(grad_out, q, k, v, out, lse, args.causal_blocks, grads["bwd512"]):
                    rows.append(dict(case=case, part=name, median_us=t.median_us))
                    print(f"{'':<40}   {name:<22} {t.median_us:9.1f} us", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(rows=rows, policy=POLICY.describe()), f, indent=1)


if __name__ == "__main__":
    main()

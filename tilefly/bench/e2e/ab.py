"""A/B driver: one model, one precision, several concurrencies; side A and side B share the
process, the weights, the prompts and (per concurrency) the KV cache.

- A: Inductor GEMM backends ``ATEN,TRITON``, tilefly disabled; MX layers on the stock Hopper
  path (``MXLinear.backend = "dequant"``: dequantize to BF16, then ``torch.mm``).
- B: ``ATEN,TRITON,TILEFLY`` with ``tilefly.enable()`` (every default family: the GEMM candidates,
  and in eager fallbacks of the graph attention and MX GEMMs); MX layers call ``F.scaled_mm``.

Per concurrency and side: reset Dynamo, compile and autotune on a short untimed run (its wall
time is ``compile_s``; it also captures the first steps' logits), then ``runs`` timed
generations (the fastest is kept). A and B must agree: logits of the prefill and the first
decode steps within ``tol`` (relative to the largest reference logit; by default the precision's
``models.DEFAULT_TOL``), compared only on the rows whose earlier tokens agree (a near-tie flipped
by rounding is not an error, but later steps of that row are then different sequences).

With one side only (``sides=(SIDE_A,)``, the CLI's ``--side``) each row also keeps that side's
logits record (``check``), which the merge compares with the other side's (see split.py).
"""
from __future__ import annotations

import contextlib
import os
import sys
import traceback
from dataclasses import asdict, dataclass
from typing import Any, Iterator

import torch

from tilefly import config, ops
from tilefly.bench.e2e import engine, models, picks, split
from tilefly.bench.e2e import profile as e2e_profile
from tilefly.bench.runner import short

DEFAULT_CONCURRENCIES = (8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class Side:
    name: str
    backends: str                 # Inductor's max_autotune_gemm_backends
    tilefly_ops: tuple[str, ...]  # families enabled for this side (() = tilefly disabled)
    mx_backend: str               # MXLinear.backend for MX precisions


SIDE_A = Side("A", "ATEN,TRITON", (), "dequant")
SIDE_B = Side("B", "ATEN,TRITON,TILEFLY", ops.defaults(), "scaled_mm")


@contextlib.contextmanager
def side_context(side: Side, model: torch.nn.Module, compiled: bool, exact_casts: bool = False) -> Iterator[None]:
    """tilefly enabled exactly for ``side.tilefly_ops``, MX layers on ``side.mx_backend`` and, when
    compiling, Inductor's autotuning over ``side.backends`` (``exact_casts``: and Inductor rounding
    every intermediate cast as eager mode does); tilefly's previous state restored after."""
    import tilefly

    before = tilefly.enabled_ops()
    tilefly.disable()
    try:
        if side.tilefly_ops:
            tilefly.enable(list(side.tilefly_ops))
        models.set_mx_backend(model, side.mx_backend)
        with contextlib.ExitStack() as stack:
            if compiled:
                from tilefly.bench.inductor import autotune

                stack.enter_context(autotune(side.backends))
                if exact_casts:
                    from torch._inductor import config as inductor_config

                    stack.enter_context(inductor_config.patch(emulate_precision_casts=True))
            yield
    finally:
        tilefly.disable()
        if before:
            tilefly.enable(list(before))


def phase_metrics(gen: engine.Generation, batch: int) -> dict[str, float]:
    """Throughput figures of one timed generation (``tok_s`` counts prefill time too)."""
    steps = gen.tokens.shape[1]
    decode_steps = max(steps - 1, 1)
    return {"prefill_s": gen.prefill_s, "decode_s": gen.decode_s,
            "tok_s": batch * steps / gen.total_s,
            "decode_tok_s": batch * (steps - 1) / gen.decode_s if steps > 1 and gen.decode_s > 0 else 0.0,
            "tpot_ms": 1000.0 * gen.decode_s / decode_steps,
            "ttft_ms": 1000.0 * gen.prefill_s}


def logits_agreement(ref: list[torch.Tensor], test: list[torch.Tensor], ref_tokens: torch.Tensor,
                     test_tokens: torch.Tensor, tol: float) -> dict[str, Any]:
    """Compare captured logits step by step on rows whose tokens before that step agree.
    ``rel_err[s]`` = max |test - ref| / max |ref| over those rows (None when no row is left)."""
    rel_err: list[float | None] = []
    rows_compared: list[int] = []
    top1 = []
    ref_tokens, test_tokens = ref_tokens.cpu(), test_tokens.cpu()
    for s, (r, t) in enumerate(zip(ref, test)):
        same_prefix = (ref_tokens[:, :s] == test_tokens[:, :s]).all(dim=1)
        rows_compared.append(int(same_prefix.sum()))
        if not same_prefix.any():
            rel_err.append(None)
            continue
        r_rows, t_rows = r[same_prefix].double(), t[same_prefix].double()
        scale = r_rows.abs().max().clamp_min(1e-30)
        rel_err.append(float((t_rows - r_rows).abs().max() / scale))
        top1.append(float((r_rows.argmax(-1) == t_rows.argmax(-1)).double().mean()))
    return split.agreement_summary(rel_err, rows_compared, top1, ref_tokens == test_tokens, tol)



def _changed_options() -> dict[str, Any]:
    """tilefly options (tilefly.config) this process runs with away from their defaults."""
    return {opt.name: getattr(config, opt.name) for opt in config.OPTIONS
            if opt.name not in ("log_level", "ops") and getattr(config, opt.name) != opt.default}


def _compile_counters() -> dict[str, int]:
    """Dynamo graphs compiled and Inductor's CUDA-graph skips so far: a decode step that fell out of
    its CUDA graph (a mutated input, a CPU tensor) or split at a graph break shows here."""
    from torch._dynamo.utils import counters

    return {"graphs": int(counters["stats"]["unique_graphs"]),
            "cudagraph_skips": int(counters["inductor"]["cudagraph_skips"])}


def run_side(model, cache, side: Side, prompts: torch.Tensor, output_len: int, compile_mode: str | None,
             runs: int, capture: int, compile_prefill: bool = True, code_path: str | None = None,
             profile_steps: int = 0, exact_casts: bool = False) -> tuple[dict[str, Any], engine.Generation,
                                                                         engine.Generation]:
    """(metrics, the fastest timed generation, the capturing warm-up generation) of one side;
    ``code_path``: where to write Inductor's generated wrapper code of its graphs (which kernel
    each GEMM call site got); ``profile_steps`` > 0: after the timed runs, profile that many
    decode steps (metrics["profile"], see profile.py); ``exact_casts``: see ``run_ab``."""
    batch, input_len = prompts.shape
    compiled = compile_mode is not None
    if compiled:
        torch._dynamo.reset()  # a fresh compile: the other side's graphs and autotune picks are dropped
    with side_context(side, model, compiled, exact_casts):
        eng = engine.Engine(model, cache, batch, input_len, output_len, compile_mode=compile_mode,
                            compile_prefill=compile_prefill)
        before = _compile_counters()
        with (picks.capture_code() if compiled else contextlib.nullcontext([]) as codes,
              picks.record_races() if compiled else contextlib.nullcontext([]) as races):
            warm = eng.generate(prompts, steps=min(output_len, max(engine.WARM_STEPS, capture)), capture=capture)
        compile_stats = {k: v - before[k] for k, v in _compile_counters().items()}
        timed = [eng.generate(prompts) for _ in range(max(1, runs))]
        profile = e2e_profile.profile_decode(eng, prompts, profile_steps) if profile_steps > 0 else None
    best = min(timed, key=lambda g: g.total_s)
    metrics = phase_metrics(best, batch)
    metrics["compile_s"] = warm.total_s
    if compiled:
        metrics["picks"] = picks.picks(codes)
        if races:
            metrics["picks"]["races"] = races
        metrics.update(compile_stats)
        if code_path and codes:
            with open(code_path, "w", encoding="utf-8") as f:
                f.write("\n\n".join(codes))
    metrics["runs"] = len(timed)
    if profile is not None:
        suspects = e2e_profile.kernel_sources(codes, [k["name"] for k in e2e_profile.slow_fused(profile)])
        if suspects:
            profile["slow_fused_sources"] = suspects
        metrics["profile"] = profile
    return metrics, best, warm


def run_ab(model_name: str, precision: str, concurrencies: list[int], input_len: int = 256,
           output_len: int = 512, device: str = "cuda", compile_mode: str | None = "max-autotune",
           runs: int = 1, compare_steps: int = 4, tol: float | None = None, seed: int = 0,
           sides: tuple[Side, ...] = (SIDE_A, SIDE_B), dtype: torch.dtype = torch.bfloat16,
           compile_prefill: bool = True, log=sys.stderr, code_dir: str | None = None,
           profile_steps: int = 0, attention: str = "grouped", mx_swizzle: str = "none",
           exact_casts: bool = False) -> dict[str, Any]:
    """Run A and B (or the one side in ``sides``) at each concurrency; returns the run's JSON-ready
    record (see report.py). ``code_dir``: keep each side's generated wrapper code there, one file
    per concurrency; ``profile_steps``: see ``run_side``; ``attention``: see attention.py; ``mx_swizzle``:
    the MX scales' layout (both sides; activation scales are rearranged into it every step);
    ``exact_casts``: both sides compile with Inductor's ``emulate_precision_casts``, so fused kernels
    round to BF16 where eager mode does (the MX logits check's setting). Without it side A's fused ops
    may quantize the unrounded FP32 value of an activation that side B, whose quantization is an
    opaque op, gets rounded; one MX rounding step apart then grows layer by layer."""
    tol = models.DEFAULT_TOL[precision] if tol is None else tol
    model = models.build_model(model_name, dtype=dtype, device=device, seed=seed, attention=attention)
    swapped = models.apply_precision(model, precision, backend=sides[0].mx_backend, swizzle=mx_swizzle)
    weights_sha = split.weights_sha(model)
    rows = []
    for batch in concurrencies:
        print(f"[e2e] {model_name} {precision} concurrency {batch}", file=log, flush=True)
        cache = engine.new_cache(model, batch, input_len + output_len)
        prompts = split.prompts(model.config.vocab_size, batch, input_len, seed)
        row: dict[str, Any] = {"concurrency": batch, "prompts_sha": split.digest(prompts)}
        prompts = prompts.to(device)
        outs = {}
        for side in sides:
            try:
                code_path = None if code_dir is None else os.path.join(
                    code_dir, f"code_{model_name}_{precision}_c{batch}_{side.name}.py")
                metrics, best, warm = run_side(model, cache, side, prompts, output_len, compile_mode, runs,
                                               compare_steps, compile_prefill, code_path, profile_steps,
                                               exact_casts)
                row[side.name] = metrics
                outs[side.name] = (best, warm)
                print(f"[e2e]   {side.name}: {metrics['tok_s']:.1f} tok/s, TPOT {metrics['tpot_ms']:.3f} ms, "
                      f"compile {metrics['compile_s']:.1f} s", file=log, flush=True)
                if "profile" in metrics:
                    print(f"[e2e]   {side.name}: {e2e_profile.describe(metrics['profile'])}", file=log, flush=True)
            except Exception as exc:  # noqa: BLE001 - one side failing is a result; the other still runs
                traceback.print_exc(file=log)
                row[side.name] = {"error": short(exc, limit=300)}
        a, b = sides[0].name, sides[-1].name
        if len(sides) == 1 and a in outs:
            best, warm = outs[a]
            row["check"] = {a: split.side_check(warm.tokens, warm.logits, best.tokens)}
        elif len(sides) == 2 and a in outs and b in outs:
            (a_best, a_warm), (b_best, b_warm) = outs[a], outs[b]
            row["agreement"] = logits_agreement(a_warm.logits, b_warm.logits, a_warm.tokens, b_warm.tokens, tol)
            row["agreement"]["timed_token_match"] = float((a_best.tokens == b_best.tokens).double().mean())
            row["speedup"] = row[b]["tok_s"] / row[a]["tok_s"]
        if "picks" in row.get("B", {}):
            row["winners"] = picks.describe(row["B"]["picks"])
        rows.append(row)
        del cache, outs
        if compile_mode is not None:
            torch._dynamo.reset()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    record = {"kind": "tilefly-e2e", "schema": 1, "model": model_name, "precision": precision,
              "input_len": input_len, "output_len": output_len, "runs": runs,
              "compile_mode": compile_mode if compile_prefill or compile_mode is None
              else f"{compile_mode} (decode only)",
              "device": str(device), "dtype": str(dtype).replace("torch.", ""), "swapped_linears": len(swapped),
              "seed": seed, "attention": attention, "compare_steps": compare_steps, "tol": tol,
              **({} if precision == "bf16" else {"mx_swizzle": mx_swizzle}),
              "weights_sha": weights_sha,
              **({"tilefly_options": options} if (options := _changed_options()) else {}),
              **({"inductor_options": {"emulate_precision_casts": True}} if exact_casts and compile_mode else {}),
              "model_config": asdict(models.spec(model_name)),
              "sides": {s.name: asdict(s) for s in sides}, "rows": rows}
    if len(sides) == 1:
        record["side"] = sides[0].name
    return record

"""How far a random-weight Llama's logits move when only the GEMMs' summation order changes: the
e2e A/B's MXFP8 logits check fails (BENCHMARKS.md sessions 25-26) while its layers agree with the
stock path within about one BF16 ulp. Hypothesis: MX models quantize every layer's input on the
fly, so a one-ulp difference that crosses an E4M3 (or E2M1) rounding boundary becomes a whole FP8
step, layer after layer.

Two runs of the same model (CPU, BF16, the e2e's Llama-3.1-8B or Qwen3-32B shapes with fewer layers), each
GEMM computed as (1) torch.mm, (2) the same product with K in two halves summed in FP32 and
rounded once: the same math, another order, like two GPU kernels. ``--perturb attention`` changes
attention instead: SDPA computed in FP32 and rounded once (a few BF16 ulps from the BF16 result).
MX layers run MXLinear's "dequant" backend (exact BF16 operands). Same prompts, teacher-forced with
run 1's tokens, so only numerics differ. Prints max |logits(2) - logits(1)| / max |logits(1)| and
top-1 agreement per step.

    python scripts/mx_order_sensitivity.py [--model qwen3-32b] [--layers 2 4] [--steps 3] [--batch 4]
                                           [--prompt 16] [--perturb attention]
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
from unittest import mock

import torch
import torch.nn.functional as F

from tilefly.bench.e2e import engine, models

_mm = torch.mm


def _two_halves(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    k = a.shape[1] // 2
    out = a[:, :k].float() @ b[:k].float()
    out += a[:, k:].float() @ b[k:].float()
    return out.to(a.dtype)


def reordered_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _two_halves(a, b) if a.dim() == 2 and a.shape[1] >= 64 else _mm(a, b)


def reordered_addmm(bias, a, b):
    return (bias.float() + _two_halves(a, b).float()).to(a.dtype)


def reordered_linear(x, weight, bias=None):
    rows, w = x.reshape(-1, x.shape[-1]), weight.t()
    out = _two_halves(rows, w) if bias is None else reordered_addmm(bias, rows, w)
    return out.reshape(*x.shape[:-1], weight.shape[0])


_sdpa = F.scaled_dot_product_attention


def fp32_sdpa(query, key, value, *args, **kwargs):
    """SDPA computed in FP32 and rounded once: a few BF16 ulps from the BF16 kernel's result (random
    inputs: 27% of the outputs differ, by up to 7 ulps), as two attention kernels differ."""
    return _sdpa(query.float(), key.float(), value.float(), *args, **kwargs).to(query.dtype)


@contextlib.contextmanager
def attention_in_fp32():
    with mock.patch.object(F, "scaled_dot_product_attention", fp32_sdpa):
        yield


@contextlib.contextmanager
def reordered():
    with mock.patch.object(torch, "mm", reordered_mm), mock.patch.object(torch, "addmm", reordered_addmm), \
            mock.patch.object(F, "linear", reordered_linear):
        yield


def run(model, prompts, forced, steps, order):
    """Logits of the prefill and ``steps - 1`` teacher-forced decode steps."""
    batch, length = prompts.shape
    cache = engine.new_cache(model, batch, length + steps)
    logits = []
    with torch.inference_mode(), order():
        out = model(input_ids=prompts, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
        logits.append(out.float())
        for i in range(1, steps):
            ids = forced[:, i - 1:i]
            out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
            logits.append(out.float())
    return logits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.1-8b", choices=("llama-3.1-8b", "qwen3-32b"),
                        help="whose shapes the shallow model takes (its layers cut to --layers)")
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--precisions", nargs="+", default=["bf16", "mxfp8", "mxfp4"])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--perturb", choices=("order", "attention"), default="order",
                        help="what the second run changes: the GEMMs' summation order, or attention computed in FP32")
    args = parser.parse_args()
    perturbed = reordered if args.perturb == "order" else attention_in_fp32
    print(f"{'precision':<9} {'layers':>6}  per step: max|d|/max|ref| (top-1 agreement)")
    for layers in args.layers:
        for precision in args.precisions:
            shallow = dataclasses.replace(models.spec(args.model), num_hidden_layers=layers)
            with mock.patch.dict(models.MODELS, {args.model: shallow}):
                model = models.build_model(args.model, dtype=torch.bfloat16, device="cpu", seed=0)
            models.apply_precision(model, precision, backend="dequant")
            g = torch.Generator().manual_seed(1)
            prompts = torch.randint(0, model.config.vocab_size, (args.batch, args.prompt), generator=g)
            forced = torch.randint(0, model.config.vocab_size, (args.batch, args.steps), generator=g)
            ref = run(model, prompts, forced, args.steps, contextlib.nullcontext)
            test = run(model, prompts, forced, args.steps, perturbed)
            cells = []
            for r, t in zip(ref, test):
                err = ((t - r).abs().max() / r.abs().max()).item()
                top1 = (t.argmax(-1) == r.argmax(-1)).double().mean().item()
                cells.append(f"{err:.1e} ({100 * top1:.0f}%)")
            print(f"{precision:<9} {layers:>6}  " + "  ".join(cells), flush=True)
            del model


if __name__ == "__main__":
    main()

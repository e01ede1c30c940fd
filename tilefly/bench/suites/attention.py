"""attention: ``F.scaled_dot_product_attention`` on the 18 cases of attention.csv (BF16,
self-attention B x H x S x D, no mask, no dropout), forward (``fwd``) and forward+backward
(``fwd+bwd``: the forward with inputs requiring grad, then ``torch.autograd.grad`` of a random
output gradient).

Providers per mode, timed in this order: ``default`` (PyTorch's own backend selection; the note
names the backend it reached), ``tilefly`` (default selection inside
``tilefly.enabled("attention")``, the router's decision recorded) once that family exists, then
``cudnn``, ``flash``, ``efficient`` (each forced with ``sdpa_kernel([SDPBackend.X])``; a backend
that refuses the case is "n/a" with PyTorch's reason). TFLOP/s: forward 4*B*H*S^2*D,
forward+backward 3.5x that; halved when causal."""
from __future__ import annotations

import contextlib
import re
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

from tilefly.bench import hooks
from tilefly.bench.cases import Case, read_csv
from tilefly.bench.results import Comparison
from tilefly.bench.runner import CaseBench, Plan, Provider, Suite
from tilefly.bench.suites._common import baseline_only, randn, tflops

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}
MODES = ("fwd", "fwd+bwd")
_TRIGGERED = re.compile(r"\s*\(Triggered internally at [^)]*\)\.?\s*$")
BACKWARD_FACTOR = 2.5  # backward FLOPs per forward FLOP (five matmuls against two)


def cases() -> list[Case]:
    out = []
    for i, row in enumerate(read_csv("attention.csv")):
        cols = {"batch": int(row["batch"]), "heads": int(row["heads"]), "seqlen": int(row["seqlen"]),
                "head_dim": int(row["head_dim"]), "causal": row["causal"].strip() == "1"}
        ident = f"b{cols['batch']}h{cols['heads']}s{cols['seqlen']}d{cols['head_dim']}"
        ident += "_causal" if cols["causal"] else ""
        out.append(Case(i, ident, cols))
    return out


class _BackendSeen(TorchDispatchMode):
    """Which SDPA backend op a call reached (the op names carry the backend)."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name()
        if "_scaled_dot_product_" in name and "backward" not in name:
            self.seen.append(name.split("_scaled_dot_product_")[1].split(".")[0].replace("_attention", ""))
        return func(*args, **(kwargs or {}))


def forced(backend: SDPBackend):
    @contextlib.contextmanager
    def context():
        with sdpa_kernel([backend]), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # refusals warn their reasons; check_refusal reports them
            yield

    return context


def check_refusal(fn):
    """Call ``fn`` once; if SDPA refuses the case, raise with the reasons PyTorch warned about."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fn()
        except RuntimeError as exc:
            # PyTorch warns "<backend> kernel not used because:" and then the reasons, each
            # ending in "(Triggered internally at <file:line>.)".
            reasons = [_TRIGGERED.sub("", str(w.message)).strip() for w in caught]
            reasons = [r for r in dict.fromkeys(reasons)
                       if r and not r.endswith(":") and "has been runtime disabled" not in r]
            raise RuntimeError("; ".join(reasons) if reasons else str(exc)) from None
    return fn


def plan() -> Plan:
    missing = hooks.eager_family_missing("attention")

    def bench(case: Case) -> CaseBench:
        b, h, s, d, causal = (case.columns[key] for key in ("batch", "heads", "seqlen", "head_dim", "causal"))
        q, k, v = (randn(b, h, s, d) for _ in range(3))
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        dout = randn(b, h, s, d)

        def forward():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        def forward_backward():
            out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
            return torch.autograd.grad(out, (qg, kg, vg), dout)

        providers = []
        for mode, fn in (("fwd", forward), ("fwd+bwd", forward_backward)):
            seen = _BackendSeen()

            def build_default(fn=fn, seen=seen):
                with seen:
                    fn()
                return fn

            providers.append(Provider(f"default:{mode}", build_default,
                                      inspect=lambda seen=seen: f"reached {seen.seen[0]}" if seen.seen else None))
            # tilefly right after default: the forced backends run long on some cases (efficient
            # at head dim 256: 7 ms a call) and the clocks, which nobody locks, sag after them; the
            # provider timed next paid it (3-4 % on cuDNN's own d256 kernels, bench of bdfc88c).
            if missing is None:
                providers.append(Provider(f"tilefly:{mode}", lambda fn=fn: fn, family="attention",
                                          context=lambda: _tilefly_enabled("attention")))
            for name, backend in BACKENDS.items():
                providers.append(Provider(f"{name}:{mode}", lambda fn=fn: check_refusal(fn), context=forced(backend),
                                          error_label="n/a"))
        flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)

        def metrics(provider: str, us: float) -> dict[str, float]:
            factor = 1.0 + BACKWARD_FACTOR if provider.endswith(":fwd+bwd") else 1.0
            return {"TFLOP/s": tflops(flops * factor, us)}

        return CaseBench(providers, metrics)

    if missing:
        comparisons = [Comparison(f"{mode} {name}/default", f"{name}:{mode}", f"default:{mode}")
                       for mode in MODES for name in BACKENDS]
        return Plan(bench, comparisons, ["TFLOP/s"], [baseline_only(missing)])
    comparisons = []
    for mode in MODES:
        comparisons += [Comparison(f"{mode} tilefly/default", f"tilefly:{mode}", f"default:{mode}"),
                        Comparison(f"{mode} tilefly/cudnn", f"tilefly:{mode}", f"cudnn:{mode}"),
                        Comparison(f"d512 {mode} tilefly/default", f"tilefly:{mode}", f"default:{mode}",
                                   (("head_dim", 512),))]
    return Plan(bench, comparisons, ["TFLOP/s"])


def _tilefly_enabled(family: str):
    import tilefly

    return tilefly.enabled(family)


SUITE = Suite(
    name="attention",
    title="SDPA, BF16 self-attention B x H x S x D, no mask/dropout: forward and forward+backward",
    cases=cases,
    quick=(0, 7, 16),  # d64 non-causal, d128 causal 4k, d512 causal
    plan=plan,
)

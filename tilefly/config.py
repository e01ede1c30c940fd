"""Every tilefly option in one place.

Each option is a module attribute, read once from its ``TILEFLY_*`` environment
variable when tilefly is imported and changeable at run time::

    import tilefly.config as cfg
    cfg.on_error = "raise"          # or TILEFLY_ON_ERROR=raise
    cfg.reload()                    # re-read the environment

``describe()`` lists every option with its variable, value and meaning.
"""
from __future__ import annotations

import logging
import os
import sys
import types
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["OPTIONS", "describe", "reload"]


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected a boolean (1/0, true/false, yes/no, on/off), got {text!r}")


def _on_off_auto(text: str) -> str:
    """"auto", or a boolean spelled any way _bool reads, as "on" / "off"."""
    value = text.strip().lower()
    if value == "auto":
        return value
    try:
        return "on" if _bool(value) else "off"
    except ValueError:
        raise ValueError(f"expected auto or a boolean (1/0, true/false, yes/no, on/off), got {text!r}") from None


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}, got {text!r}")
        return value

    return parse


def _ops(text: str) -> tuple[str, ...] | None:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    return names or None


def _log_level(text: str) -> str:
    value = text.strip().upper()
    if value not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ValueError(f"expected DEBUG, INFO, WARNING, ERROR or CRITICAL, got {text!r}")
    return value


def _path(text: str) -> str | None:
    return text.strip() or None


@dataclass(frozen=True)
class Option:
    name: str
    env: str
    parse: Callable[[str], Any]
    default: Any
    doc: str


OPTIONS: tuple[Option, ...] = (
    Option("disable", "TILEFLY_DISABLE", _bool, False,
           "Turn tilefly off entirely: enable() installs nothing and Inductor gets no TILEFLY candidates."),
    Option("ops", "TILEFLY_OPS", _ops, None,
           "Comma-separated op families enable() installs when called without ops= (default: all)."),
    Option("log_level", "TILEFLY_LOG_LEVEL", _log_level, "WARNING",
           "Level of the 'tilefly' logger; DEBUG logs every dispatch decision with its reason."),
    Option("on_error", "TILEFLY_ON_ERROR", _choice("fallback", "raise"), "fallback",
           "When a tilefly kernel raises: 'fallback' logs a warning and recomputes with ATen; 'raise' re-raises."),
    Option("force", "TILEFLY_FORCE", _bool, False,
           "Ignore performance bands (serve inputs where ATen is known to be faster); correctness limits stay."),
    Option("gemm_autotune", "TILEFLY_GEMM_AUTOTUNE", _choice("default", "exhaustive"), "default",
           "GEMM candidates offered to Inductor: the curated config list or every config that fits."),
    Option("gemm_race_timing", "TILEFLY_GEMM_RACE_TIMING", _choice("auto", "graph", "inductor"), "auto",
           "How Inductor's autotuning times a GEMM race that tilefly's candidates are in: 'graph' every "
           "candidate (tilefly's, ATen's, Triton's) as a CUDA graph replay of one call (GPU time only), "
           "'inductor' with Inductor's own events around a plain call (host time beyond its L2 flush counts "
           "too), 'auto' as 'graph' when Inductor runs its output as CUDA graphs (tilefly/_race_timing.py)."),
    Option("attention_db", "TILEFLY_ATTENTION_DB", _path, None,
           "Path of an attention tuning database to use instead of the shipped one."),
    Option("attention_routes", "TILEFLY_ATTENTION_ROUTES", _choice("auto", "all"), "auto",
           "SDPA backend ops the attention family overrides when enabled: 'auto' only those the tuning "
           "database serves with another implementation that saves an override's host cost and 20% of the "
           "op's time somewhere (an override costs host time on every call, served or not), 'all' every "
           "fused backend op."),
    Option("mx_requantize", "TILEFLY_MX_REQUANTIZE", _bool, False,
           "MX GEMMs of at least 4096 x 4096 with BF16 output: requantize both operands to one E4M3 scale "
           "per row and run PyTorch's row-scaled FP8 GEMM. Not exact: a block far below its row's largest "
           "scale loses low bits (scripts/mx_requant_error.py)."),
    Option("mx_upcast", "TILEFLY_MX_UPCAST", _choice("auto", "always", "never"), "auto",
           "MX GEMMs through BF16: both operands upcast by a tilefly kernel, then torch.mm (exact while a "
           "row's scales span at most 2^117; rows beyond BF16's range are rescaled). 'auto' takes it where M and N are both large enough "
           "for the product to outweigh the weight stream (ops/mx_gemm/upcast.py); 'always' and 'never' "
           "force the choice."),
    Option("attention_decode", "TILEFLY_ATTENTION_DECODE", _on_off_auto, "auto",
           "SDPA's masked forward calls of at most 16 query rows a head (a decode step over a static KV cache) "
           "through tilefly's split-KV decode kernel (ops/attention/decode.py), which reads only the keys up to "
           "the last unmasked one. 'auto': where the GPU's decode tuning database (ops/attention/decode_tuning.py) "
           "has it at most 0.9x SDPA's time for the nearest measured shape, so with no database nothing changes; "
           "'on': every eligible call; 'off': none. 'auto' with a database, and 'on', install the forward "
           "overrides of the cuDNN and efficient ops."),
    Option("mx_fused_quant", "TILEFLY_MX_FUSED_QUANT", _bool, True,
           "In compiled graphs, the MX quantization of an MX layer's input runs inside the kernel that makes "
           "that input: a residual add + RMSNorm before the q/k/v and gate/up projections "
           "(tilefly/mx/norm_fusion.py), an MLP's SiLU product before the down projection "
           "(tilefly/mx/silu_fusion.py), each one tilefly kernel instead of Inductor's kernel plus tilefly's "
           "quantization kernel; and a masked attention's output before o_proj, quantized inside tilefly's "
           "decode attention kernel wherever that kernel serves the call (tilefly/mx/attention_fusion.py). "
           "On by default: it raised Llama-3.1-8B MXFP4 decoding at 32 requests "
           "from 5457 to 5782-5809 tok/s on the H200 (two runs, BENCHMARKS.md session 38)."),
    Option("triton_autotune_timing", "TILEFLY_TRITON_AUTOTUNE_TIMING", _choice("inductor", "queued"), "queued",
           "How Inductor times the configs of its own Triton kernels (pointwise, reductions) while tilefly is "
           "enabled. 'inductor': its way, one launch from Python between events, the clones of in-place "
           "buffers inside them, which for a few-µs decode kernel measures mostly host time; 'queued': "
           "launches queued behind a spin kernel so that they run back to back, as in a CUDA graph, and "
           "a cache tag that keeps these picks apart from stock ones (tilefly/_kernel_timing.py). Read at "
           "enable(). 'queued' by default: it took BF16 Llama-3.1-8B decoding at 32 requests from 4756 to "
           "5171 tok/s on the H200 (its rope + KV-cache write kernel from 11.5 to 1.4 µs a call; "
           "BENCHMARKS.md session 39)."),
    Option("mx_expanded_activation", "TILEFLY_MX_EXPANDED_ACTIVATION", _bool, True,
           "With mx_fused_quant, the fused add + RMSNorm and SiLU-product MXFP4 quantization kernels also write "
           "the quantized rows expanded to FP8 in the MX GEMM's operand order (tilefly/mx/expanded.py) where the "
           "GEMMs reading them run a folded build (17-32 tokens), and those GEMMs (q/k/v, gate/up, down) take "
           "that copy instead of unpacking the FP4 nibbles in every program (kernels_v2, Y_EXPANDED; "
           "bit-identical results). On by default: Llama-3.1-8B MXFP4 decoding at 32 requests went from 6330 "
           "to 6573 tok/s on the H200, its MX GEMMs from 2983 to 2690 µs a step (BENCHMARKS.md session 42)."),
    Option("mx_pdl", "TILEFLY_MX_PDL", _bool, False,
           "Launch the MX activation quantization and the v2 / v4 MX GEMM kernels with programmatic dependent "
           "launch: each may start while the kernel ahead of it finishes, and waits for its results inside "
           "(griddepcontrol.wait). The quantizing kernels (also the fused norm and SiLU ones) let the GEMM "
           "launch at their start, and a v2 decode GEMM on an MXLinear's weight streams the weight's first "
           "ring slots in before its wait (tilefly/mx/weight_operand.py). Off: on the H200 neither version "
           "paid. Without the weight prefetch Llama-3.1-8B MXFP8 at 32 requests ran 4% slower end to end; with "
           "it MXFP4 at 32 requests ran 5665 tok/s against 5782 without PDL, and a 16-layer MXFP4 / MXFP8 MLP "
           "chain in a CUDA graph took 1.00-1.15x its time without PDL (scripts/mx_pdl_probe.py, "
           "BENCHMARKS.md session 39)."),
)

# Module attributes, filled by reload(); declared for readers and type checkers.
disable: bool
ops: tuple[str, ...] | None
log_level: str
on_error: str
force: bool
gemm_autotune: str
gemm_race_timing: str
attention_db: str | None
attention_routes: str
mx_requantize: bool
mx_upcast: str
attention_decode: str
mx_fused_quant: bool
mx_expanded_activation: bool
mx_pdl: bool
triton_autotune_timing: str


_BY_NAME = {opt.name: opt for opt in OPTIONS}


def reload() -> None:
    """Read every option from its environment variable (or its default)."""
    module = sys.modules[__name__]
    for opt in OPTIONS:
        raw = os.environ.get(opt.env)
        if raw is None:
            setattr(module, opt.name, opt.default)
            continue
        try:
            value = opt.parse(raw)
        except ValueError as exc:
            raise ValueError(f"{opt.env}: {exc}") from None
        setattr(module, opt.name, value)


def _coerce(opt: Option, value: Any) -> Any:
    if isinstance(value, str):
        return opt.parse(value)
    if value is None and opt.default is None:
        return None
    if opt.name == "ops":
        return _ops(",".join(value))
    if isinstance(opt.default, bool) and isinstance(value, bool):
        return value
    if opt.parse is _on_off_auto and isinstance(value, bool):
        return "on" if value else "off"
    raise TypeError(f"tilefly.config.{opt.name}: expected a string or {type(opt.default).__name__}, got {value!r}")


class _ConfigModule(types.ModuleType):
    """Validates assignments, so a bad value fails where it is set, naming the option."""

    def __setattr__(self, name: str, value: Any) -> None:
        opt = _BY_NAME.get(name)
        if opt is not None:
            value = _coerce(opt, value)
            if name == "log_level":
                logging.getLogger("tilefly").setLevel(value)
        super().__setattr__(name, value)


def describe() -> str:
    """One line per option: name, environment variable, current value, meaning."""
    lines = []
    for opt in OPTIONS:
        lines.append(f"{opt.name:<14} {opt.env:<22} {globals()[opt.name]!r:<12} {opt.doc}")
    return "\n".join(lines)


sys.modules[__name__].__class__ = _ConfigModule
reload()

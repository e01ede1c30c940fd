"""Decoder-only models for the end-to-end benchmark, built from configs written here (no downloads).

Shapes follow the public Hugging Face configs of each model; weights are random (seeded),
which is all a throughput measurement needs. "tiny" exists for CPU tests and GPU smoke runs.
The big models are never instantiated by the tests: ``hf_config(name)`` alone is checked.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

PRECISIONS = ("bf16", "mxfp8", "mxfp4")
# Default A/B logits tolerance (max |B - A| / max |A|) per precision: what two correct GEMM kernels
# that differ only in summation order produce on these random-weight models. BF16: 0.014-0.023 measured
# between sides at 8-16 requests. MXFP4: bitwise equal GEMMs (products and sums exact in FP32), so the
# logits agree up to the BF16 lm_head's rounding only where everything else rounds alike too: attention
# a few BF16 ulps off moved them 0.45-0.49 at 4 layers on CPU (scripts/mx_order_sensitivity.py --perturb
# attention, BENCHMARKS.md session 33), as each layer requantizes to E2M1. Its check therefore runs
# eager with side B's tilefly limited to mx_gemm, or compiled with --exact-casts and B's decode attention
# off. MXFP8: every layer requantizes its input to E4M3, so a one-ulp difference can become a whole FP8
# step; on CPU a reordered sum alone moved the logits 0.066 at 4 layers, 0.12 at 8 and 0.16-0.22 at 16
# (BENCHMARKS.md sessions 26-27), so 32 layers sit near 0.3-0.4.
DEFAULT_TOL = {"bf16": 0.05, "mxfp8": 0.5, "mxfp4": 0.05}


@dataclass(frozen=True)
class ModelSpec:
    name: str
    family: str                 # "llama" or "qwen3": picks the transformers config class
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    rope_extra: dict[str, Any] = field(default_factory=dict)  # rope scaling fields besides rope_theta


MODELS: dict[str, ModelSpec] = {
    s.name: s
    for s in (
        ModelSpec("tiny", "llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256,
                  rope_theta=10000.0, rms_norm_eps=1e-5, max_position_embeddings=2048),
        # Qwen3's attention (q/k norms) with Qwen3-32B's 8 query heads a KV head, for smoke tests
        ModelSpec("tiny-qwen3", "qwen3", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=8, num_key_value_heads=1, head_dim=16, vocab_size=256,
                  rope_theta=1000000.0, rms_norm_eps=1e-6, max_position_embeddings=2048),
        # meta-llama/Llama-3.1-8B config.json
        ModelSpec("llama-3.1-8b", "llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                  num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=128256,
                  rope_theta=500000.0, rms_norm_eps=1e-5, max_position_embeddings=131072,
                  rope_extra={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
        # Qwen/Qwen3-32B config.json
        ModelSpec("qwen3-32b", "qwen3", hidden_size=5120, intermediate_size=25600, num_hidden_layers=64,
                  num_attention_heads=64, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                  rope_theta=1000000.0, rms_norm_eps=1e-6, max_position_embeddings=40960),
    )
}


def spec(name: str) -> ModelSpec:
    if name not in MODELS:
        raise ValueError(f"unknown e2e model {name!r}; known: {', '.join(MODELS)}")
    return MODELS[name]


def hf_config(name: str, attention: str = "grouped"):
    """The transformers config (LlamaConfig / Qwen3Config) of model ``name``; ``attention``: a key
    of ``attention.ATTENTION`` (SDPA either way; "grouped" reads the KV cache uncopied in decode steps)."""
    from tilefly.bench.e2e.attention import ATTENTION, GROUPED, register

    if attention not in ATTENTION:
        raise ValueError(f"attention must be one of {tuple(ATTENTION)}, got {attention!r}")
    s = spec(name)
    rope = {"rope_type": "default", "rope_theta": s.rope_theta, **s.rope_extra}
    common = dict(vocab_size=s.vocab_size, hidden_size=s.hidden_size, intermediate_size=s.intermediate_size,
                  num_hidden_layers=s.num_hidden_layers, num_attention_heads=s.num_attention_heads,
                  num_key_value_heads=s.num_key_value_heads, head_dim=s.head_dim, rms_norm_eps=s.rms_norm_eps,
                  max_position_embeddings=s.max_position_embeddings, rope_parameters=rope,
                  tie_word_embeddings=False, hidden_act="silu")
    if s.family == "llama":
        from transformers import LlamaConfig

        config = LlamaConfig(**common)
    else:
        from transformers import Qwen3Config

        config = Qwen3Config(**common, use_sliding_window=False, sliding_window=None)
    if ATTENTION[attention] == GROUPED:
        register()
    config._attn_implementation = ATTENTION[attention]
    return config


def build_model(name: str, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu",
                seed: int = 0, attention: str = "grouped") -> torch.nn.Module:
    """Model ``name`` with seeded random weights, built directly on ``device``, in eval mode."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config(name, attention), dtype=dtype)
    return model.eval().requires_grad_(False)


def apply_precision(model: torch.nn.Module, precision: str, backend: str = "dequant",
                    swizzle: str = "32_4_4") -> list[str]:
    """Quantize ``model``'s linear layers in place for ``precision`` (lm_head stays BF16);
    returns the swapped names ([] for bf16). ``backend`` and ``swizzle`` (the scales' layout,
    "32_4_4" or "none") are MXLinear's."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "bf16":
        return []
    from tilefly.mx import swap_linears

    return swap_linears(model, precision, skip=("lm_head",), backend=backend, swizzle=swizzle)


def set_mx_backend(model: torch.nn.Module, backend: str) -> int:
    """Switch every MXLinear of ``model`` to ``backend``; returns how many were switched."""
    from tilefly.mx import MXLinear

    count = 0
    for module in model.modules():
        if isinstance(module, MXLinear):
            module.backend = backend
            count += 1
    return count

"""Decode attention for the e2e models without copying the KV cache per query head group.

transformers' SDPA path serves grouped-query attention (Llama-3.1-8B: 32 query heads over 8 KV
heads) with ``repeat_kv`` whenever a mask is passed, and a static cache always passes one (it
hides the unwritten slots). Compiled, every decode step then materializes each layer's whole K
and V cache once per query head of a group, and the attention kernel reads those copies: on the
H200, Llama-3.1-8B MXFP8 at 16 requests (d213f2e, ``--profile``), 2.1 ms of a 9.1 ms step went to
the copies and 1.9 ms to the attention reading them. A serving engine (the seed's measurement ran
in one) reads each KV head once.

``ATTENTION["grouped"]`` does that for one-token decode steps: query heads ``g * G .. g * G + G - 1``
share KV head ``g`` (``repeat_kv``'s order), so the G query heads of a group become G query rows
of one SDPA call on the uncopied K and V, the decode mask (B, 1, 1, L) broadcast over them.
Prefill (more than one query token) and models without grouping take transformers' SDPA path
unchanged. Both sides of an A/B run the same attention; ``"hf"`` is transformers' own path.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

GROUPED = "tilefly_grouped_sdpa"                 # the attention implementation's registered name
ATTENTION = {"grouped": GROUPED, "hf": "sdpa"}   # --attention choice -> config._attn_implementation


def grouped_decode_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                        is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query (B, H, Lq, D), key and value (B, Hkv, L, D);
    returns ((B, Lq, H, D), None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    batch, heads, q_len, dim = query.shape
    if q_len != 1 or groups == 1 or (attention_mask is not None and attention_mask.shape[1] != 1):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    rows = query.reshape(batch, heads // groups, groups, dim)
    out = F.scaled_dot_product_attention(rows, key, value, attn_mask=attention_mask,
                                         dropout_p=dropout if module.training else 0.0, scale=scaling)
    return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None


def register() -> None:
    """Make ``GROUPED`` a transformers attention implementation, with SDPA's mask."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(GROUPED, grouped_decode_sdpa)
    AttentionMaskInterface.register(GROUPED, sdpa_mask)

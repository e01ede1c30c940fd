"""Model configs of the e2e benchmark: the big models' shapes (never instantiated) and the tiny one."""
import pytest
import torch

pytest.importorskip("transformers")

from tilefly.bench.e2e import attention, engine, models  # noqa: E402


@pytest.mark.parametrize("name, cls, expected", [
    ("llama-3.1-8b", "LlamaConfig",
     dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
          num_key_value_heads=8, head_dim=128, vocab_size=128256, rms_norm_eps=1e-5)),
    ("qwen3-32b", "Qwen3Config",
     dict(hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64,
          num_key_value_heads=8, head_dim=128, vocab_size=151936, rms_norm_eps=1e-6)),
])
def test_big_model_configs(name, cls, expected):
    config = models.hf_config(name)
    assert type(config).__name__ == cls
    for key, value in expected.items():
        assert getattr(config, key) == value, key
    assert config.tie_word_embeddings is False
    assert config._attn_implementation == attention.GROUPED
    assert models.hf_config(name, attention="hf")._attn_implementation == "sdpa"


def test_rope_parameters():
    llama = models.hf_config("llama-3.1-8b").rope_parameters
    assert llama["rope_theta"] == 500000.0 and llama["rope_type"] == "llama3" and llama["factor"] == 8.0
    assert llama["original_max_position_embeddings"] == 8192
    qwen = models.hf_config("qwen3-32b")
    assert qwen.rope_parameters["rope_theta"] == 1000000.0
    assert set(qwen.layer_types) == {"full_attention"}, "no sliding-window layers: one static cache shape"


def test_unknown_model():
    with pytest.raises(ValueError, match="known: tiny"):
        models.spec("llama-70b")


def test_tiny_model_is_seeded_and_shaped():
    a = models.build_model("tiny", dtype=torch.bfloat16, seed=3)
    b = models.build_model("tiny", dtype=torch.bfloat16, seed=3)
    c = models.build_model("tiny", dtype=torch.bfloat16, seed=4)
    wa, wb, wc = (m.model.layers[0].mlp.up_proj.weight for m in (a, b, c))
    assert wa.dtype == torch.bfloat16 and tuple(wa.shape) == (128, 64)
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert a.model.layers[0].self_attn.k_proj.weight.shape == (2 * 16, 64)  # 2 KV heads of 16
    assert not any(p.requires_grad for p in a.parameters())


@pytest.mark.parametrize("precision", ["mxfp8", "mxfp4"])
def test_apply_precision_keeps_lm_head(precision):
    from tilefly.mx import MXLinear

    model = models.build_model("tiny")
    swapped = models.apply_precision(model, precision)
    assert len(swapped) == 2 * 7 and "lm_head" not in swapped
    assert type(model.lm_head) is torch.nn.Linear
    assert all(m.fmt == precision and m.backend == "dequant" for m in model.modules() if isinstance(m, MXLinear))
    assert models.set_mx_backend(model, "scaled_mm") == 14
    assert all(m.backend == "scaled_mm" for m in model.modules() if isinstance(m, MXLinear))


def test_apply_precision_passes_the_scale_layout():
    from tilefly.mx import MXLinear
    from tilefly.mx.layout import blocked_numel

    model = models.build_model("tiny")
    models.apply_precision(model, "mxfp8", swizzle="none")
    layers = [m for m in model.modules() if isinstance(m, MXLinear)]
    assert layers and all(m.swizzle == "none" for m in layers)
    up = model.model.layers[0].mlp.up_proj
    assert tuple(up.weight_scale_bits.shape) == (128, 64 // 32)
    models.apply_precision(blocked := models.build_model("tiny"), "mxfp8")
    assert blocked.model.layers[0].mlp.up_proj.weight_scale_bits.numel() == blocked_numel(128, 2)


def test_bf16_precision_swaps_nothing():
    model = models.build_model("tiny")
    assert models.apply_precision(model, "bf16") == []
    with pytest.raises(ValueError, match="precision"):
        models.apply_precision(model, "fp8")


def test_unknown_attention_is_refused():
    with pytest.raises(ValueError, match="attention must be one of"):
        models.hf_config("tiny", attention="flash")


@pytest.mark.parametrize("batch", [1, 3])
def test_grouped_decode_attention_matches_transformers(batch):
    """Same weights, same prompts: the grouped decode steps give transformers' logits and tokens
    (prefill takes the same path in both)."""
    prompts = torch.randint(0, 256, (batch, 12), generator=torch.Generator().manual_seed(batch))
    outs = {}
    for name in ("grouped", "hf"):
        model = models.build_model("tiny", dtype=torch.float32, seed=3, attention=name)
        assert model.config.num_attention_heads // model.config.num_key_value_heads == 2  # grouped-query
        eng = engine.Engine(model, engine.new_cache(model, batch, 12 + 6), batch, 12, 6)
        outs[name] = eng.generate(prompts, capture=6)
    assert torch.equal(outs["grouped"].tokens, outs["hf"].tokens)
    for got, want in zip(outs["grouped"].logits, outs["hf"].logits):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_grouped_decode_attention_groups_query_heads_by_kv_head():
    """Query head h reads KV head h // G: make every KV head's values distinct and check each
    query head's output."""
    class Module(torch.nn.Module):
        num_key_value_groups = 3

    batch, kv_heads, length, dim = 2, 2, 5, 4
    query = torch.randn(batch, kv_heads * 3, 1, dim)
    key = torch.randn(batch, kv_heads, length, dim)
    value = torch.arange(kv_heads, dtype=torch.float32).view(1, kv_heads, 1, 1).expand(batch, kv_heads, length, dim)
    mask = torch.ones(batch, 1, 1, length, dtype=torch.bool)
    mask[:, :, :, -2:] = False
    out, weights = attention.grouped_decode_sdpa(Module().eval(), query, key, value.contiguous(), mask)
    assert weights is None and out.shape == (batch, 1, kv_heads * 3, dim)
    for h in range(kv_heads * 3):
        torch.testing.assert_close(out[:, 0, h], torch.full((batch, dim), float(h // 3)))
    ref = torch.nn.functional.scaled_dot_product_attention(
        query, key.repeat_interleave(3, dim=1), value.repeat_interleave(3, dim=1), attn_mask=mask)
    torch.testing.assert_close(out, ref.transpose(1, 2))

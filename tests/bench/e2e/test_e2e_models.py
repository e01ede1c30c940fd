"""Model configs of the e2e benchmark: the big models' shapes (never instantiated) and the tiny one."""
import pytest
import torch

pytest.importorskip("transformers")

from tilefly.bench.e2e import models  # noqa: E402


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
    assert config._attn_implementation == "sdpa"


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


def test_bf16_precision_swaps_nothing():
    model = models.build_model("tiny")
    assert models.apply_precision(model, "bf16") == []
    with pytest.raises(ValueError, match="precision"):
        models.apply_precision(model, "fp8")

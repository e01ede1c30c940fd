"""The e2e engine on the tiny model, eager on CPU: static-cache prefill + decode against a
reference that recomputes the whole sequence every step (no cache)."""
import pytest
import torch

pytest.importorskip("transformers")

from tilefly.bench.e2e import engine, models  # noqa: E402

INPUT_LEN, OUTPUT_LEN = 8, 5


@pytest.fixture(scope="module")
def fp32_model():
    return models.build_model("tiny", dtype=torch.float32, seed=0)


def _prompts(batch, seed=1, input_len=INPUT_LEN):
    return torch.randint(0, 256, (batch, input_len), generator=torch.Generator().manual_seed(seed))


def _engine(model, batch, input_len=INPUT_LEN, output_len=OUTPUT_LEN):
    cache = engine.new_cache(model, batch, input_len + output_len)
    return engine.Engine(model, cache, batch, input_len, output_len)


def test_cached_generation_matches_full_recompute(fp32_model):
    prompts = _prompts(3)
    out = _engine(fp32_model, 3).generate(prompts, capture=OUTPUT_LEN)
    ref_tokens, ref_logits = engine.reference_generate(fp32_model, prompts, OUTPUT_LEN)
    assert out.tokens.shape == (3, OUTPUT_LEN) and out.tokens.dtype == torch.long
    assert torch.equal(out.tokens, ref_tokens)
    assert len(out.logits) == OUTPUT_LEN
    for step, (got, want) in enumerate(zip(out.logits, ref_logits)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=f"step {step}")


@pytest.mark.parametrize("attention", ["grouped", "hf"])
def test_qwen3_attention_with_eight_query_rows_a_head_matches_full_recompute(attention):
    """Qwen3-32B's layout (8 query heads a KV head, q/k norms) through the engine's cache, both
    attention implementations, against the uncached reference."""
    model = models.build_model("tiny-qwen3", dtype=torch.float32, seed=0, attention=attention)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    prompts = _prompts(3, seed=4)
    out = _engine(model, 3).generate(prompts, capture=OUTPUT_LEN)
    ref_tokens, ref_logits = engine.reference_generate(model, prompts, OUTPUT_LEN)
    assert torch.equal(out.tokens, ref_tokens)
    for step, (got, want) in enumerate(zip(out.logits, ref_logits)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=f"step {step}")


def test_prompt_tokens_reach_the_logits(fp32_model):
    """Changing the first prompt token changes the first output logits: the cache holds the
    whole prompt (a cache that kept only the last token would pass the other checks less often)."""
    prompts = _prompts(2)
    other = prompts.clone()
    other[:, 0] = (other[:, 0] + 1) % 256
    eng = _engine(fp32_model, 2)
    a = eng.generate(prompts, steps=1, capture=1).logits[0]
    b = eng.generate(other, steps=1, capture=1).logits[0]
    assert (a - b).abs().max() > 1e-4


def test_reruns_reset_the_cache(fp32_model):
    eng = _engine(fp32_model, 2)
    prompts = _prompts(2)
    first = eng.generate(prompts, capture=2)
    second = eng.generate(prompts, capture=2)
    assert torch.equal(first.tokens, second.tokens)
    torch.testing.assert_close(first.logits[1], second.logits[1], rtol=0, atol=0)
    assert int(eng.cache.layers[0].cumulative_length) == INPUT_LEN + OUTPUT_LEN - 1


def test_rows_are_independent_of_batch_companions(fp32_model):
    prompts = _prompts(3, seed=5)
    together = _engine(fp32_model, 3).generate(prompts, capture=OUTPUT_LEN)
    alone = _engine(fp32_model, 1).generate(prompts[2:3], capture=OUTPUT_LEN)
    assert torch.equal(together.tokens[2:3], alone.tokens)
    torch.testing.assert_close(together.logits[-1][2:3], alone.logits[-1], rtol=1e-4, atol=1e-4)


def test_bf16_generation_tracks_reference():
    model = models.build_model("tiny", dtype=torch.bfloat16, seed=2)
    prompts = _prompts(2, seed=7)
    out = _engine(model, 2).generate(prompts, capture=OUTPUT_LEN)
    ref_tokens, ref_logits = engine.reference_generate(model, prompts, OUTPUT_LEN)
    # BF16 rounding differs between cached and full attention; near-ties may flip later tokens,
    # the first step's logits must be close.
    torch.testing.assert_close(out.logits[0], ref_logits[0], rtol=2e-2, atol=2e-2)
    assert torch.equal(out.tokens[:, 0], ref_tokens[:, 0])


def test_timings_and_step_count(fp32_model):
    out = _engine(fp32_model, 2).generate(_prompts(2), steps=3)
    assert out.tokens.shape == (2, 3)
    assert out.prefill_s > 0 and out.decode_s > 0 and out.total_s == out.prefill_s + out.decode_s
    assert out.logits == []


def test_shape_errors(fp32_model):
    eng = _engine(fp32_model, 2)
    with pytest.raises(ValueError, match="prompts must be"):
        eng.generate(_prompts(3))
    with pytest.raises(ValueError, match="steps must be"):
        eng.generate(_prompts(2), steps=OUTPUT_LEN + 1)

"""GPU: the tiny model's compiled A/B (max-autotune, CUDA-graph decode) in seconds, per precision;
and the CLI on CPU (eager), which writes a run file the merge step reads."""
import json

import pytest
import torch

pytest.importorskip("transformers")

from tilefly.bench.e2e import ab, engine, models  # noqa: E402


@pytest.mark.cuda
@pytest.mark.parametrize("precision", ["bf16", "mxfp8", "mxfp4"])
def test_tiny_compiled_ab_agrees(precision):
    """MX side B: tilefly's mx_gemm serves MXLinear's F.scaled_mm, which the compiled decode calls
    through the opaque op tilefly::mx_linear_mm, so the decode step stays one CUDA graph (the
    GEMM's split-K buffers kept outside the graph pools: tilefly._device.kept).
    One concurrency: a max-autotune compile of both sides took 78 s for BF16 (d80dcdd, H200), and
    MX runs with an eager prefill: coordinate-descent tuning of the activation-quantizing kernels
    took 93 s to compile side A's prefill and decode (47fed4e). The decode graph is what this test
    is about."""
    mx = precision != "bf16"
    record = ab.run_ab("tiny", precision, [8], input_len=32, output_len=16, device="cuda",
                       compile_mode="max-autotune", compare_steps=4, compile_prefill=not mx, profile_steps=4)
    for row in record["rows"]:
        for side in ("A", "B"):
            assert "error" not in row[side], row[side]
            assert row[side]["cudagraph_skips"] == 0, row[side]
            # the decode graph, and the prefill's where it is compiled (bf16)
            assert row[side]["graphs"] == (1 if mx else 2), row[side]
        assert row["agreement"]["ok"], row["agreement"]
        assert row["A"]["compile_s"] > 0 and row["B"]["tok_s"] > 0
        for side in ("A", "B"):  # the decode profile saw the graph's kernels
            prof = row[side]["profile"]
            assert prof["steps"] == 4 and prof["kernels_per_step"] >= 1, prof
            assert 0 < prof["busy_us_per_step"] < prof["wall_us_per_step"], prof
        if mx:  # B's MX layers run tilefly's kernels, A's do not
            assert any(f["family"] == "tilefly GEMM" for f in row["B"]["profile"]["families"]), row["B"]["profile"]
            assert not any(f["family"] == "tilefly GEMM" for f in row["A"]["profile"]["families"])


@pytest.mark.cuda
def test_tiny_qwen3_compiled_ab_agrees_with_decode_attention_on(monkeypatch):
    """Qwen3's layout (8 query heads a KV head, q/k norms) through the grouped decode step, side B with
    tilefly's decode attention forced on (``auto`` knows no head dim 16): compiled, one CUDA graph,
    A and B logits within BF16's tolerance, and B's profile shows tilefly's attention."""
    from tilefly import config

    monkeypatch.setattr(config, "attention_decode", "on")
    record = ab.run_ab("tiny-qwen3", "bf16", [8], input_len=32, output_len=16, device="cuda",
                       compile_mode="max-autotune", compare_steps=4, compile_prefill=False, profile_steps=4)
    (row,) = record["rows"]
    for side in ("A", "B"):
        assert "error" not in row[side], row[side]
        assert row[side]["cudagraph_skips"] == 0 and row[side]["graphs"] == 1, row[side]
    assert row["agreement"]["ok"], row["agreement"]
    assert any(f["family"] == "tilefly attention" for f in row["B"]["profile"]["families"]), row["B"]["profile"]
    assert not any(f["family"] == "tilefly attention" for f in row["A"]["profile"]["families"])


@pytest.mark.cuda
def test_compiled_cudagraph_decode_matches_reference():
    model = models.build_model("tiny", dtype=torch.float32, device="cuda", seed=0)
    prompts = torch.randint(0, 256, (4, 16), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    cache = engine.new_cache(model, 4, 16 + 8)
    torch._dynamo.reset()
    eng = engine.Engine(model, cache, 4, 16, 8, compile_mode="max-autotune", fullgraph=True)
    eng.generate(prompts)                       # compile, record the CUDA graph
    out = eng.generate(prompts, capture=8)      # replays
    ref_tokens, ref_logits = engine.reference_generate(model, prompts, 8)
    assert torch.equal(out.tokens.cpu(), ref_tokens.cpu())
    for got, want in zip(out.logits, ref_logits):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
    torch._dynamo.reset()


def test_cli_eager_cpu_run_writes_a_mergeable_file(tmp_path, capsys):
    from tilefly.bench.e2e import report
    from tilefly.bench.e2e.__main__ import main

    rc = main(["--model", "tiny", "--device", "cpu", "--eager", "--input-len", "8", "--output-len", "3",
               "--concurrency", "2", "--precision", "mxfp4", "--out", str(tmp_path)])
    # side B's MX layers call F.scaled_mm, which ATen lacks on CPU: recorded, and the exit code says so
    assert rc == 1
    data = json.loads((tmp_path / "run_tiny_mxfp4_c2.json").read_text())
    assert data["transformers"] and data["torch"] == torch.__version__ and data["gpu"] == "cpu"
    assert "error" in data["rows"][0]["B"] and data["rows"][0]["A"]["tok_s"] > 0
    assert "### tiny · mxfp4" in report.markdown(report.merge([report.load(str(tmp_path / "run_tiny_mxfp4_c2.json"))]))
    assert "| 2 |" in capsys.readouterr().out

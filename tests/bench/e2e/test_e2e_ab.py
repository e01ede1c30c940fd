"""The A/B driver's logic on CPU: logits agreement, phase metrics, side switching, and a whole
eager A/B run of the tiny model in BF16, MXFP8 and MXFP4 (both sides on the dequant path)."""
import pytest
import torch

pytest.importorskip("transformers")

import tilefly  # noqa: E402
from tilefly import ops  # noqa: E402
from tilefly.bench.e2e import ab, engine, models  # noqa: E402

CPU_B = ab.Side("B", "ATEN,TRITON,TILEFLY", ("gemm",), "dequant")  # ATen has no MX scaled_mm on CPU


def _logits(steps, batch=3, vocab=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, vocab, generator=g) * 4 for _ in range(steps)]


def test_agreement_within_and_beyond_tolerance():
    ref = _logits(3)
    tokens = torch.stack([r.argmax(-1) for r in ref], dim=1)
    close = [r + 1e-3 * torch.randn_like(r) for r in ref]
    res = ab.logits_agreement(ref, close, tokens, tokens, tol=1e-2)
    assert res["ok"] and res["max_rel_err"] < 1e-2 and res["rows_compared"] == [3, 3, 3]
    assert res["token_match"] == 1.0 and res["rows_diverged"] == 0 and res["first_divergence"] is None
    far = [r.clone() for r in ref]
    far[2][1, 5] += 2.0 * ref[2].abs().max()
    res = ab.logits_agreement(ref, far, tokens, tokens, tol=1e-2)
    assert not res["ok"] and res["rel_err"][2] == pytest.approx(2.0, rel=1e-6)


def test_agreement_skips_rows_after_a_divergence():
    ref = _logits(3)
    a_tokens = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    b_tokens = a_tokens.clone()
    b_tokens[1, 0] = 0  # row 1 took another token at step 0: later steps compare different sequences
    test = [r.clone() for r in ref]
    test[1][1] += 100.0  # garbage on row 1 from step 1 on must not count
    test[2][1] += 100.0
    res = ab.logits_agreement(ref, test, a_tokens, b_tokens, tol=1e-6)
    assert res["rows_compared"] == [3, 2, 2]
    assert res["ok"] and res["max_rel_err"] == 0.0
    assert res["rows_diverged"] == 1 and res["first_divergence"] == 0
    assert res["token_match"] == pytest.approx(8 / 9)


def test_agreement_with_nothing_to_compare_is_not_ok():
    res = ab.logits_agreement([], [], torch.zeros(2, 0, dtype=torch.long), torch.zeros(2, 0, dtype=torch.long), 0.1)
    assert not res["ok"] and res["max_rel_err"] is None


def test_phase_metrics():
    gen = engine.Generation(torch.zeros(4, 11, dtype=torch.long), prefill_s=0.5, decode_s=2.0)
    m = ab.phase_metrics(gen, 4)
    assert m["tok_s"] == pytest.approx(44 / 2.5)
    assert m["decode_tok_s"] == pytest.approx(40 / 2.0)
    assert m["tpot_ms"] == pytest.approx(200.0) and m["ttft_ms"] == pytest.approx(500.0)


def test_side_context_switches_and_restores():
    model = models.build_model("tiny")
    models.apply_precision(model, "mxfp8")
    tilefly.enable(["rms_norm"])
    with ab.side_context(ab.SIDE_B, model, compiled=False):
        assert set(tilefly.enabled_ops()) == set(ops.defaults()) and "mx_gemm" in tilefly.enabled_ops()
        assert {m.backend for m in model.modules() if hasattr(m, "fmt")} == {"scaled_mm"}
    assert tilefly.enabled_ops() == ("rms_norm",)
    with ab.side_context(ab.SIDE_A, model, compiled=False):
        assert tilefly.enabled_ops() == ()
        assert {m.backend for m in model.modules() if hasattr(m, "fmt")} == {"dequant"}
    assert tilefly.enabled_ops() == ("rms_norm",)


def test_side_context_exact_casts_only_while_compiling_and_asked():
    from torch._inductor import config as inductor_config

    model = models.build_model("tiny")
    assert inductor_config.emulate_precision_casts is False   # Inductor's default: the reason for the option
    for compiled, exact, expected in ((True, True, True), (True, False, False), (False, True, False)):
        with ab.side_context(ab.SIDE_A, model, compiled=compiled, exact_casts=exact):
            assert inductor_config.emulate_precision_casts is expected
        assert inductor_config.emulate_precision_casts is False


@pytest.mark.parametrize("precision", ["bf16", "mxfp8", "mxfp4"])
def test_eager_ab_run(precision):
    record = ab.run_ab("tiny", precision, [2, 3], input_len=8, output_len=4, device="cpu", compile_mode=None,
                       compare_steps=3, sides=(ab.SIDE_A, CPU_B), log=open("/dev/null", "w"))
    assert record["model"] == "tiny" and record["precision"] == precision
    assert record["tol"] == {"bf16": 0.05, "mxfp8": 0.5, "mxfp4": 0.05}[precision]   # models.DEFAULT_TOL
    assert record["swapped_linears"] == (0 if precision == "bf16" else 14)
    assert [row["concurrency"] for row in record["rows"]] == [2, 3]
    for row in record["rows"]:
        for side in ("A", "B"):
            assert row[side]["tok_s"] > 0 and row[side]["tpot_ms"] > 0, row[side]
        agree = row["agreement"]
        assert agree["ok"] and agree["rows_compared"] == [row["concurrency"]] * 3
        assert agree["token_match"] == 1.0 and agree["timed_token_match"] == 1.0
        assert row["speedup"] == pytest.approx(row["B"]["tok_s"] / row["A"]["tok_s"])
    assert tilefly.enabled_ops() == ()


def test_a_failing_side_is_recorded():
    """Side B on MX scaled_mm: ATen has no MX kernel on CPU, so B fails and A still runs."""
    record = ab.run_ab("tiny", "mxfp8", [2], input_len=8, output_len=3, device="cpu", compile_mode=None,
                       log=open("/dev/null", "w"))
    row = record["rows"][0]
    assert row["A"]["tok_s"] > 0
    assert "MXKernelUnavailable" in row["B"]["error"]
    assert "agreement" not in row and "speedup" not in row


def test_run_side_keeps_the_generated_code_when_asked(tmp_path, monkeypatch):
    # the compiled path's bookkeeping without compiling: torch.compile as identity, and a stand-in
    # for the wrapper code Inductor would have generated
    from contextlib import contextmanager

    from tilefly.bench.e2e import picks

    @contextmanager
    def fake_capture():
        yield ["def call(args):\n    extern_kernels.mm(a, b, out=c)\n"
               "    triton_tem_fused_mm_0.run(a, d, c)\n    triton_tem_fused_mm_0.run(e, d, f)\n"
               "    extern_kernels.tilefly_mm_splitk128x8x128_s6_w4_k16_v1(a, b, g)\n"
               "    buf9 = torch.ops.tilefly.mx_linear_mm.default(a, w, sa, sw, 'mxfp8', 'none', None, "
               "torch.bfloat16)\n"
               "    assert_size_stride(buf9, (2, 4), (4, 1), 'torch.ops.tilefly.mx_linear_mm.default')\n"]

    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    monkeypatch.setattr(picks, "capture_code", fake_capture)
    model = models.build_model("tiny", dtype=torch.float32, device="cpu", seed=0)
    cache = engine.new_cache(model, 2, 8 + 3)
    prompts = torch.randint(0, model.config.vocab_size, (2, 8))
    path = tmp_path / "code_A.py"
    metrics, _, _ = ab.run_side(model, cache, ab.SIDE_A, prompts, 3, "max-autotune-no-cudagraphs", runs=1,
                                capture=2, code_path=str(path))
    assert metrics["picks"] == {"captured": 1, "tilefly": {"tilefly_mm_splitk128x8x128_s6_w4_k16_v1": 1},
                                "triton_templates": 1, "triton_template_calls": 2, "aten_gemm_calls": 1,
                                "mx_op_calls": 1}
    assert picks.describe(metrics["picks"]) == ("tilefly tilefly_mm_splitk128x8x128_s6_w4_k16_v1 x1; "
                                                "Triton templates 1 (2 calls); ATen calls 1; MX layer calls 1")
    assert path.read_text().startswith("def call(args):")
    metrics, _, _ = ab.run_side(model, cache, ab.SIDE_A, prompts, 3, None, runs=1, capture=2,
                                code_path=str(tmp_path / "eager.py"))
    assert "picks" not in metrics and not (tmp_path / "eager.py").exists()   # eager: nothing compiled


def test_picks_counts_packed_sibling_mx_calls_apart():
    from tilefly.bench.e2e import picks

    code = ("def call(args):\n"
            "    buf4 = torch.ops.tilefly.mx_linear_mm_packed.default(buf2, [w0, w1, w2], buf3, [s0, s1, s2], "
            "'mxfp8', 'none', torch.bfloat16)\n"
            "    assert_size_stride(buf4, (2, 12), (12, 1), 'torch.ops.tilefly.mx_linear_mm_packed.default')\n"
            "    buf9 = torch.ops.tilefly.mx_linear_mm.default(a, w, sa, sw, 'mxfp8', 'none', None, torch.bfloat16)\n")
    found = picks.picks([code])
    assert (found["mx_op_calls"], found["mx_packed_calls"]) == (1, 1) and "mx_fused_norm_calls" not in found
    assert picks.describe(found).endswith("MX layer calls 1; packed sibling MX calls 1")
    code += ("    buf1 = torch.ops.tilefly.add_rms_norm_mx_quantize.default(x, r, w, 1e-05, 'mxfp8')\n"
             "    assert_size_stride(buf1, (2, 12), (12, 1), 'torch.ops.tilefly.add_rms_norm_mx_quantize.default')\n")
    code += "    buf2 = torch.ops.tilefly.silu_mul_mx_quantize.default(g, u, 'mxfp8')\n"
    found = picks.picks([code])
    assert found["mx_fused_norm_calls"] == found["mx_fused_silu_calls"] == 1
    assert picks.describe(found).endswith("packed sibling MX calls 1; fused add + RMSNorm + MX quantization calls 1; "
                                          "fused SiLU product + MX quantization calls 1")


def test_cli_exact_casts_reaches_the_run_and_its_record(monkeypatch, tmp_path):
    from tilefly.bench.e2e.__main__ import main

    seen = {}
    real = ab.run_ab

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(ab, "run_ab", spy)
    assert main(["--model", "tiny", "--precision", "mxfp4", "--concurrency", "2", "--input-len", "4",
                 "--output-len", "2", "--device", "cpu", "--eager", "--side", "A", "--exact-casts",
                 "--out", str(tmp_path)]) == 0
    assert seen["exact_casts"] is True
    seen.clear()
    assert main(["--model", "tiny", "--precision", "mxfp4", "--concurrency", "2", "--input-len", "4",
                 "--output-len", "2", "--device", "cpu", "--eager", "--side", "A", "--out", str(tmp_path)]) == 0
    assert seen["exact_casts"] is False


def test_exact_casts_are_recorded_only_for_compiled_runs():
    eager = ab.run_ab("tiny", "mxfp4", [2], input_len=4, output_len=2, device="cpu", compile_mode=None,
                      sides=(ab.SIDE_A,), exact_casts=True, log=open("/dev/null", "w"))
    assert "inductor_options" not in eager   # nothing was compiled, so no cast was emulated


class TritonTemplateCaller:   # stand-ins named as Inductor's ChoiceCaller classes (picks.family reads the name)
    def __init__(self, name):
        self.name = name


class ExternKernelCaller(TritonTemplateCaller):
    pass


class _Node:
    def __init__(self, *size):
        self.size = size

    def get_size(self):
        return list(self.size)


def test_race_keeps_each_familys_best_time_and_the_winner():
    from tilefly.bench.e2e import picks

    timings = {TritonTemplateCaller("triton_mm_1"): 0.0310, TritonTemplateCaller("triton_mm_2"): 0.0295,
               ExternKernelCaller("mm"): 0.0400, ExternKernelCaller("tilefly_mm_splitk64x32x128_s8_w4_k16_v1"): 0.0301,
               ExternKernelCaller("tilefly_mm_splitk128x32x128_s5_w4_k16_v1"): float("inf")}   # failed to run
    record = picks.race(timings, "mm", [_Node(32, 4096), _Node(4096, 14336)])
    assert record == {"op": "mm", "shapes": [[32, 4096], [4096, 14336]],
                      "us": {"aten": 40.0, "tilefly": 30.1, "triton": 29.5},
                      "winner": "triton", "winner_choice": "triton_mm_2"}
    assert picks.race({ExternKernelCaller("mm"): float("inf")}, "mm", [])["us"] == {}


def test_record_races_follows_inductors_feedback_hook_and_leaves_it_clean():
    from torch._inductor import select_algorithm

    from tilefly.bench.e2e import picks

    cache = select_algorithm.get_algorithm_selector_cache()
    before = list(cache.feedback_saver_fns)
    won = {ExternKernelCaller("tilefly_mm_splitk64x32x128_s8_w4_k16_v1"): 0.010, ExternKernelCaller("mm"): 0.012}
    lost = {ExternKernelCaller("tilefly_mm_splitk64x32x128_s8_w4_k16_v1"): 0.0315,
            TritonTemplateCaller("triton_mm_3"): 0.0300}
    with picks.record_races() as races:
        for timings in (won, lost):   # as Inductor calls each saver after benchmarking one selection
            for fn in cache.feedback_saver_fns:
                fn(timings, "mm", [_Node(32, 4096), _Node(4096, 4096)], list(timings), lambda: {}, {})
    assert cache.feedback_saver_fns == before
    assert [r["winner"] for r in races] == ["tilefly", "triton"]
    assert picks.describe_races(races) == ("autotuning races: tilefly fastest in 1 of 2; where it lost, its time "
                                           "over the winner's: median 1.05x, closest 1.05x")
    assert picks.describe_races([picks.race({ExternKernelCaller("mm"): 0.01}, "mm", [])]) == (
        "autotuning races 1, none with a tilefly candidate")
    p = {"captured": 1, "tilefly": {}, "triton_templates": 1, "aten_gemm_calls": 0, "races": races}
    assert picks.describe(p).endswith("ATen calls 0; autotuning races: tilefly fastest in 1 of 2; where it lost, "
                                      "its time over the winner's: median 1.05x, closest 1.05x")


def test_record_races_says_which_races_were_timed_as_graph_replays(monkeypatch):
    from torch._inductor import select_algorithm

    from tilefly import config
    from tilefly.bench.e2e import picks

    monkeypatch.setattr(config, "gemm_race_timing", "graph")
    cache = select_algorithm.get_algorithm_selector_cache()
    with_tilefly = {ExternKernelCaller("tilefly_mm_splitk64x32x128_s8_w4_k16_v1"): 0.010,
                    TritonTemplateCaller("triton_mm_3"): 0.012}
    without = {TritonTemplateCaller("triton_mm_4"): 0.012, ExternKernelCaller("mm"): 0.013}
    with picks.record_races() as races:
        for timings in (with_tilefly, without):
            for fn in cache.feedback_saver_fns:
                fn(timings, "mm", [_Node(32, 4096), _Node(4096, 4096)], list(timings), lambda: {}, {})
    assert [r["timing"] for r in races] == ["graph", "inductor"]
    assert picks.describe_races(races) == ("autotuning races: tilefly fastest in 1 of 1 (1 timed as CUDA graph "
                                           "replays)")

"""Dense GEMM candidates through Inductor's real lowering on CPU (torch 2.13 in CI).

The device check is told the CPU is a Hopper GPU and the choices' heuristics are also
registered for "cpu", so ``torch.compile(max-autotune)`` of ``mm``/``addmm`` on CPU
tensors goes through the same lowering, choice and autotuning code as on the H200;
tilefly's wrappers then compute with ATen (their kernels need CUDA), which keeps the
results right. The GPU run of the same flow is in test_gemm_cuda.py."""
import functools
import logging

import pytest
import torch

pytest.importorskip("torch._inductor")

from torch._inductor import config as inductor_config  # noqa: E402

import tilefly.ops.gemm  # noqa: E402,F401 - registers the provider
from tilefly import _inductor  # noqa: E402
from tilefly import config as tilefly_config  # noqa: E402
from tilefly.ops.gemm import configs, launch  # noqa: E402
from tilefly.ops.gemm import inductor as gemm_inductor  # noqa: E402


@pytest.fixture
def offered(monkeypatch):
    """Install tilefly's choices; returns {op_name: [choice names]} Inductor was offered."""
    monkeypatch.setattr(gemm_inductor, "_device_of", lambda node: ("cuda", (9, 0)))
    _inductor.install(["gemm"])
    gemm_inductor.register_heuristics("cpu")
    cls = _inductor.TileflyChoices
    original = cls.get_template_configs
    record: dict[str, list[str]] = {}

    def spy(self, kernel_inputs, templates, op_name, kwarg_overrides=None):
        result = original(self, kernel_inputs, templates, op_name, kwarg_overrides)
        record.setdefault(op_name, []).extend(c.name for c in result)
        return result

    monkeypatch.setattr(cls, "get_template_configs", spy)
    torch._dynamo.reset()
    yield record
    _inductor.uninstall()
    torch._dynamo.reset()


def compile_and_run(fn, *args, backends="ATEN,TILEFLY", dynamic=False):
    from torch._inductor.utils import run_and_get_code

    with inductor_config.patch(max_autotune=True, max_autotune_gemm_backends=backends, force_disable_caches=True,
                               autotune_num_choices_displayed=0):
        torch._dynamo.reset()
        out, code = run_and_get_code(torch.compile(fn, dynamic=dynamic), *args)
    return out, "\n".join(code)


def tilefly_names(names):
    return [n for n in names if n.startswith("tilefly_")]


def test_mm_candidates_appear_with_the_backend_name_only(offered):
    a, b = torch.randn(256, 512, dtype=torch.bfloat16), torch.randn(512, 384, dtype=torch.bfloat16)
    out, _ = compile_and_run(lambda x, y: x @ y, a, b)
    names = tilefly_names(offered["mm"])
    assert names and all(n.startswith("tilefly_mm_") and n.endswith("_v1") for n in names)
    assert "mm" in offered["mm"], "ATen stays in the race"
    torch.testing.assert_close(out, a @ b)

    offered.clear()
    out, code = compile_and_run(lambda x, y: x @ y, a, b, backends="ATEN,TRITON")
    assert tilefly_names(offered.get("mm", [])) == [] and "tilefly" not in code
    torch.testing.assert_close(out, a @ b)


def test_addmm_candidates_are_offered_once_per_call_site(offered):
    x = torch.randn(64, 256, dtype=torch.bfloat16)
    w, bias = torch.randn(512, 256, dtype=torch.bfloat16), torch.randn(512, dtype=torch.bfloat16)
    out, _ = compile_and_run(lambda x, w, b: torch.nn.functional.linear(x, w, b), x, w, bias)
    names = tilefly_names(offered["addmm"])
    assert names and len(names) == len(set(names)), names
    assert all(n.startswith("tilefly_addmm_splitk") for n in names), "64 tokens: skinny configs"
    torch.testing.assert_close(out, torch.nn.functional.linear(x, w, bias))


def test_ineligible_call_sites_get_no_candidates(offered):
    a, b = torch.randn(64, 17, dtype=torch.bfloat16), torch.randn(17, 64, dtype=torch.bfloat16)   # K=17
    compile_and_run(lambda x, y: x @ y, a, b)
    assert tilefly_names(offered.get("mm", [])) == []
    offered.clear()
    a32, b32 = a.float(), b.float()
    compile_and_run(lambda x, y: x @ y, a32, b32)
    assert tilefly_names(offered.get("mm", [])) == []


def test_scaled_addmm_gets_no_candidates(offered):
    x, w, bias = (torch.randn(64, 128, dtype=torch.bfloat16), torch.randn(128, 256, dtype=torch.bfloat16),
                  torch.randn(256, dtype=torch.bfloat16))
    out, _ = compile_and_run(lambda x, w, b: torch.addmm(b, x, w, beta=0.5), x, w, bias)
    assert tilefly_names(offered.get("addmm", [])) == []
    torch.testing.assert_close(out, torch.addmm(bias, x, w, beta=0.5))


def test_a_winning_tilefly_choice_is_what_the_generated_code_calls(offered, monkeypatch):
    from torch._inductor.choices import InductorChoices

    if not hasattr(InductorChoices, "override_best_choice"):
        pytest.skip("this torch has no override_best_choice hook")

    def prefer_tilefly(self, best, timings):
        ours = [c for c in timings if c.name.startswith("tilefly_")]
        return ours[0] if ours else best

    monkeypatch.setattr(_inductor.TileflyChoices, "override_best_choice", prefer_tilefly)
    x = torch.randn(32, 256, dtype=torch.bfloat16)
    w, bias = torch.randn(256, 256, dtype=torch.bfloat16), torch.randn(256, dtype=torch.bfloat16)
    out, code = compile_and_run(lambda x, w, b: torch.relu(x @ w) + torch.addmm(b, x, w), x, w, bias)
    assert "extern_kernels.tilefly_mm_" in code and "extern_kernels.tilefly_addmm_" in code
    torch.testing.assert_close(out, torch.relu(x @ w) + torch.addmm(bias, x, w))


def test_a_config_that_does_not_compile_is_dropped_with_a_debug_log(offered, failing_compile, caplog):
    """_compiles (GPU only) drops a config whose ahead-of-time compile fails and keeps the rest."""
    a, b = torch.randn(256, 512, dtype=torch.bfloat16), torch.randn(512, 384, dtype=torch.bfloat16)
    broken = configs.offered(256, 384, 512)[0]

    failing_compile(gemm_inductor.PROVIDER, launch, broken)
    with caplog.at_level(logging.DEBUG, logger="tilefly.gemm"):
        compile_and_run(lambda x, y: x @ y, a, b)
    expected = [gemm_inductor.choice_name("mm", cfg) for cfg in configs.offered(256, 384, 512) if cfg != broken]
    assert tilefly_names(offered["mm"]) == expected
    assert [r.levelno for r in caplog.records
            if f" {broken.name} " in r.getMessage() and "dropped" in r.getMessage()] == [logging.DEBUG]


def test_exhaustive_autotune_offers_the_exhaustive_configs(offered, monkeypatch):
    """gemm_autotune="exhaustive" offers every config configs.offered(..., "exhaustive") picks, not DEFAULT."""
    from torch._inductor.runtime.benchmarking import benchmarker

    # ~200 choices: time each with one call instead of 120 ms of CPU benchmarking
    monkeypatch.setattr(benchmarker, "benchmark_cpu", functools.partial(benchmarker.benchmark_cpu, warmup=0, rep=0))
    x, w = torch.randn(16, 256, dtype=torch.bfloat16), torch.randn(128, 256, dtype=torch.bfloat16)
    tilefly_config.gemm_autotune = "exhaustive"
    compile_and_run(lambda x, w: x @ w.t(), x, w)
    picked = configs.offered(16, 128, 256, "exhaustive")
    assert len(picked) > len(configs.offered(16, 128, 256))
    assert tilefly_names(offered["mm"]) == [gemm_inductor.choice_name("mm", cfg) for cfg in picked]


def test_dynamic_shapes_get_no_candidates(offered, caplog):
    """Symbolic sizes fail the static-shape predicate: ATen is offered, tilefly is not."""
    a, b = torch.randn(256, 512, dtype=torch.bfloat16), torch.randn(512, 384, dtype=torch.bfloat16)
    with caplog.at_level(logging.DEBUG, logger="tilefly.gemm"):
        out, _ = compile_and_run(lambda x, y: x @ y, a, b, dynamic=True)
    assert "mm" in offered["mm"] and tilefly_names(offered["mm"]) == []
    assert "dynamic (symbolic) shape" in caplog.text
    torch.testing.assert_close(out, a @ b)

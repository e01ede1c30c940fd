"""One quick case of every suite, timed for real on the H200 (few reps): every baseline
provider produces a time, tables and JSON are written. Skipped without an sm_90 GPU."""
import json

import pytest

from tilefly.bench import cli, report, suites, timing
from tilefly.bench.runner import run_suite

SMOKE = timing.Policy(warmup_calls=2, min_reps=5, target_ms=1.0, max_reps=5)
# Providers every case must time (others may be n/a, e.g. flash at head dim 512).
MUST_TIME = {
    "rmsnorm": ["aten"], "rmsnorm_llm": ["aten"], "topk": ["aten:nondet", "aten:det"],
    "dense_gemm": ["aten", "triton", "best(aten,triton)"], "grouped_gemm": ["aten", "best(aten,triton)"],
    "grouped_gemm_small": ["aten", "best(aten,triton)"],
    "mxfp_gemm": ["dequant_mm_eager", "dequant_mm_compiled", "bf16_mm", "dequant_mm"],
    "attention": ["default:fwd", "default:fwd+bwd", "efficient:fwd"],
}


def test_every_suite_names_the_providers_its_smoke_case_must_time():
    """A suite added without an entry here fails its GPU smoke test with a KeyError (grouped_gemm_small did)."""
    assert set(MUST_TIME) == set(suites.NAMES)


@pytest.mark.cuda
@pytest.mark.parametrize("name", suites.NAMES)
def test_one_quick_case(name, tmp_path):
    suite = suites.get(name)
    case = suite.cases()[suite.quick[0]]
    result = run_suite(suite, [case], SMOKE, True, cli.run_environment("smoke"))
    (res,) = result.cases
    for provider in MUST_TIME[name]:
        timed = res.providers[provider]
        assert timed.median_us and timed.median_us > 0, (provider, timed)
        assert timed.p20_us <= timed.median_us <= timed.p80_us
    for provider in res.providers.values():
        if provider.median_us is None:
            assert provider.note, "an untimed provider must say why"
    report.write_all(result, str(tmp_path), png=False)
    data = json.loads((tmp_path / f"{name}.json").read_text())
    assert data["gpu"] and data["quick"] is True and len(data["cases"]) == 1
    assert f"| {case.index} |" in report.markdown(result)


@pytest.mark.cuda
def test_headstart_keeps_host_time_out_of_the_events():
    """A call whose host side spins 400 µs before a tiny kernel: timed plainly, the GPU waits on the
    host between the events (about 400 µs less the flush); with the GPU held 2 ms after each flush, the
    host is ahead and the events time the kernel alone."""
    import dataclasses
    import time

    import torch

    x = torch.randn(1024, device="cuda")

    def slow_host():
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 400e-6:
            pass
        x.add_(1.0)

    policy = timing.Policy(warmup_calls=2, min_reps=20, target_ms=1.0, max_reps=20)
    plain = timing.measure(slow_host, policy).median_us
    held = timing.measure(slow_host, dataclasses.replace(policy, headstart_us=2000.0)).median_us
    assert plain > 200.0 and held < 50.0, (plain, held)

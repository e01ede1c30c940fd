"""Fixtures of the benchmark-harness tests: a synthetic topk-like result (two modes, two
families, one fallback, one error) built by hand so the expected numbers are known."""
import pytest

from tilefly.bench.results import CaseResult, Comparison, ProviderResult, SuiteResult, summarize


def _case(i, family, times, served=None, note=None):
    providers = {name: ProviderResult(us, us * 0.9, us * 1.1, served if name.startswith("tilefly") else None,
                                      note if name.startswith("tilefly") else None, 50)
                 for name, us in times.items()}
    metrics = {"GB/s": {n: 1000.0 / us for n, us in times.items()}}
    return CaseResult({"family": family, "m": i}, f"case{i}", providers, metrics, i)


def _synthetic() -> SuiteResult:
    cases = [
        _case(0, "register", {"aten:nondet": 40.0, "tilefly:nondet": 10.0, "aten:det": 40.0, "tilefly:det": 20.0}),
        _case(1, "register", {"aten:nondet": 30.0, "tilefly:nondet": 30.0, "aten:det": 30.0, "tilefly:det": 15.0}),
        _case(2, "radix", {"aten:nondet": 10.0, "tilefly:nondet": 20.0, "aten:det": 12.0, "tilefly:det": 12.5},
              served=False, note="fallback: k=2000 above the radix limit 1024"),
    ]
    cases[1].providers["tilefly:det"] = ProviderResult(note="error: RuntimeError: boom")
    comps = [Comparison(f"{fam}:{mode} tilefly/aten", f"tilefly:{mode}", f"aten:{mode}", (("family", fam),))
             for fam in ("register", "radix") for mode in ("nondet", "det")]
    result = SuiteResult("topk", "NVIDIA H200", "2.11.0", "3.6.0", "0.1.0", "abc123", "2026-12-01T00:00:00+00:00",
                         False, cases, title="synthetic topk", notes=["a note"], comparisons=comps,
                         metric_columns=["GB/s"], timing="median of 50 reps")
    result.summary = summarize(cases, comps)
    return result



@pytest.fixture
def synthetic():
    return _synthetic


@pytest.fixture
def make_case():
    return _case

"""Summary math and the JSON schema of a suite result."""
import json
import math

import pytest

from tilefly.bench import report
from tilefly.bench.results import ProviderResult, geomean, percentile, ratio, summarize

REQUIRED_KEYS = {"suite", "gpu", "torch", "triton", "tilefly", "commit", "date", "quick", "cases", "summary"}
PROVIDER_KEYS = {"median_us", "p20_us", "p80_us", "served", "note"}


def test_geomean_and_percentile():
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert geomean([0.5, 2.0]) == pytest.approx(1.0)   # a loss cancels a win of the same size
    assert geomean([3.0]) == pytest.approx(3.0)
    with pytest.raises(ValueError):
        geomean([])
    with pytest.raises(ValueError):
        geomean([1.0, 0.0])
    values = sorted([5.0, 1.0, 3.0, 2.0, 4.0])
    assert percentile(values, 0.5) == 3.0
    assert percentile(values, 0.2) == pytest.approx(1.8)
    assert percentile(values, 0.0) == 1.0 and percentile(values, 1.0) == 5.0


def test_ratio_needs_both_timed(make_case):
    case = make_case(0, "x", {"a": 10.0, "b": 30.0})
    assert ratio(case, "a", "b") == pytest.approx(3.0)
    assert ratio(case, "b", "a") == pytest.approx(1 / 3)
    case.providers["a"] = ProviderResult(note="n/a: refused")
    assert ratio(case, "a", "b") is None
    assert ratio(case, "missing", "b") is None


def test_summary_per_family_and_mode(synthetic):
    s = synthetic().summary
    reg = s["register:nondet tilefly/aten"]
    assert reg["n"] == 2 and reg["geomean"] == pytest.approx(math.sqrt(4.0 * 1.0))
    assert reg["min"] == pytest.approx(1.0) and reg["max"] == pytest.approx(4.0)
    assert s["register:det tilefly/aten"]["n"] == 1          # the errored case is left out
    radix = s["radix:nondet tilefly/aten"]
    assert radix["geomean"] == pytest.approx(0.5)             # losses count
    assert radix["n_fallback"] == 1                          # fallbacks count, and are counted
    assert set(s) == {"register:nondet tilefly/aten", "register:det tilefly/aten",
                      "radix:nondet tilefly/aten", "radix:det tilefly/aten"}


def test_json_round_trip(tmp_path, synthetic):
    result = synthetic()
    path = tmp_path / "topk.json"
    report.write_json(result, str(path))
    data = json.loads(path.read_text())
    assert REQUIRED_KEYS <= set(data)
    for case in data["cases"]:
        assert {"case", "id", "providers", "metrics"} <= set(case)
        for provider in case["providers"].values():
            assert PROVIDER_KEYS <= set(provider)
    assert set(data["summary"]["radix:nondet tilefly/aten"]) >= {"geomean", "min", "max", "n"}
    assert data["comparisons"][0]["where"] == {"family": "register"}
    again = report.load(str(path))
    assert again == result
    assert summarize(again.cases, again.comparisons) == result.summary


def test_merge_split_runs(synthetic):
    from tilefly.bench.results import merge

    first, second = synthetic(), synthetic()
    first.cases = first.cases[:2]
    second.cases = second.cases[1:]
    second.cases[0].providers["aten:nondet"] = ProviderResult(60.0, 59.0, 61.0, None, None, 50)
    second.date = "2026-12-02T00:00:00+00:00"
    merged = merge([second, first])
    assert [c.index for c in merged.cases] == [0, 1, 2]
    assert merged.cases[1].providers["aten:nondet"].median_us == 60.0  # the later run wins
    assert merged.date == second.date and merged.notes == ["a note"]
    assert merged.summary["register:nondet tilefly/aten"]["geomean"] == pytest.approx(math.sqrt(4.0 * 2.0))
    second.suite = "other"
    with pytest.raises(ValueError):
        merge([first, second])
    second.suite, second.timing = first.suite, first.timing + "; held 300 µs after each flush"
    with pytest.raises(ValueError, match="timed differently"):
        merge([first, second])

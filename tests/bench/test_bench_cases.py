"""Case lists: counts, identity with the shared copies, quick subsets, --cases selection."""
from collections import Counter
from pathlib import Path

import pytest

from tilefly.bench import suites
from tilefly.bench.cases import Case, select
from tilefly.bench.suites import grouped_gemm

PACKAGE_CASES = Path(__file__).resolve().parents[2] / "tilefly" / "bench" / "cases"
SHARED_CASES = Path(__file__).resolve().parents[3] / "shared" / "cases"


def _cases(name):
    return suites.get(name).cases()


@pytest.mark.parametrize("name,expected", [
    ("dense_gemm", 15), ("grouped_gemm", 24), ("mxfp_gemm", 34), ("rmsnorm", 22),
    ("topk", 33), ("attention", 18), ("rmsnorm_llm", 24), ("grouped_gemm_small", 6),
])
def test_case_counts(name, expected):
    cases = _cases(name)
    assert len(cases) == expected
    assert [c.index for c in cases] == list(range(expected))
    assert len({c.id for c in cases}) == expected, "case ids must be unique"


def test_per_family_counts():
    assert Counter(c.columns["format"] for c in _cases("mxfp_gemm")) == {"mxfp8": 17, "mxfp4": 17}
    assert Counter(c.columns["family"] for c in _cases("topk")) == {"register": 10, "radix": 23}
    assert Counter(c.columns["suite"] for c in _cases("grouped_gemm")) == \
        {"standard": 14, "kn_variants": 5, "ragged_m": 5}


def test_grouped_gemm_small_grid():
    from tilefly.bench.suites import grouped_gemm_small

    cases = _cases("grouped_gemm_small")
    shapes = {c.id: grouped_gemm_small.shape(c) for c in cases}
    assert shapes["gate_up_g128x32"] == ([32] * 128, 1536, 2048)
    assert shapes["down_g128x8"] == ([8] * 128, 2048, 768)
    for c in cases:  # the columns the report and scripts/gemm_ceiling.py read agree with the shape
        rows, n, k = shapes[c.id]
        assert (c.columns["g"], c.columns["m_total"], c.columns["n"], c.columns["k"]) == (len(rows), sum(rows), n, k)


def test_rmsnorm_llm_grid():
    cases = _cases("rmsnorm_llm")
    assert {(c.columns["tokens"], c.columns["hidden"]) for c in cases} == \
        {(t, h) for t in (1, 16, 128, 1024, 8192, 32768) for h in (2048, 4096, 5120, 8192)}
    assert {c.columns["dtype"] for c in cases} == {"bf16"}


@pytest.mark.skipif(not SHARED_CASES.is_dir(), reason="shared/cases not beside this checkout")
def test_csvs_identical_to_shared():
    shared = sorted(p.name for p in SHARED_CASES.glob("*.csv"))
    assert shared == sorted(p.name for p in PACKAGE_CASES.glob("*.csv"))
    for name in shared:
        assert (PACKAGE_CASES / name).read_bytes() == (SHARED_CASES / name).read_bytes(), name


@pytest.mark.parametrize("name", suites.NAMES)
def test_quick_subsets(name):
    suite = suites.get(name)
    cases = suite.cases()
    assert suite.quick, "every suite needs a quick subset"
    assert len(set(suite.quick)) == len(suite.quick)
    assert all(0 <= i < len(cases) for i in suite.quick)
    assert len(suite.quick) <= 4, "the quick run of all suites must stay a few minutes"


def test_grouped_ids_split_by_family():
    ids = [c.id for c in _cases("grouped_gemm")]
    assert sum(i.startswith("std_") for i in ids) == 14
    assert sum(i.startswith(("kn_", "ragged_")) for i in ids) == 10


def test_grouped_parsing():
    assert grouped_gemm.parse("standard", "g8x512x2048x8192") == ([512] * 8, 2048, 8192)
    assert grouped_gemm.parse("kn_variants", "K4096 x N14336 (MoE up)") == ([512] * 8, 14336, 4096)
    assert grouped_gemm.parse("ragged_m", "[0,1024,0,512,2048,128,0,896]") == \
        ([0, 1024, 0, 512, 2048, 128, 0, 896], 4096, 4096)
    with pytest.raises(ValueError):
        grouped_gemm.parse("other", "g1x1x1x1")
    ragged = [c for c in _cases("grouped_gemm") if c.columns["suite"] == "ragged_m"]
    assert [c.columns["m_total"] for c in ragged] == [5568, 4608, 2153, 502, 5515]


def test_case_columns_typed():
    dense = _cases("dense_gemm")[0]
    assert dense.columns == {"m": 8, "n": 4096, "k": 4096}
    assert dense.reference["aten_tflops"] == 22.8
    attn = _cases("attention")
    assert attn[1].columns["causal"] is True and attn[0].columns["causal"] is False


def test_select():
    cases = [Case(0, "m8_a", {}), Case(1, "m16_b", {}), Case(2, "m18_c", {})]
    assert select(cases, None) == cases
    assert [c.index for c in select(cases, ["1"])] == [1]           # digits: index only
    assert [c.index for c in select(cases, ["M1"])] == [1, 2]       # substring, case-insensitive
    assert [c.index for c in select(cases, ["0", "_c"])] == [0, 2]
    assert select(cases, ["nothing"]) == []

"""The sweep's saved-JSON table and the GEMM ceiling script, on CPU with synthetic results."""
import importlib.util
import json
import math
import pathlib

import pytest

from tilefly.ops.gemm import sweep

ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_sweep_table_names_the_best_config_and_its_ratio(tmp_path):
    saved = {"dtype": "bf16", "search": "default", "rows": [
        {"m": 16, "n": 4096, "k": 4096, "layout": "TN", "aten_us": 18.0, "best": "splitk128x16", "best_us": 15.0,
         "configs": {}},
        {"m": 4096, "n": 256, "k": 4096, "layout": "TN", "aten_us": 17.0, "best": "splitk128x64", "best_us": 20.0,
         "configs": {}},
        {"m": 1, "n": 1, "k": 8, "layout": "NN", "aten_us": 3.0, "configs": {}},      # nothing served: skipped
    ]}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(saved))
    lines = []
    sweep.table([str(path)], echo=lines.append)
    assert "| 16x4096x4096 | TN | bf16 | 18.0 | splitk128x16 | 15.0 | 1.20x |" in lines
    assert "| 4096x256x4096 | TN | bf16 | 17.0 | splitk128x64 | 20.0 | 0.85x |" in lines
    assert not any(line.startswith("| 1x1x8") for line in lines)
    assert lines[-1].endswith(f"x{math.sqrt(1.2 * 0.85):.3f}, min x0.85, max x1.20 over 2 rows")


def _ceiling():
    spec = importlib.util.spec_from_file_location("gemm_ceiling", ROOT / "scripts" / "gemm_ceiling.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ceiling_fits_the_read_floor_and_takes_the_slower_floor():
    ceiling = _ceiling()
    # reads at exactly 5 us + 1 us per MB: the fit must recover both
    floor = {"rows": [{"bytes": b, "read": [{"us": 5 + b / 1e6}, {"us": 9 + b / 1e6}]} for b in (1e7, 5e7, 2e8)]}
    fixed, per_byte = ceiling.read_floor_fit(floor)
    assert math.isclose(fixed, 5.0) and math.isclose(per_byte, 1e-6)
    suite = {"cases": [
        {"case": {"m": 16, "n": 4096, "k": 4096},                       # memory-bound: 2 * (64 K + 16 M + 64 K) bytes
         "providers": {"aten": {"median_us": 60.0}, "triton": {"median_us": 80.0}, "tilefly": {"median_us": 50.0}}},
        {"case": {"suite": "standard", "case": "g2x4096", "g": 2, "m_total": 8192, "n": 8192, "k": 8192},
         "providers": {"aten": {"median_us": 3000.0}, "triton": {"median_us": 2000.0},
                       "tilefly": {"median_us": 2500.0}}},
    ]}
    rows = ceiling.bounds(suite, fixed, per_byte, empty_us=4.0, peak_tflops=1000.0)
    memory = 5 + 2 * (16 * 4096 + 4096 * 4096 + 16 * 4096) / 1e6
    assert math.isclose(rows[0]["memory_us"], memory) and rows[0]["memory_us"] > rows[0]["compute_us"]
    assert math.isclose(rows[0]["bound"]["best(aten,triton)"], 60.0 / memory)
    assert math.isclose(rows[0]["tilefly"]["aten"], 60.0 / 50.0)
    compute = 4.0 + 2.0 * 8192 ** 3 / 1e9                               # grouped: compute-bound at 1000 TFLOP/s
    assert rows[1]["shape"] == "standard g2x4096"
    assert math.isclose(rows[1]["compute_us"], compute) and rows[1]["compute_us"] > rows[1]["memory_us"]
    assert math.isclose(rows[1]["bound"]["triton"], 2000.0 / compute)
    assert math.isclose(rows[1]["memory_us"], 5 + 2 * (8192 * 8192 + 2 * 8192 * 8192 + 8192 * 8192) / 1e6)


def test_ceiling_fill_takes_only_the_missing_cases_and_marks_them():
    ceiling = _ceiling()

    def case(index, us):
        return {"index": index, "case": {"m": 16, "n": 4096, "k": 4096},
                "providers": {p: {"median_us": us} for p in ("aten", "triton", "tilefly")}}

    held = {"suite": "dense_gemm", "cases": [case(0, 10.0), case(2, 30.0)]}
    as_defined = {"suite": "dense_gemm", "cases": [case(0, 99.0), case(1, 20.0), case(2, 99.0)]}
    merged = ceiling.filled(held, as_defined)
    assert [(c["index"], c["providers"]["aten"]["median_us"], c.get("filled", False)) for c in merged["cases"]] == \
        [(0, 10.0, False), (1, 20.0, True), (2, 30.0, False)]
    rows = ceiling.bounds(merged, 5.0, 1e-6, empty_us=4.0, peak_tflops=1000.0)
    assert [r["shape"].startswith("* ") for r in rows] == [False, True, False]
    with pytest.raises(ValueError, match="--fill"):
        ceiling.filled(held, dict(as_defined, suite="grouped_gemm"))

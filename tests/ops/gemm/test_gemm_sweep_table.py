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


def test_ceiling_of_mx_cases_counts_packed_values_and_scales_and_groups_by_format(capsys, tmp_path):
    ceiling = _ceiling()

    def case(fmt, m, bf16_us, tilefly_us):
        return {"case": {"format": fmt, "m": m, "n": 4096, "k": 4096},
                "providers": {"bf16_mm": {"median_us": bf16_us}, "dequant_mm": {"median_us": 3 * bf16_us},
                              "tilefly": {"median_us": tilefly_us}}}

    suite = {"suite": "mxfp_gemm", "cases": [case("mxfp8", 32, 16.0, 14.0), case("mxfp4", 32, 16.0, 12.0),
                                             case("mxfp4", 8192, 400.0, 500.0)]}
    rows = ceiling.bounds(suite, 5.0, 1e-6, empty_us=4.0, peak_tflops=1000.0)
    scales = (32 + 4096) * 4096 / 32                              # one E8M0 byte per 32 values of A and B
    out = 2 * 32 * 4096                                           # BF16 C
    assert math.isclose(rows[0]["memory_us"], 5 + ((32 + 4096) * 4096 * 1.0 + scales + out) / 1e6)
    assert math.isclose(rows[1]["memory_us"], 5 + ((32 + 4096) * 4096 * 0.5 + scales + out) / 1e6)
    assert set(rows[0]["bound"]) == {"bf16_mm", "dequant_mm"}     # no aten / triton columns in the MX suite
    assert math.isclose(rows[0]["bound"]["bf16_mm"], 16.0 / rows[0]["memory_us"])
    assert math.isclose(rows[2]["compute_us"], 4.0 + 2.0 * 8192 * 4096 * 4096 / 1e9)
    groups = ceiling.geomean_groups(rows)
    assert {name: len(members) for name, members in groups.items()} == {"mxfp8 ": 1, "mxfp4 ": 2}

    floor = {"empty_us": {"132": 4.0}, "rows": [{"bytes": b, "read": [{"us": 5 + b / 1e6}]} for b in (1e7, 2e8)]}
    (tmp_path / "suite.json").write_text(json.dumps(suite))
    (tmp_path / "floor.json").write_text(json.dumps(floor))
    assert ceiling.main(["--suite", str(tmp_path / "suite.json"), "--floor", str(tmp_path / "floor.json")]) == 0
    printed = capsys.readouterr().out
    assert "| mxfp4 32x4096x4096 | 16.0 | 48.0 | 12.0 |" in printed
    expected = math.sqrt(rows[1]["tilefly"]["bf16_mm"] * rows[2]["tilefly"]["bf16_mm"])
    assert "mxfp4 geomean over bf16_mm: bound" in printed and f"tilefly {expected:.3f}x (2 cases)" in printed

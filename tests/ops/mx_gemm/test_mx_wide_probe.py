"""scripts/mx_wide_probe.py's tables from its JSON (no GPU): the fastest wide build per shape, and one
build's time in two runs."""
import importlib.util
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[3]


def _probe():
    spec = importlib.util.spec_from_file_location("mx_wide_probe", ROOT / "scripts" / "mx_wide_probe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(path, commit, times):
    rows = [{"fmt": "mxfp8", "m": 128, "n": 4096, "k": 4096, "bf16_mm_us": 16.0, "upcast_us": 34.0, "build": build,
             "splits": splits, "auto": True, "us": us, "rel_err": 0.0} for build, splits, us in times]
    path.write_text(json.dumps({"gpu": "H200", "commit": commit, "headstart_us": 0.0, "rows": rows}))
    return str(path)


def test_render_names_the_fastest_build_and_its_ratio_to_bf16_mm(tmp_path):
    path = _run(tmp_path / "a.json", "abc", [("mx3_128x128_s2_w8_k16", 4, 40.0), ("mx3_64x128_s2_w4_k16_b1", 2, 32.0)])
    table = _probe().render([path])
    assert "| MXFP8 128x4096x4096 | 16.0 | 34.0 | 32.0 (mx3_64x128_s2_w4_k16_b1, 2 splits) | 0.50x |" in table


def test_compare_times_the_base_runs_fastest_build_in_the_other_run(tmp_path):
    base = _run(tmp_path / "a.json", "abc", [("x", 1, 40.0), ("y", 1, 32.0)])
    other = _run(tmp_path / "b.json", "def", [("x", 1, 20.0), ("y", 1, 48.0)])
    table = _probe().compare(base, other)
    assert "| MXFP8 128x4096x4096 | y | 32.0 | 48.0 | 1.50x |" in table
    assert "geomean 1.500x" in table

"""Generic tuning-database plumbing: GPU keys, <=-binning, loading, the diffable writer, merging."""
import json

import pytest

from tilefly.tuning import db as tdb


@pytest.mark.parametrize("name,cap,key", [
    ("NVIDIA H200", (9, 0), "sm90_h200"),
    ("NVIDIA H100 80GB HBM3", (9, 0), "sm90_h100"),
    ("NVIDIA H100 PCIe", (9, 0), "sm90_h100_pcie"),
    ("NVIDIA H200 NVL", (9, 0), "sm90_h200_nvl"),
    ("NVIDIA GH200 480GB", (9, 0), "sm90_gh200"),
    ("NVIDIA A100-SXM4-80GB", (8, 0), "sm80_a100_sxm4"),
])
def test_gpu_key(name, cap, key):
    assert tdb.gpu_key(name, cap) == key


def test_floor_bin():
    bins = (1, 128, 1024)
    assert [tdb.floor_bin(v, bins) for v in (0, 1, 127, 128, 1023, 1024, 10**6)] == [None, 1, 1, 128, 128, 1024, 1024]
    assert tdb.floor_bin(5, ()) is None


def _header(**extra):
    return dict({"version": 1, "gpu": "NVIDIA H200", "torch": "2.11.0", "created": "now",
                 "tuner_args": {"quick": True}}, **extra)


def test_written_file_is_diffable_and_loads_back(tmp_path):
    entries = [{"b": 2, "a": 1}, {"a": 3, "b": 4}]
    path = tdb.write(tmp_path / "sub" / "x.json", _header(), entries)
    text = path.read_text()
    lines = text.splitlines()
    assert lines[1].startswith('  "version"') and lines[2].startswith('  "gpu"')
    assert '    {"a": 1, "b": 2},' in lines and '    {"a": 3, "b": 4}' in lines  # one sorted entry per line
    db = tdb.load(path, 1, lambda e: None)
    assert db.entries == tuple(entries) and db.header["gpu"] == "NVIDIA H200"
    assert json.loads(tdb.dumps(_header(), []))["entries"] == []


def test_load_reports_the_bad_entry(tmp_path):
    path = tdb.write(tmp_path / "x.json", _header(), [{"a": 1}, {"a": -1}])
    with pytest.raises(tdb.DatabaseError, match=r"x.json: entry 1: negative"):
        tdb.load(path, 1, lambda e: "negative" if e["a"] < 0 else None)
    with pytest.raises(tdb.DatabaseError, match="schema version 1, this tilefly reads version 2"):
        tdb.load(path, 2, lambda e: None)


def test_merge_combines_chunks_later_file_wins(tmp_path):
    a = tdb.load(tdb.write(tmp_path / "a.json", _header(), [{"k": 1, "t": 1}, {"k": 2, "t": 1}]), 1, lambda e: None)
    b = tdb.load(tdb.write(tmp_path / "b.json", _header(), [{"k": 2, "t": 2}, {"k": 0, "t": 2}]), 1, lambda e: None)
    header, entries = tdb.merge([a, b], key=lambda e: e["k"])
    assert entries == [{"k": 0, "t": 2}, {"k": 1, "t": 1}, {"k": 2, "t": 2}]
    assert header["tuner_args"]["merged_from"] == ["a.json", "b.json"]
    other = tdb.load(tdb.write(tmp_path / "c.json", _header(gpu="NVIDIA H100"), []), 1, lambda e: None)
    with pytest.raises(tdb.DatabaseError, match="different GPUs"):
        tdb.merge([a, other], key=lambda e: e["k"])

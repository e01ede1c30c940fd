"""The decode config database (decode_tuning.py): building it from the probe's rows, validating it,
and picking the nearest shape's config (the default without a database)."""
import json
import logging

import pytest

from tilefly.ops.attention import decode, decode_tuning
from tilefly.tuning import db as tdb


def _row(programs, valid, knobs, us, sdpa_us=50.0, cache=768, rows=4, head_dim=128):
    return dict(batch=programs // 8, programs=programs, rows=rows, head_dim=head_dim, valid=valid, cache=cache,
                us=us, sdpa_us=sdpa_us, **dict(zip(decode_tuning.KNOBS, knobs)))


def _entry(programs, us, sdpa_us, rows=4, head_dim=128, keys=768):
    return dict(programs=programs, keys=keys, rows=rows, head_dim=head_dim, block_n=64, num_warps=4, num_stages=3,
                programs_per_sm=4, us=us, sdpa_us=sdpa_us)


A, B, C = (64, 4, 3, 4), (32, 4, 2, 2), (128, 8, 2, 1)


def test_entries_take_the_least_geometric_mean_over_the_valid_lengths():
    rows = [_row(256, 256, A, 10.0), _row(256, 767, A, 40.0),      # geomean 20
            _row(256, 256, B, 16.0), _row(256, 767, B, 16.0),      # geomean 16: wins
            _row(256, 256, C, 1.0),                                # not timed at 767: left out
            _row(2048, 512, C, 90.0, sdpa_us=200.0), _row(2048, 512, A, 95.0, sdpa_us=200.0),
            _row(256, 512, C, 30.0, rows=8)]                              # another layout: an entry of its own
    entries = decode_tuning.entries_from_probe(rows)
    assert entries == [
        dict(rows=4, head_dim=128, programs=256, keys=768, block_n=32, num_warps=4, num_stages=2, programs_per_sm=2,
             us=16.0, sdpa_us=50.0),
        dict(rows=4, head_dim=128, programs=2048, keys=768, block_n=128, num_warps=8, num_stages=2,
             programs_per_sm=1, us=90.0, sdpa_us=200.0),
        dict(rows=8, head_dim=128, programs=256, keys=768, block_n=128, num_warps=8, num_stages=2, programs_per_sm=1,
             us=30.0, sdpa_us=50.0)]
    assert all(decode_tuning.validate_entry(e) is None for e in entries)


@pytest.mark.parametrize("change, problem", [
    (dict(programs=0), "programs must be a positive integer"),
    (dict(block_n=48), "power of two"),
    (dict(num_warps=3), "num_warps"),
    (dict(us=-1.0), "us must be a positive time"),
    (dict(keys=True), "keys must be a positive integer"),
    (dict(rows=None), "rows must be a positive integer"),
])
def test_bad_entries_are_named(change, problem):
    assert problem in decode_tuning.validate_entry({**_entry(256, 20.0, 40.0), **change})


def test_nearest_shape_in_log2_distance():
    entries = [dict(programs=64, keys=768, name="small"), dict(programs=2048, keys=768, name="large"),
               dict(programs=256, keys=8192, name="long")]
    assert decode_tuning.nearest(entries, 256, 768)["name"] == "small"       # 2 doublings vs 3
    assert decode_tuning.nearest(entries, 1024, 1000)["name"] == "large"
    assert decode_tuning.nearest(entries, 256, 4096)["name"] == "long"


def _write_db(path, entries):
    header = {"version": decode_tuning.VERSION, "gpu": "NVIDIA H200", "torch": "2.11", "created": "now",
              "tuner_args": {}}
    tdb.write(path, header, entries)
    return str(path)


def test_pick_reads_the_database_and_falls_back_to_the_default(tmp_path, caplog):
    path = _write_db(tmp_path / "db.json", decode_tuning.entries_from_probe(
        [_row(256, 512, B, 10.0), _row(2048, 512, C, 50.0)]))
    assert decode_tuning._pick(path, 200, 700, 4, 128) == decode.DecodeConfig(*B)
    assert decode_tuning._pick(path, 4096, 700, 4, 128) == decode.DecodeConfig(*C)
    assert decode_tuning._pick(path, 200, 700, 8, 128) == decode.DEFAULT          # a layout it does not hold
    assert decode_tuning._pick(path, 200, 700, 4, 64) == decode.DEFAULT
    assert decode_tuning._pick(str(tmp_path / "missing.json"), 256, 768, 4, 128) == decode.DEFAULT
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"version": decode_tuning.VERSION, "gpu": "x", "torch": "", "created": "", "tuner_args": {},
                               "entries": [{"programs": 1}]}))
    with caplog.at_level(logging.WARNING, logger="tilefly.attention"):
        assert decode_tuning._pick(str(bad), 256, 768, 4, 128) == decode.DEFAULT
    assert "entry 0" in caplog.text


def test_main_builds_a_database_the_loader_accepts(tmp_path):
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({"gpu": "NVIDIA H200", "capability": [9, 0], "torch": "2.11",
                                 "rows": [_row(256, 512, A, 12.0), _row(256, 512, B, 11.0)]}))
    out = tmp_path / "attention_decode_test.json"
    assert decode_tuning.main([str(probe), "--out", str(out)]) == 0
    (entry,) = decode_tuning.load(out).entries
    assert (entry["block_n"], entry["programs_per_sm"], entry["us"]) == (32, 2, 11.0)
    assert tdb.shipped_path(decode_tuning.FAMILY, tdb.gpu_key("NVIDIA H200", (9, 0))).name == \
        "attention_decode_sm90_h200.json"


def test_main_takes_the_layout_of_older_probe_rows_from_its_flags(tmp_path, capsys):
    probe = tmp_path / "probe.json"
    old = [{k: v for k, v in _row(256, 512, A, 12.0).items() if k not in ("rows", "head_dim")}]
    probe.write_text(json.dumps({"gpu": "NVIDIA H200", "capability": [9, 0], "torch": "2.11", "rows": old}))
    out = tmp_path / "db.json"
    with pytest.raises(SystemExit):
        decode_tuning.main([str(probe), "--out", str(out)])
    assert "--head-dim --rows" in capsys.readouterr().err
    assert decode_tuning.main([str(probe), "--out", str(out), "--rows", "4", "--head-dim", "128"]) == 0
    (entry,) = decode_tuning.load(out).entries
    assert (entry["rows"], entry["head_dim"]) == (4, 128)
    assert json.loads(out.read_text())["tuner_args"]["rows"] == 4


def test_auto_verdicts_and_install_reasons(tmp_path, monkeypatch):
    path = _write_db(tmp_path / "db.json", [_entry(256, 30.0, 40.0), _entry(2048, 39.0, 40.0)])
    monkeypatch.setattr(decode_tuning, "_shipped", lambda device_index: path)
    assert decode_tuning.verdict(0, 300, 768, 4, 128) is None                     # 30 <= 0.9 x 40
    assert "39.0 us against SDPA's 40.0" in decode_tuning.verdict(0, 4096, 768, 4, 128)
    assert "no entry for 8 query rows a head at head dim 128" in decode_tuning.verdict(0, 300, 768, 8, 128)
    assert "no entry for 4 query rows a head at head dim 64" in decode_tuning.verdict(0, 300, 768, 4, 64)
    assert "no CUDA device" in decode_tuning.verdict(-1, 256, 768, 4, 128)
    assert decode_tuning.install_reason(0) is None
    assert "no CUDA device" in decode_tuning.install_reason(None)
    losing = _write_db(tmp_path / "losing.json", [_entry(256, 39.0, 40.0)])
    monkeypatch.setattr(decode_tuning, "_shipped", lambda device_index: losing)
    assert "no shape where the kernel takes <= 0.9x" in decode_tuning.install_reason(0)
    monkeypatch.setattr(decode_tuning, "_shipped", lambda device_index: str(tmp_path / "none.json"))
    assert "no decode tuning database" in decode_tuning.install_reason(0)

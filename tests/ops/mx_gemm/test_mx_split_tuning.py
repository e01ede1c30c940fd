"""The MX decode split tuning database (split_tuning.py): building it from the probe's rows, the shipped
H200 file's entries against today's picks, and the launcher taking an entry's count over its model."""
import json
import logging
from dataclasses import replace

import pytest
import torch

from tilefly import _device
from tilefly.ops.mx_gemm import configs, eligibility, split_tuning
from tilefly.tuning import db as tdb

from mx_cases import operands

H200_DB = tdb.shipped_path(split_tuning.FAMILY, tdb.gpu_key("NVIDIA H200", (9, 0)))


def _row(splits, us, build="mx2_64x32_s4_w4_k16_ss16_xr", rows=6144, cols=32, k=4096, picked=True, fmt="mxfp4"):
    return dict(fmt=fmt, build=build, rows=rows, cols=cols, k=k, splits=splits, us=us, auto=False, picked=picked)


def test_entries_take_the_fastest_count_of_the_picked_build():
    rows = [_row(2, 21.3), _row(4, 17.9), _row(4, 17.7), _row(8, 21.4),      # 4 twice: its least time
            _row(8, 9.0, build="mx2_128x32_s4_w4_k16_ss16_xr", picked=False),  # another build: not the pick's
            _row(2, 35.6, build="mx2_128x16_s4_w4_k16_ss16_xr", rows=28672, cols=16),
            _row(3, 35.6, build="mx2_128x16_s4_w4_k16_ss16_xr", rows=28672, cols=16)]   # a tie: fewer splits
    entries = split_tuning.entries_from_probe(rows)
    assert [(e["rows"], e["cols"], e["splits"], e["us"]) for e in entries] == [(28672, 16, 2, 35.6), (6144, 32, 4, 17.7)]
    assert entries[1]["timed"] == {"2": 21.3, "4": 17.7, "8": 21.4}
    assert all(split_tuning.validate_entry(e) is None for e in entries)


@pytest.mark.parametrize("change, problem", [
    ({"fmt": "fp8"}, "fmt"), ({"splits": 0}, "splits"), ({"rows": 4.5}, "rows"), ({"us": -1.0}, "us"),
    ({"timed": {"2": 21.3}}, "timed"), ({"build": ""}, "build")])
def test_bad_entries_are_named(change, problem):
    entry = split_tuning.entries_from_probe([_row(4, 17.7)])[0]
    assert split_tuning.validate_entry({**entry, **change}).startswith(problem)


def test_shipped_h200_entries_name_todays_picks_and_plannable_counts():
    """A pick that changes build leaves its entries unused: this says which to measure again."""
    entries = split_tuning.load(H200_DB).entries
    assert entries
    for e in entries:
        cfg = configs.pick(e["rows"], e["cols"], e["k"], e["fmt"])
        if e["build"].endswith("_ey"):   # what the launcher runs on the pick when the activation comes expanded
            cfg = replace(cfg, expanded_y=1)
        assert split_tuning.build_name(cfg) == e["build"], f"{e}: the pick is now {cfg.name}"
        assert cfg.min_splits(e["k"]) <= e["splits"] <= e["k"] // cfg.block_k
        assert e["us"] == min(e["timed"].values())


def test_the_expanded_down_projection_splits_where_the_silu_copy_folds():
    """The SiLU kernel folds its copy per CHUNK_BLOCKS; a program whose K-range straddles two chunks scales every
    block instead of folding, so the shipped count gives each program whole chunks."""
    from tilefly.mx import silu_quant

    cfg = replace(configs.pick(4096, 32, 14336, "mxfp4"), expanded_y=1)
    splits = split_tuning._table(str(H200_DB))[("mxfp4", split_tuning.build_name(cfg), 4096, 32, 14336)]
    slots, chunk_slots = 14336 // cfg.block_k, silu_quant.CHUNK_BLOCKS * 32 // cfg.block_k
    assert slots % splits == 0 and (slots // splits) % chunk_slots == 0


def test_build_name_leaves_out_the_split_limit_pdl_and_the_y_fold():
    cfg = configs.pick(6144, 32, 4096, "mxfp4")
    assert cfg.fold_y
    unfolded = replace(cfg, fold_y=0)
    assert split_tuning.build_name(replace(cfg, max_splits=32, pdl=True)) == split_tuning.build_name(cfg) == unfolded.name
    assert split_tuning.build_name(unfolded) == unfolded.name


def _db(tmp_path, entries):
    path = tmp_path / "db.json"
    tdb.write(path, {"version": split_tuning.VERSION, "gpu": "NVIDIA H200", "torch": "", "created": "",
                     "tuner_args": {}}, entries)
    return str(path)


def test_splits_for_serves_only_the_exact_shape(tmp_path, monkeypatch):
    path = _db(tmp_path, split_tuning.entries_from_probe([_row(2, 21.3), _row(4, 17.7)]))
    monkeypatch.setattr(split_tuning, "_shipped", lambda index: path)
    cfg = configs.pick(6144, 32, 4096, "mxfp4")
    assert split_tuning.splits_for(0, "mxfp4", cfg, 6144, 32, 4096) == 4
    assert split_tuning.splits_for(0, "mxfp4", cfg, 6144, 32, 8192) is None       # another K
    assert split_tuning.splits_for(0, "mxfp8", cfg, 6144, 32, 4096) is None       # another format
    assert split_tuning.splits_for(None, "mxfp4", cfg, 6144, 32, 4096) is None    # a CPU tensor
    assert split_tuning.splits_for(-1, "mxfp4", cfg, 6144, 32, 4096) is None


def test_a_bad_database_warns_once_and_the_model_serves(tmp_path, monkeypatch, caplog):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"version": 99}))
    monkeypatch.setattr(split_tuning, "_shipped", lambda index: str(path))
    split_tuning._table.cache_clear()
    cfg = configs.pick(6144, 32, 4096, "mxfp4")
    with caplog.at_level(logging.WARNING, logger="tilefly.mx_gemm"):
        assert split_tuning.splits_for(0, "mxfp4", cfg, 6144, 32, 4096) is None
        assert split_tuning.splits_for(0, "mxfp4", cfg, 6144, 32, 4096) is None
    assert len([r for r in caplog.records if "split planner's model serves" in r.message]) == 1
    split_tuning._table.cache_clear()


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4"])
def test_the_launcher_takes_the_databases_count_over_its_model(monkeypatch, fmt):
    from tilefly.ops.mx_gemm import launch

    monkeypatch.setattr(_device, "sm_count", lambda t: 132)
    a, b, sa, sb = operands(fmt, 32, 6144, 4096, False)
    p = eligibility.parse(a, b, sa, sb, False, False)
    out = torch.empty(32, 6144, dtype=torch.bfloat16)
    model = launch._prepare(p, a, b, sa, sb, out, None, None)
    asked = []

    def measured(device_index, fmt_, cfg, rows, cols, k):
        asked.append((fmt_, split_tuning.build_name(cfg), rows, cols, k))
        return 3

    monkeypatch.setattr(split_tuning, "splits_for", measured)
    tuned = launch._prepare(p, a, b, sa, sb, out, None, None)
    assert asked == [(fmt, split_tuning.build_name(model.cfg), 6144, 32, 4096)]
    assert model.grid[1] == 2 and tuned.grid[1] == 3    # 32 K-steps: 3 splits of 11
    assert tuned.args[-1] == 11


def test_cli_writes_the_database_from_probe_files(tmp_path, capsys):
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({"gpu": "NVIDIA H200", "capability": [9, 0], "torch": "2.11", "commit": "abc",
                                 "rows": [_row(2, 21.3), _row(4, 17.7)]}))
    out = tmp_path / "db.json"
    assert split_tuning.main([str(probe), "--out", str(out)]) == 0
    db = split_tuning.load(out)
    assert [e["splits"] for e in db.entries] == [4] and db.header["tuner_args"]["commits"] == ["abc"]
    assert "4 splits" in capsys.readouterr().out

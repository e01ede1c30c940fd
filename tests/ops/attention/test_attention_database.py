"""The attention tuning database on CPU: schema validation, lookup and binning, defaults,
missing and corrupt files (one warning), the config override, and the steady-state cost."""
import json
import logging
import re
import statistics
import time

import pytest

from tilefly import config
from tilefly.ops.attention import database
from tilefly.tuning import db as tdb
from attention_standins import db_entry, write_db


@pytest.fixture(autouse=True)
def _fresh():
    database.reload()
    yield
    database.reload()


def _plan(served_as="cudnn", direction="fwd", dtype="bf16", d=64, causal=False, gqa=False, sq=1024, sk=1024):
    return database.plan(served_as, direction, dtype, d, causal, gqa, sq, sk, 0)


@pytest.fixture
def grid(tmp_path):
    entries = [db_entry("fwd", sq_bin=s, sk_bin=s, serve={"cudnn": [f"tilefly_fa/cfg{s}", "flash"]})
               for s in (128, 1024, 4096)]
    entries.append(db_entry("fwd", sq_bin=1, sk_bin=4096, serve={"efficient": ["flash"]}))
    entries.append(db_entry("bwd", sq_bin=1024, sk_bin=1024))
    config.attention_db = write_db(tmp_path / "db.json", entries)
    return entries


def test_lookup_takes_the_nearest_bin_at_or_below(grid):
    assert _plan(sq=1024, sk=1024).candidates == (("tilefly_fa", "cfg1024"), ("flash", None))
    assert _plan(sq=4095, sk=4095).candidates[0] == ("tilefly_fa", "cfg1024")
    assert _plan(sq=50000, sk=9000).candidates[0] == ("tilefly_fa", "cfg4096")
    assert _plan("efficient", sq=77, sk=5000).candidates == (("flash", None),)


def test_untuned_keys_keep_pytorchs_choice(grid):
    for plan in (_plan(sq=100, sk=100),             # below the lowest bin
                 _plan(sq=1024, sk=4096),           # no cell (1024, 4096)
                 _plan(d=128), _plan(dtype="fp16"), _plan(causal=True), _plan(gqa=True)):
        assert plan.candidates == () and "untuned workload" in plan.reason


def test_own_kernel_fastest_and_unmeasured_backend(grid):
    plan = _plan(direction="bwd")
    assert plan.candidates == () and "cudnn's own kernel is fastest" in plan.reason
    grid_entry = db_entry("fwd", sq_bin=8, sk_bin=8)
    del grid_entry["serve"]["flash"]
    config.attention_db = write_db(config.attention_db, [grid_entry])
    database.reload()
    assert "flash was not measured" in _plan("flash", sq=8, sk=8).reason


@pytest.mark.parametrize("content,problem", [
    (None, "no such file"),
    ("{not json", "not valid JSON"),
    ('{"version": 1}', "missing top-level fields"),
    ('{"version": 99, "gpu": "x", "torch": "", "created": "", "tuner_args": {}, "entries": []}', "schema version 99"),
])
def test_missing_or_corrupt_file_warns_once_and_keeps_pytorch(tmp_path, caplog, content, problem):
    path = tmp_path / "db.json"
    if content is not None:
        path.write_text(content)
    config.attention_db = str(path)
    with caplog.at_level(logging.WARNING, logger="tilefly"):
        plans = [_plan(sq=s, sk=s) for s in (128, 1024, 1024, 4096)]
    assert all(p.candidates == () for p in plans)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and problem in warnings[0].getMessage()


@pytest.mark.parametrize("mutate,problem", [
    (lambda e: e.pop("direction"), "missing field 'direction'"),
    (lambda e: e.update(dtype="fp32"), "bad dtype"),
    (lambda e: e.update(head_dim=0), "bad head_dim"),
    (lambda e: e.update(causal=1), "bad causal"),
    (lambda e: e["serve"].update(cudnn=[["flash", 1.0]]), "must end with 'cudnn' itself"),
    (lambda e: e["serve"].update(cudnn=[["triton", 1.0], ["cudnn", 2.0]]), "bad item"),
    (lambda e: e["serve"].update(math=[["math", 1.0]]), "unknown backend 'math'"),
    (lambda e: e["times_us"].update(flash=-1), "bad times_us"),
    (lambda e: e.update(shape=[1, 2]), "bad shape"),
])
def test_schema_rejects_bad_entries(tmp_path, mutate, problem):
    entry = db_entry("fwd")
    mutate(entry)
    path = write_db(tmp_path / "db.json", [db_entry("bwd"), entry])
    with pytest.raises(tdb.DatabaseError, match="entry 1: .*" + re.escape(problem)):
        database.load(path)


def test_config_override_replaces_the_shipped_file(tmp_path, monkeypatch):
    monkeypatch.setattr(tdb, "DATA_DIR", tmp_path)
    monkeypatch.setattr(tdb, "device_gpu_key", lambda index: "sm90_test")
    write_db(tmp_path / "attention_sm90_test.json", [db_entry("fwd", sq_bin=8, sk_bin=8, serve={"cudnn": ["flash"]})])
    assert _plan(sq=8, sk=8).candidates == (("flash", None),)
    config.attention_db = write_db(tmp_path / "mine.json",
                                   [db_entry("fwd", sq_bin=8, sk_bin=8, serve={"cudnn": ["efficient"]})])
    assert _plan(sq=8, sk=8).candidates == (("efficient", None),)
    monkeypatch.setenv("TILEFLY_ATTENTION_DB", str(tmp_path / "attention_sm90_test.json"))
    config.reload()
    assert _plan(sq=8, sk=8).candidates == (("flash", None),)


def test_shipped_file_is_named_by_gpu():
    assert tdb.shipped_path("attention", tdb.gpu_key("NVIDIA H200", (9, 0))).name == "attention_sm90_h200.json"


def test_the_shipped_h200_database_comes_from_the_tuner_and_covers_the_benchmark():
    """The shipped file: written by `python -m tilefly tune attention --grid ship` on an H200 (its
    header says so), valid, complete, and with an entry for every attention-suite workload."""
    path = tdb.shipped_path("attention", tdb.gpu_key("NVIDIA H200", (9, 0)))
    data = json.loads(path.read_text())
    assert data["gpu"] == "NVIDIA H200" and data["tuner_args"]["grid_name"] == "ship"
    assert data["tuner_args"]["complete"] and data["tuner_args"].get("hand_made_for") is None
    config.attention_db = str(path)
    for dtype in ("bf16", "fp16"):
        for d, causal, s in ((64, False, 1024), (128, True, 16384), (96, True, 4096), (512, True, 2048)):
            for direction in ("fwd", "bwd"):
                plan = database.plan("cudnn" if d <= 256 else "efficient", direction, dtype, d, causal, False, s, s, 0)
                assert "untuned" not in plan.reason, plan.reason
    # Head dim 512: PyTorch's efficient kernel is beaten in both directions, by tilefly's kernels.
    for direction, config_name in (("fwd", "d512n64p"), ("bwd", "bwd512g")):
        plan = database.plan("efficient", direction, "bf16", 512, False, False, 2048, 2048, 0)
        assert plan.candidates[0] == ("tilefly_fa", config_name)


def test_lookup_cost(grid):
    """Steady state: well under a microsecond per call on a GPU host; < 2 us median here for CI headroom."""
    args = ("cudnn", "fwd", "bf16", 64, False, False, 1500, 1500, 0)
    assert database.plan(*args).candidates
    per_call = []
    for _ in range(100):
        start = time.perf_counter_ns()
        for _ in range(100):
            database.plan(*args)
        per_call.append((time.perf_counter_ns() - start) / 100)
    median_us = statistics.median(per_call) / 1000
    assert median_us < 2.0, f"lookup costs {median_us:.2f} us"


def test_route_reason_overrides_only_ops_the_database_serves_otherwise(grid, monkeypatch):
    from tilefly import _device

    config.attention_routes = "auto"
    monkeypatch.setattr(_device, "has_hopper", lambda: True)
    assert database.route_reason("cudnn", "fwd") is None           # tilefly / flash beat it somewhere
    assert database.route_reason("efficient", "fwd") is None       # flash beats it at Sq 1, Sk 4096
    for backend, direction in (("flash", "fwd"), ("cudnn", "bwd"), ("efficient", "bwd")):
        assert "never serves" in database.route_reason(backend, direction)
    config.attention_routes = "all"
    assert database.route_reason("flash", "fwd") is None
    config.attention_routes = "auto"
    # A saving below an override's host cost does not route the op: 100 - 10 us < HOST_COST_US["bwd"].
    config.attention_db = write_db(config.attention_db + ".small.json",
                                   [db_entry("bwd", sq_bin=1024, sk_bin=1024, serve={"cudnn": ["flash"]})])
    database.reload()
    assert 90.0 < database.HOST_COST_US["bwd"] and "best: 90 us, 90%" in database.route_reason("cudnn", "bwd")
    # Nor does a large saving that is a small share of the op's time (10 us per call is not worth the tax).
    entry = db_entry("fwd", sq_bin=1024, sk_bin=1024, serve={"cudnn": ["flash"]})
    entry["serve"]["cudnn"] = [["flash", 900.0], ["cudnn", 1000.0]]
    config.attention_db = write_db(config.attention_db + ".share.json", [entry])
    database.reload()
    assert "best: 100 us, 10%" in database.route_reason("cudnn", "fwd")
    config.attention_db = "/nonexistent/attention.json"
    database.reload()
    assert database.route_reason("cudnn", "fwd") == "no usable tuning database"
    monkeypatch.setattr(_device, "has_hopper", lambda: False)
    assert database.route_reason("cudnn", "fwd") == "no sm_90 GPU is current"

"""The attention tuner's logic on CPU: grid, chunks, ranking, entries that pass the schema,
the time limit, merging; measurement itself is faked here (GPU: test_attention_gpu.py)."""
import itertools

import pytest
import torch

from tilefly.ops.attention import database, tuner
from tilefly.tuning import db as tdb
from tilefly.tuning import cli


def test_grids_cover_the_issue_and_stay_small():
    full, quick = tuner.grid(quick=False), tuner.grid(quick=True)
    assert {w.head_dim for w in full} == {32, 64, 96, 128, 192, 256, 512}
    assert {w.dtype for w in full} == {"bf16", "fp16"} and {w.gqa for w in full} == {False, True}
    assert all(w.sq == w.sk for w in full if w.causal)
    assert len(full) == 476 and len(quick) == 48
    assert len(set(full)) == len(full)
    b, hq, hk, sq, sk = tuner.Workload("bf16", 512, True, True, 16384, 16384).shape
    assert (b, hq, hk) == (1, 8, 2)
    assert tuner.Workload("bf16", 64, False, False, 1, 1024).shape[0] == 16


def test_the_ship_grid_covers_every_head_dim_of_the_benchmark_in_both_dtypes():
    ship = tuner.grid("ship")
    assert len(ship) == 280 and set(ship) <= set(tuner.grid("full"))
    assert {w.head_dim for w in ship} == {32, 64, 96, 128, 192, 256, 512} and {w.dtype for w in ship} == {"bf16", "fp16"}
    assert [w.dtype for w in ship[:140]] == ["bf16"] * 140     # BF16 (the benchmark's) first: a time-limited call has it
    # Every attention-suite length has its own bin (a lookup takes the bin at or below).
    assert {w.sq for w in ship} >= {1024, 2048, 4096, 8192}
    assert tuner._parser().parse_args(["--quick"]).grid == "quick"
    assert tuner._parser().parse_args([]).grid == "full"


def test_head_dims_pick_a_subset_of_the_grid_for_a_retune():
    ship = tuner.grid("ship")
    d512 = tuner.only_head_dims(ship, "512")
    assert d512 and {w.head_dim for w in d512} == {512} and len(d512) == len(ship) // 7
    assert tuner.only_head_dims(ship, "128,512") == [w for w in ship if w.head_dim in (128, 512)]
    assert tuner.only_head_dims(ship, None) == ship
    with pytest.raises(ValueError, match="no head dim \\[48\\]"):
        tuner.only_head_dims(ship, "48,512")
    assert tuner._parser().parse_args(["--head-dims", "512"]).head_dims == "512"


def test_chunks_partition_the_grid():
    full = tuner.grid(quick=False)
    parts = [tuner.chunk(full, f"{i}/3") for i in (1, 2, 3)]
    assert sorted(itertools.chain(*parts), key=full.index) == full
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    with pytest.raises(ValueError):
        tuner.chunk(full, "4/3")


def test_rank_orders_faster_implementations_and_applies_the_margin():
    native = {"cudnn": 100.0, "flash": 150.0, "efficient": 400.0, "tilefly_fa/a": 80.0}
    served = {"cudnn": {"tilefly_fa/a": 82.0},
              "flash": {"cudnn": 101.0, "tilefly_fa/a": 81.0},
              "efficient": {"cudnn": 105.0, "flash": 152.0, "tilefly_fa/a": 390.0}}  # 390 > 400 * 0.97
    serve = tuner.rank(native, served)
    assert serve["cudnn"] == [["tilefly_fa/a", 82.0], ["cudnn", 100.0]]
    assert serve["flash"] == [["tilefly_fa/a", 81.0], ["cudnn", 101.0], ["flash", 150.0]]
    assert serve["efficient"] == [["cudnn", 105.0], ["flash", 152.0], ["efficient", 400.0]]
    assert "cudnn" not in tuner.rank({"flash": 1.0}, {})  # a backend that did not run gets no row


def _fake_measure(w):
    native = {"cudnn": 100.0, "flash": 90.0} if w.head_dim <= 256 else {"efficient": 500.0}
    served = {"cudnn": {"flash": 91.0}} if w.head_dim <= 256 else {}
    return [tuner.entry(w, d, "cudnn" if w.head_dim <= 256 else "efficient", native, served, {})
            for d in ("fwd", "bwd")]


def test_entries_pass_the_schema_and_answer_lookups(tmp_path, monkeypatch):
    from tilefly import config

    entries, left = tuner.tune(tuner.grid(quick=True), _fake_measure, time_limit_s=1e9, echo=lambda s: None)
    assert not left and len(entries) == 96
    assert all(database.validate_entry(e) is None for e in entries)
    header = {"version": 1, "gpu": "NVIDIA H200", "torch": "x", "created": "now", "tuner_args": {}}
    config.attention_db = str(tdb.write(tmp_path / "db.json", header, entries))
    database.reload()
    try:
        plan = database.plan("cudnn", "bwd", "bf16", 128, True, False, 3000, 3000, 0)
        assert plan.candidates == (("flash", None),)
        assert database.plan("efficient", "fwd", "bf16", 512, True, False, 9000, 9000, 0).candidates == ()
    finally:
        database.reload()


def test_time_limit_stops_starting_workloads():
    ticks = iter(range(1000))
    workloads = tuner.grid(quick=True)[:10]
    messages = []
    entries, left = tuner.tune(workloads, _fake_measure, time_limit_s=3.5, echo=messages.append,
                               clock=lambda: float(next(ticks)))
    assert 0 < len(entries) < 20 and len(left) == 10 - len(entries) // 2
    assert "rerun with --resume" in messages[-1]


def test_a_failing_workload_is_skipped_not_fatal():
    def measure(w):
        if w.head_dim == 512:
            raise RuntimeError("CUDA out of memory")
        return _fake_measure(w)

    messages = []
    entries, left = tuner.tune(tuner.grid(quick=True), measure, 1e9, echo=messages.append)
    assert not left and len(entries) == 72
    assert sum("FAILED RuntimeError: CUDA out of memory" in m for m in messages) == 12


def test_merge_command_writes_one_database(tmp_path, capsys):
    header = {"version": 1, "gpu": "NVIDIA H200", "torch": "x", "created": "now", "tuner_args": {"complete": True}}
    work = tuner.grid(quick=True)
    paths = []
    for i in (1, 2):
        entries, _ = tuner.tune(tuner.chunk(work, f"{i}/2"), _fake_measure, 1e9, echo=lambda s: None)
        paths.append(str(tdb.write(tmp_path / f"part{i}.json", header, entries)))
    out = tmp_path / "all.json"
    assert cli.main(["attention", "--merge", *paths, "--out", str(out)]) == 0
    merged = database.load(str(out))
    assert len(merged.entries) == 96 and merged.header["tuner_args"]["complete"] is True
    assert [database.key_of(e) for e in merged.entries] == sorted(database.key_of(e) for e in merged.entries)


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU this would run the tuner")
def test_cli_without_gpu_or_family(capsys):
    assert cli.main([]) == 2
    assert cli.main(["gemm"]) == 2
    assert cli.main(["attention", "--quick"]) == 2  # no CUDA GPU on this machine
    assert "needs a CUDA GPU" in capsys.readouterr().err

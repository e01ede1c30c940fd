"""The tilefly-vs-cuDNN report on CPU: ratios from hand-made entries whose answers are known,
the command line on a hand-made file, and the shipped database covering every served head dim."""
import math

import pytest

from tilefly.ops.attention import configs, database, report
from attention_standins import db_entry, write_db


def _entry(direction, dtype, head_dim, times):
    e = db_entry(direction, dtype=dtype, head_dim=head_dim)
    e["times_us"] = times
    return e


ENTRIES = [
    # best tilefly 80 ("flash" at 50 is not tilefly): 120 / 80
    _entry("fwd", "bf16", 64, {"cudnn": 120.0, "flash": 50.0, "tilefly_fa/m128n64": 80.0, "tilefly_fa/m64n64": 95.0}),
    _entry("fwd", "fp16", 64, {"cudnn": 90.0, "tilefly_fa/m128n128": 100.0}),             # 0.9
    _entry("fwd", "bf16", 64, {"flash": 70.0, "tilefly_fa/m128n64": 10.0}),                # no cuDNN time: skipped
    _entry("bwd", "bf16", 128, {"cudnn": 300.0, "efficient": 900.0, "tilefly_fa/bwd64x64": 200.0}),   # 1.5
]


def test_ratios_of_hand_made_entries():
    assert report.cudnn_ratios(ENTRIES) == {("bwd", 128): (1.5, 1.5, 1), ("fwd", 64): (0.9, 1.5, 2)}
    assert report.cudnn_ratios(ENTRIES, "bf16") == {("bwd", 128): (1.5, 1.5, 1), ("fwd", 64): (1.5, 1.5, 1)}
    assert report.cudnn_ratios(ENTRIES, "fp16") == {("fwd", 64): (0.9, 0.9, 1)}


def test_table():
    assert report.format_table(report.cudnn_ratios(ENTRIES), head_dims=(64, 128, 512)).splitlines() == [
        "| head dim | 64 | 128 | 512 |",
        "|---|---|---|---|",
        "| forward | 0.90-1.50x (2) | - | - |",
        "| backward | - | 1.50-1.50x (1) | - |",
    ]


def test_command_line(tmp_path, capsys):
    path = write_db(tmp_path / "db.json", ENTRIES)
    assert report.main(["--db", path, "--dtype", "fp16"]) == 0
    out = capsys.readouterr().out
    assert "### fp16" in out and "### bf16" not in out and "| forward | 0.90-0.90x (1) | - |" in out
    assert report.main(["--db", str(tmp_path / "missing.json")]) == 2


@pytest.mark.parametrize("dtype", [None, "bf16", "fp16"])
def test_shipped_database_covers_every_head_dim(dtype):
    ratios = report.cudnn_ratios(database.load(report.SHIPPED_DB).entries, dtype)
    for d in configs.HEAD_DIMS:
        assert ratios[("fwd", d)][2] > 0
    for lo, hi, n in ratios.values():
        assert 0 < lo <= hi and math.isfinite(hi) and n > 0


"""Merging e2e runs (split over device calls) into one report: Markdown, JSON, PNG, and the CLI."""
import importlib.util
import json

import pytest

from tilefly.bench.e2e import report, split


def _side(tok_s, tpot_ms=1.0):
    return {"tok_s": tok_s, "decode_tok_s": tok_s * 1.1, "tpot_ms": tpot_ms, "ttft_ms": 50.0,
            "prefill_s": 0.05, "decode_s": 1.0, "compile_s": 30.0, "runs": 1}


def _row(conc, a, b, ok=True):
    return {"concurrency": conc, "A": _side(a), "B": _side(b), "speedup": b / a,
            "agreement": {"ok": ok, "max_rel_err": 1e-3 if ok else 0.5, "token_match": 0.75}}


def _run(model, precision, rows, date, commit="a" * 40):
    return {"kind": "tilefly-e2e", "schema": 1, "model": model, "precision": precision, "input_len": 256,
            "output_len": 512, "compile_mode": "max-autotune", "runs": 1, "rows": rows, "gpu": "NVIDIA H200",
            "torch": "2.11.0", "transformers": "5.17.0", "commit": commit, "date": date,
            "sides": {"A": {"backends": "ATEN,TRITON", "mx_backend": "dequant"},
                      "B": {"backends": "ATEN,TRITON,TILEFLY", "mx_backend": "scaled_mm"}}}


@pytest.fixture
def parts():
    first = _run("llama-3.1-8b", "bf16", [_row(8, 1000.0, 1200.0), _row(16, 1800.0, 1900.0)],
                 "2026-12-01T00:00:00+00:00")
    second = _run("llama-3.1-8b", "bf16", [_row(16, 2000.0, 2500.0), _row(32, 3000.0, 2900.0, ok=False)],
                  "2026-12-01T01:00:00+00:00")
    mx = _run("llama-3.1-8b", "mxfp8", [_row(8, 500.0, 1500.0), _row(64, 900.0, 2700.0)], "2026-12-01T02:00:00+00:00")
    return first, second, mx


def test_merge_groups_and_later_run_wins(parts):
    first, second, mx = parts
    merged = report.merge([second, mx, first])  # input order does not matter; dates do
    assert merged["kind"] == report.MERGED_KIND
    assert [(r["model"], r["precision"]) for r in merged["runs"]] == [("llama-3.1-8b", "bf16"),
                                                                     ("llama-3.1-8b", "mxfp8")]
    bf16 = merged["runs"][0]
    assert [row["concurrency"] for row in bf16["rows"]] == [8, 16, 32]
    assert bf16["rows"][1]["A"]["tok_s"] == 2000.0, "the later run's concurrency 16 wins"
    assert bf16["date"] == "2026-12-01T01:00:00+00:00"
    assert merged["notes"] == []
    # merging a merged report with nothing new changes nothing
    assert report.merge([merged]) == merged


def test_a_later_one_side_run_keeps_the_other_side_of_the_row(parts):
    first, _, _ = parts
    b_only = _run("llama-3.1-8b", "bf16", [{"concurrency": 8, "B": _side(1500.0), "note": "B only"}],
                  "2026-12-01T03:00:00+00:00", commit="c" * 40)
    b_only["side"] = "B"
    merged = report.merge([first, b_only])
    row = merged["runs"][0]["rows"][0]
    assert row["A"]["tok_s"] == 1000.0 and row["B"]["tok_s"] == 1500.0
    assert row["speedup"] == pytest.approx(1.5)
    assert row["commits"] == {"A": "a" * 40, "B": "c" * 40}
    assert "agreement" not in row and "carried over" in row["note"]
    assert "1.50x" in report.markdown(merged)
    # an A-only run never pairs with a row that has no B
    a_only = _run("llama-3.1-8b", "bf16", [{"concurrency": 64, "A": _side(700.0)}], "2026-12-01T04:00:00+00:00")
    a_only["side"] = "A"
    assert "speedup" not in report.merge([first, a_only])["runs"][0]["rows"][-1]


def test_a_one_side_run_of_another_environment_or_an_error_keeps_rows_apart(parts):
    first, _, _ = parts
    elsewhere = _run("llama-3.1-8b", "bf16", [{"concurrency": 8, "B": _side(1500.0)}], "2026-12-01T03:00:00+00:00")
    elsewhere.update(side="B", gpu="NVIDIA H100")
    row = report.merge([first, elsewhere])["runs"][0]["rows"][0]
    assert "A" not in row and "speedup" not in row           # another GPU's B is not paired with this A
    failed = _run("llama-3.1-8b", "bf16", [{"concurrency": 8, "B": {"error": "OOM"}}], "2026-12-01T03:00:00+00:00")
    failed["side"] = "B"
    row = report.merge([first, failed])["runs"][0]["rows"][0]
    assert row["A"]["tok_s"] == 1000.0 and row["B"]["tok_s"] == 1200.0   # the measured row stays


def test_merge_notes_different_environments(parts):
    first, second, _ = parts
    second["commit"] = "b" * 40
    assert "different environments" in report.merge([first, second])["notes"][0]


def test_markdown_tables(parts):
    md = report.markdown(report.merge(list(parts)))
    assert "### llama-3.1-8b · bf16" in md and "### llama-3.1-8b · mxfp8" in md
    bf16_table, mx_table = md.split("### llama-3.1-8b · mxfp8")
    row8 = next(line for line in bf16_table.splitlines() if line.startswith("| 8 |"))
    assert "| 1000 | 1200 | 1.20x |" in row8 and "ok (1.0e-03, tokens 75%)" in row8
    row32 = next(line for line in bf16_table.splitlines() if line.startswith("| 32 |"))
    assert "0.97x" in row32 and "**MISMATCH**" in row32
    assert "BF16 B tok/s" not in bf16_table and "BF16 B tok/s" in mx_table
    mx8 = next(line for line in mx_table.splitlines() if line.startswith("| 8 |"))
    assert "| 500 | 1500 | 3.00x |" in mx8 and "| 1200 | 1.25x |" in mx8  # B vs the BF16 model's B
    mx64 = next(line for line in mx_table.splitlines() if line.startswith("| 64 |"))
    assert mx64.count("|  |") >= 2, "no BF16 run at concurrency 64: empty cells"
    assert "MX layers: A dequant, B scaled_mm" in mx_table


def test_markdown_shows_a_failed_side(parts):
    first = parts[0]
    first["rows"][0]["B"] = {"error": "MXKernelUnavailable: boom"}
    del first["rows"][0]["speedup"], first["rows"][0]["agreement"]
    md = report.markdown(report.merge([first]))
    row8 = next(line for line in md.splitlines() if line.startswith("| 8 |"))
    assert "| error |" in row8 and "B: MXKernelUnavailable: boom" in row8


def test_write_all_and_cli_merge(parts, tmp_path):
    from tilefly.bench.e2e.__main__ import main

    paths = []
    for i, part in enumerate(parts):
        path = tmp_path / f"run_{i}.json"
        path.write_text(json.dumps(part))
        paths.append(str(path))
    out = tmp_path / "merged"
    assert main(["--merge", *paths, "--out", str(out)]) == 0
    merged = report.load(str(out / "e2e.json"))
    assert merged == report.merge(list(parts))
    assert (out / "e2e.md").read_text().startswith("## e2e:")
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "e2e.png").stat().st_size > 1000


def test_load_rejects_other_json(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"suite": "topk"}))
    with pytest.raises(ValueError, match="not an e2e result"):
        report.load(str(path))


def test_runs_of_other_lengths_or_modes_stay_apart(parts):
    first, second, _ = parts
    second["output_len"] = 64
    merged = report.merge([first, second])
    assert len(merged["runs"]) == 2
    assert sorted(r["output_len"] for r in merged["runs"]) == [64, 512]


def test_runs_of_other_attention_stay_apart(parts):
    first, second, _ = parts
    second["attention"] = "grouped"  # first has no key: recorded before the option, transformers' path
    merged = report.merge([first, second])
    assert sorted(split.attention(r) for r in merged["runs"]) == ["grouped", "hf"]
    md = report.markdown(merged)
    assert "### llama-3.1-8b · bf16 · hf attention" in md and "### llama-3.1-8b · bf16 · grouped attention" in md


def test_mx_runs_of_other_scale_layouts_stay_apart(parts):
    """MX runs without the key were recorded in SWIZZLE_32_4_4; a NO_SWIZZLE run gets a table of its
    own, and both still find the BF16 model's side B for their B/BF16 column."""
    first, _, mx = parts
    plain = dict(mx, rows=[dict(row) for row in mx["rows"]], mx_swizzle="none", date="2026-12-01T03:00:00+00:00")
    merged = report.merge([first, mx, plain])
    assert sorted(str(split.mx_swizzle(r)) for r in merged["runs"]) == ["32_4_4", "None", "none"]
    md = report.markdown(merged)
    assert "### llama-3.1-8b · mxfp8 · hf attention\n" in md
    assert "### llama-3.1-8b · mxfp8 · hf attention · none scale layout" in md
    rows_at_8 = [line for line in md.splitlines() if line.startswith("| 8 |") and "| 1500 |" in line]
    assert len(rows_at_8) == 2 and all("1.25x" in line for line in rows_at_8)  # 1500 over BF16 B's 1200


def test_cudagraph_skips_are_flagged(parts):
    first = parts[0]
    first["rows"][1]["B"]["cudagraph_skips"] = 2
    md = report.markdown(report.merge([first]))
    row16 = next(line for line in md.splitlines() if line.startswith("| 16 |"))
    assert "B: CUDA graphs skipped 2x" in row16
    assert "skipped" not in next(line for line in md.splitlines() if line.startswith("| 8 |"))


def test_the_bf16_baseline_of_an_mx_run_has_its_tilefly_options(parts):
    """A BF16 run with a tilefly option set (an experiment) is not the baseline of an MX run without it."""
    first, _, mx = parts
    experiment = dict(first, rows=[dict(row, B=_side(999.0)) for row in first["rows"]],
                      tilefly_options={"attention_decode": True}, date="2026-12-01T05:00:00+00:00")
    for order in ([first, experiment, mx], [experiment, first, mx]):
        md = report.markdown(report.merge(order))
        row8 = next(line for line in md.splitlines() if line.startswith("| 8 |") and "| 1500 |" in line)
        assert "| 1200 | 1.25x |" in row8

"""Markdown and PNG rendering from a synthetic result, and --render from JSON."""
import importlib.util

import pytest

from tilefly.bench import cli, report
from tilefly.bench.results import CaseResult, ProviderResult, SuiteResult, summarize


def _lines_with(text, needle):
    return [line for line in text.splitlines() if needle in line]


def test_markdown_tables_per_mode(synthetic):
    md = report.markdown(synthetic())
    assert md.startswith("## topk: synthetic topk")
    assert "NVIDIA H200" in md and "torch 2.11.0" in md and "commit abc123" in md and "full (3 cases)" in md
    assert "> a note" in md
    assert "### nondet" in md and "### det" in md
    header = _lines_with(md, "| # |")[0]
    assert "aten µs (GB/s)" in header and "tilefly/aten" in header
    row0 = _lines_with(md, "| 0 | register |")[0]
    assert "40.0 (25.0)" in row0 and "4.00x" in row0


def test_markdown_fallback_error_and_geomean(synthetic):
    md = report.markdown(synthetic())
    radix = _lines_with(md, "| 2 | radix |")
    assert all("fallback: k=2000 above the radix limit 1024" in line for line in radix)
    assert not any("0.50x" in line for line in radix), "a fallback shows its reason instead of a speedup"
    errored = _lines_with(md, "| 1 | register |")[1]  # the det table
    assert "| error |" in errored and "RuntimeError: boom" in errored
    geo = _lines_with(md, "**geomean**")
    assert len(geo) == 2
    # nondet over all three cases: (4 * 1 * 0.5) ** (1/3)
    assert f"**{2 ** (1 / 3):.2f}x**" in geo[0]
    assert "`register:nondet tilefly/aten`: geomean **2.00x** (min 1.00x, max 4.00x, n=2)" in md
    assert "1 fell back to ATen" in md


def test_markdown_without_modes_or_comparisons():
    case = CaseResult({"m": 8, "n": 16}, "8x16", {"aten": ProviderResult(12.345, 12.0, 13.0, None, None, 50),
                                                  "cudnn": ProviderResult(note="n/a: head dim 512 unsupported")},
                      {"TFLOP/s": {"aten": 100.0}}, 0)
    result = SuiteResult("s", "gpu", "t", "tr", "tf", "unknown", "date", True, [case], metric_columns=["TFLOP/s"])
    result.summary = summarize(result.cases, [])
    md = report.markdown(result)
    assert "###" not in md and "Summary" not in md and "**geomean**" not in md
    assert "| 0 | 8 | 16 | 12.3 (100) | n/a | cudnn: n/a: head dim 512 unsupported |" in md
    assert "quick subset" in md


def test_pipe_in_notes_is_escaped(synthetic):
    result = synthetic()
    result.cases[0].providers["aten:det"].note = "a|b"
    assert "a\\|b" in report.markdown(result)


def test_write_all_and_render(tmp_path, capsys, synthetic):
    result = synthetic()
    written = report.write_all(result, str(tmp_path), png=False)
    assert sorted(p.rsplit("/", 1)[-1] for p in written) == ["topk.json", "topk.md"]
    (tmp_path / "topk.md").unlink()
    out_dir = tmp_path / "rendered"
    assert cli.main(["--render", str(tmp_path / "topk.json"), "--out", str(out_dir), "--no-plot"]) == 0
    printed = capsys.readouterr().out
    assert printed.strip() == report.markdown(result).strip()
    assert (out_dir / "topk.md").read_text() == report.markdown(result)


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="matplotlib not installed")
def test_png(tmp_path, synthetic):
    path = tmp_path / "topk.png"
    assert report.plot(synthetic(), str(path)) is None
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_png_without_matplotlib(tmp_path, monkeypatch, synthetic):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    why = report.plot(synthetic(), str(tmp_path / "x.png"))
    assert "matplotlib is not installed" in why
    assert not (tmp_path / "x.png").exists()


def test_cli_merge(tmp_path, capsys, synthetic):
    first, second = synthetic(), synthetic()
    first.cases, second.cases = first.cases[:1], first.cases[1:]
    report.write_json(first, str(tmp_path / "a.json"))
    report.write_json(second, str(tmp_path / "b.json"))
    out = tmp_path / "merged"
    assert cli.main(["--merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out", str(out), "--no-plot"]) == 0
    merged = report.load(str(out / "topk.json"))
    assert [c.id for c in merged.cases] == ["case0", "case1", "case2"]
    assert merged.summary == synthetic().summary
    assert "| 2 | radix |" in capsys.readouterr().out

"""A and B in separate processes (``--side``), then merged: the same report as a both-sides run,
identical weights and prompts across processes, refused and unpaired pairs, small files, and a
perturbed side caught by the merge's logits comparison. Tiny model, eager, on CPU."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")

import tilefly  # noqa: E402
from tilefly.bench.e2e import ab, engine, report, split  # noqa: E402
from tilefly.bench.e2e.__main__ import main  # noqa: E402

ARGS = ["--model", "tiny", "--device", "cpu", "--eager", "--input-len", "8", "--output-len", "4",
        "--concurrency", "2", "3", "--runs", "1"]
NAME = "run_tiny_bf16_c2-3"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A both-sides run in this process; side A and side B each in a process of its own, started
    with different hash seeds (set iteration order must not reach the weights)."""
    both, sides = tmp_path_factory.mktemp("both"), tmp_path_factory.mktemp("sides")
    assert main([*ARGS, "--out", str(both)]) == 0
    root = os.path.dirname(os.path.dirname(tilefly.__file__))
    procs = [subprocess.Popen([sys.executable, "-m", "tilefly.bench.e2e", *ARGS, "--side", side, "--out", str(sides)],
                              env=dict(os.environ, PYTHONPATH=root, PYTHONHASHSEED=str(i)), cwd=root,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i, side in enumerate("AB")]
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out
    return both / f"{NAME}.json", sides / f"{NAME}_A.json", sides / f"{NAME}_B.json"


def _table(md):
    return [line for line in md.splitlines() if line.startswith("|")]


def test_split_merge_matches_a_both_sides_run(runs, tmp_path, capsys):
    both, a, b = runs
    assert main(["--merge", str(a), str(b), "--out", str(tmp_path), "--no-plot"]) == 0
    merged, ref = report.load(str(tmp_path / "e2e.json")), report.merge([report.load(str(both))])
    got_md, want_md = report.markdown(merged), report.markdown(ref)
    assert _table(got_md)[:2] == _table(want_md)[:2] and len(_table(got_md)) == len(_table(want_md))
    assert "*separate runs*" in got_md and "*separate runs*" not in want_md
    (run,), (ref_run,) = merged["runs"], ref["runs"]
    assert run["sides"] == ref_run["sides"] and run["weights_sha"] == ref_run["weights_sha"]
    for row, ref_row in zip(run["rows"], ref_run["rows"]):
        assert set(row) == set(ref_row) | {"split"} and "check" not in row
        assert row["prompts_sha"] == ref_row["prompts_sha"]
        assert row["split"] == {"A": a.name, "B": b.name} and "commits" not in row   # one commit
        agree, ref_agree = row["agreement"], ref_row["agreement"]
        assert set(agree) == set(ref_agree) | {"basis"}
        for key in ("ok", "max_rel_err", "rows_compared", "top1_match", "token_match", "timed_token_match"):
            assert agree[key] == ref_agree[key], key
        assert agree["ok"] and agree["max_rel_err"] == 0.0   # same machine, same weights: bit-identical
    assert "| 3 |" in capsys.readouterr().out


def test_side_files_hold_the_environment_and_stay_small(runs):
    _, a, b = runs
    for path, side in ((a, "A"), (b, "B")):
        data = json.loads(path.read_text())
        assert data["side"] == side and set(data["sides"]) == {side}
        for key in ("gpu", "torch", "commit", "date", "seed", "model_config", "input_len", "output_len",
                    "weights_sha", "compare_steps", "tol"):
            assert key in data, key
        assert all(set(row["check"]) == {side} and row[side]["tok_s"] > 0 for row in data["rows"])
        assert path.stat().st_size < 16_000 and (path.parent / f"{path.stem}.md").exists()
    # the record at Llama-8B scale (32 requests, 4 steps, 512 output tokens), random logits
    g = torch.Generator().manual_seed(0)
    logits = [(3 * torch.randn(32, 128256, generator=g)).bfloat16().float() for _ in range(4)]
    check = split.side_check(torch.zeros(32, 4, dtype=torch.long), logits,
                             torch.randint(0, 128256, (32, 512), generator=g))
    assert len(json.dumps(check)) < 400_000


@pytest.mark.parametrize("field, value", [("weights_sha", "0" * 16), ("input_len", 9), ("torch", "2.99.0")])
def test_a_mismatched_pair_is_refused(runs, tmp_path, capsys, field, value):
    _, a, b = runs
    data = json.loads(b.read_text())
    data[field] = value
    bad = tmp_path / b.name
    bad.write_text(json.dumps(data))
    assert main(["--merge", str(a), str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{field} " in err and str(a) in err and str(bad) in err
    assert not (tmp_path / "out" / "e2e.json").exists()


def test_sides_from_other_commits_say_so(runs, tmp_path, capsys):
    _, a, b = runs
    data = json.loads(b.read_text())
    data["commit"] = "later1"
    later = tmp_path / b.name
    later.write_text(json.dumps(data))
    assert main(["--merge", str(a), str(later), "--out", str(tmp_path / "out"), "--no-plot"]) == 0
    a_commit = json.loads(a.read_text())["commit"]
    for row in report.load(str(tmp_path / "out" / "e2e.json"))["runs"][0]["rows"]:
        assert row["commits"] == {"A": a_commit, "B": "later1"}
    assert f"A at commit {a_commit}, B at later1" in capsys.readouterr().out


def _merge_b_with(runs, tmp_path, capsys, **fields) -> str:
    """Merge side A's run with side B's run rewritten with ``fields``; both must stay unpaired (the
    merged runs keep a note on every row). Returns what the merge printed."""
    _, a, b = runs
    data = {**json.loads(b.read_text()), **fields}
    other = tmp_path / b.name
    other.write_text(json.dumps(data))
    assert main(["--merge", str(a), str(other), "--out", str(tmp_path / "out"), "--no-plot"]) == 0
    runs_ = report.load(str(tmp_path / "out" / "e2e.json"))["runs"]
    assert len(runs_) == 2 and all("note" in row for run in runs_ for row in run["rows"])   # unpaired
    return capsys.readouterr().out


def test_sides_of_other_tilefly_options_stay_apart(runs, tmp_path, capsys, monkeypatch):
    from tilefly import config
    from tilefly.bench.e2e import ab

    assert ab._changed_options() == {}
    monkeypatch.setattr(config, "mx_pdl", True)
    assert ab._changed_options() == {"mx_pdl": True}
    out = _merge_b_with(runs, tmp_path, capsys, tilefly_options={"mx_pdl": True})
    assert "· tilefly mx_pdl=True" in out


def test_sides_with_exact_casts_stay_apart_and_say_so(runs, tmp_path, capsys):
    fields = dict(inductor_options={"emulate_precision_casts": True}, tilefly_options={"attention_decode": "off"})
    assert split.options(fields) == "tilefly attention_decode=off, inductor emulate_precision_casts=True"
    out = _merge_b_with(runs, tmp_path, capsys, **fields)
    assert "· tilefly attention_decode=off, inductor emulate_precision_casts=True" in out


def test_sides_of_limited_b_families_stay_apart_and_say_so(runs, tmp_path, capsys):
    """``--b-ops`` is recorded in the run file (a B of fewer families measures something else), and
    the title of its table says which families B ran, and that the run was eager."""
    assert main([*ARGS, "--side", "B", "--b-ops", "topk", "rms_norm", "--out", str(tmp_path)]) == 0
    limited = json.loads((tmp_path / f"{NAME}_B.json").read_text())
    assert limited["b_ops"] == ["rms_norm", "topk"] and limited["sides"]["B"]["tilefly_ops"] == ["topk", "rms_norm"]
    assert split.options(limited) == "B ops=rms_norm+topk"
    capsys.readouterr()
    out = _merge_b_with(runs, tmp_path, capsys, b_ops=limited["b_ops"])
    assert "### tiny · bf16 · eager · grouped attention · B ops=rms_norm+topk" in out


def test_other_prompts_are_refused(runs, tmp_path):
    _, a, _ = runs
    assert main([*ARGS, "--concurrency", "3", "--seed", "1", "--side", "B", "--out", str(tmp_path)]) == 0
    other = json.loads((tmp_path / "run_tiny_bf16_c3_B.json").read_text())
    with pytest.raises(ValueError, match="weights_sha .*prompts_sha"):
        report.merge([report.load(str(a)), other])


def test_sides_of_other_attention_stay_unpaired(runs):
    """A side-B run with transformers' attention does not pair with (or replace) the grouped
    side B of the same concurrency: each attention gets its own table."""
    _, a, b = runs
    grouped_b = report.load(str(b))
    hf_b = dict(report.load(str(b)))
    hf_b.pop("attention")  # as recorded before the option existed
    hf_b["date"] = "9999-01-01T00:00:00+00:00"  # later: it would have won a plain (model, precision) key
    merged = report.merge([report.load(str(a)), grouped_b, hf_b])
    by_attention = {split.attention(run): run for run in merged["runs"]}
    assert sorted(by_attention) == ["grouped", "hf"]
    assert all(row.get("agreement", {}).get("ok") for row in by_attention["grouped"]["rows"])
    assert all("B only" in row["note"] for row in by_attention["hf"]["rows"])


def test_an_unpaired_side_is_reported(runs, tmp_path):
    _, a, b = runs
    b_c3 = json.loads(b.read_text())
    b_c3["rows"] = [row for row in b_c3["rows"] if row["concurrency"] == 3]
    merged = report.merge([report.load(str(a)), b_c3])
    rows = merged["runs"][0]["rows"]
    assert [row["concurrency"] for row in rows] == [2, 3]
    assert "B" not in rows[0] and "A only" in rows[0]["note"] and "check" not in rows[0]
    assert rows[1]["agreement"]["ok"] and "note" not in rows[1]
    line = next(line for line in _table(report.markdown(merged)) if line.startswith("| 2 |"))
    assert re.search(r"\| \d+/- \|", line) and "A only" in line and line.count("|  |") >= 4  # B's cells empty
    only_b = report.merge([report.load(str(b))])["runs"][0]["rows"]
    assert all("B only" in row["note"] and "A" not in row for row in only_b)


def _perturbed(kind):
    decode = engine.decode_step

    def step(model, cache, ids):
        nxt, logits = decode(model, cache, ids)
        logits = logits.clone()
        scale = logits.abs().amax()
        if kind == "one column":    # far below the top 16: only request 0's whole row shows it
            logits[:, 7] = logits.amin(dim=-1) - 0.2 * scale
        else:                       # every request but 0, argmax unchanged: only the top 16 show it
            logits[1:] *= 1.2
        return nxt, logits

    return step


@pytest.mark.parametrize("kind", ["one column", "top logits"])
def test_the_merge_catches_a_perturbed_side(runs, tmp_path, monkeypatch, kind):
    _, a, _ = runs
    monkeypatch.setattr(engine, "decode_step", _perturbed(kind))
    assert main([*ARGS, "--side", "B", "--out", str(tmp_path)]) == 0
    shutil.copy(a, tmp_path)
    merged = report.merge([report.load(str(tmp_path / a.name)), report.load(str(tmp_path / f"{NAME}_B.json"))])
    for row in merged["runs"][0]["rows"]:
        agree = row["agreement"]
        assert not agree["ok"] and agree["max_rel_err"] > 0.1 and agree["token_match"] == 1.0, agree
        assert agree["rel_err"][0] == 0.0   # the prefill is not perturbed
    assert "**MISMATCH**" in report.markdown(merged)


def test_record_comparison_tracks_the_full_one():
    """On the same logits, the records' error is at most the in-process one and equal to it where
    the largest error lies in a top 16 or in request 0's row at step 1; token figures are equal, also
    after a request diverges."""
    g = torch.Generator().manual_seed(3)
    ref = [4 * torch.randn(6, 300, generator=g) for _ in range(4)]
    test = [r + 0.02 * torch.randn(r.shape, generator=g) for r in ref]
    test[1][0, ref[1][0].argmin()] -= 3.0   # request 0's row: seen
    test[2][4, ref[2][4].argmax()] += 3.0   # a top logit: seen
    test[3][4, ref[3][4].argmin()] -= 3.0   # the tail of another request: missed
    second = ref[1][5].topk(2).indices[1]
    test[1][5, second] = test[1][5].max() + 0.01   # request 5 diverges at step 1
    r_tok = torch.stack([r.argmax(-1) for r in ref], dim=1)
    t_tok = torch.stack([t.argmax(-1) for t in test], dim=1)
    full = ab.logits_agreement(ref, test, r_tok, t_tok, tol=0.05)
    got = split.agreement(split.side_check(r_tok, ref, r_tok), split.side_check(t_tok, test, t_tok), tol=0.05)
    assert got["rows_compared"] == full["rows_compared"] == [6, 6, 5, 5]
    for key in ("token_match", "rows_diverged", "first_divergence", "top1_match"):
        assert got[key] == full[key], key
    assert all(e <= f + 1e-12 for e, f in zip(got["rel_err"], full["rel_err"]))
    assert got["rel_err"][0] > 0.5 * full["rel_err"][0]   # noise only: the top 16 see most of it
    assert got["rel_err"][1:3] == pytest.approx(full["rel_err"][1:3], rel=1e-6) and full["rel_err"][1] > 0.1
    assert got["rel_err"][3] < 0.05 < full["rel_err"][3]
    assert got["timed_token_match"] == pytest.approx(23 / 24)


def test_pack_round_trip():
    for t in (torch.randn(3, 5).bfloat16(), torch.arange(12, dtype=torch.int32).reshape(3, 4),
              torch.zeros(2, 0, dtype=torch.int32)):
        back = split.unpack(json.loads(json.dumps(split.pack(t))))
        assert back.dtype == t.dtype and torch.equal(back, t)

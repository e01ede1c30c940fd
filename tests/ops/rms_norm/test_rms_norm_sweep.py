"""sweep.py's command line on CPU, with the GPU timing replaced: case selection (--case, several),
--new (the heuristic and configs.new_candidates only, every config listed) and the TUNED lines."""
from tilefly.ops.rms_norm import configs, sweep


def test_new_sweep_times_the_heuristic_and_the_new_candidates_of_the_named_cases(monkeypatch, capsys):
    asked = []

    def fake_case(dtype, M, N, quick, new=False):
        size = 4 if dtype == "fp32" else 2
        layout = configs.row_layout(N, N, True, size)
        pick = configs.heuristic(N, size, layout)
        todo = [pick] + (configs.new_candidates(N, size, layout) if new else [])
        asked.append((dtype, M, N, new, len(todo)))
        result = {cfg: 100.0 - i for i, cfg in enumerate(todo)}  # the last new candidate wins
        result.update(aten=150.0, op=100.0, layout=layout, heuristic=pick, bytes=(2 * M * N + N) * size)
        return result

    # the mechanics, whatever is pending: two stand-in candidates per case
    pending = lambda N, size, layout: configs.tried_candidates(N, size, layout)[:2]  # noqa: E731
    monkeypatch.setattr(configs, "new_candidates", pending)
    monkeypatch.setattr(sweep, "sweep_case", fake_case)
    sweep.main(["--new", "--case", "fp16,8192,4097", "--case", "fp16,2048,114688"])
    out = capsys.readouterr().out
    assert [a[:4] for a in asked] == [("fp16", 2048, 114688, True), ("fp16", 8192, 4097, True)]
    split_new = configs.new_candidates(4097, 2, configs.SPLIT)
    assert asked[1][4] == 1 + len(split_new)
    for cfg in split_new:
        assert f"  {cfg}\n" in out                                  # every timed config listed
    assert f"(2, 'split', 4096): {split_new[-1]!r}," in out        # and the winner as a TUNED line

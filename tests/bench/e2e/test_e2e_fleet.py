"""The e2e fleet (several one-side runs at once, one per GPU): its queue, deadline and commands, on CPU
with stand-in processes."""
import argparse

import pytest

from tilefly.bench.e2e import fleet


class _Process:
    """Ends (rc) after ``polls`` polls."""

    def __init__(self, polls, rc):
        self.polls, self.rc = polls, rc

    def poll(self):
        self.polls -= 1
        return self.rc if self.polls < 0 else None


def _args(tmp_path, **kw):
    base = dict(model="llama-3.1-8b", out=str(tmp_path), timeout=290, deadline=None, min_start=120, profile=8,
                compile_prefill=False, commit="abc1234", extra=[])
    return argparse.Namespace(**{**base, **kw})


def test_jobs_parse_and_bad_ones_are_named():
    assert fleet.parse_job("mxfp8:32:B") == fleet.Job("mxfp8", 32, "B")
    for bad in ("mxfp8:32", "fp8:32:B", "bf16:x:A", "bf16:8:C"):
        with pytest.raises(argparse.ArgumentTypeError, match="PRECISION:CONCURRENCY:SIDE"):
            fleet.parse_job(bad)


def test_an_interrupted_fleet_stops_its_jobs(tmp_path):
    started = []

    class _Stuck(_Process):
        def __init__(self):
            super().__init__(polls=10 ** 9, rc=0)
            self.stopped = False
            started.append(self)

        def terminate(self):
            self.stopped = True

        def wait(self):
            return -15

    def sleep_then_interrupt(seconds):
        raise KeyboardInterrupt

    jobs = [fleet.parse_job("bf16:8:A"), fleet.parse_job("bf16:8:B")]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fleet.time, "sleep", sleep_then_interrupt)
        with pytest.raises(KeyboardInterrupt):
            fleet.run(jobs, _args(tmp_path), gpus=2, launch=lambda *a, **k: _Stuck())
    assert len(started) == 2 and all(p.stopped for p in started)


def test_the_same_job_twice_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        fleet.main(["--jobs", "bf16:8:A", "bf16:8:A", "--out", str(tmp_path), "--gpus", "1"])
    assert "named twice" in capsys.readouterr().err


def test_the_command_of_a_job(tmp_path):
    cmd = fleet.command(fleet.Job("bf16", 16, "A"), _args(tmp_path, extra=["--mx-swizzle", "none"]))
    assert cmd[1:] == ["-m", "tilefly.bench.e2e", "--model", "llama-3.1-8b", "--precision", "bf16", "--concurrency",
                       "16", "--side", "A", "--out", str(tmp_path), "--no-plot", "--eager-prefill", "--profile", "8",
                       "--commit", "abc1234", "--mx-swizzle", "none"]


def test_a_queue_over_two_gpus_and_a_deadline(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")      # the fleet's GPUs 0 and 1 are devices 4 and 5
    (tmp_path / "run_llama-3.1-8b_mxfp8_c8_B.json").write_text("{}")   # an older run of a job about to run
    launched = []
    ends = {"bf16_c8_A": (2, 0), "bf16_c8_B": (0, 1), "mxfp8_c8_B": (1, 124), "mxfp8_c16_B": (0, 0)}

    def launch(cmd, env, stdout, stderr):
        name = f"{cmd[cmd.index('--precision') + 1]}_c{cmd[cmd.index('--concurrency') + 1]}_" \
               f"{cmd[cmd.index('--side') + 1]}"
        launched.append((name, env["CUDA_VISIBLE_DEVICES"], cmd[2]))
        assert env["TORCHINDUCTOR_FX_GRAPH_CACHE"] == "0" and cmd[0] == "timeout"
        return _Process(*ends[name])

    now = [0.0]

    def clock():
        now[0] += 100.0     # every look at the clock: 100 s later
        return now[0]

    jobs = [fleet.parse_job(j) for j in ("bf16:8:A", "bf16:8:B", "mxfp8:8:B", "mxfp8:16:B")]
    outcome = fleet.run(jobs, _args(tmp_path, deadline=500), gpus=2, launch=launch, clock=clock, poll_s=0)
    # the first two start at once on GPUs 0 and 1, each limited to what the deadline leaves
    assert launched[:2] == [("bf16_c8_A", "4", "290"), ("bf16_c8_B", "5", "290")]
    assert launched[2] == ("mxfp8_c8_B", "5", "200")       # GPU 1 freed first, 200 s of the deadline left
    assert not (tmp_path / "run_llama-3.1-8b_mxfp8_c8_B.json").exists()
    assert outcome == {"bf16_c8_A": "rc 0", "bf16_c8_B": "rc 1", "mxfp8_c8_B": "timed out",
                       "mxfp8_c16_B": "not started: 100 s left of the deadline"}
    assert (tmp_path / "log_bf16_c8_A.txt").exists()


def test_a_job_runs_until_the_deadline_unless_capped():
    assert fleet.job_limit(None, 430.7) == 430           # no cap: what the deadline leaves
    assert fleet.job_limit(290, 430.7) == 290 and fleet.job_limit(500, 430.7) == 430
    assert fleet.job_limit(300, None) == 300
    assert fleet.job_limit(None, None) == fleet.NO_DEADLINE_TIMEOUT


def test_tiny_fleet_on_cpu_runs_real_processes_and_pairs_them(tmp_path):
    """The whole path, subprocesses and merge, with the e2e CLI's CPU dry run (eager, tiny lengths)."""
    import json

    pytest.importorskip("transformers")
    rc = fleet.main(["--model", "tiny", "--jobs", "bf16:8:A", "bf16:8:B", "--out", str(tmp_path), "--gpus", "1",
                     "--timeout", "240", "--", "--device", "cpu", "--eager", "--input-len", "8", "--output-len", "4"])
    assert rc == 0
    (run,) = json.loads((tmp_path / "merged" / "e2e.json").read_text())["runs"]
    (row,) = run["rows"]
    assert row["A"]["tok_s"] > 0 and row["B"]["tok_s"] > 0 and row["agreement"]["ok"], row
    assert sorted(p.name for p in tmp_path.glob("log_*.txt")) == ["log_bf16_c8_A.txt", "log_bf16_c8_B.txt"]


@pytest.mark.cuda
def test_tiny_fleet_runs_both_sides_and_pairs_them(tmp_path):
    import json

    pytest.importorskip("transformers")
    rc = fleet.main(["--model", "tiny", "--jobs", "bf16:8:A", "bf16:8:B", "--out", str(tmp_path), "--timeout", "300",
                     "--", "--input-len", "32", "--output-len", "16"])
    assert rc == 0
    (run,) = json.loads((tmp_path / "merged" / "e2e.json").read_text())["runs"]
    (row,) = run["rows"]
    assert row["A"]["tok_s"] > 0 and row["B"]["tok_s"] > 0 and row["agreement"]["ok"], row

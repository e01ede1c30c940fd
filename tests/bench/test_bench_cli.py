"""The bench CLI on a machine without a Hopper GPU, and its argument handling."""
import pytest

from tilefly import doctor
from tilefly.bench import cli


@pytest.fixture
def no_hopper(monkeypatch):
    monkeypatch.setattr(cli, "hopper_missing", lambda: "this machine has no CUDA GPU")


@pytest.mark.parametrize("status", [0, 3])
def test_cpu_machine_runs_selfcheck_and_returns_its_status(monkeypatch, capsys, no_hopper, status):
    calls = []
    monkeypatch.setattr(doctor, "selfcheck", lambda: calls.append(1) or status)
    assert cli.main([]) == status
    out = capsys.readouterr().out
    assert calls == [1]
    assert "need an NVIDIA Hopper GPU" in out and "no CUDA GPU" in out
    assert "torch" in out and "gpu" in out  # the environment is printed


def test_cpu_machine_with_suite_arguments_does_not_crash(monkeypatch, capsys, no_hopper):
    monkeypatch.setattr(doctor, "selfcheck", lambda: 0)
    assert cli.main(["--suite", "dense_gemm", "--cases", "8x4096", "--rep", "3"]) == 0
    assert "need an NVIDIA Hopper GPU" in capsys.readouterr().out


def test_selfcheck_crash_is_reported_not_raised(monkeypatch, capsys, no_hopper):
    def broken():
        raise ModuleNotFoundError("No module named 'tilefly.ops.x'")

    monkeypatch.setattr(doctor, "selfcheck", broken)
    assert cli.main([]) == 1
    assert "self-check could not run" in capsys.readouterr().out


def test_real_machine_check_matches_torch():
    import torch

    reason = cli.hopper_missing()
    has_hopper = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
    assert (reason is None) == has_hopper


def test_list(capsys):
    assert cli.main(["--list"]) == 0
    out = capsys.readouterr().out
    for name in ("rmsnorm", "rmsnorm_llm", "topk", "dense_gemm", "grouped_gemm", "grouped_gemm_small", "mxfp_gemm",
                 "attention"):
        assert f"\n{name}: " in "\n" + out
    assert "*  9  4096x4096x4096" in out  # a quick dense case, marked


def test_argument_errors():
    with pytest.raises(SystemExit):
        cli.parse_args(["--suite", "nope"])
    with pytest.raises(SystemExit):
        cli.parse_args(["--rep", "0"])
    with pytest.raises(SystemExit):
        cli.parse_args(["--rounds", "0"])
    assert cli.parse_args(["--rounds", "5"]).rounds == 5 and cli.parse_args([]).rounds == 1
    for bad in ("-1", "20000"):
        with pytest.raises(SystemExit):
            cli.parse_args(["--headstart-us", bad])
    assert cli.parse_args(["--headstart-us", "250"]).headstart_us == 250.0
    assert cli.parse_args([]).headstart_us == 0.0


def test_headstart_reaches_the_policy_and_its_description(monkeypatch, tmp_path, capsys):
    from tilefly.bench import runner, timing

    seen = []

    def run_suite(suite, cases, policy, *args, **kwargs):
        seen.append(policy)
        raise RuntimeError("stop here: only the policy is under test")

    monkeypatch.setattr(runner, "run_suite", run_suite)
    monkeypatch.setattr(cli, "run_environment", lambda commit: {})
    status = cli.run(cli.parse_args(["--suite", "rmsnorm", "--cases", "0", "--headstart-us", "300",
                                     "--out", str(tmp_path), "--commit", "x"]))
    assert status == 1 and "stop here" in capsys.readouterr().err
    assert seen[0].headstart_us == 300.0 and seen[0].rounds == 1
    assert "held 300 µs after each flush" in seen[0].describe()
    assert "held" not in timing.FULL.describe()


def test_suite_selection():
    assert cli.selected_suites(None) == list(cli.suites.NAMES)
    assert cli.selected_suites(["all"]) == list(cli.suites.NAMES)
    assert cli.selected_suites(["topk", "rmsnorm", "topk"]) == ["topk", "rmsnorm"]


def test_python_m_entry_point(monkeypatch, capsys, no_hopper):
    from tilefly.__main__ import main

    monkeypatch.setattr(doctor, "selfcheck", lambda: 0)
    assert main(["bench", "--quick"]) == 0
    assert "need an NVIDIA Hopper GPU" in capsys.readouterr().out


def test_e2e_suite_takes_its_own_arguments_in_any_spelling():
    """``--suite e2e`` and ``--suite=e2e``, anywhere on the line, hand the rest to the e2e engine;
    mixed with other suites it is a clear error, not argparse's "invalid choice"."""
    assert cli.e2e_argv(["--suite", "e2e", "--model", "tiny"]) == ["--model", "tiny"]
    assert cli.e2e_argv(["--model", "tiny", "--suite=e2e"]) == ["--model", "tiny"]
    assert cli.e2e_argv(["--precision", "bf16", "--suite", "e2e", "--eager"]) == ["--precision", "bf16", "--eager"]
    assert cli.e2e_argv(["--suite", "rmsnorm"]) is None and cli.e2e_argv([]) is None
    for mixed in (["--suite", "e2e", "rmsnorm"], ["--suite", "rmsnorm", "e2e"]):
        with pytest.raises(SystemExit, match="runs alone"):
            cli.e2e_argv(mixed)


def test_main_hands_the_e2e_suite_to_its_engine(monkeypatch):
    e2e = pytest.importorskip("tilefly.bench.e2e.__main__")
    seen = []
    monkeypatch.setattr(e2e, "main", lambda argv: seen.append(argv) or 0)
    assert cli.main(["--model", "tiny", "--suite=e2e"]) == 0 and seen == [["--model", "tiny"]]


def test_a_finished_run_leaves_no_checkpoint_and_a_failed_one_keeps_it(monkeypatch, tmp_path, synthetic):
    from tilefly.bench import runner

    fail = []

    def run_suite(suite, cases, policy, quick, env, checkpoint=None):
        result = synthetic()
        result.suite = suite.name
        checkpoint(result)
        assert (tmp_path / f"{suite.name}.partial.json").exists()
        if fail:
            raise RuntimeError("stopped after the checkpoint")
        return result

    monkeypatch.setattr(runner, "run_suite", run_suite)
    monkeypatch.setattr(cli, "run_environment", lambda commit: {})
    args = ["--suite", "topk", "--cases", "0", "--out", str(tmp_path), "--no-plot", "--commit", "x"]
    assert cli.run(cli.parse_args(args)) == 0
    assert (tmp_path / "topk.json").exists() and not (tmp_path / "topk.partial.json").exists()
    fail.append(True)
    assert cli.run(cli.parse_args(args)) == 1
    assert (tmp_path / "topk.partial.json").exists()

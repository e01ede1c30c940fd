"""The runner's bookkeeping, and each suite's inputs and eager providers dry-run on CPU
(timing faked: CUDA events need a GPU; the GPU smoke test times for real)."""
import contextlib

import pytest
import torch

from tilefly.bench import runner, timing
from tilefly.bench.cases import Case
from tilefly.bench.results import Comparison
from tilefly.bench.runner import CaseBench, Derived, Plan, Provider
from tilefly.bench.suites import _common, attention, dense_gemm, grouped_gemm, mxfp_gemm, rmsnorm, topk


@pytest.fixture
def fake_timing(monkeypatch):
    """measure() calls fn twice and reports 10 µs per call times the provider's position."""
    calls = []

    def measure(fn, policy=timing.FULL, device=None):
        fn()
        fn()
        calls.append(fn)
        us = 10.0 * len(calls)
        return timing.Timing(us, us * 0.9, us * 1.1, 2)

    monkeypatch.setattr(timing, "measure", measure)
    return calls


@pytest.fixture
def on_cpu(monkeypatch, fake_timing):
    monkeypatch.setattr(_common, "DEVICE", "cpu")


def _raise(message):
    raise RuntimeError(message)


def test_run_case_bookkeeping(fake_timing):
    seen = []

    @contextlib.contextmanager
    def context():
        seen.append("in")
        yield
        seen.append("out")

    bench = CaseBench(
        providers=[Provider("a", lambda: lambda: torch.ones(2), context=context, inspect=lambda: "picked X"),
                   Provider("b", lambda: lambda: _raise("refused\nsecond line"), error_label="n/a"),
                   Provider("c", None, note="n/a: not built"),
                   Provider("d", lambda: lambda: torch.zeros(1), note="config k64")],
        metrics=lambda name, us: {"TFLOP/s": 100.0 / us},
        derived=[Derived("best(a,d)", ("a", "d")), Derived("best(b,c)", ("b", "c"))])
    plan = Plan(lambda case: bench, [Comparison("d/a", "d", "a")], ["TFLOP/s"])
    result = runner.run_case(Case(3, "x", {"m": 1}), plan, timing.FULL)
    p = result.providers
    assert seen == ["in", "out"]
    assert (p["a"].median_us, p["a"].p20_us, p["a"].p80_us, p["a"].reps) == (10.0, 9.0, 11.0, 2)
    assert p["a"].note == "picked X" and p["a"].served is None
    assert p["b"].median_us is None and p["b"].note == "n/a: refused"
    assert p["c"].median_us is None and p["c"].note == "n/a: not built"
    assert p["d"].median_us == 20.0 and p["d"].note == "config k64"
    assert p["best(a,d)"].median_us == 10.0 and p["best(a,d)"].note == "= a"
    assert p["best(b,c)"].median_us is None
    assert result.metrics["TFLOP/s"] == {"a": 10.0, "d": 5.0, "best(a,d)": 10.0}
    assert result.index == 3 and result.case == {"m": 1}


def test_interleaved_rounds_take_turns_and_pool_the_samples(monkeypatch):
    """rounds=3: warm-up once per provider, then a, b, c and two rounds in the runner's shuffled
    orders, ceil(10 / 3) = 4 reps a turn, each inside the provider's context; the pooled 12
    samples make the median; a provider failing in a later round is recorded as failed, one not
    built as n/a."""
    events, entered = [], []
    b_calls = []

    def make_context(name):
        @contextlib.contextmanager
        def context():
            entered.append(name)
            yield
        return context

    def b_fn():
        b_calls.append(1)
        if len(b_calls) > 2:
            raise RuntimeError("gone")

    fns = {"a": lambda: None, "b": b_fn, "c": lambda: None}
    policy = timing.Policy(rounds=3, headstart_us=50.0)     # the hold reaches every sample
    monkeypatch.setattr(timing, "warm", lambda fn, policy, device=None: events.append(("warm", fn)) or 10)

    def sample(fn, reps, device=None, headstart_us=0.0):
        assert headstart_us == policy.headstart_us
        name = next(n for n, f in fns.items() if f is fn)
        events.append((name, reps))
        fn()
        base = {"a": 10.0, "b": 20.0, "c": 30.0}[name]
        return [base + i for i in range(reps)]

    monkeypatch.setattr(timing, "sample", sample)
    providers = [Provider("a", lambda: fns["a"], context=make_context("a")),
                 Provider("n", None, note="n/a: not here"),
                 Provider("b", lambda: fns["b"], context=make_context("b"), error_label="n/a"),
                 Provider("c", lambda: fns["c"], context=make_context("c"), note="config x")]
    got = runner.run_providers_interleaved(providers, policy)
    assert list(got) == ["a", "n", "b", "c"]
    order = [e[0] for e in events if e[0] != "warm"]
    want = [n for r in range(3) for n in runner._round_order(["a", "b", "c"], r)]
    assert order == want and order[:3] == ["a", "b", "c"]     # b fails in round 3, its last
    assert all(e[1] == 4 for e in events if e[0] != "warm")
    assert entered[:3] == ["a", "b", "c"] and entered.count("a") == 1 + 3 + 1   # build, 3 rounds, result
    assert (got["a"].median_us, got["a"].reps) == (timing.summary([10.0 + i for i in range(4)] * 3).median_us, 12)
    assert got["c"].note == "config x" and got["c"].reps == 12
    assert got["b"].median_us is None and got["b"].note == "n/a: gone"
    assert got["n"].note == "n/a: not here"
    assert "3 rounds" in policy.describe()


def test_round_orders_vary_the_neighbours():
    """After the first round the order is shuffled per round (seeded: runs repeat), so no provider
    follows the same one every round, as a rotated cyclic order would make it."""
    names = [f"p{i}" for i in range(10)]
    orders = [runner._round_order(names, r) for r in range(5)]
    assert orders[0] == names and all(sorted(o) == names for o in orders)
    assert orders == [runner._round_order(names, r) for r in range(5)]
    before_first = {o[o.index("p0") - 1] if o.index("p0") else None for o in orders[1:]}
    assert len(before_first) > 1


def test_run_case_interleaves_when_asked(monkeypatch, fake_timing):
    seen = []
    monkeypatch.setattr(runner, "run_providers_interleaved",
                        lambda providers, policy: seen.append(policy.rounds) or
                        {p.name: runner.ProviderResult(1.0, 1.0, 1.0, None, None, 1) for p in providers})
    bench = CaseBench(providers=[Provider("a", lambda: lambda: None)], metrics=lambda name, us: {})
    plan = Plan(lambda case: bench, [], [])
    result = runner.run_case(Case(0, "x", {}), plan, timing.Policy(rounds=2))
    assert seen == [2] and result.providers["a"].median_us == 1.0 and not fake_timing


def test_case_setup_failure_is_recorded(fake_timing):
    plan = Plan(lambda case: _raise("out of memory"), [], [])
    result = runner.run_case(Case(0, "x", {}), plan, timing.FULL)
    assert result.providers["setup"].note == "error: RuntimeError: out of memory"


def test_reps_policy():
    assert timing.FULL.reps_for(1000.0) == 200                   # 200 ms of 1 ms calls
    assert timing.FULL.reps_for(10_000.0) == timing.FULL.min_reps
    assert timing.FULL.reps_for(0.5) == timing.FULL.max_reps
    assert timing.Policy(fixed_reps=7).reps_for(1.0) == 7
    assert "L2 flushed" in timing.FULL.describe()


def test_rmsnorm_dry_run(on_cpu):
    case = Case(0, "t", {"dtype": "fp16", "m": 4, "n": 33})
    result = runner.run_case(case, rmsnorm.plan(), timing.FULL)
    assert result.providers["aten"].median_us == 10.0
    assert result.metrics["GB/s"]["aten"] == pytest.approx((2 * 4 * 33 + 33) * 2 / 10.0 / 1e3)
    if "tilefly" in result.providers:  # the family exists: on CPU it cannot serve, and says so
        assert result.providers["tilefly"].served is False
        assert result.providers["tilefly"].note.startswith("fallback: ")


def test_topk_modes_restore_determinism(on_cpu):
    assert not torch.are_deterministic_algorithms_enabled()
    seen = []
    with topk.deterministic(True):
        seen.append(torch.are_deterministic_algorithms_enabled())
    assert seen == [True] and not torch.are_deterministic_algorithms_enabled()
    result = runner.run_case(Case(0, "t", {"family": "register", "m": 8, "n": 100, "k": 4}), topk.plan(), timing.FULL)
    assert {"aten:nondet", "aten:det"} <= set(result.providers)
    assert all(p.median_us for p in result.providers.values())
    assert not torch.are_deterministic_algorithms_enabled()


def test_dense_inputs_and_aten(on_cpu):
    bench = dense_gemm.plan().bench(Case(0, "t", {"m": 8, "n": 16, "k": 32}))
    providers = {p.name: p for p in bench.providers}
    assert {"aten", "triton"} <= set(providers)
    out = providers["aten"].build()()
    assert out.shape == (8, 16) and out.dtype == torch.bfloat16
    assert bench.metrics("aten", 1.0) == {"TFLOP/s": 2 * 8 * 16 * 32 / 1e6, "B TB/s": 16 * 32 * 2 / 1e6}
    assert "B TB/s" not in dense_gemm.gemm_metrics(512, 16, 32)("aten", 1.0)


def test_dense_tilefly_hook_gets_the_nt_operands(on_cpu, monkeypatch):
    """The hook computes a @ b (b K x N): it must get B^T, the column-major K x N view. It once got
    the N x K tensor itself, which timed NN on square shapes and nothing on the others."""
    seen = []

    class Hook:
        @staticmethod
        def tilefly_providers(a, b):
            seen.append((a, b))
            return {"cfg": lambda: a @ b}

    monkeypatch.setattr(dense_gemm.hooks, "bench_module", lambda name: (Hook, None))
    bench = dense_gemm.plan().bench(Case(0, "t", {"m": 8, "n": 16, "k": 32}))
    aten = next(p for p in bench.providers if p.name == "aten").build()
    next(p for p in bench.providers if p.name == "tilefly").build()
    (a, b), = seen
    assert a.shape == (8, 32) and b.shape == (32, 16) and b.stride() == (1, 32)
    torch.testing.assert_close(a @ b, aten())


def test_grouped_inputs(on_cpu):
    case = Case(0, "t", {"suite": "ragged_m", "case": "[3,0,5]"})
    bench = grouped_gemm.plan().bench(case)
    aten = next(p for p in bench.providers if p.name == "aten").build()
    a, b, offs = _closure_tensors(aten)
    assert a.shape == (8, 4096) and b.shape == (3, 4096, 4096)
    assert b.stride() == (4096 * 4096, 1, 4096), "B must be column-major per group"
    assert offs.dtype == torch.int32 and offs.tolist() == [3, 3, 8]
    assert bench.metrics("aten", 1.0)["TFLOP/s"] == pytest.approx(2 * 8 * 4096 * 4096 / 1e6)


def _closure_tensors(fn):
    import inspect

    cells = inspect.getclosurevars(fn).nonlocals
    return cells["a"], cells["b"], cells["offs"]


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4"])
def test_mxfp_dequant_baseline_matches_reference(on_cpu, fmt):
    bench = mxfp_gemm.plan().bench(Case(0, "t", {"format": fmt, "m": 4, "n": 8, "k": 64}))
    providers = {p.name: p for p in bench.providers}
    assert {"dequant_mm_eager", "dequant_mm_compiled", "bf16_mm"} <= set(providers)
    got = providers["dequant_mm_eager"].build()().float()
    bf16 = providers["bf16_mm"].build()().float()
    assert got.shape == bf16.shape == (4, 8)
    assert not torch.equal(got, bf16)  # quantization changed something
    assert torch.allclose(got, bf16, atol=0.6 * 8 if fmt == "mxfp4" else 1.0, rtol=0.3)
    metrics = bench.metrics("dequant_mm_eager", 1.0)
    data_bytes = 8 * 64 if fmt == "mxfp8" else 8 * 32
    assert metrics["W TB/s"] == pytest.approx((data_bytes + 8 * 2) / 1e6)
    assert bench.metrics("bf16_mm", 1.0)["W TB/s"] == pytest.approx(8 * 64 * 2 / 1e6)


def test_attention_on_cpu_default_runs_and_cudnn_is_na(on_cpu):
    case = Case(0, "t", {"batch": 1, "heads": 2, "seqlen": 16, "head_dim": 8, "causal": True})
    result = runner.run_case(case, attention.plan(), timing.FULL)
    p = result.providers
    assert p["default:fwd"].median_us and p["default:fwd+bwd"].median_us
    assert p["cudnn:fwd"].median_us is None and p["cudnn:fwd"].note.startswith("n/a: ")
    flops = 4 * 1 * 2 * 16 * 16 * 8 / 2
    assert result.metrics["TFLOP/s"]["default:fwd"] == pytest.approx(flops / p["default:fwd"].median_us / 1e6)
    assert result.metrics["TFLOP/s"]["default:fwd+bwd"] == \
        pytest.approx(3.5 * flops / p["default:fwd+bwd"].median_us / 1e6)


def test_attention_refusal_reason_is_pytorchs():
    import warnings

    def refused():
        for text in ("Flash attention kernel not used because: (Triggered internally at /x/sdp_utils.cpp:988.)",
                     "Memory Efficient attention has been runtime disabled. (Triggered internally at /x.h:552.)",
                     "head_dim should be no more than 256 (Triggered internally at /x/sdp_utils.cpp:522.)"):
            warnings.warn(text)
        raise RuntimeError("No available kernel. Aborting execution.")

    with pytest.raises(RuntimeError, match=r"^head_dim should be no more than 256$"):
        attention.check_refusal(refused)
    with pytest.raises(RuntimeError, match="No available kernel"):
        attention.check_refusal(lambda: _raise("No available kernel. Aborting execution."))
    ok = lambda: 1  # noqa: E731
    assert attention.check_refusal(ok) is ok


def test_progress_without_tqdm(monkeypatch, capsys):
    import builtins

    real_import = builtins.__import__

    def no_tqdm(name, *args, **kwargs):
        if name == "tqdm":
            raise ImportError("no tqdm here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tqdm)
    cases = [Case(0, "a", {}), Case(1, "b", {})]
    assert list(runner.progress(cases, "suite")) == cases
    assert capsys.readouterr().err.splitlines() == ["[suite] 1/2 a", "[suite] 2/2 b"]


def test_flush_mode_defaults_to_read_and_names_the_variable_when_wrong(monkeypatch):
    monkeypatch.delenv("TILEFLY_BENCH_FLUSH", raising=False)
    assert timing.flush_mode() == "read" and "MiB read" in timing.FULL.describe()
    monkeypatch.setenv("TILEFLY_BENCH_FLUSH", "write")
    assert "MiB write" in timing.QUICK.describe()
    monkeypatch.setenv("TILEFLY_BENCH_FLUSH", "dirty")
    with pytest.raises(ValueError, match="TILEFLY_BENCH_FLUSH"):
        timing.flush_mode()


def test_config_screen_holds_the_gpu_like_the_run(monkeypatch):
    """run_suite hands its policy's headstart to the screen that picks a family's fastest config
    (best_config_provider), and clears it afterwards: a config of several launches must not be
    screened by its host time when the run times the GPU alone."""
    screens = []

    def measure(fn, policy=timing.FULL, device=None):
        screens.append(policy.headstart_us)
        return timing.Timing(1.0, 1.0, 1.0, 1)

    monkeypatch.setattr(timing, "measure", measure)
    provider = _common.best_config_provider("tilefly", lambda: {"one": lambda: None})

    def bench(case):
        provider.build()
        return CaseBench([], lambda name, us: {}, [])

    suite = type("S", (), {"name": "fake", "title": "fake", "plan": staticmethod(lambda: Plan(bench, [], []))})
    for hold in (0.0, 300.0):
        env = dict.fromkeys(("gpu", "torch", "triton", "tilefly", "commit", "date"), "-")
        runner.run_suite(suite, [Case("fake", 0, {})], timing.Policy(headstart_us=hold), True, env)
        assert screens[-1] == hold and timing.RUN_HEADSTART_US == 0.0


def test_checkpoint_after_each_case_keeps_what_a_stopped_run_measured(tmp_path):
    """A run stopped from outside after its first case (here: the second case's inputs raise
    KeyboardInterrupt, as a step's time limit would) leaves a partial result that --merge reads."""
    from tilefly.bench import report
    from tilefly.bench.results import merge

    def bench(case):
        if case.index == 1:
            raise KeyboardInterrupt
        return CaseBench([], lambda name, us: {}, [])

    suite = type("S", (), {"name": "fake", "title": "fake", "plan": staticmethod(lambda: Plan(bench, [], []))})
    env = dict.fromkeys(("gpu", "torch", "triton", "tilefly", "commit", "date"), "-")
    path = str(tmp_path / "fake.partial.json")
    seen = []

    def checkpoint(result):
        seen.append([c.id for c in result.cases])
        report.write_partial(result, path)

    with pytest.raises(KeyboardInterrupt):
        runner.run_suite(suite, [Case(0, "first", {}), Case(1, "second", {})], timing.QUICK, True, env,
                         checkpoint=checkpoint)
    assert seen == [["first"]]
    saved = report.load(path)
    assert [c.id for c in saved.cases] == ["first"] and not (tmp_path / "fake.partial.json.tmp").exists()
    assert saved.notes == [runner.partial_note(1, 2)] and "1 of its 2 cases" in saved.notes[0]
    alone = merge([saved])
    assert [c.id for c in alone.cases] == ["first"] and alone.notes == saved.notes
    # the rest, run apart: once every case is in, the merged result no longer says partial
    rest = report.load(path)
    rest.cases[0].index, rest.cases[0].id, rest.notes, rest.date = 1, "second", [], "later"
    whole = merge([saved, rest])
    assert [c.id for c in whole.cases] == ["first", "second"] and whole.notes == []

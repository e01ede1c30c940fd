"""tilefly._kernel_timing: the option, the hook on Inductor's Triton kernel timing and its cache tag (CPU),
and the queued timing itself on the GPU."""
import types

import pytest

pytest.importorskip("torch._inductor")

import torch  # noqa: E402
from torch._inductor.runtime.triton_heuristics import CachingAutotuner  # noqa: E402
from torch.compiler import config as compiler_config  # noqa: E402

from tilefly import _inductor, _kernel_timing, config  # noqa: E402


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    _inductor.uninstall()
    monkeypatch.setattr(compiler_config, "cache_key_tag", compiler_config.cache_key_tag)
    yield
    _inductor.uninstall()


def test_the_option_rejects_unknown_values():
    with pytest.raises(ValueError, match="inductor, queued"):
        config.triton_autotune_timing = "events"


@pytest.mark.parametrize("user_tag", ["", "mine"])
def test_queued_hooks_the_bench_and_tags_the_caches_until_uninstalled(monkeypatch, user_tag):
    monkeypatch.setattr(compiler_config, "cache_key_tag", user_tag)
    monkeypatch.setattr(config, "triton_autotune_timing", "queued")
    _inductor.install(["gemm"])
    assert _kernel_timing.queued()
    assert getattr(CachingAutotuner.bench, "tilefly_hook", False)
    assert compiler_config.cache_key_tag == user_tag + _kernel_timing.TAG
    _inductor.install(["gemm"])                       # a second enable() tags once
    assert compiler_config.cache_key_tag == user_tag + _kernel_timing.TAG
    _inductor.uninstall()
    assert not _kernel_timing.queued() and compiler_config.cache_key_tag == user_tag


def test_inductor_timing_leaves_the_tag_and_a_later_enable_reads_the_option(monkeypatch):
    monkeypatch.setattr(config, "triton_autotune_timing", "inductor")
    _inductor.install(["gemm"])
    assert not _kernel_timing.queued() and not compiler_config.cache_key_tag.endswith(_kernel_timing.TAG)
    monkeypatch.setattr(config, "triton_autotune_timing", "queued")
    _inductor.install(["gemm"])
    assert _kernel_timing.queued() and compiler_config.cache_key_tag.endswith(_kernel_timing.TAG)
    monkeypatch.setattr(config, "triton_autotune_timing", "inductor")
    _inductor.install(["gemm"])
    assert not _kernel_timing.queued() and not compiler_config.cache_key_tag.endswith(_kernel_timing.TAG)


class FakeAutotuner:
    """What the hook uses of a CachingAutotuner: argument 0 is written in place, argument 1 zeroed
    before each launch, argument 2 only read."""

    custom_kernel = False
    inductor_meta = {"kernel_name": "triton_poi_fake"}

    def __init__(self, device="cuda"):
        self.device_props = types.SimpleNamespace(type=device)
        self.restored = []

    def get_device_interface(self):
        return types.SimpleNamespace(current_device=lambda: 0, get_raw_stream=lambda device: 7)

    def copy_args_to_cpu_if_needed(self, *args, **kwargs):
        return {}

    def maybe_clone_args(self, exclude, *args, **kwargs):
        return [args[0].clone(), *args[1:]], dict(kwargs)

    def reset_to_zero_args(self, *args, **kwargs):
        args[1].zero_()

    def restore_args_from_cpu(self, cpu_copies):
        self.restored.append(cpu_copies)


def launcher(n_spills=0):
    calls = []

    def launch(written, zeroed, read, *, stream):
        calls.append(stream)
        written.add_(read)
        zeroed.add_(1)

    launch.n_spills = n_spills
    return launch, calls


def operands():
    return torch.randn(8), torch.randn(8), torch.randn(8)


@pytest.fixture
def queued_on(monkeypatch):
    monkeypatch.setitem(_kernel_timing._state, "queued", True)
    timed = []

    def fake_queued_ms(launch, launches=3, batches=1):
        for _ in range(launches):
            launch()
        timed.append(launches)
        return 0.001

    monkeypatch.setattr(_kernel_timing, "queued_ms", fake_queued_ms)
    monkeypatch.setattr(_kernel_timing, "one_launch_ms", lambda launch: launch() or 0.01)
    return timed


def inductors_bench():
    calls = []

    def original(self, launcher, *args, with_profiler=False, **kwargs):
        calls.append((launcher, with_profiler))
        return 0.5

    return original, calls


def test_the_hook_times_queued_launches_on_clones_and_leaves_the_arguments_as_inductor_does(queued_on):
    original, inductor_calls = inductors_bench()
    bench = _kernel_timing._bench(original)
    autotuner = FakeAutotuner()
    launch, calls = launcher()
    written, zeroed, read = operands()
    before = written.clone()
    assert bench(autotuner, launch, written, zeroed, read) == 0.001
    assert queued_on == [3] and calls == [7, 7, 7, 7] and not inductor_calls
    assert torch.equal(written, before)          # the launches wrote a clone
    assert torch.equal(zeroed, torch.zeros(8))   # zeroed again after them
    assert autotuner.restored == [{}]


@pytest.mark.parametrize("case", ["option off", "profiler", "cpu kernel", "spills"])
def test_the_hook_leaves_to_inductor_what_it_does_not_time(monkeypatch, queued_on, case):
    if case == "option off":
        monkeypatch.setitem(_kernel_timing._state, "queued", False)
    original, inductor_calls = inductors_bench()
    bench = _kernel_timing._bench(original)
    launch, calls = launcher(n_spills=64 if case == "spills" else 0)
    autotuner = FakeAutotuner("cpu" if case == "cpu kernel" else "cuda")
    assert bench(autotuner, launch, *operands(), with_profiler=case == "profiler") == 0.5
    assert inductor_calls == [(launch, case == "profiler")] and not queued_on and not calls


def test_a_long_launch_keeps_inductors_timing(monkeypatch, queued_on):
    monkeypatch.setattr(_kernel_timing, "one_launch_ms", lambda launch: launch() or 0.5)
    original, inductor_calls = inductors_bench()
    written, zeroed, read = operands()
    launch, calls = launcher()
    assert _kernel_timing._bench(original)(FakeAutotuner(), launch, written, zeroed, read) == 0.5
    assert len(inductor_calls) == 1 and len(calls) == 1 and not queued_on
    assert torch.equal(zeroed, torch.zeros(8))


def test_a_failing_queued_timing_falls_back_to_inductors(monkeypatch, queued_on):
    def broken(launch, launches=3, batches=1):
        raise RuntimeError("no GPU")

    monkeypatch.setattr(_kernel_timing, "queued_ms", broken)
    original, inductor_calls = inductors_bench()
    written, zeroed, read = operands()
    launch, _ = launcher()
    assert _kernel_timing._bench(original)(FakeAutotuner(), launch, written, zeroed, read) == 0.5
    assert len(inductor_calls) == 1 and torch.equal(zeroed, torch.zeros(8))


class ScriptedGPU:
    """torch.cuda's events, spin and synchronize, with each batch's spin and queue times scripted:
    ``batches`` holds (ms the spin lasted, ms the launches took on the GPU)."""

    def __init__(self, monkeypatch, batches, host_ms):
        self.batches, self.spins, self.records = list(batches), [], []
        gpu = self

        class Event:
            def __init__(self, enable_timing=True):
                self.index = len(gpu.records)
                gpu.records.append(self)

            def record(self):
                pass

            def synchronize(self):
                pass

            def elapsed_time(self, other):
                spin_ms, run_ms = gpu.batches[self.index // 3]
                return spin_ms if self.index % 3 == 0 else run_ms

        clock = iter(x * host_ms / 1e3 for x in range(1000))
        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "_sleep", self.spins.append)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
        monkeypatch.setattr(_kernel_timing.time, "perf_counter", lambda: next(clock))


def test_queued_ms_doubles_the_spin_until_it_outlasts_the_host_and_takes_the_median(monkeypatch):
    # the host takes 1 ms to queue the launches (perf_counter steps 1 ms a call); the first batch's spin
    # lasted 0.5 ms (discarded), the rest 2 ms
    monkeypatch.delitem(_kernel_timing._state, "spin", raising=False)
    gpu = ScriptedGPU(monkeypatch, [(0.5, 9.0), (2.0, 0.06), (2.0, 0.03), (2.0, 0.09), (2.0, 0.03)], host_ms=1.0)
    launches = []
    assert _kernel_timing.queued_ms(lambda: launches.append(1), launches=3, batches=3) == pytest.approx(0.06 / 3)
    assert gpu.spins == [_kernel_timing.SPIN_CYCLES] + [2 * _kernel_timing.SPIN_CYCLES] * 3
    assert len(launches) == 4 * 3
    # the next config starts from the spin that sufficed
    assert _kernel_timing.queued_ms(lambda: launches.append(1), launches=3, batches=1) == pytest.approx(0.03 / 3)
    assert gpu.spins[-1] == 2 * _kernel_timing.SPIN_CYCLES and len(gpu.spins) == 5


@pytest.mark.cuda
def test_cuda_queued_ms_measures_the_gpu_not_the_host():
    """A one-program add launched from Python costs the host several µs; queued, its GPU time shows."""
    x = torch.randn(1024, device="cuda")
    ms = _kernel_timing.queued_ms(lambda: x.add_(1.0))
    assert 0 < ms < 0.004, ms
    assert _kernel_timing.one_launch_ms(lambda: x.add_(1.0)) < _kernel_timing.LONG_MS


@pytest.mark.cuda
def test_cuda_compiled_in_place_kernels_tuned_queued_match_eager(monkeypatch):
    """A KV-cache-like in-place write and a pointwise product, compiled with coordinate descent while
    queued timing is on: the hook timed them, the results are eager's and the cache was written."""
    monkeypatch.setattr(config, "triton_autotune_timing", "queued")
    timed = []
    real = _kernel_timing.queued_ms
    monkeypatch.setattr(_kernel_timing, "queued_ms", lambda launch, *a, **k: timed.append(1) or real(launch, *a, **k))

    def step(cache, pos, k, a, b):
        cache.index_copy_(1, pos, k)
        return torch.nn.functional.silu(a) * b

    cache = torch.randn(32, 768, 8, 128, device="cuda", dtype=torch.bfloat16)
    pos = torch.tensor([300], device="cuda")
    k = torch.randn(32, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
    a, b = (torch.randn(32, 14336, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    want_cache = cache.clone().index_copy_(1, pos, k)
    import tilefly

    torch._dynamo.reset()
    with tilefly.enabled(), torch._inductor.config.patch(coordinate_descent_tuning=True, force_disable_caches=True):
        assert _kernel_timing.queued()
        got = torch.compile(step, mode="max-autotune-no-cudagraphs")(cache, pos, k, a, b)
    assert timed
    torch.testing.assert_close(got, torch.nn.functional.silu(a) * b)
    assert torch.equal(cache, want_cache)

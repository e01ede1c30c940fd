"""tilefly._race_timing: when and how Inductor's race times tilefly's candidates, and the ATen and
Triton candidates racing them, as CUDA graph replays (the graphs themselves need a GPU:
tests/ops/gemm/test_gemm_cuda.py)."""
import pytest

pytest.importorskip("torch._inductor")

import torch  # noqa: E402
from torch._inductor import config as inductor_config  # noqa: E402
from torch._inductor.ir import FixedLayout  # noqa: E402
from torch._inductor.select_algorithm import (  # noqa: E402
    ExternKernelCaller,
    ExternKernelChoice,
    TritonTemplateCaller,
    extern_kernels,
)

from tilefly import _inductor, _race_timing, config  # noqa: E402

LAYOUT = FixedLayout(torch.device("cpu"), torch.float32, [2, 2])


@pytest.fixture(autouse=True)
def _clean_install():
    _inductor.uninstall()
    yield
    _inductor.uninstall()


@pytest.mark.parametrize("option, cudagraphs, graph", [
    ("auto", True, True), ("auto", False, False), ("graph", False, True), ("inductor", True, False)])
def test_graph_timed_follows_the_option_and_inductors_cuda_graphs(monkeypatch, option, cudagraphs, graph):
    monkeypatch.setattr(config, "gemm_race_timing", option)
    with inductor_config.patch({"triton.cudagraphs": cudagraphs}):
        assert _race_timing.graph_timed() is graph


def test_the_option_rejects_unknown_values():
    with pytest.raises(ValueError, match="auto, graph, inductor"):
        config.gemm_race_timing = "events"


def tilefly_caller(name):
    calls = []

    def kernel(a, b, *, out):
        calls.append((a, b, out))
        return torch.mm(a, b, out=out)

    if hasattr(extern_kernels, name):
        delattr(extern_kernels, name)
    choice = _inductor.extern_choice(kernel, name)
    assert isinstance(choice, ExternKernelChoice) and choice.name == name
    caller = choice.bind([], LAYOUT)
    assert isinstance(caller, ExternKernelCaller) and caller.name == name
    return caller, calls


def operands():
    return torch.randn(2, 2), torch.randn(2, 2), torch.full((2, 2), float("nan"))


@pytest.fixture
def replays(monkeypatch):
    """replay_ms stood in for: runs the call once (as a replay would) and answers 0.125 ms."""
    made = []

    def replay(call):
        made.append(call)
        call()
        return 0.125

    monkeypatch.setattr(_race_timing, "replay_ms", replay)
    return made


def test_a_tilefly_candidate_is_timed_as_a_replay_of_its_own_call(monkeypatch, replays):
    caller, calls = tilefly_caller("tilefly_mm_probe_v1")
    monkeypatch.setattr(config, "gemm_race_timing", "graph")
    monkeypatch.setattr(ExternKernelCaller, "benchmark", lambda self, *a, out: pytest.fail("Inductor's timing"))
    a, b, out = operands()
    assert caller.benchmark(a, b, out=out) == 0.125
    assert len(replays) == 1 and len(calls) == 1 and calls[0] == (a, b, out)
    torch.testing.assert_close(out, a @ b)


def test_inductors_timing_when_not_graph_timed_or_when_the_graph_fails(monkeypatch):
    caller, _ = tilefly_caller("tilefly_mm_probe2_v1")
    monkeypatch.setattr(ExternKernelCaller, "benchmark", lambda self, *a, out: 7.0)
    a, b, out = operands()
    monkeypatch.setattr(config, "gemm_race_timing", "inductor")
    monkeypatch.setattr(_race_timing, "replay_ms", lambda call: pytest.fail("graph timing"))
    assert caller.benchmark(a, b, out=out) == 7.0

    def broken(call):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(config, "gemm_race_timing", "graph")
    monkeypatch.setattr(_race_timing, "replay_ms", broken)
    assert caller.benchmark(a, b, out=out) == 7.0


def test_the_dense_and_grouped_providers_make_tilefly_choices():
    from tilefly.ops.gemm import inductor as gemm_inductor
    from tilefly.ops.grouped_gemm import inductor as grouped_inductor

    gemm_inductor.GemmProvider().prepare()
    grouped_inductor.GroupedProvider().prepare()
    kind = _race_timing._tilefly_classes()["choice"]
    assert gemm_inductor._CHOICES and all(type(c) is kind for c in gemm_inductor._CHOICES.values())
    assert grouped_inductor._CHOICES and all(type(c) is kind for c in grouped_inductor._CHOICES.values())


# ---- the other candidates of a race with tilefly in it ------------------------------------------

class FakeBenchmarkRequest:
    """A Triton template's benchmark request: each run function it makes adds a + b into out."""

    def __init__(self):
        self.made = self.cleaned = 0

    def make_run_fn(self, a, b, *, out):
        self.made += 1
        return lambda: torch.add(a, b, out=out)

    def cleanup_run_fn(self):
        self.cleaned += 1


def template_caller():
    caller = object.__new__(TritonTemplateCaller)   # the benchmark path needs only a name and a bmreq
    caller.name, caller.bmreq = "triton_mm_7", FakeBenchmarkRequest()
    return caller


def race(name):
    from torch._inductor.kernel.mm import aten_mm

    tilefly, _ = tilefly_caller(name)
    return tilefly, aten_mm.bind([], LAYOUT), template_caller()


def test_a_race_with_tilefly_times_atens_and_tritons_candidates_as_replays(monkeypatch, replays):
    monkeypatch.setattr(config, "gemm_race_timing", "graph")
    monkeypatch.setattr(ExternKernelCaller, "benchmark", lambda self, *a, out: pytest.fail("Inductor's timing"))
    monkeypatch.setattr(TritonTemplateCaller, "benchmark", lambda self, *a, out: pytest.fail("Inductor's timing"))
    choices = list(race("tilefly_mm_probe3_v1"))
    assert _race_timing.time_race_on_gpu(choices) is not None
    _, aten, triton = choices
    a, b, out = operands()
    assert aten.benchmark(a, b, out=out) == 0.125
    torch.testing.assert_close(out, a @ b)
    out.fill_(float("nan"))
    assert triton.benchmark(a, b, out=out) == 0.125
    torch.testing.assert_close(out, a + b)
    assert triton.bmreq.made == 1 and triton.bmreq.cleaned == 1
    assert len(replays) == 2
    _race_timing.time_race_on_gpu(choices)   # a second pass wraps nothing twice
    assert aten.benchmark(a, b, out=out) == 0.125 and len(replays) == 3


@pytest.mark.parametrize("why", ["not graph timed", "no tilefly candidate"])
def test_other_races_keep_inductors_timing(monkeypatch, why):
    monkeypatch.setattr(config, "gemm_race_timing", "inductor" if why == "not graph timed" else "graph")
    tilefly, aten, triton = race("tilefly_mm_probe4_v1")
    choices = [aten, triton] if why == "no tilefly candidate" else [tilefly, aten, triton]
    _race_timing.time_race_on_gpu(choices)
    assert "benchmark" not in vars(aten) and "benchmark" not in vars(triton)


def test_a_failed_replay_falls_back_to_inductors_timing(monkeypatch):
    monkeypatch.setattr(config, "gemm_race_timing", "graph")
    monkeypatch.setattr(ExternKernelCaller, "benchmark", lambda self, *a, out: 3.0)
    monkeypatch.setattr(TritonTemplateCaller, "benchmark", lambda self, *a, out: 4.0)

    def broken(call):
        raise RuntimeError("capture failed")

    monkeypatch.setattr(_race_timing, "replay_ms", broken)
    choices = list(race("tilefly_mm_probe5_v1"))
    _race_timing.time_race_on_gpu(choices)
    _, aten, triton = choices
    a, b, out = operands()
    assert aten.benchmark(a, b, out=out) == 3.0
    assert triton.benchmark(a, b, out=out) == 4.0 and triton.bmreq.cleaned == 1


def test_install_hooks_race_timing_after_the_grouped_candidates():
    from torch._inductor import select_algorithm

    from tilefly.ops.grouped_gemm import inductor as grouped_inductor

    fns = select_algorithm.get_algorithm_selector_cache().preprocessing_fns
    if _race_timing.time_race_on_gpu in fns:
        fns.remove(_race_timing.time_race_on_gpu)
    fns.insert(0, _race_timing.time_race_on_gpu)   # as if hooked before the grouped function came
    _inductor.install(["grouped_gemm"])
    _inductor.install(["grouped_gemm"])
    assert fns[-1] is _race_timing.time_race_on_gpu and fns.count(_race_timing.time_race_on_gpu) == 1
    assert fns.index(grouped_inductor.append_grouped_choices) < len(fns) - 1


def test_the_race_timing_enters_the_graph_cache_key(monkeypatch):
    choices = _inductor.TileflyChoices()
    monkeypatch.setattr(config, "gemm_race_timing", "graph")
    graph = choices.uuid()
    monkeypatch.setattr(config, "gemm_race_timing", "inductor")
    assert choices.uuid() != graph


def test_an_extern_candidate_without_an_out_variant_is_replayed_too(monkeypatch, replays):
    monkeypatch.setattr(config, "gemm_race_timing", "graph")
    monkeypatch.setattr(ExternKernelCaller, "benchmark", lambda self, *a, out: pytest.fail("Inductor's timing"))
    name = "tilefly_test_matmul_no_out"
    if hasattr(extern_kernels, name):
        delattr(extern_kernels, name)
    no_out = ExternKernelChoice(torch.matmul, name=name, has_out_variant=False).bind([], LAYOUT)
    tilefly, _ = tilefly_caller("tilefly_mm_probe6_v1")
    _race_timing.time_race_on_gpu([tilefly, no_out])
    a, b, out = operands()
    assert no_out.benchmark(a, b, out=out) == 0.125 and len(replays) == 1
    torch.testing.assert_close(out, a @ b)


def test_graph_timed_candidates_get_cache_keys_of_their_own(monkeypatch, replays):
    tilefly, aten, triton = race("tilefly_mm_probe7_v1")
    monkeypatch.setattr(TritonTemplateCaller, "hash_key", lambda self: "triton-key")
    plain = {c.name: c.hash_key() for c in (tilefly, aten)}
    monkeypatch.setattr(config, "gemm_race_timing", "inductor")
    _race_timing.time_race_on_gpu([tilefly, aten, triton])
    assert {c.name: c.hash_key() for c in (tilefly, aten)} == plain and triton.hash_key() == "triton-key"
    monkeypatch.setattr(config, "gemm_race_timing", "graph")
    _race_timing.time_race_on_gpu([tilefly, aten, triton])
    assert tilefly.hash_key() == plain[tilefly.name] + ":graph-timed"
    assert aten.hash_key() == plain[aten.name] + ":graph-timed"
    assert triton.hash_key() == "triton-key:graph-timed"
    _race_timing.time_race_on_gpu([tilefly, aten, triton])   # wrapped once only
    assert aten.hash_key() == plain[aten.name] + ":graph-timed"

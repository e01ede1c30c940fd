"""The eager router, proven on CPU with stand-in registrations on the CPU key of a
real aten op (aten::topk): the mechanism is the same as on the CUDA key."""
import logging
import threading

import pytest
import torch

import tilefly
from tilefly import _dispatch, config

FAMILY = "standin"


class Counter:
    def __init__(self):
        self.calls = 0


def _topk_by_sort(x, k, dim=-1, largest=True, sorted=True):
    values, indices = torch.sort(x, dim=dim, descending=largest, stable=True)
    return values.narrow(dim, 0, k).contiguous(), indices.narrow(dim, 0, k).contiguous()


@pytest.fixture
def standin():
    """Register a sort-based topk on the CPU key that serves k <= 4; yields its call counter."""
    counter = Counter()

    def predicate(x, k, dim=-1, largest=True, sorted=True):
        return None if k <= 4 else f"k={k} > 4"

    def fn(x, k, dim=-1, largest=True, sorted=True):
        counter.calls += 1
        return _topk_by_sort(x, k, dim, largest, sorted)

    impl = _dispatch.Impl(FAMILY, "aten::topk", "sort_topk", predicate, fn, dispatch_key="CPU")
    _dispatch.register(impl)
    yield counter
    _dispatch.uninstall([FAMILY])
    _dispatch._registry.pop(FAMILY, None)


def test_condition_true_serves_ours_false_keeps_original(standin):
    x = torch.randn(8, 100)
    _dispatch.install([FAMILY])
    v, i = torch.topk(x, 3)
    assert standin.calls == 1
    ref = torch.sort(x, descending=True).values[:, :3]
    assert torch.equal(v, ref) and torch.equal(x.gather(1, i), v)
    torch.topk(x, 7)
    assert standin.calls == 1, "k=7 is ineligible: the original kernel must serve it"


def test_uninstall_restores_aten_and_is_idempotent(standin):
    x = torch.randn(4, 50)
    _dispatch.install([FAMILY])
    _dispatch.install([FAMILY])
    assert _dispatch.installed() == (FAMILY,)
    assert len([k for k in _dispatch._routes if k[0] == "aten::topk"]) == 1
    torch.topk(x, 2)
    assert standin.calls == 1
    _dispatch.uninstall([FAMILY])
    _dispatch.uninstall([FAMILY])
    torch.topk(x, 2)
    assert standin.calls == 1 and _dispatch.installed() == ()


def test_autograd_flows_through_the_override(standin):
    _dispatch.install([FAMILY])
    x = torch.randn(5, 40, dtype=torch.float64, requires_grad=True)
    v, i = torch.topk(x, 4)
    (v * torch.arange(4.0, dtype=torch.float64)).sum().backward()
    expected = torch.zeros_like(x).scatter(1, i, torch.arange(4.0, dtype=torch.float64).expand(5, 4))
    assert standin.calls == 1
    assert torch.equal(x.grad, expected)


def test_compiled_function_still_runs(standin):
    _dispatch.install([FAMILY])
    torch._dynamo.reset()
    f = torch.compile(lambda t: torch.topk(t * 2, 3).values, backend="aot_eager")
    x = torch.randn(6, 30)
    assert torch.equal(f(x), torch.topk(x * 2, 3).values)
    assert standin.calls >= 1


def test_failing_implementation_falls_back_or_raises_by_policy(standin, caplog):
    def broken(x, k, dim=-1, largest=True, sorted=True):
        raise RuntimeError("kernel exploded")

    impl = _dispatch.Impl("broken", "aten::topk", "broken_topk", lambda *a, **k: None, broken, dispatch_key="CPU")
    _dispatch.register(impl)
    try:
        _dispatch.install(["broken"])
        x = torch.randn(3, 20)
        with caplog.at_level(logging.WARNING, logger="tilefly"):
            v, i = torch.topk(x, 2)
        assert torch.equal(v, torch.sort(x, descending=True).values[:, :2])
        assert "broken_topk failed" in caplog.text
        config.on_error = "raise"
        with pytest.raises(tilefly.TileflyKernelError, match="kernel exploded"):
            torch.topk(x, 2)
    finally:
        _dispatch.uninstall(["broken"])
        _dispatch._registry.pop("broken", None)


def test_first_eligible_implementation_wins_in_registration_order(standin):
    calls = []

    def second(x, k, dim=-1, largest=True, sorted=True):
        calls.append(k)
        return _topk_by_sort(x, k, dim, largest, sorted)

    impl = _dispatch.Impl(FAMILY, "aten::topk", "second", lambda x, k, *a, **kw: None if k <= 8 else "k > 8", second,
                          dispatch_key="CPU")
    _dispatch.register(impl)
    _dispatch.install([FAMILY])
    x = torch.randn(2, 64)
    torch.topk(x, 3)
    torch.topk(x, 6)
    with _dispatch.recording() as decisions:
        torch.topk(x, 20)
    assert standin.calls == 1 and calls == [6]
    assert decisions == [_dispatch.Decision("aten::topk", None, "sort_topk: k=20 > 4; second: k > 8")]


def test_concurrent_calls_stay_correct_while_installing_and_uninstalling(standin):
    x = torch.randn(16, 256)
    expected = torch.sort(x, descending=True).values[:, :3]
    errors = []
    stop = threading.Event()

    def caller():
        while not stop.is_set():
            v, _ = torch.topk(x, 3)
            if not torch.equal(v, expected):
                errors.append("wrong values")

    threads = [threading.Thread(target=caller) for _ in range(3)]
    for t in threads:
        t.start()
    for _ in range(50):
        _dispatch.install([FAMILY])
        _dispatch.uninstall([FAMILY])
    stop.set()
    for t in threads:
        t.join()
    assert not errors
    assert _dispatch.installed() == ()


def test_explain_reports_served_fallback_and_unrouted(standin):
    x = torch.randn(4, 32)
    report = tilefly.explain(lambda: torch.topk(x, 2))
    assert report.decisions[0].impl is None and "not enabled" in report.decisions[0].reason
    _dispatch.install([FAMILY])
    report = tilefly.explain(lambda t: (torch.topk(t, 2), torch.topk(t, 9)), x)
    assert [d.impl for d in report.decisions] == ["sort_topk", None]
    assert report.decisions[1].reason == "k=9 > 4"
    assert "served by tilefly (sort_topk)" in str(report) and "k=9 > 4" in str(report)
    assert isinstance(report.result, tuple)


def test_an_install_reason_keeps_the_op_on_aten_and_explain_says_why(standin):
    reason = ["the database never serves it"]
    impl = _dispatch.Impl("gated", "aten::topk", "gated_topk", lambda *a, **k: None, _topk_by_sort,
                          dispatch_key="CPU", install_reason=lambda: reason[0])
    _dispatch.register(impl)
    try:
        _dispatch.install(["gated"])
        assert _dispatch.original("aten::topk", "CPU") is None        # no handler: ATen's kernel as is
        assert _dispatch.unrouted_reason("aten::topk") == "gated_topk: the database never serves it"
        report = tilefly.explain(lambda: torch.topk(torch.randn(4, 8), 2))
        assert report.decisions[0].reason == "not routed: gated_topk: the database never serves it"
        _dispatch.install([FAMILY])                                    # another family's entry routes the op
        assert _dispatch.original("aten::topk", "CPU") is not None
        assert _dispatch.unrouted_reason("aten::topk") is None
        _dispatch.uninstall([FAMILY, "gated"])
        reason[0] = None                                               # asked again at every install
        _dispatch.install(["gated"])
        assert _dispatch.original("aten::topk", "CPU") is not None
    finally:
        _dispatch.uninstall(["gated"])
        _dispatch._registry.pop("gated", None)


def test_explain_rejects_non_callable():
    with pytest.raises(TypeError, match="fn must be callable"):
        tilefly.explain(3)


def test_debug_log_names_each_decision(standin, caplog):
    _dispatch.install([FAMILY])
    with caplog.at_level(logging.DEBUG, logger="tilefly"):
        torch.topk(torch.randn(2, 10), 9)
    assert "aten::topk -> ATen (k=9 > 4)" in caplog.text


def test_all_thread_recording_sees_calls_made_in_other_threads(standin):
    _dispatch.install([FAMILY])
    x = torch.randn(3, 40)
    with _dispatch.recording() as mine, _dispatch.recording(all_threads=True) as everywhere:
        worker = threading.Thread(target=lambda: torch.topk(x, 2))
        worker.start()
        worker.join()
        torch.topk(x, 9)
    assert [d.impl for d in everywhere] == ["sort_topk", None]
    assert [d.impl for d in mine] == [None], "a thread-local recording sees this thread only"

"""Eligibility of torch.topk calls (eager.py) on CPU with the device check mocked, and registration."""
import pytest
import torch

import tilefly
from tilefly import _device, _dispatch, config
from tilefly.ops.topk import eager


@pytest.fixture
def on_hopper(monkeypatch):
    """Pretend every tensor lives on an sm_90 GPU, so the other conditions are what decides."""
    monkeypatch.setattr(_device, "hopper_reason", lambda t: None)


def test_device_reason_comes_first():
    assert "cpu" in eager.topk_reason(torch.randn(4, 8), 2)


def test_served_shapes(on_hopper):
    for shape, k in [((4, 1024), 8), ((1000,), 7), ((2, 3, 5), 5), ((1, 262144), 1024), ((8, 32768), 833)]:
        assert eager.topk_reason(torch.randn(shape), k) is None, (shape, k)
        assert eager.topk_reason(torch.randn(shape), k, len(shape) - 1, False, False) is None


@pytest.mark.parametrize("make,k,kwargs,words", [
    (lambda: torch.randn(4, 8, dtype=torch.float64), 2, {}, "dtype"),
    (lambda: torch.randint(0, 9, (4, 8)), 2, {}, "dtype"),
    (lambda: torch.tensor(3.0), 1, {}, "0-d"),
    (lambda: torch.randn(4, 8), 2, {"dim": 0}, "not the last dimension"),
    (lambda: torch.randn(4, 8), 2, {"dim": -2}, "not the last dimension"),
    (lambda: torch.randn(0, 8), 2, {}, "empty"),
    (lambda: torch.randn(4, 8), 0, {}, "outside"),
    (lambda: torch.randn(4, 8), 9, {}, "outside"),
    (lambda: torch.randn(8, 4).t(), 2, {}, "strided"),
    (lambda: torch.randn(2, 8192), 2000, {}, "no kernel"),
])
def test_fallback_reasons(on_hopper, make, k, kwargs, words):
    reason = eager.topk_reason(make(), k, **kwargs)
    assert reason is not None and words in reason, reason


def test_band_is_skipped_by_force(on_hopper, monkeypatch):
    x = torch.randn(2, 2048)
    assert eager.topk_reason(x, eager.BAND_FULL_MAX_K) is None
    assert eager.topk_reason(torch.randn(2, 4097), 1024) is None
    assert "force" in eager.topk_reason(x, 1000)
    monkeypatch.setattr(config, "force", True)
    assert eager.topk_reason(x, 1000) is None


def test_out_variant_checks_its_tensors(on_hopper):
    x = torch.randn(4, 100)
    ok = dict(values=torch.empty(4, 7), indices=torch.empty(4, 7, dtype=torch.int64))
    assert eager.topk_values_reason(x, 7, **ok) is None
    empty = dict(values=torch.empty(0), indices=torch.empty(0, dtype=torch.int64))
    assert eager.topk_values_reason(x, 7, **empty) is None
    bad = [
        (dict(values=torch.empty(4, 7, dtype=torch.float64), indices=ok["indices"]), "dtypes"),
        (dict(values=ok["values"], indices=torch.empty(4, 7, dtype=torch.int32)), "dtypes"),
        (dict(values=torch.empty(4, 8), indices=ok["indices"]), "shape"),
        (dict(values=torch.empty(7, 4).t(), indices=ok["indices"]), "non-contiguous"),
    ]
    for outs, words in bad:
        reason = eager.topk_values_reason(x, 7, **outs)
        assert reason is not None and words in reason, reason
    assert "dim" in eager.topk_values_reason(x, 7, 0, **ok)
    memory = torch.randn(4 * 7 + 4 * 100)
    reason = eager.topk_values_reason(memory[28:].view(4, 100), 7, values=memory[:28].view(4, 7),
                                      indices=ok["indices"])
    assert reason is not None and "shares memory" in reason


def test_both_overloads_are_registered_with_their_predicates():
    tilefly.ops.load("topk")
    impls = {i.op: i for i in _dispatch.registered("topk")}
    assert impls["aten::topk"].predicate is eager.topk_plan and impls["aten::topk"].fn is eager.topk_served
    has_out_kernel = True
    try:
        torch.library.get_kernel("aten::topk.values", "CUDA")
    except RuntimeError:
        has_out_kernel = False  # CPU-only torch build: nothing to fall back to, so not routed
    if has_out_kernel:
        assert impls["aten::topk.values"].fn is eager.topk_values
        assert impls["aten::topk.values"].predicate is eager.topk_values_reason
    assert all(i.dispatch_key == "CUDA" for i in impls.values())


def test_enable_and_disable_on_a_cpu_build_leave_cpu_topk_alone():
    x = torch.randn(3, 50)
    want = torch.topk(x, 4)
    with tilefly.enabled("topk"):
        assert "topk" in tilefly.enabled_ops()
        got = torch.topk(x, 4)
    assert "topk" not in tilefly.enabled_ops()
    assert torch.equal(got.values, want.values) and torch.equal(got.indices, want.indices)


def test_importing_the_family_imports_no_kernel_module():
    import subprocess
    import sys

    code = ("import sys, tilefly; tilefly.ops.load('topk'); "
            "bad = [m for m in sys.modules if m.startswith('tilefly.ops.topk.kernels') or m == 'triton']; "
            "sys.exit(1 if bad else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0

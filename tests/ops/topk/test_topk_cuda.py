"""torch.topk through tilefly on an H200: every kernel, dtype and edge the issue lists, against the
packed-sort reference (exact indices: smaller index first among ties) and ATen's values."""
import pytest
import torch

import tilefly
from tilefly import _dispatch, config
from tilefly.ops.topk import configs
from tilefly.ops.topk.keys import reference_topk

pytestmark = pytest.mark.cuda

# (N, k) pairs covering every N and every k the issue names, and each kernel plan kind
SHAPES = [(1, 1), (5, 2), (5, 5), (1000, 7), (1000, 1000), (1024, 8), (1024, 16), (1024, 17), (4097, 1),
          (4097, 16), (4097, 64), (4097, 257), (32768, 2), (32768, 1024), (262144, 8), (262144, 1024)]


@pytest.fixture(autouse=True)
def _served():
    from tilefly.ops.topk import eager

    eager._plans.clear()  # tests that patch configs must not replay another test's launches
    config.force = True  # small shapes are outside the performance band
    tilefly.enable("topk")
    yield
    tilefly.disable()


def _data(rows, N, dtype=torch.float32, kind="randn", seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed * 1_000_003 + N)
    x = torch.randn(rows, N, device="cuda", generator=g)
    if kind == "ties":
        x = torch.randint(-3, 3, (rows, N), device="cuda", generator=g).float()
    elif kind == "nan":
        x[:, ::5] = float("nan")
        x[:, 1::9] = float("inf")
        x[:, 2::7] = -float("inf")
        x[:, 3::11] = -0.0
    return x.to(dtype)


def _same_bits(a, b):
    width = torch.int32 if a.dtype == torch.float32 else torch.int16
    return torch.equal(a.view(width), b.view(width))


def _check(x, k, largest=True, sorted=True, out=None):
    """Run torch.topk with tilefly; assert it was served and matches the reference and ATen."""
    with _dispatch.recording() as decisions:
        if out is None:
            values, indices = torch.topk(x, k, largest=largest, sorted=sorted)
        else:
            values, indices = torch.topk(x, k, largest=largest, sorted=sorted, out=out)
    assert decisions and decisions[-1].impl is not None, decisions
    want_values, want_indices = reference_topk(x, k, largest)
    assert values.dtype == x.dtype and indices.dtype == torch.int64
    assert values.shape == (*x.shape[:-1], k) == indices.shape and values.is_contiguous()
    assert torch.equal(indices, want_indices)
    assert _same_bits(values, want_values)  # the input's own values, NaN payloads included
    tilefly.disable()
    aten = torch.topk(x, k, largest=largest, sorted=True)
    tilefly.enable("topk")
    assert torch.allclose(values.float(), aten.values.float(), rtol=0, atol=0, equal_nan=True)
    return values, indices


@pytest.mark.parametrize("N,k", SHAPES)
def test_shapes(N, k):
    _check(_data(3, N), k)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("N,k", [(5, 5), (1024, 8), (4097, 257)])
def test_half_dtypes(dtype, N, k):
    _check(_data(4, N, dtype, "nan"), k)
    _check(_data(4, N, dtype), k, largest=False)


@pytest.mark.parametrize("N,k", [(1000, 7), (1024, 17), (4097, 64), (32768, 1024)])
@pytest.mark.parametrize("largest", [True, False])
def test_nan_inf_and_signed_zero(N, k, largest):
    _check(_data(3, N, kind="nan"), k, largest)


@pytest.mark.parametrize("N,k", [(1000, 7), (1024, 16), (1024, 17), (4097, 257), (32768, 1024)])
@pytest.mark.parametrize("largest", [True, False])
def test_heavy_ties_take_the_smaller_index_first(N, k, largest):
    # few distinct values: the filter kernel's full-sort branch and the radix exact fallback
    _check(_data(3, N, kind="ties"), k, largest)


@pytest.mark.parametrize("N,k", [(1024, 8), (4097, 257)])
def test_unsorted_returns_the_same_set(N, k):
    x = _data(3, N)
    values, indices = torch.topk(x, k, sorted=False)
    want_values, want_indices = reference_topk(x, k)
    assert torch.equal(indices.sort(dim=-1).values, want_indices.sort(dim=-1).values)
    assert torch.equal(values.sort(dim=-1).values, want_values.sort(dim=-1).values)


@pytest.mark.parametrize("N,k", [(1024, 8), (4097, 64)])
def test_one_row_and_one_dimension(N, k):
    _check(_data(1, N), k)
    _check(_data(1, N)[0], k)


def test_noncontiguous_inputs():
    wide = _data(6, 1100)
    _check(wide[:, :1024], 8)                              # strided rows: a view
    _check(wide[::2, 50:1074], 16)                         # every other row, offset start
    _check(_data(4, 3 * 4097).view(4, 3, 4097).transpose(0, 1), 64)  # leading dims not collapsible: a copy
    x = _data(1024, 6)
    with _dispatch.recording() as decisions:
        got = torch.topk(x.t(), 3)                          # last dim strided: ATen
        by_dim = torch.topk(x, 3, dim=0)                    # another dim: ATen
    assert [d.impl for d in decisions] == [None, None]
    assert "strided" in decisions[0].reason and "last dimension" in decisions[1].reason
    assert torch.equal(got.values, by_dim.values.t())


def test_out_variant_writes_into_given_tensors():
    x = _data(3, 4097)
    values = torch.full((3, 257), float("nan"), device="cuda")
    indices = torch.full((3, 257), -1, dtype=torch.int64, device="cuda")
    got_values, got_indices = _check(x, 257, out=(values, indices))
    assert got_values.data_ptr() == values.data_ptr() and got_indices.data_ptr() == indices.data_ptr()
    empty = (torch.empty(0, device="cuda"), torch.empty(0, dtype=torch.int64, device="cuda"))
    _check(x, 7, out=empty)
    assert empty[0].shape == (3, 7)
    wrong = (torch.empty(2, 2, device="cuda"), torch.empty(2, 2, dtype=torch.int64, device="cuda"))
    with _dispatch.recording() as decisions, pytest.warns(UserWarning):
        torch.topk(x, 7, out=wrong)                         # ATen resizes (and warns)
    assert decisions[-1].impl is None and "shape" in decisions[-1].reason
    assert torch.equal(wrong[1], reference_topk(x, 7)[1])


@pytest.mark.parametrize("N,k", [(1024, 8), (4097, 257), (32768, 1024)])
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("kind", ["ties", "randn"])  # exact paths, fast paths (atomics in any order)
def test_repeat_runs_are_bit_identical(N, k, deterministic, kind):
    x = _data(64, N, kind=kind)
    torch.use_deterministic_algorithms(deterministic)
    try:
        first = _check(x, k)
        for _ in range(3):
            again = torch.topk(x, k)
            assert torch.equal(again.indices, first[1]) and _same_bits(again.values, first[0])
    finally:
        torch.use_deterministic_algorithms(False)


def test_radix_rows_in_several_batches(monkeypatch):
    plan = configs.plan(4097, 257)
    monkeypatch.setattr(configs, "RADIX_SCRATCH_BYTES", plan.C * 8 * 2)  # two rows a batch
    _check(_data(5, 4097), 257)


@pytest.mark.parametrize("N,k", [(1024, 8), (8192, 16), (2048, 2), (8192, 64), (32768, 833)])
def test_every_sweep_variant_matches_the_reference(N, k):
    # the sweep times these plans directly (launch.topk_rows(plan=...)): each must be exact too
    from tilefly.ops.topk import launch
    from tilefly.ops.topk.sweep import variants

    x = _data(5, N, seed=3)
    want_values, want_indices = reference_topk(x, k)
    for plan in variants(N, k):
        values = torch.full((5, k), float("nan"), device="cuda")
        indices = torch.full((5, k), -1, dtype=torch.int64, device="cuda")
        launch.topk_rows(x, k, True, values, indices, plan)
        assert torch.equal(indices, want_indices), plan
        assert torch.equal(values, want_values), plan


@pytest.mark.parametrize("largest", [True, False])
def test_exact_paths_when_the_fast_paths_overflow(largest):
    # plans with too few candidate slots: every row of random data takes the exact path
    import dataclasses

    from tilefly.ops.topk import launch

    for N, k, plan in [(8192, 16, dataclasses.replace(configs.plan(8192, 16), CAP=16)),
                       (32768, 256, dataclasses.replace(configs.plan(32768, 256), C=256))]:
        x = _data(4, N, seed=5)
        values = torch.full((4, k), float("nan"), device="cuda")
        indices = torch.full((4, k), -1, dtype=torch.int64, device="cuda")
        launch.topk_rows(x, k, largest, values, indices, plan)
        want_values, want_indices = reference_topk(x, k, largest)
        assert torch.equal(indices, want_indices) and torch.equal(values, want_values)


@pytest.mark.parametrize("N,k", [(1024, 8), (5, 5), (32768, 1024)])
def test_cuda_graph_capture_and_replay(N, k):
    static = _data(8, N)
    torch.topk(static, k)  # compile and warm the allocator outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        values, indices = torch.topk(static, k)
    for seed in (1, 2):
        static.copy_(_data(8, N, seed=seed))
        graph.replay()
        torch.cuda.synchronize()
        want_values, want_indices = reference_topk(static, k)
        assert torch.equal(indices, want_indices) and torch.equal(values, want_values)


def test_compiled_graph_reaches_the_override():
    x = _data(4, 4097)
    compiled = torch.compile(lambda t: torch.topk(t * 2.0, 64), fullgraph=True)
    with _dispatch.recording() as decisions:
        values, indices = compiled(x)
    assert any(d.op == "aten::topk" and d.impl == "triton_topk" for d in decisions), decisions
    assert torch.equal(indices, reference_topk(x * 2.0, 64)[1])


def test_autograd_uses_our_indices():
    x = _data(2, 1024).requires_grad_()
    values, indices = torch.topk(x, 8)
    values.sum().backward()
    expected = torch.zeros_like(x).scatter_(1, indices, 1.0)
    assert torch.equal(x.grad, expected)


def test_disable_restores_aten_and_explain_names_the_reason():
    x = _data(2, 1024)
    tilefly.disable()
    with _dispatch.recording() as decisions:
        torch.topk(x, 8)
    assert decisions == []
    tilefly.enable("topk")
    report = str(tilefly.explain(lambda t: torch.topk(t, 2, dim=0), x))  # x has 2 rows: k=2 is valid on dim 0
    assert "last dimension" in report


def test_band_keeps_whole_row_sorts_on_aten_without_force():
    config.force = False
    with _dispatch.recording() as decisions:
        torch.topk(_data(2, 4097), 1024)
        torch.topk(_data(2, 2048), 1024)  # a whole-row sort: ATen's
    assert decisions[0].impl == "triton_topk" and decisions[1].impl is None


@pytest.mark.parametrize("N,k", [(1024, 8), (4097, 16), (32768, 257), (262144, 1024), (1000, 7)])
def test_replayed_launches_match_on_new_buffers(N, k):
    """The second call of a shape replays the first call's launches (eager.topk_served): fresh
    inputs each time, one of them at a 4-byte offset (same shape and strides, unaligned pointer,
    so it must not take a replay specialized on alignment), all against the reference."""
    from tilefly.ops.topk import eager

    rows = 3
    for seed in range(3):
        _check(_data(rows, N, seed=seed), k)
    buf = _data(1, rows * N + 1, seed=7).view(-1)
    _check(buf[1:].view(rows, N), k)
    _check(_data(rows, N, seed=9), k, largest=False)
    plans = [p for p in eager._plans.values() if isinstance(p, eager.Served)]
    assert plans and all(p.replay for p in plans), "no call was replayed"

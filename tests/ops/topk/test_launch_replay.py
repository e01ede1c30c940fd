"""launch.trace / Replay on CPU: the recorded launches, replayed on fresh buffers, pass exactly
the arguments a direct run on those buffers would (Triton's launcher stubbed out)."""
import pytest
import torch

from tilefly import _triton_launch
from tilefly.ops.topk import launch


@pytest.fixture
def stubbed(monkeypatch):
    """Kernels record instead of running; 'direct' launches append to a list; scratch is logged."""
    monkeypatch.setattr(launch._Kernel, "__call__", lambda self, grid, args, constexprs, num_warps:
                        launch._record(self, grid, (*args, *constexprs.values())))
    replayed, scratches = [], []

    class Launch:
        def __init__(self, kernel):
            self.kernel = kernel

        def __call__(self, g0, g1, stream, args):
            replayed.append((self.kernel, g0, g1, args))

    scratch = launch._scratch
    monkeypatch.setattr(launch, "_scratch", lambda *a: scratches.append(scratch(*a)) or scratches[-1])
    monkeypatch.setattr(_triton_launch, "direct", Launch)
    monkeypatch.setattr(_triton_launch, "current_stream", lambda index: 0)
    return replayed, scratches


def _as_ints(args, bases, scratch):
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(("ptr", a.data_ptr() - scratch.data_ptr()) if a.data_ptr() not in bases
                       else ("ptr", bases[a.data_ptr()]))
        else:
            out.append(a)
    return out


@pytest.mark.parametrize("N,k", [(1024, 8), (1000, 7), (32768, 257), (262144, 1024)])
def test_replay_rebases_every_pointer(stubbed, N, k):
    replayed, scratches = stubbed
    rows = 3
    x, v, i = torch.randn(rows, N), torch.empty(rows, k), torch.empty(rows, k, dtype=torch.int64)
    replay = launch.trace(x, x, k, True, v, i)
    assert replay is not None and replay.steps

    x2, v2, i2 = torch.randn(rows, N), torch.empty(rows, k), torch.empty(rows, k, dtype=torch.int64)
    launch._tracing.launches, launch._tracing.scratch = [], []
    launch.topk_rows(x2, k, True, v2, i2)
    expected = launch._tracing.launches
    launch._tracing.launches = launch._tracing.scratch = None
    expected_scratch = scratches[-1]

    replay(x2.data_ptr(), v2.data_ptr(), i2.data_ptr(), 0, x2.device)
    replay_scratch = scratches[-1]
    assert replay_scratch.numel() == expected_scratch.numel()
    names = {x2.data_ptr(): "x", v2.data_ptr(): "values", i2.data_ptr(): "indices"}
    assert len(replayed) == len(expected)
    for (kernel, g0, g1, args), (want_kernel, grid, want_args) in zip(replayed, expected):
        assert kernel is want_kernel and (g0, g1) == (grid[0], grid[1] if len(grid) > 1 else 1)
        got = [("ptr", names.get(a, a - replay_scratch.data_ptr())) if isinstance(w, torch.Tensor) else a
               for a, w in zip(args, want_args)]
        want = [("ptr", names.get(w.data_ptr(), w.data_ptr() - expected_scratch.data_ptr()))
                if isinstance(w, torch.Tensor) else w for w in want_args]
        assert got == want


def test_a_copied_input_is_not_replayed(stubbed):
    x = torch.randn(4, 8, 1024).transpose(0, 1)  # reshape to rows copies
    rows = x.reshape(-1, 1024)
    v, i = torch.empty(8, 4, 8), torch.empty(8, 4, 8, dtype=torch.int64)
    assert rows.data_ptr() != x.data_ptr() or not rows.is_contiguous()
    assert launch.trace(x, rows.contiguous(), 8, True, v, i) is None

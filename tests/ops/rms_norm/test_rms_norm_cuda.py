"""RMSNorm on an sm_90 GPU: tilefly's forward against float64 and against ATen, reached through
F.rms_norm and aten::_fused_rms_norm, with every call's dispatch decision recorded so that a
silent fallback to ATen cannot pass for a success. ``config.force`` is on so small shapes run
the kernels too."""
import itertools

import pytest
import torch
import torch.nn.functional as F

import tilefly
from tilefly import _dispatch, config
from tilefly.ops.rms_norm import configs, eager, launcher
from tilefly.ops.rms_norm.configs import Config

pytestmark = pytest.mark.cuda

OP = torch.ops.aten._fused_rms_norm
SERVED = "triton_rms_norm"
DTYPES = [torch.float16, torch.bfloat16, torch.float32]
NS = [1, 7, 127, 4095, 4097, 8193, 16385, 65536, 114688, 262144]
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5}   # y, rtol and atol
FP32_EPS = torch.finfo(torch.float32).eps


@pytest.fixture(autouse=True)
def rms_norm_enabled():
    tilefly.enable("rms_norm")
    config.force = True
    torch.manual_seed(0)
    yield


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape, device="cuda", dtype=torch.float32).to(dtype)


def rand_weight(shape, dtype):
    return (torch.rand(shape, device="cuda") + 0.5).to(dtype)


def reference(x, n, w, eps):
    """float64 forward: (y, rstd)."""
    dims = tuple(range(x.dim() - n, x.dim()))
    xd = x.double()
    rstd = torch.rsqrt(xd.pow(2).mean(dims, keepdim=True) + (FP32_EPS if eps is None else eps))
    y = xd * rstd
    return (y * w.double() if w is not None else y), rstd


def check_config(x, w, cfg, y_ref, rstd_ref):
    """Launch ``cfg`` on 2-D ``x`` into NaN-poisoned outputs and compare with the float64
    reference; returns the launcher's Entry."""
    y = torch.full_like(x, float("nan"))
    rstd = torch.full((x.shape[0], 1), float("nan"), device="cuda")
    entry = launcher.launch(x, w, y, rstd, 1e-6, cfg)
    tol = TOL[x.dtype]
    torch.testing.assert_close(y.double(), y_ref, rtol=tol, atol=tol, msg=str(cfg))
    torch.testing.assert_close(rstd.double(), rstd_ref, rtol=1e-5, atol=0, msg=str(cfg))
    return entry


def on_aten(fn, *args):
    """Run fn with tilefly off (ATen's kernel), then restore the families that were on."""
    before = tilefly.enabled_ops()
    tilefly.disable()
    try:
        return fn(*args)
    finally:
        if before:
            tilefly.enable(list(before))


def served(fn, *args):
    """Run fn and require that every _fused_rms_norm it called was served by tilefly."""
    with _dispatch.recording() as decisions:
        out = fn(*args)
    assert decisions, "the call never reached tilefly's router"
    assert all(d.impl == SERVED for d in decisions), decisions
    return out


def fell_back(fn, *args):
    """Run fn and return (result, reason) of a call tilefly declined."""
    with _dispatch.recording() as decisions:
        out = fn(*args)
    assert len(decisions) == 1 and decisions[0].impl is None, decisions
    return out, decisions[0].reason


def check_op(x, shape, w=None, eps=1e-6):
    """Served aten::_fused_rms_norm against float64 and ATen: values, dtypes, shapes, strides."""
    y, rstd = served(OP, x, list(shape), w, eps)
    y_aten, rstd_aten = on_aten(OP, x, list(shape), w, eps)
    y_ref, rstd_ref = reference(x, len(shape), w, eps)
    assert (y.shape, y.dtype, y.stride()) == (y_aten.shape, y_aten.dtype, y_aten.stride())
    assert (rstd.shape, rstd.dtype, rstd.stride()) == (rstd_aten.shape, rstd_aten.dtype, rstd_aten.stride())
    tol = TOL[x.dtype]
    torch.testing.assert_close(rstd.double(), rstd_ref, rtol=1e-5, atol=0)
    torch.testing.assert_close(y.double(), y_ref, rtol=tol, atol=tol)
    torch.testing.assert_close(rstd, rstd_aten, rtol=1e-5, atol=0)
    torch.testing.assert_close(y, y_aten, rtol=tol, atol=tol)
    return y, rstd


@pytest.mark.parametrize("has_w", [True, False], ids=["w", "no-w"])
@pytest.mark.parametrize("N", NS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_and_row_length_matches_float64_and_aten(dtype, N, has_w):
    M = 37 if N <= 8193 else 5  # 37: not a multiple of any rows-per-program
    x = rand(M, N, dtype=dtype)
    check_op(x, [N], rand_weight(N, dtype) if has_w else None)


@pytest.mark.parametrize("shape, n", [((4097,), 1), ((33, 4097), 1), ((3, 11, 4097), 1),
                                      ((3, 11, 257), 2), ((2, 3, 5, 64), 3), ((6, 40000), 1),
                                      ((2, 3, 128, 512), 2)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_input_ranks_and_normalized_dims(shape, n, dtype):
    x = rand(*shape, dtype=dtype)
    norm = shape[len(shape) - n:]
    check_op(x, norm, rand_weight(norm, dtype))
    y = served(F.rms_norm, x, norm, rand_weight(norm, dtype), 1e-5)
    assert y.shape == x.shape


@pytest.mark.parametrize("eps", [0.0, 1e-6, 1e-2, 1.0, None])
@pytest.mark.parametrize("dtype, N", [(torch.float16, 4097), (torch.float32, 4096), (torch.bfloat16, 65537)])
def test_eps_variants(dtype, N, eps):
    check_op(rand(9, N, dtype=dtype), [N], rand_weight(N, dtype), eps)


def test_eps_none_is_float32_epsilon():
    x = rand(4, 256, dtype=torch.float16) * 1e-4  # small rows, so eps shows in rstd
    _, rstd_none = served(OP, x, [256], None, None)
    _, rstd_eps = served(OP, x, [256], None, FP32_EPS)
    torch.testing.assert_close(rstd_none, rstd_eps, rtol=0, atol=0)


@pytest.mark.parametrize("N", [4096, 4097, 65537])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_nan_and_inf_follow_float64_and_match_aten_on_finite_rows(dtype, N):
    # Rows with +-inf: rsqrt(inf) = 0, so y = x * 0 is 0, and NaN at the infinite element
    # (inf * 0). ATen's kernels disagree among themselves there: on the H200 (torch 2.11) it
    # matched this at N = 4096 and not at 4097 or 65537 (one side NaN). So those rows are checked
    # against float64 only; what ATen returns for them is not asserted either way.
    x = rand(6, N, dtype=dtype)
    x[1, 3] = float("nan")
    x[2, N // 2] = float("inf")
    x[3, N - 1] = -float("inf")
    x[4] = 0.0                                    # 0 * rsqrt(0 + eps=0) = NaN, as in ATen
    w = rand_weight(N, dtype)
    y, rstd = served(OP, x, [N], w, 0.0)
    y_ref, rstd_ref = reference(x, 1, w, 0.0)
    tol = TOL[dtype]
    torch.testing.assert_close(rstd.double(), rstd_ref, rtol=1e-5, atol=0, equal_nan=True)
    torch.testing.assert_close(y.double(), y_ref, rtol=tol, atol=tol, equal_nan=True)
    assert y[1].isnan().all() and rstd[1].isnan().all() and y[4].isnan().all() and rstd[4].isinf().all()
    for row, col in ((2, N // 2), (3, N - 1)):
        assert rstd[row].item() == 0
        assert y[row, col].isnan() and y[row].isnan().sum() == 1
        assert (y[row].nan_to_num(nan=0.0) == 0).all()
    finite = [0, 1, 4, 5]                          # no +-inf: ATen and tilefly must agree
    y_aten, rstd_aten = on_aten(OP, x, [N], w, 0.0)
    torch.testing.assert_close(rstd[finite], rstd_aten[finite], rtol=1e-5, atol=0, equal_nan=True)
    torch.testing.assert_close(y[finite], y_aten[finite], rtol=tol, atol=tol, equal_nan=True)


def test_empty_rows_are_served_and_empty_normalized_dims_stay_on_aten():
    x = torch.empty(0, 4096, device="cuda", dtype=torch.float16)
    y, rstd = served(OP, x, [4096], None, 1e-6)
    assert y.shape == (0, 4096) and rstd.shape == (0, 1) and rstd.dtype == torch.float32
    assert served(F.rms_norm, x, (4096,)).shape == (0, 4096)

    x = torch.empty(4, 0, device="cuda", dtype=torch.float16)

    def outcome(fn):
        try:
            return fn()
        except RuntimeError as exc:
            return type(exc)

    with _dispatch.recording() as decisions:
        ours = outcome(lambda: OP(x, [0], None, 1e-6))
    assert decisions and decisions[0].impl is None and "N=0" in decisions[0].reason
    theirs = on_aten(outcome, lambda: OP(x, [0], None, 1e-6))
    if isinstance(theirs, tuple):
        for a, b in zip(ours, theirs):
            assert a.shape == b.shape and a.dtype == b.dtype
    else:
        assert ours is theirs


def _same_layout(x32, dtype):
    """x32's sizes, strides and storage offset, re-created in dtype with fresh random values."""
    storage = torch.randn(x32.untyped_storage().nbytes() // 4, device="cuda").to(dtype)
    return storage.as_strided(x32.shape, x32.stride(), x32.storage_offset())


@pytest.mark.parametrize("make", [
    lambda: rand(64, 4160)[:, :4096],                         # row slice, aligned stride
    lambda: rand(64, 4105)[:, :4097],                         # row slice, odd stride
    lambda: rand(64 * 4096 + 1).narrow(0, 1, 64 * 4096).view(64, 4096),   # x itself off 16 bytes
    lambda: rand(4096).expand(64, 4096),                      # one row broadcast
    lambda: rand(4, 8, 40003)[:, :, :40000],                  # long rows, leading dims collapse
], ids=["slice-aligned", "slice-odd", "misaligned-base", "expanded", "long-strided"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_row_strided_inputs_are_served(make, dtype):
    x = _same_layout(make(), dtype)
    assert not x.is_contiguous() or x.data_ptr() % 16
    N = x.shape[-1]
    check_op(x, [N], rand_weight(N, dtype))


@pytest.mark.parametrize("make, why", [
    (lambda: rand(4096, 64).t(), "not one contiguous block"),
    (lambda: rand(4, 8, 512)[:, :3], "not one contiguous block"),
])
def test_unservable_layouts_fall_back_with_a_reason(make, why):
    x = make()
    N = x.shape[-1]
    (y, rstd), reason = fell_back(OP, x, [N], None, 1e-6)
    assert why in reason
    y_ref, _ = reference(x, 1, None, 1e-6)
    torch.testing.assert_close(y.double(), y_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("has_w", [True, False], ids=["w", "no-w"])
@pytest.mark.parametrize("N", [127, 4097, 16384, 65537])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gradients_through_autograd_match_aten(dtype, N, has_w):
    x0 = rand(24, N, dtype=dtype)
    w0 = rand_weight(N, dtype) if has_w else None
    grad_out = rand(24, N, dtype=dtype)

    def grads():
        x = x0.clone().requires_grad_()
        w = w0.clone().requires_grad_() if has_w else None
        y = F.rms_norm(x, (N,), w, 1e-6)
        y.backward(grad_out)
        return y, x.grad, (w.grad if has_w else None)

    y, gx, gw = served(grads)
    y_a, gx_a, gw_a = on_aten(grads)
    tol = TOL[dtype]
    torch.testing.assert_close(y, y_a, rtol=tol, atol=tol)
    torch.testing.assert_close(gx, gx_a, rtol=tol, atol=tol)
    if has_w:
        torch.testing.assert_close(gw, gw_a, rtol=tol, atol=tol * 10)  # a sum over 24 rows


@pytest.mark.parametrize("shape, n, take", [
    ((6, 4, 1025), 2, lambda t: t),                          # two normalized dims (4100 a row)
    ((24, 4200), 1, lambda t: t[:, :4097]),                  # row slice: strided rows
    ((3, 8, 40003), 1, lambda t: t[:, :, :40000]),           # long strided rows, leading dims
], ids=["2-dims", "row-slice", "long-row-slice"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gradients_match_aten_for_multi_dim_and_strided_inputs(dtype, shape, n, take):
    """ATen's backward runs with tilefly's rstd: its shape (x.shape[:-n] + [1] * n) and values
    must serve it for every normalized-dims count and row stride tilefly serves."""
    x0 = take(rand(*shape, dtype=dtype))
    norm = list(x0.shape[-n:])
    w0 = rand_weight(norm, dtype)
    grad_out = rand(*x0.shape, dtype=dtype)

    def grads():
        x = x0.detach().requires_grad_()     # keeps x0's strides: a view of the bigger tensor
        w = w0.clone().requires_grad_()
        y = F.rms_norm(x, norm, w, 1e-6)
        y.backward(grad_out)
        return y, x.grad, w.grad

    y, gx, gw = served(grads)
    y_a, gx_a, gw_a = on_aten(grads)
    tol = TOL[dtype]
    torch.testing.assert_close(y, y_a, rtol=tol, atol=tol)
    torch.testing.assert_close(gx, gx_a, rtol=tol, atol=tol)
    torch.testing.assert_close(gw, gw_a, rtol=tol, atol=tol * 10)  # a sum over the rows


@pytest.mark.parametrize("N, cfg", [(4097, None), (65537, None), (65537, Config("segments", 8192, 1, 8)),
                                    (4097, Config("rows", 4096, 1, 4, w_shift=True, row_edges=True)),
                                    (65536, Config("segments", 16384, 1, 4, x16=True)),
                                    (16385, Config("rows", 16384, 1, 8, w_shift=True, row_edges=True, pdl=True))],
                         ids=["rows", "chunked", "segments", "rows-w-shift", "segments-x16", "rows-w-shift-pdl"])
def test_cuda_graph_capture_and_replay(N, cfg):
    static_x = rand(256, N, dtype=torch.float16)
    w = rand_weight(N, torch.float16)

    def norm():
        if cfg is None:
            return F.rms_norm(static_x, (N,), w, 1e-6)
        return eager.rms_norm_forward(static_x, [N], w, 1e-6, kernel_config=cfg)[0]  # workspace/copies inside

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up compiles and fills the launch cache
        for _ in range(2):
            norm()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with _dispatch.recording() as decisions, torch.cuda.graph(graph):
        static_y = norm()
    assert all(d.impl == SERVED for d in decisions) and bool(decisions) == (cfg is None)
    for _ in range(2):
        static_x.copy_(rand(256, N, dtype=torch.float16))
        static_y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        y_ref, _ = reference(static_x, 1, w, 1e-6)
        torch.testing.assert_close(static_y.double(), y_ref, rtol=2e-3, atol=2e-3)


def test_disable_restores_aten_and_explain_tells_which_ran():
    x, w = rand(64, 4097, dtype=torch.bfloat16), rand_weight(4097, torch.bfloat16)
    report = tilefly.explain(F.rms_norm, x, (4097,), w)
    assert [d.impl for d in report.decisions] == [SERVED] and "served by tilefly" in str(report)
    tilefly.disable()
    report = tilefly.explain(F.rms_norm, x, (4097,), w)
    assert report.decisions and report.decisions[0].impl is None
    assert "not enabled" in report.decisions[0].reason
    with _dispatch.recording() as decisions:
        F.rms_norm(x, (4097,), w)
    assert decisions == []


def test_performance_band_keeps_tiny_inputs_on_aten_unless_forced():
    config.force = False
    tiny = rand(2, 256, dtype=torch.float16)
    report = tilefly.explain(F.rms_norm, tiny, (256,))
    assert report.decisions[0].impl is None and "launch-bound" in report.decisions[0].reason
    big = rand(1024, 4096, dtype=torch.float16)
    assert tilefly.explain(F.rms_norm, big, (4096,)).decisions[0].impl == SERVED
    config.force = True
    assert tilefly.explain(F.rms_norm, tiny, (256,)).decisions[0].impl == SERVED


# (N, row stride or None for contiguous, config or None for the heuristic) -> kernel and layout
LAUNCH_CASES = {
    "rows-aligned": (4096, None, None),
    "rows-split": (4097, None, None),
    "rows-generic-strided": (4097, 4105, None),
    "rows-no-split": (4097, None, Config("rows", 8192, 1, 16, split=False)),
    "rows-packed": (127, None, Config("rows", 128, 8, 4)),
    "rows-tiny": (7, None, None),
    "chunked-aligned": (65536, None, None),
    "chunked-split": (65537, None, None),
    "chunked-generic-strided": (40000, 40003, None),
    "chunked-unpipelined": (65537, None, Config("chunked", 2048, 1, 4, 1, 4)),
    "chunked-short-rows": (4097, None, Config("chunked", 1024, 1, 4, 3, 2)),
    "segments-aligned": (65536, None, Config("segments", 16384, 1, 16)),
    "segments-split": (65537, None, Config("segments", 8192, 1, 8)),
    "segments-generic-strided": (40000, 40003, Config("segments", 8192, 1, 8)),
    "segments-two-pieces": (16385, None, Config("segments", 8192, 1, 16)),
    "rows-split-w-shift": (4097, None, Config("rows", 4096, 1, 4, w_shift=True)),
    "rows-split-row-edges": (4097, None, Config("rows", 4096, 2, 4, row_edges=True)),
    "rows-split-w-shift-row-edges": (8193, None, Config("rows", 8192, 1, 8, w_shift=True, row_edges=True)),
    "rows-split-w-shift-row-edges-packed": (1001, None, Config("rows", 1024, 4, 4, w_shift=True, row_edges=True)),
    # GENERIC rows (x strided): both flags ignored
    "rows-generic-strided-w-shift": (4097, 4105, Config("rows", 8192, 1, 16, w_shift=True, row_edges=True)),
    "chunked-split-w-shift": (65537, None, Config("chunked", 4096, 1, 16, 1, 2, w_shift=True)),
    "segments-split-w-shift": (65537, None, Config("segments", 8192, 1, 8, w_shift=True)),
    "segments-aligned-reload": (65536, None, Config("segments", 16384, 1, 4, reload=True)),
    "segments-split-w-shift-reload": (65537, None, Config("segments", 8192, 1, 4, w_shift=True, reload=True)),
    "segments-aligned-x16": (114688, None, Config("segments", 16384, 1, 4, x16=True)),
    # w realigned in registers: one row a program, packed rows, 64 values a thread
    "rows-split-w-realign": (4097, None, Config("rows", 4096, 1, 4, row_edges=True, w_realign=True)),
    "rows-split-w-realign-packed": (1001, None, Config("rows", 1024, 4, 4, row_edges=True, w_realign=True)),
    "rows-split-w-realign-long": (16385, None, Config("rows", 16384, 1, 8, row_edges=True, w_realign=True)),
    "rows-split-w-realign-no-edges": (8193, None, Config("rows", 8192, 2, 16, w_realign=True)),
    # cache hints on x and y
    "rows-split-hint-cg": (16385, None, Config("rows", 16384, 1, 8, w_shift=True, row_edges=True, pdl=True, hint="cg")),
    "rows-aligned-hint-cs": (16384, None, Config("rows", 16384, 1, 8, hint="cs")),
    # the tile normalized in pieces, 16-bit x kept as loaded (x16 raises for FP32)
    "rows-split-pieces-x16": (16385, None, Config("rows", 16384, 1, 8, w_shift=True, row_edges=True, pdl=True,
                                                  pieces=2, x16=True)),
    "rows-split-same-phase-pieces": (16385, None, Config("rows", 16384, 2, 16, row_edges=True, w_realign=True,
                                                         same_phase=True, pieces=2)),
    "rows-aligned-pieces-x16": (65536, None, Config("rows", 65536, 1, 32, pieces=2, x16=True, hint="cs")),
    "rows-aligned-pieces": (4096, None, Config("rows", 4096, 2, 4, pieces=2)),
    "rows-split-w-realign-4-pieces-x16": (16385, None, Config("rows", 16384, 1, 16, row_edges=True, w_realign=True,
                                                              pieces=4, x16=True)),
    "rows-split-same-phase-4-pieces": (16385, None, Config("rows", 16384, 2, 32, row_edges=True, w_realign=True,
                                                           same_phase=True, pieces=4)),
    # each piece's w one piece early
    "rows-split-w-realign-4-pieces-w-ahead": (16385, None, Config("rows", 16384, 1, 8, row_edges=True, w_realign=True,
                                                                  pieces=4, w_ahead=True)),
    "rows-split-w-shift-pdl-w-ahead": (16385, None, Config("rows", 16384, 1, 8, w_shift=True, row_edges=True, pdl=True,
                                                           pieces=2, w_ahead=True)),
    "rows-aligned-w-ahead": (8192, None, Config("rows", 8192, 2, 16, x16=True, pieces=2, w_ahead=True)),
    # a code path for each 16-byte phase (M = 37: every phase)
    "rows-split-w-branch": (4097, None, Config("rows", 4096, 1, 4, row_edges=True, w_realign=True, w_branch=True)),
    "rows-split-w-branch-8-pieces-w-ahead": (16385, None, Config("rows", 16384, 1, 8, row_edges=True, w_realign=True,
                                                                 pieces=8, w_ahead=True, w_branch=True)),
    "rows-split-same-phase-w-branch": (16385, None, Config("rows", 16384, 2, 32, row_edges=True, w_realign=True,
                                                           same_phase=True, pieces=4, w_branch=True)),
    # the rows kernel as a programmatic dependent of the copies' kernel
    "rows-split-w-shift-pdl": (16385, None, Config("rows", 16384, 1, 8, w_shift=True, row_edges=True, pdl=True)),
    "rows-split-w-shift-pdl-packed": (1001, None, Config("rows", 1024, 4, 4, w_shift=True, row_edges=True, pdl=True)),
}


@pytest.mark.parametrize("case", list(LAUNCH_CASES))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_each_kernel_and_layout_writes_every_output(dtype, case):
    N, stride, cfg = LAUNCH_CASES[case]
    M = 37
    x = rand(M, stride or N, dtype=dtype)[:, :N]
    w = rand_weight(N, dtype)
    y = torch.full((M, N), float("nan"), device="cuda", dtype=dtype)       # poisoned outputs
    rstd = torch.full((M, 1), float("nan"), device="cuda")
    if cfg is not None and cfg.x16 and dtype == torch.float32:             # x16 is a 16-bit switch
        with pytest.raises(ValueError, match="x16"):
            launcher.launch(x, w, y, rstd, 1e-6, cfg)
        assert y.isnan().all()
        return
    launcher.launch(x, w, y, rstd, 1e-6, cfg)
    y_ref, rstd_ref = reference(x, 1, w, 1e-6)
    torch.testing.assert_close(rstd.double(), rstd_ref, rtol=1e-5, atol=0)
    torch.testing.assert_close(y.double(), y_ref, rtol=TOL[dtype], atol=TOL[dtype])


def test_launch_cache_serves_any_row_count_with_one_compiled_kernel():
    w = rand_weight(4097, torch.float16)
    before = len(launcher._entries)
    for M in (1, 17, 1000, 5):
        x = rand(M, 4097, dtype=torch.float16)
        check_op(x, [4097], w)
    assert len(launcher._entries) - before <= 1
    x = rand(300, 4097, dtype=torch.float16)
    first = served(OP, x, [4097], w, 1e-6)
    plan = eager._plans[next(k for k in eager._plans if k[0] == x.shape)]
    assert plan.fast is not None, "an aligned launch must leave the plan its fast launch"
    second = served(OP, x, [4097], w, 1e-6)                 # through plan.fast
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    for _ in range(3):                                       # and through the recent guard
        third = served(OP, rand(300, 4097, dtype=torch.float16).copy_(x), [4097], w, 1e-6)
        assert torch.equal(first[0], third[0])


def test_fast_path_keeps_unaligned_pointers_off_the_aligned_kernel():
    base = rand(64 * 4096 + 8, dtype=torch.bfloat16)
    w = rand_weight(4096, torch.bfloat16)
    aligned, shifted = base[:64 * 4096].view(64, 4096), base[1:64 * 4096 + 1].view(64, 4096)
    for x in (aligned, shifted, aligned, shifted):           # same plan key, alternating alignment
        check_op(x, [4096], w)


@pytest.mark.parametrize("dtype, M, N, seg, reload", [(torch.bfloat16, 300, 114688, 8192, False),
                                                      (torch.float32, 257, 65537, 4096, False),
                                                      (torch.float16, 300, 114688, 8192, True)])
def test_segments_kernel_on_many_rows(dtype, M, N, seg, reload):
    # thousands of CTAs (M x pieces) waiting on each other by tickets: no deadlock, every row right
    x = rand(M, N, dtype=dtype)
    w = rand_weight(N, dtype)
    y = torch.full_like(x, float("nan"))
    rstd = torch.full((M, 1), float("nan"), device="cuda")
    for _ in range(2):
        launcher.launch(x, w, y, rstd, 1e-6, Config("segments", seg, 1, 8, reload=reload))
    torch.cuda.synchronize()
    y_ref, rstd_ref = reference(x, 1, w, 1e-6)
    torch.testing.assert_close(rstd.double(), rstd_ref, rtol=1e-5, atol=0)
    torch.testing.assert_close(y.double(), y_ref, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype, N", [(torch.float16, 4097), (torch.float32, 65536), (torch.bfloat16, 16385)])
def test_every_sweep_candidate_is_correct(dtype, N):
    x = rand(19, N, dtype=dtype)
    w = rand_weight(N, dtype)
    y_ref, rstd_ref = reference(x, 1, w, 1e-6)
    layout = configs.row_layout(N, N, True, x.element_size())
    for cfg in configs.candidates(N, x.element_size(), layout):
        check_config(x, w, cfg, y_ref, rstd_ref)


@pytest.mark.parametrize("dtype, N", [(torch.float16, 65536), (torch.float16, 114688), (torch.bfloat16, 262144)])
def test_every_x16_segments_candidate_is_correct(dtype, N):
    # what the full sweep times on long 16-bit rows: segments keeping x as loaded (x16)
    M = 19
    x = rand(M, N, dtype=dtype)
    w = rand_weight(N, dtype)
    y_ref, rstd_ref = reference(x, 1, w, 1e-6)
    layout = configs.row_layout(N, N, True, x.element_size())
    candidates = configs._x16_segments(N, x.element_size(), layout)
    assert candidates
    for cfg in candidates:
        check_config(x, w, cfg, y_ref, rstd_ref)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=str)
def test_w_shift_sees_a_weight_changed_in_place_between_calls(dtype):
    # the shifted copies are written per launch: an in-place change (even through .data, which no
    # version counter records) shows in the next call, cached launch entry or not
    N, M = 4097, 64
    x, w = rand(M, N, dtype=dtype), rand_weight(N, dtype)
    y, rstd = torch.empty_like(x), torch.empty(M, 1, device="cuda")
    for cfg, change in itertools.product((Config("rows", 4096, 1, 4, w_shift=True, row_edges=True),
                                          Config("rows", 4096, 1, 4, w_shift=True, row_edges=True, pdl=True)),
                                         (None, lambda: w.data.mul_(-1.5), lambda: w.copy_(rand_weight(N, dtype)))):
        if change is not None:
            change()
        y.fill_(float("nan"))
        launcher.launch(x, w, y, rstd, 1e-6, cfg)
        y_ref, _ = reference(x, 1, w, 1e-6)
        torch.testing.assert_close(y.double(), y_ref, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_w_realign_takes_an_unaligned_or_end_of_buffer_weight(dtype):
    # w_realign's vector loads need a 16-byte-aligned w (else the launch uses plain loads), and
    # read w up to its last 16-byte line: a w at the very end of its buffer stays correct
    N, M = 4097, 29
    x = rand(M, N, dtype=dtype)
    weights = rand_weight(2 * N + 1, dtype)
    for cfg, w in itertools.product((Config("rows", 4096, 1, 4, row_edges=True, w_realign=True),
                                     Config("rows", 4096, 1, 4, row_edges=True, w_realign=True, w_branch=True)),
                                    (weights[1:N + 1], weights[N + 1:], rand_weight(N, dtype))):
        y, rstd = torch.full_like(x, float("nan")), torch.full((M, 1), float("nan"), device="cuda")
        launcher.launch(x, w, y, rstd, 1e-6, cfg)
        y_ref, _ = reference(x, 1, w, 1e-6)
        torch.testing.assert_close(y.double(), y_ref, rtol=TOL[dtype], atol=TOL[dtype], msg=f"w at {w.data_ptr() % 16}")


def test_compiled_model_with_tilefly_enabled_runs_and_matches():
    # Inductor decomposes _fused_rms_norm itself, so the compiled graph does not need tilefly.
    model = torch.nn.Sequential(torch.nn.Linear(512, 4097), torch.nn.RMSNorm(4097, eps=1e-6)).cuda().half()
    x = rand(64, 512, dtype=torch.float16)
    expected = on_aten(model, x)
    torch._dynamo.reset()
    compiled = torch.compile(model)
    torch.testing.assert_close(compiled(x), expected, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("cfg", [Config("segments", 16384, 1, 4, x16=True), Config("segments", 32768, 1, 16, x16=True)],
                         ids=str)
def test_segments_keeping_16_bit_x(dtype, cfg):
    M, N = 300, 114688
    x = rand(M, N, dtype=dtype)
    w = rand_weight(N, dtype)
    check_config(x, w, cfg, *reference(x, 1, w, 1e-6))


def _rows_and_candidates(M, N, dtype, candidates_of):
    """Contiguous [M, N] rows and a weight, the configs ``candidates_of`` offers for their layout, and
    the float64 reference (y, rstd)."""
    x = rand(M, N, dtype=dtype)
    w = rand_weight(N, dtype)
    layout = configs.row_layout(N, N, True, x.element_size())
    return x, w, candidates_of(N, x.element_size(), layout), reference(x, 1, w, 1e-6)


@pytest.mark.parametrize("dtype, N", [(torch.float32, 16385), (torch.float16, 16385), (torch.float32, 16384),
                                      (torch.bfloat16, 16384)])
def test_persistent_rows_loop_over_many_tiles(dtype, N):
    """Persistent rows tiles (sweep.py --new) with more row tiles than programs, so each program
    loops and its pipelined loads run ahead into the next tile; every output written once."""
    M = 601
    x, w, candidates, ref = _rows_and_candidates(M, N, dtype, configs.persistent_candidates)
    assert candidates and all(c.persistent for c in candidates)
    for cfg in candidates:
        entry = check_config(x, w, cfg, *ref)
        assert entry is None or entry.grid(M) < -(-M // cfg.rows)     # fewer programs than tiles


@pytest.mark.parametrize("dtype, N", [(torch.float32, 16385), (torch.float16, 16385), (torch.bfloat16, 8193),
                                      (torch.float32, 4097)])
def test_same_phase_rows(dtype, N):
    """SPLIT rows tiles whose rows are V apart (the full sweep): every row written once when M is
    not a multiple of V * ROWS, w by shifted copies, through pdl, or realigned."""
    x, w, candidates, ref = _rows_and_candidates(601, N, dtype, configs.same_phase_candidates)
    assert candidates and all(c.same_phase for c in candidates)
    for cfg in candidates:
        check_config(x, w, cfg, *ref)

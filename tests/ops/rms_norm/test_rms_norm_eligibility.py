"""RMSNorm eligibility on CPU: every rejection reason on meta tensors with the GPU check mocked,
the row-stride rule, the per-shape plan cache and the predicate-to-op hand-over, output shapes
of the empty case, and the router registration."""
import pytest
import torch

import tilefly
from tilefly import _device, _dispatch, config
from tilefly.ops.rms_norm import eager, launcher

OP = "aten::_fused_rms_norm"


@pytest.fixture
def on_hopper(monkeypatch):
    """Pretend every tensor lives on an sm_90 GPU: the remaining checks are device-independent."""
    monkeypatch.setattr(_device, "hopper_reason", lambda t: None)
    eager._plans.clear()
    yield
    eager._plans.clear()


@pytest.fixture
def plan_builds(monkeypatch):
    """Count plan builds (the slow path of the predicate)."""
    built = []
    build = eager._build_plan

    def counting(*args):
        built.append(args[0].shape)
        return build(*args)

    monkeypatch.setattr(eager, "_build_plan", counting)
    return built


def meta(*shape, dtype=torch.float16):
    return torch.empty(shape, dtype=dtype, device="meta")


def test_llm_shaped_input_is_served_with_and_without_the_trailing_defaults(on_hopper):
    x, w = meta(8192, 4096), meta(4096)
    assert eager.rms_norm_reason(x, [4096]) is None  # the boxed call drops trailing defaults
    assert eager.rms_norm_reason(x, [4096], w) is None
    assert eager.rms_norm_reason(x, [4096], w, 1e-6) is None
    assert eager.rms_norm_reason(meta(4, 2048, 4097, dtype=torch.float32), [2048, 4097], None, None) is None


def test_off_hopper_the_device_check_answers():
    reason = eager.rms_norm_reason(torch.randn(4, 8), [8])
    assert reason == _device.hopper_reason(torch.randn(1)) and "cpu" in reason


@pytest.mark.parametrize("args, expected", [
    ((meta(64, 4096, dtype=torch.float64), [4096]), "dtype torch.float64 is not served"),
    ((meta(64, 4096), [1024]), "is not the trailing dims"),
    ((meta(64, 4096), []), "is not the trailing dims"),
    ((meta(4096), [1, 4096]), "is not the trailing dims"),
    ((meta(64, 4096), [4096], meta(4096, dtype=torch.float32)), "weight dtype torch.float32 differs"),
    ((meta(64, 4096), [4096], torch.empty(4096, dtype=torch.float16)), "weight is on cpu"),
    ((meta(64, 4096), [4096], meta(2048)), "weight shape [2048] is not normalized_shape"),
    ((meta(64, 64, 64), [64, 64], meta(64, 64).t()), "weight is not contiguous"),
    ((meta(64, 0), [0]), "row length N=0 outside"),
    ((meta(2, (1 << 24) + 1), [(1 << 24) + 1]), "row length N=16777217 outside"),
    ((meta(4096, 4096).t(), [4096]), "not one contiguous block"),
    ((meta(4, 8, 4096)[:, :3, :], [4096]), "not one contiguous block"),
    ((meta(8, 4, 128)[:, :, :64], [4, 64]), "not one contiguous block"),
    ((meta(1 << 31, 1), [1]), "more than 2**31 rows"),
    ((meta(4, 64), [64]), "launch-bound"),
])
def test_each_rejection_names_its_reason(on_hopper, args, expected):
    reason = eager.rms_norm_reason(*args)
    assert reason is not None and expected in reason, reason


def test_force_lifts_only_the_performance_band(on_hopper):
    tiny = meta(4, 64)
    assert "launch-bound" in eager.rms_norm_reason(tiny, [64])
    config.force = True
    assert eager.rms_norm_reason(tiny, [64]) is None
    assert "row length" in eager.rms_norm_reason(meta(4, 0), [0])
    assert "dtype" in eager.rms_norm_reason(meta(4, 64, dtype=torch.float64), [64])


def test_band_threshold_is_on_input_bytes(on_hopper):
    rows_at_threshold = eager.MIN_SERVED_BYTES // (2 * 1024)
    assert eager.rms_norm_reason(meta(rows_at_threshold, 1024), [1024]) is None
    assert eager.rms_norm_reason(meta(rows_at_threshold - 1, 1024), [1024]) is not None


def test_repeat_calls_reuse_the_plan_and_each_key_gets_its_own(on_hopper, plan_builds):
    x, w = meta(64, 4096), meta(4096)
    for _ in range(3):
        assert eager.rms_norm_reason(x, [4096], w, 1e-6) is None
        assert eager.rms_norm_reason(meta(64, 4096), [4096], meta(4096)) is None   # same key, new tensors
    assert len(plan_builds) == 1
    assert eager.rms_norm_reason(x, [4096]) is None                                  # no weight: another key
    assert "weight dtype" in eager.rms_norm_reason(x, [4096], meta(4096, dtype=torch.float32))
    assert "weight shape" in eager.rms_norm_reason(x, [4096], meta(1, 4096))
    assert "not one contiguous" in eager.rms_norm_reason(meta(4096, 64).t(), [4096], w)
    assert "dtype torch.float64" in eager.rms_norm_reason(meta(64, 4096, dtype=torch.float64), [4096])
    assert eager.rms_norm_reason(x, [4096], w) is None and len(plan_builds) == 6


def test_another_normalized_shape_on_the_same_key_is_not_answered_from_the_cache(on_hopper):
    x = meta(8, 64, 64)
    assert eager.rms_norm_reason(x, [64]) is None
    assert eager.rms_norm_reason(x, [64, 64]) is None
    assert "not the trailing dims" in eager.rms_norm_reason(x, [32, 64])
    assert eager.rms_norm_reason(x, (64, 64)) is None                                # a tuple compares too
    assert eager.rms_norm_reason(x, [64]) is None


@pytest.fixture
def cuda_branch(on_hopper, monkeypatch):
    """CPU tensors take the CUDA tensors' branch of the predicate (device index 0), the one that
    keeps the recent guard."""
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0, raising=False)
    monkeypatch.setattr(eager, "_recent", None)


def test_recent_guard_answers_repeats_and_only_repeats(cuda_branch, plan_builds):
    x, w = torch.randn(64, 4096, dtype=torch.float16), torch.randn(4096, dtype=torch.float16)
    plan = eager.rms_norm_plan(x, [4096], w, 1e-6)
    assert isinstance(plan, eager.Plan) and eager._recent is not None and eager._recent[2] is plan
    eager._plans.clear()                                          # only the guard can answer now
    assert eager.rms_norm_reason(torch.randn(64, 4096, dtype=torch.float16), [4096],
                                 torch.randn(4096, dtype=torch.float16)) is None
    assert len(plan_builds) == 1
    assert "weight dtype" in eager.rms_norm_reason(x, [4096], w.float())
    assert "not one contiguous" in eager.rms_norm_reason(torch.randn(4096, 64, dtype=torch.float16).t(), [4096], w)
    assert "not the trailing dims" in eager.rms_norm_reason(x, [4096, 1], w)
    assert "weight shape" in eager.rms_norm_reason(x, [4096], torch.randn(1, 4096, dtype=torch.float16))
    assert eager.rms_norm_reason(x, [4096]) is None                                  # no weight: its own guard
    assert eager._recent[1] is True
    sliced = torch.randn(64, 4100, dtype=torch.float16)[:, :4096]                      # same shape, other strides
    assert eager.rms_norm_plan(sliced, [4096], w).stride == 4100
    assert "launch-bound" in eager.rms_norm_reason(torch.randn(1, 1024, dtype=torch.float16), [1024])
    assert "launch-bound" in eager.rms_norm_reason(torch.randn(1, 1024, dtype=torch.float16), [1024])


def test_cache_is_bounded(on_hopper, monkeypatch):
    monkeypatch.setattr(eager, "MAX_PLANS", 8)
    for m in range(1, 30):
        assert eager.rms_norm_reason(meta(m, 4096), [4096]) is None
        assert len(eager._plans) <= 8


def test_the_op_runs_the_plan_its_predicate_returned(on_hopper, monkeypatch):
    plans = []
    monkeypatch.setattr(launcher, "run_plan", lambda plan, *args: plans.append(plan))
    x, w = torch.randn(8, 4096, dtype=torch.float16), torch.randn(4096, dtype=torch.float16)
    norm = [4096]
    plan = eager.rms_norm_plan(x, norm, w, 1e-6)
    y, rstd = eager.rms_norm_served(plan, x, norm, w, 1e-6)
    assert plans[-1] is plan is eager._plans[next(iter(eager._plans))]
    assert (y.shape, y.dtype, rstd.shape, rstd.dtype) == ((8, 4096), torch.float16, (8, 1), torch.float32)

    other = torch.randn(16, 4096, dtype=torch.float16)       # called directly: its own plan
    y, rstd = eager.rms_norm_forward(other, norm, w, 1e-6)
    assert plans[-1].M == 16 and rstd.shape == (16, 1)
    with pytest.raises(ValueError, match="not the trailing dims"):
        eager.rms_norm_forward(x, [8], None, 1e-6)


@pytest.mark.parametrize("make", [
    lambda: torch.randn(6, 10),
    lambda: torch.randn(6, 16)[:, :10],
    lambda: torch.randn(3, 1, 10).transpose(0, 1),          # contiguous, odd stride on a size-1 dim
    lambda: torch.randn(2, 3, 4, 10),
    lambda: torch.randn(10).expand(6, 10),
])
def test_outputs_have_atens_layout(on_hopper, monkeypatch, make):
    monkeypatch.setattr(launcher, "run_plan", lambda *args: None)
    config.force = True  # tiny inputs
    x = make()
    for _ in range(2):  # the second call allocates from the plan's templates
        assert eager.rms_norm_reason(x, [10]) is None
        y, rstd = eager.rms_norm_forward(x, [10])
        y_ref, rstd_ref = torch.ops.aten._fused_rms_norm(x.to("meta"), [10], None, None)
        for got, want in ((y, y_ref), (rstd, rstd_ref)):
            assert (got.shape, got.dtype, got.is_contiguous()) == (want.shape, want.dtype, True)
            # the stride of a size-1 dim means nothing (ATen's meta keeps the input's there)
            assert [s for s, n in zip(got.stride(), got.shape) if n > 1] == \
                [s for s, n in zip(want.stride(), want.shape) if n > 1]
        assert y.device == x.device == rstd.device


@pytest.mark.parametrize("make, n, stride", [
    (lambda: torch.empty(6, 10), 1, 10),
    (lambda: torch.empty(6, 16)[:, :10], 1, 16),                    # row slice of a wider buffer
    (lambda: torch.empty(10).expand(6, 10), 1, 0),                  # broadcast rows
    (lambda: torch.empty(2, 3, 16)[:, :, :10], 1, 16),              # leading dims collapse
    (lambda: torch.empty(2, 3, 4, 5), 2, 20),
    (lambda: torch.empty(2, 1, 3, 10)[:, :, :, :], 1, 10),
    (lambda: torch.empty(3, 1, 10).transpose(0, 1), 1, 10),        # size-1 dims carry any stride
    (lambda: torch.empty(7), 1, 7),
    (lambda: torch.empty(6, 10).t(), 1, None),                      # column-major rows
    (lambda: torch.empty(4, 8, 10)[:, :3], 1, None),                # rows not evenly spaced
    (lambda: torch.empty(3, 4, 5).transpose(1, 2), 2, None),        # normalized block not contiguous
])
def test_row_stride(make, n, stride):
    assert eager.row_stride(make(), n) == stride


def test_empty_input_returns_atens_output_shapes_without_launching():
    x = torch.empty(2, 0, 8, 16, dtype=torch.bfloat16)
    y, rstd = eager.rms_norm_forward(x, [8, 16], None, None)
    y_ref, rstd_ref = torch.ops.aten._fused_rms_norm(x.to("meta"), [8, 16], None, None)
    assert (y.shape, y.dtype, y.stride()) == (y_ref.shape, y_ref.dtype, y_ref.stride())
    assert (rstd.shape, rstd.dtype, rstd.stride()) == (rstd_ref.shape, rstd_ref.dtype, rstd_ref.stride())
    assert rstd.shape == (2, 0, 1, 1)


def _cuda_kernel_of_op() -> str:
    lines = [line for line in torch._C._dispatch_dump(OP).splitlines() if line.startswith("CUDA:")]
    return lines[0] if lines else ""


def test_enable_installs_the_route_and_disable_restores_aten():
    assert "_dispatch.py" not in _cuda_kernel_of_op()
    assert tilefly.enable("rms_norm") == ("rms_norm",)
    assert (OP, "CUDA") in _dispatch._routes
    assert "_dispatch.py" in _cuda_kernel_of_op(), "tilefly's handler must own the CUDA key"
    impls = _dispatch._routes[(OP, "CUDA")].impls
    assert [(i.name, i.predicate, i.fn, i.takes_plan) for i in impls] == \
        [("triton_rms_norm", eager.rms_norm_plan, eager.rms_norm_served, True)]
    tilefly.disable()
    assert (OP, "CUDA") not in _dispatch._routes
    assert "_dispatch.py" not in _cuda_kernel_of_op()


def test_importing_and_enabling_does_not_import_triton_kernels():
    import subprocess
    import sys

    code = ("import sys, tilefly; tilefly.enable('rms_norm'); "
            "assert 'tilefly.ops.rms_norm.kernels' not in sys.modules; assert 'triton' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_compiled_model_with_tilefly_enabled_still_runs():
    tilefly.enable("rms_norm")
    model = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.RMSNorm(48, eps=1e-5))
    x = torch.randn(5, 32)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager")
    torch.testing.assert_close(compiled(x), model(x))


def test_host_cost_benchmark_runs_on_cpu_and_restores_what_it_stubs(capsys):
    from tilefly.ops.rms_norm import sweep

    reason, stream = _device.hopper_reason, launcher._raw_stream
    sweep.host_cost(repeats=1, calls=20)
    out = capsys.readouterr().out
    assert "predicate + op" in out and out.count("us per call") == 4
    assert _device.hopper_reason is reason and launcher._raw_stream is stream
    assert "get_device" not in torch.Tensor.__dict__ and eager._recent is None


def test_a_cuda_input_on_another_gpu_generation_stays_on_aten(monkeypatch):
    """The device check runs when a CUDA key's plan is built (not skipped for CUDA tensors)."""
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0, raising=False)
    monkeypatch.setattr(_device, "hopper_reason", lambda t: "GPU is sm_80, tilefly's kernels target sm_90 (Hopper)")
    monkeypatch.setattr(eager, "_recent", None)
    eager._plans.clear()
    try:
        assert "sm_80" in eager.rms_norm_reason(torch.randn(64, 4096, dtype=torch.float16), [4096])
    finally:
        eager._plans.clear()

"""RMSNorm eligibility on CPU: every rejection reason on meta tensors with the GPU check mocked,
the row-stride rule, output shapes of the empty case, and the router registration."""
import pytest
import torch

import tilefly
from tilefly import _device, _dispatch, config
from tilefly.ops.rms_norm import eager

OP = "aten::_fused_rms_norm"


@pytest.fixture
def on_hopper(monkeypatch):
    """Pretend every tensor lives on an sm_90 GPU: the remaining checks are device-independent."""
    monkeypatch.setattr(_device, "hopper_reason", lambda t: None)


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
    assert [(i.name, i.predicate, i.fn) for i in impls] == \
        [("triton_rms_norm", eager.rms_norm_reason, eager.rms_norm_forward)]
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

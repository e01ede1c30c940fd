"""Host side of the grouped GEMM on CPU: what is declined before anything is written,
the output layout, and the Inductor wrapper's ATen fallback."""
import pytest
import torch

from tilefly.ops.grouped_gemm import bench, configs, launch
from tilefly.ops.grouped_gemm import inductor as grouped_inductor

BF16 = torch.bfloat16


def operands(rows=(30, 0, 70), n=48, k=32):
    a = torch.randn(sum(rows), k, dtype=BF16)
    b = torch.randn(len(rows), n, k, dtype=BF16).transpose(-2, -1)
    offs = torch.tensor(rows).cumsum(0).to(torch.int32)
    return a, b, offs


@pytest.mark.parametrize("n, padded", [(48, 48), (100, 104), (1, 8), (4096, 4096)])
def test_output_rows_are_padded_to_16_bytes_like_inductors(n, padded):
    out = bench.output_like_inductor(torch.empty(5, 8, dtype=BF16), n)
    assert out.shape == (5, n) and out.stride() == (padded, 1)
    assert bench.output_like_inductor(torch.empty(5, 8, dtype=BF16), 3, torch.float32).stride() == (4, 1)


def test_cpu_tensors_are_declined_before_anything_is_written():
    a, b, offs = operands()
    out = bench.output_like_inductor(a, 48).fill_(float("nan"))
    with pytest.raises(launch.Unsupported, match="CUDA"):
        launch.run(configs.DEFAULT[0], a, b, offs, out)
    assert out.isnan().all()


def test_inductor_wrapper_falls_back_to_aten_when_the_kernel_declines():
    a, b, offs = operands()
    out = bench.output_like_inductor(a, 48).fill_(float("nan"))
    fn = grouped_inductor._kernel(configs.DEFAULT[0])
    assert fn.__name__ == "tilefly_grouped_mm_grouped128x256x64_s3_w8_g8_v1"
    assert fn(a, b, offs, out=out) is out
    torch.testing.assert_close(out, torch._grouped_mm(a, b, offs=offs))


def test_bench_declines_cpu_tensors():
    assert bench.tilefly_providers(*operands()) == {}

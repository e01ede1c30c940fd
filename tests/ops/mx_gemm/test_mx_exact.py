"""MXFP4 is exact, on the H200: what the e2e's MXFP4 logits check (0.05 tolerance) and
scripts/mx_exactness_check.py rest on.

When each row of A and each column of B keeps one scale along K, an output is the sum of K products
of E2M1 values times one power of two. Those products are multiples of 2^-2 below 36, so K = 14336 of
them stay below 2^21 units of 2^-2: every partial sum is exact in FP32, whatever the order, the tile,
the K split, the unpack or the wgmma's order. So every MXFP4 build must give the float64 product
rounded once to the output dtype, bit for bit. Scales differ from row to row, so a scale applied to the
wrong row or column still shows."""
import pytest
import torch

from tilefly.ops.mx_gemm import configs

from mx_cases import raw_data, run_config, with_scales

SHAPES = [(8, 6144, 4096), (8, 1024, 14336), (32, 512, 14336), (64, 256, 2048), (128, 384, 1024)]


def _exact_case(m, n, k, swizzled, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a, b_nk = raw_data("mxfp4", m, k, g), raw_data("mxfp4", n, k, g)
    bits_a = torch.randint(120, 129, (m, 1), device="cuda", generator=g).expand(m, k // 32)
    bits_b = torch.randint(120, 129, (n, 1), device="cuda", generator=g).expand(n, k // 32)
    b, sa, sb, ref = with_scales("mxfp4", swizzled, a, b_nk, bits_a.contiguous(), bits_b.contiguous())
    return a, b, sa, sb, ref


@pytest.mark.cuda
@pytest.mark.parametrize("swizzled, out_dtype", [(False, torch.bfloat16), (True, torch.bfloat16),
                                                 (False, torch.float16)])
@pytest.mark.parametrize("m, n, k", SHAPES)
def test_cuda_every_mxfp4_build_is_exact(m, n, k, swizzled, out_dtype):
    a, b, sa, sb, ref = _exact_case(m, n, k, swizzled, seed=m * n + k)
    want = ref.to(out_dtype)     # scales 2^-7..2^1: products 2^-14..2^2 a unit, sums within FP16's range
    assert torch.isfinite(want).all() and (want != 0).float().mean() > 0.9
    for cfg in [None] + configs.offered(max(m, n), min(m, n), k, "mxfp4"):     # None: the launcher's pick
        out = torch.full((m, n), float("nan"), device="cuda", dtype=out_dtype)
        run_config(a, b, sa, sb, swizzled, cfg, out)
        off = (out != want).sum().item()
        name = "pick" if cfg is None else cfg.name
        assert off == 0, f"{name}: {off} of {out.numel()} elements differ from the exact product"

"""MX GEMM kernel v3 (kernels_v3: operands upcast to BF16 in the CTA): configs on CPU, the sm_90a compile
of its shipped builds (async BF16 wgmma, the exact E4M3 conversion, no spills); on the H200 every v3
config against the float64 dequantized reference, poisoned outputs, K tails, extreme and NaN scales, the
probe-only wide builds (``v3_wide_configs``), E4M3 subnormal data and NaN data bytes."""
from dataclasses import replace

import pytest
import torch

from tilefly import mx
from tilefly.ops.mx_gemm import configs

from mx_cases import (assert_compiles_without_spills, check_extreme_scale_run, close, extreme_scale_case, operands,
                      poison_swizzle_padding, raw_data, reference, run_config, with_scales)


def _v3(m, n, k, fmt):
    """The shipped build's tile for this width (v3_configs offers it at 33-64 columns only; the kernel
    serves any width) and its one-buffer-set variant."""
    built = configs.MXConfig(64, configs.small_slot(min(m, n)), 2, 4, kernel=3)
    return [built, replace(built, bf16_sets=1)]


# ---- configs ----------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", mx.FORMATS)
def test_v3_is_offered_at_33_to_64_columns_only_and_never_picked(fmt):
    """The eager pick is exact everywhere: since the staged v2 build won 64 tokens (suite at 66b0808),
    v3 only enters the benchmark's race."""
    for cols in (33, 48, 64):
        built = [c for c in configs.offered(4096, cols, 4096, fmt) if c.kernel == 3]
        assert [c.name for c in built] == ["mx3_64x64_s2_w4_k16"]
        assert configs.static_reason(built[0], fmt) is None
    for cols in (1, 8, 32, 65, 4096):
        assert not [c for c in configs.offered(4096, cols, 4096, fmt) if c.kernel == 3]
    for cols in (1, 8, 32, 33, 48, 64, 65, 4096):
        assert configs.pick(4096, cols, 4096, fmt).kernel != 3


def test_v3_smem_counts_both_sets_of_bf16_block_buffers():
    cfg = configs.MXConfig(64, 32, 4, 4, kernel=3)
    ring = 4 * (64 + 32) * 128
    assert cfg.smem_bytes("mxfp8") == ring + 2 * 4 * (64 + 32) * 32 * 2 + configs.SMEM_RESERVE
    one_set = configs.MXConfig(64, 32, 4, 4, kernel=3, bf16_sets=1)
    assert one_set.smem_bytes("mxfp8") == ring + 4 * (64 + 32) * 32 * 2 + configs.SMEM_RESERVE
    assert one_set.name == "mx3_64x32_s4_w4_k16_b1" and cfg.name == "mx3_64x32_s4_w4_k16"
    assert configs.static_reason(replace(cfg, bf16_sets=3), "mxfp8") == "bf16_sets must be 1 or 2"
    assert configs.static_reason(configs.MXConfig(64, 32, 16, 4, kernel=3), "mxfp8").startswith("needs")


V3_SPECS = [s.name for s in configs.compile_specs() if ".mx3_" in s.name]


def test_compile_specs_cover_every_shipped_v3_config():
    for fmt in mx.FORMATS:
        for cfg in configs.v3_configs(4096, 64, 4096, fmt):
            assert any(f".{cfg.name}[{fmt},swz=00,bias=0,bf16" in name for name in V3_SPECS)
            assert any(f".{cfg.name}[{fmt},swz=11,bias=1,fp16" in name for name in V3_SPECS)


@pytest.mark.parametrize("name", V3_SPECS)
def test_v3_compiles_with_bf16_wgmma_and_no_spills(name):
    pytest.importorskip("triton")
    assert_compiles_without_spills(name)


# ---- on the H200 ----------------------------------------------------------------------------------

SHAPES = [(m, n, k) for m in (1, 16, 33, 64) for n in (256, 4096) for k in (256, 4096)] + [(4096, 32, 1024)]


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("swizzled", [False, True])
@pytest.mark.parametrize("m, n, k", SHAPES)
def test_every_v3_config_matches_float64(fmt, swizzled, m, n, k):
    a, b, sa, sb = operands(fmt, m, n, k, swizzled, "cuda", seed=m + 3 * n + k)
    ref = reference(a, b, sa, sb, fmt, swizzled)
    for cfg in _v3(m, n, k, fmt):
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        close(run_config(a, b, sa, sb, swizzled, cfg, out), ref, 2.0 ** -8)


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("swizzled", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m, n, k", [(16, 4096, 4096), (33, 256, 4096), (4096, 7, 512)])
def test_v3_bias_and_output_dtypes_into_poisoned_outputs(fmt, swizzled, dtype, m, n, k):
    """Row-major and column-major outputs filled with NaN first: every element must be written."""
    a, b, sa, sb = operands(fmt, m, n, k, swizzled, "cuda", seed=7)
    bias = torch.randn(n, device="cuda", dtype=dtype)
    ref = reference(a, b, sa, sb, fmt, swizzled, bias)
    eps = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}[dtype]
    for cfg in _v3(m, n, k, fmt):
        for out in (torch.full((m, n), float("nan"), device="cuda", dtype=dtype),
                    torch.full((n, m), float("nan"), device="cuda", dtype=dtype).t()):
            close(run_config(a, b, sa, sb, swizzled, cfg, out, bias), ref, eps)


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("swizzled", [False, True])
@pytest.mark.parametrize("m, n, k", [(1, 256, 160), (40, 4096, 4128), (4096, 33, 96), (5, 1000, 672)])
def test_v3_k_tails_odd_slot_counts_and_byte_wise_scales(fmt, swizzled, m, n, k):
    """K not a multiple of 128 (a partial last slot), odd slot counts per split (the unpaired slot
    after the loop), and NO_SWIZZLE scales read byte by byte; padding bytes of the blocked layout set
    to NaN must not matter."""
    a, b, sa, sb = operands(fmt, m, n, k, swizzled, "cuda", seed=23)
    if swizzled:
        poison_swizzle_padding(sa, sb, m, n, k)
    ref = reference(a, b, sa, sb, fmt, swizzled)
    assert not torch.isnan(ref).any()
    for cfg in _v3(m, n, k, fmt):
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        close(run_config(a, b, sa, sb, swizzled, cfg, out), ref, 2.0 ** -8)


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("swizzled", [False, True])
@pytest.mark.parametrize("m, n", [(1, 4096), (33, 256), (4096, 64)])
def test_v3_extreme_scales_within_a_row_span_of_2_117_and_nan(fmt, swizzled, m, n):
    """One operand's rows at 2^-127 .. 2^-10, the other's at the inverse (2^10 .. 2^127, within a few
    octaves), so every product is representable and each row spans up to 2^117: upcast relative to
    each row's largest scale and rescaled exactly in the epilogue. One NaN scale byte per operand
    poisons its row or column."""
    k = 512
    g = torch.Generator(device="cuda").manual_seed(31)
    a, b_nk = raw_data(fmt, m, k, g), raw_data(fmt, n, k, g)
    low = torch.tensor([0, 100, 10, 1, 111, 0, 60, 100, 0, 111, 30, 50, 0, 2, 90, 111], device="cuda",
                       dtype=torch.int32)
    bits_a = torch.where(torch.arange(m, device="cuda")[:, None] % 2 == 0, low, low + 6).to(torch.uint8)
    delta = torch.randint(-3, 4, (n, k // 32), device="cuda", generator=g, dtype=torch.int32)
    bits_b = (254 - low + delta).clamp(0, 254).to(torch.uint8)
    b, sa, sb, ref, expect_nan = extreme_scale_case(fmt, swizzled, a, b_nk, bits_a, bits_b)
    for cfg in _v3(m, n, k, fmt):
        check_extreme_scale_run(a, b, sa, sb, swizzled, cfg, ref, expect_nan)


WIDE_SHAPES = [(128, 256, 4096), (4096, 96, 256), (300, 200, 4128), (65, 4096, 512), (1024, 1024, 1024)]


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("swizzled", [False, True])
@pytest.mark.parametrize("m, n, k", WIDE_SHAPES)
def test_every_wide_v3_build_matches_float64(fmt, swizzled, m, n, k):
    """Tiles up to 128 x 128 (``v3_wide_configs``), K tails and odd slot counts included (4128 = 32 slots
    and one of 32 K), each into a NaN-filled output."""
    a, b, sa, sb = operands(fmt, m, n, k, swizzled, "cuda", seed=m + 5 * n + k)
    ref = reference(a, b, sa, sb, fmt, swizzled)
    builds = configs.v3_wide_configs(max(m, n), min(m, n), k, fmt)
    assert builds
    for cfg in builds:
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        close(run_config(a, b, sa, sb, swizzled, cfg, out), ref, 2.0 ** -8)


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_wide_v3_bias_and_column_major_output(fmt, dtype):
    m, n, k = 200, 384, 1024
    a, b, sa, sb = operands(fmt, m, n, k, True, "cuda", seed=11)
    bias = torch.randn(n, device="cuda", dtype=dtype)
    ref = reference(a, b, sa, sb, fmt, True, bias)
    eps = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}[dtype]
    for cfg in configs.v3_wide_configs(n, m, k, fmt)[:2]:
        for out in (torch.full((m, n), float("nan"), device="cuda", dtype=dtype),
                    torch.full((n, m), float("nan"), device="cuda", dtype=dtype).t()):
            close(run_config(a, b, sa, sb, True, cfg, out, bias), ref, eps)


@pytest.mark.cuda
@pytest.mark.parametrize("m, n, k", [(64, 48, 256), (256, 128, 512)])
def test_v3_subnormal_e4m3_values_are_exact(m, n, k):
    """X holds only E4M3 subnormals (codes 1-7, either sign: +-2^-9 .. 7 x 2^-9) at scale 2^0, so the
    whole product rests on them: an upcast that flushed them would return zeros."""
    g = torch.Generator(device="cuda").manual_seed(43)
    codes = torch.randint(1, 8, (m, k), device="cuda", generator=g, dtype=torch.int32)
    sign = torch.randint(0, 2, (m, k), device="cuda", generator=g, dtype=torch.int32) * 128
    a = (codes + sign).to(torch.uint8).view(torch.float8_e4m3fn)
    b_nk = raw_data("mxfp8", n, k, g)
    ones_a = torch.full((m, k // 32), 127, device="cuda", dtype=torch.int32)
    bits_b = torch.randint(120, 135, (n, k // 32), device="cuda", generator=g, dtype=torch.int32)
    b, sa, sb, ref = with_scales("mxfp8", False, a, b_nk, ones_a, bits_b)
    assert ref.abs().max() > 0
    builds = _v3(m, n, k, "mxfp8") + configs.v3_wide_configs(max(m, n), min(m, n), k, "mxfp8")[:1]
    for cfg in builds:
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
        close(run_config(a, b, sa, sb, False, cfg, out), ref, 2.0 ** -13)


@pytest.mark.cuda
def test_v3_nan_data_poisons_its_row_and_column():
    """A NaN data byte (E4M3 0x7F or 0xFF; E2M1 has no NaN) makes its output row (in X) or column (in Y)
    NaN, as the dequantized product does."""
    m, n, k = 96, 160, 512
    a, b, sa, sb = operands("mxfp8", m, n, k, False, "cuda", seed=47)
    a.view(torch.uint8)[5, 77] = 0x7F
    b.view(torch.uint8).t()[9, 300] = 0xFF
    ref = reference(a, b, sa, sb, "mxfp8", False)
    expect = torch.zeros(m, n, dtype=torch.bool, device="cuda")
    expect[5, :] = True
    expect[:, 9] = True
    assert torch.equal(torch.isnan(ref), expect)
    for cfg in _v3(m, n, k, "mxfp8") + configs.v3_wide_configs(n, m, k, "mxfp8")[:1]:
        out = torch.full((m, n), 0.0, device="cuda", dtype=torch.bfloat16)
        run_config(a, b, sa, sb, False, cfg, out)
        assert torch.equal(torch.isnan(out), expect), cfg.name

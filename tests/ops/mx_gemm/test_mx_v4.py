"""MX GEMM kernel v4 (kernels_v4: MXFP4 scales folded into the unpacked FP8 operands): configs and the
folded table arithmetic on CPU, the sm_90a compile of its builds; on the H200 every v4 build against
the float64 dequantized reference, with slots that fold, slots that fall back to v2's per-block path,
poisoned outputs, K tails, byte-wise, extreme and NaN scales."""
from dataclasses import replace

import pytest
import torch

from tilefly import mx
from tilefly.ops.mx_gemm import configs

from mx_cases import (assert_compiles_without_spills, check_extreme_scale_run, close, extreme_scale_case, operands,
                      poison_swizzle_padding, raw_data, reference, run_config, with_scales)


def _v4(m, n, k):
    """Both v4 tiles for the shape's token count (v4_configs builds them at <= 64 columns; the kernel
    serves any width), each also with X from registers (X_REGS)."""
    cols = min(64, min(m, n))
    return configs.v4_configs(4096, cols, k, "mxfp4") + configs.v4_regs_configs(4096, cols, k, "mxfp4")


# ---- configs ----------------------------------------------------------------------------------

def test_v4_is_built_offered_and_picked_for_mxfp4_decode():
    built = configs.v4_configs(4096, 32, 4096, "mxfp4")
    assert [c.name for c in built] == ["mx4_128x32_s4_w4_k16_ss16", "mx4_64x32_s4_w4_k16_ss16"]
    assert not configs.v4_configs(4096, 32, 4096, "mxfp8") and not configs.v4_configs(4096, 65, 4096, "mxfp4")
    for cols in (1, 8, 9, 32, 64, 65, 4096):
        offered = [c for c in configs.offered(4096, cols, 4096, "mxfp4") if c.kernel == 4]
        v4 = configs.v4_configs(4096, cols, 4096, "mxfp4") + configs.v4_regs_configs(4096, cols, 4096, "mxfp4")
        assert offered == v4 and bool(offered) == (cols <= 64)
        picked = configs.pick(4096, cols, 4096, "mxfp4")
        assert (picked.kernel == 4) == (configs.V4_MIN_COLS < cols <= 64)
        assert picked.x_regs == (cols <= 64)   # v2's or v4's build with X from registers
        if picked.kernel == 4:   # the staged v2 tile it replaces
            assert replace(picked, kernel=2, x_regs=0) in configs.v2_staged_configs(4096, cols, 4096, "mxfp4")
    assert all(configs.pick(4096, cols, 4096, "mxfp8").kernel == 2 for cols in (1, 32, 64, 4096))


def test_v4_validates_and_counts_one_unpacked_buffer():
    cfg = configs.v4_configs(4096, 32, 4096, "mxfp4")[0]
    staged_v2 = replace(cfg, kernel=2)
    assert cfg.smem_bytes("mxfp4") == staged_v2.smem_bytes("mxfp4") - (128 + 32) * 128
    assert configs.static_reason(cfg, "mxfp4") is None
    for bad in (replace(cfg, scale_slots=0), replace(cfg, num_warps=8)):
        assert configs.static_reason(bad, "mxfp4").startswith("kernel 4")
    assert configs.static_reason(cfg, "mxfp8").startswith("kernel 4")


V4_SPECS = [s.name for s in configs.compile_specs() if ".mx4_" in s.name]


def test_v4_x_regs_builds():
    built = configs.v4_regs_configs(4096, 32, 4096, "mxfp4")
    assert [c.name for c in built] == ["mx4_128x32_s4_w4_k16_ss16_xr", "mx4_64x32_s4_w4_k16_ss16_xr"]
    assert [replace(c, x_regs=0) for c in built] == configs.v4_configs(4096, 32, 4096, "mxfp4")
    assert all(configs.static_reason(c, "mxfp4") is None for c in built)
    assert built[0].smem_bytes("mxfp4") == replace(built[0], x_regs=0).smem_bytes("mxfp4")
    for other in (1, 3):     # v1 and v3 have no X_REGS build
        assert configs.static_reason(replace(built[0], kernel=other, scale_slots=0), "mxfp4").startswith("x_regs")
    for mode in (2, 3, -1):
        assert configs.static_reason(replace(built[0], x_regs=mode), "mxfp4").startswith("x_regs must be 0 or 1")


def test_fragment_order_is_the_documented_permutation():
    """kernels_v4.fragment_order, transcribed with torch's reshape and permute (the same semantics as
    Gluon's): position 32i + 16h + 4q + c holds K element 32q + 8i + 4h + c, a permutation of the slot."""
    k = torch.arange(128)
    order = k.reshape(1, 4, 4, 2, 4).permute(0, 2, 3, 1, 4).reshape(128)   # one row
    assert sorted(order.tolist()) == list(range(128))
    for i in range(4):
        for h in range(2):
            for q in range(4):
                for c in range(4):
                    assert order[32 * i + 16 * h + 4 * q + c] == 32 * q + 8 * i + 4 * h + c


def test_compile_specs_cover_every_v4_build():
    for cfg in configs.v4_configs(4096, 32, 4096, "mxfp4") + configs.v4_regs_configs(4096, 32, 4096, "mxfp4"):
        assert any(f".{cfg.name}[mxfp4,swz=00,bias=0,bf16" in name for name in V4_SPECS)
        assert any(f".{cfg.name}[mxfp4,swz=11,bias=1,fp16" in name for name in V4_SPECS)
    for rows, cols, k in [(r, c, k) for r in (4096, 14336) for c in range(1, 65) for k in (4096, 14336)]:
        picked = configs.pick(rows, cols, k, "mxfp4")   # every tile the eager path runs v4 on
        assert picked.kernel != 4 or any(f".{picked.name}[mxfp4,swz=00,bias=0,bf16" in name for name in V4_SPECS)


@pytest.mark.parametrize("name", V4_SPECS)
def test_v4_compiles_with_fp8_wgmma_and_no_spills(name):
    pytest.importorskip("triton")
    assert_compiles_without_spills(name)


# ---- the folded tables, transcribed ------------------------------------------------------------------

def _e4m3(byte):
    return torch.tensor([byte], dtype=torch.uint8).view(torch.float8_e4m3fn).item()


@pytest.mark.parametrize("d", range(0, 7))
def test_folded_tables_give_each_magnitude_times_two_to_minus_d(d):
    """fp4_unpack.tables_below (v4's folded_tables): v2's table words with every nonzero byte's exponent field lowered by d;
    exact for d <= FOLD_SPAN, and d = FOLD_SPAN + 1 is where the smallest magnitude leaves E4M3's
    normal range (why slots beyond the span take the per-block path)."""
    fp4_unpack = pytest.importorskip("tilefly.ops.mx_gemm.fp4_unpack")
    span = fp4_unpack.FOLD_SPAN.value
    shift = 8 * d
    lo = (fp4_unpack.TABLE_LO.value - shift * 0x01010100) & 0xFFFFFFFF
    hi = (fp4_unpack.TABLE_HI.value - shift * 0x01010101) & 0xFFFFFFFF
    table = [(lo >> (8 * i)) & 255 for i in range(4)] + [(hi >> (8 * i)) & 255 for i in range(4)]
    got = [_e4m3(b) for b in table]
    want = [v * 2.0 ** -d for v in mx.FP4_VALUES[:8]]
    if d <= span:
        assert got == want
    else:
        assert got != want


# ---- on the H200 ----------------------------------------------------------------------------------

SHAPES = [(m, n, k) for m in (1, 16, 33, 64) for n in (256, 4096) for k in (256, 4096)] + [(4096, 32, 1024)]


@pytest.mark.cuda
@pytest.mark.parametrize("swizzled", [False, True])
@pytest.mark.parametrize("m, n, k", SHAPES)
def test_every_v4_build_matches_float64(swizzled, m, n, k):
    a, b, sa, sb = operands("mxfp4", m, n, k, swizzled, "cuda", seed=m + 3 * n + k)
    ref = reference(a, b, sa, sb, "mxfp4", swizzled)
    for cfg in _v4(m, n, k):
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        close(run_config(a, b, sa, sb, swizzled, cfg, out), ref, 2.0 ** -8)


@pytest.mark.cuda
@pytest.mark.parametrize("swizzled", [False, True])
@pytest.mark.parametrize("spread", [3, 5, 6, 12])
def test_v4_slots_that_fold_and_slots_that_do_not(swizzled, spread):
    """Scale bytes drawn per block within ``spread`` octaves of each other: up to FOLD_SPAN every slot
    folds, beyond it some slots take the per-block path, in the same program; FP32 output, so the
    comparison sees the FP32 accumulation, not BF16 rounding."""
    m, n, k = 32, 4096, 2048
    g = torch.Generator(device="cuda").manual_seed(43 + spread)
    a, b_nk = raw_data("mxfp4", m, k, g), raw_data("mxfp4", n, k, g)
    bits_a = torch.randint(120, 121 + spread, (m, k // 32), device="cuda", generator=g, dtype=torch.int32)
    bits_b = torch.randint(125, 126 + spread, (n, k // 32), device="cuda", generator=g, dtype=torch.int32)
    b, sa, sb, ref = with_scales("mxfp4", swizzled, a, b_nk, bits_a, bits_b)
    for cfg in _v4(m, n, k):
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
        close(run_config(a, b, sa, sb, swizzled, cfg, out), ref, 2.0 ** -13)


@pytest.mark.cuda
@pytest.mark.parametrize("swizzled", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m, n, k", [(16, 4096, 4096), (33, 256, 4096), (4096, 7, 512)])
def test_v4_bias_and_output_dtypes_into_poisoned_outputs(swizzled, dtype, m, n, k):
    a, b, sa, sb = operands("mxfp4", m, n, k, swizzled, "cuda", seed=7)
    bias = torch.randn(n, device="cuda", dtype=dtype)
    ref = reference(a, b, sa, sb, "mxfp4", swizzled, bias)
    eps = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}[dtype]
    for cfg in _v4(m, n, k):
        for out in (torch.full((m, n), float("nan"), device="cuda", dtype=dtype),
                    torch.full((n, m), float("nan"), device="cuda", dtype=dtype).t()):
            close(run_config(a, b, sa, sb, swizzled, cfg, out, bias), ref, eps)


@pytest.mark.cuda
@pytest.mark.parametrize("swizzled", [False, True])
@pytest.mark.parametrize("m, n, k", [(1, 256, 160), (40, 4096, 4128), (4096, 33, 96), (5, 1000, 672)])
def test_v4_k_tails_and_byte_wise_scales(swizzled, m, n, k):
    a, b, sa, sb = operands("mxfp4", m, n, k, swizzled, "cuda", seed=23)
    if swizzled:
        poison_swizzle_padding(sa, sb, m, n, k)
    ref = reference(a, b, sa, sb, "mxfp4", swizzled)
    assert not torch.isnan(ref).any()
    for cfg in _v4(m, n, k):
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        close(run_config(a, b, sa, sb, swizzled, cfg, out), ref, 2.0 ** -8)


@pytest.mark.cuda
@pytest.mark.parametrize("swizzled", [False, True])
@pytest.mark.parametrize("m, n", [(1, 4096), (33, 256), (4096, 64)])
def test_v4_extreme_and_nan_scales(swizzled, m, n):
    """v2's extreme case (A's blocks at 2^-127 / 2^127 / ..., B's at the inverse): no slot folds, the
    exact per-block path runs; one NaN scale byte per operand poisons its row or column."""
    k = 512
    g = torch.Generator(device="cuda").manual_seed(31)
    a, b_nk = raw_data("mxfp4", m, k, g), raw_data("mxfp4", n, k, g)
    base = torch.tensor([0, 254, 127, 1, 253, 0, 254, 100, 0, 254, 30, 200, 0, 254, 127, 127],
                        device="cuda", dtype=torch.int32)
    delta = torch.randint(-6, 7, (n, k // 32), device="cuda", generator=g, dtype=torch.int32)
    bits_a = base.expand(m, -1).contiguous().to(torch.uint8)
    bits_b = (254 - base + delta).clamp(0, 254).to(torch.uint8)
    b, sa, sb, ref, expect_nan = extreme_scale_case("mxfp4", swizzled, a, b_nk, bits_a, bits_b)
    for cfg in _v4(m, n, k):
        check_extreme_scale_run(a, b, sa, sb, swizzled, cfg, ref, expect_nan)


@pytest.mark.cuda
@pytest.mark.parametrize("swizzled", [False, True])
def test_v4_folded_slots_with_extreme_slot_maxima(swizzled):
    """Every slot folds (each row's four blocks within 2^2) but the slots' largest scales sit near
    2^+-120, so the folded partial is scaled by the exact (non-moderate) path."""
    m, n, k = 16, 512, 1024
    g = torch.Generator(device="cuda").manual_seed(47)
    a, b_nk = raw_data("mxfp4", m, k, g), raw_data("mxfp4", n, k, g)
    slot_a = torch.randint(5, 10, (m, k // 128, 1), device="cuda", generator=g, dtype=torch.int32)
    bits_a = (slot_a + torch.randint(0, 3, (m, k // 128, 4), device="cuda", generator=g, dtype=torch.int32))
    bits_b = 254 - bits_a[:1].expand(n, -1, -1) - 2
    b, sa, sb, ref = with_scales("mxfp4", swizzled, a, b_nk, bits_a.reshape(m, k // 32),
                                 bits_b.reshape(n, k // 32))
    assert torch.isfinite(ref).all() and ref.abs().max() > 0
    for cfg in _v4(m, n, k):
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float32)
        close(run_config(a, b, sa, sb, swizzled, cfg, out), ref, 2.0 ** -13)

"""tilefly.mx.quantize / dequantize against hand-computed blocks, error bounds on random data, and
the argument errors."""
import math

import pytest
import torch
import torch.nn.functional as F

from tilefly import mx

FP8_TINY = 2.0 ** -9  # smallest E4M3 subnormal


def _block(values, fill=0.0):
    row = torch.full((1, 32), fill)
    row[0, : len(values)] = torch.tensor(values)
    return row


def _bits(scales):
    return scales.view(torch.uint8).tolist()


def _exact(data, scales, fmt, **kw):
    return mx.dequantize(data, scales, fmt, dtype=torch.float64, **kw)


@pytest.mark.parametrize("k", [-20, -3, 0, 7, 100])
def test_mxfp8_block_with_amax_448_times_power_of_two(k):
    # amax = 448 * 2**k: floor(log2) = 8 + k, E4M3 emax = 8 -> shared exponent k, biased 127 + k;
    # 448, 1, -0.5 and the smallest subnormal are exact, 0.3 rounds to 0.3125 (step 2**-5 there).
    values = [448.0, -448.0, 1.0, -0.5, 0.3, FP8_TINY]
    data, scales = mx.quantize(_block([v * 2.0 ** k for v in values]), "mxfp8")
    assert data.dtype == torch.float8_e4m3fn and scales.dtype == torch.float8_e8m0fnu
    assert data.shape == (1, 32) and scales.shape == (1, 1)
    assert _bits(scales) == [[127 + k]]
    expected = [448.0, -448.0, 1.0, -0.5, 0.3125, FP8_TINY]
    assert data.float()[0, :6].tolist() == expected
    assert _exact(data, scales, "mxfp8")[0, :6].tolist() == [v * 2.0 ** k for v in expected]


def test_mxfp8_rounding():
    # amax 1.0: shared exponent 0 - 8, biased 119. 0.3 * 256 = 76.8 -> 80 (E4M3 step 8 in [64, 128)).
    data, scales = mx.quantize(_block([1.0, 0.3, -0.5, 2.0 ** -12]), "mxfp8")
    assert _bits(scales) == [[119]]
    assert data.float()[0, :4].tolist() == [256.0, 80.0, -128.0, 0.0625]
    assert mx.dequantize(data, scales, "mxfp8")[0, :4].float().tolist() == [1.0, 0.3125, -0.5, 2.0 ** -12]


def test_mxfp8_saturates_and_scales_per_block():
    # Block 0: amax 500 -> floor(log2) = 8 -> exponent 0, 500 saturates to 448 (not NaN).
    # Block 1: amax 3.0 -> floor(log2) = 1 -> exponent -7, biased 120.
    x = torch.cat([_block([500.0, -511.0, -1.0]), _block([3.0, 0.75])], dim=1)
    data, scales = mx.quantize(x, "mxfp8")
    assert _bits(scales) == [[127, 120]]
    assert data.float()[0, [0, 1, 2, 32, 33]].tolist() == [448.0, -448.0, -1.0, 384.0, 96.0]


@pytest.mark.parametrize("k", [-30, 0, 5, 120])
def test_mxfp4_all_magnitudes_and_signs(k):
    # amax 6 * 2**k: floor(log2 6) = 2, E2M1 emax = 2 -> exponent k. Element i of FP4_VALUES has
    # code i, its negative code 8 + i; two codes a byte, the even element in the low nibble.
    values = list(mx.FP4_VALUES) + [-v for v in mx.FP4_VALUES]
    x = _block([v * 2.0 ** k for v in values])
    data, scales = mx.quantize(x, "mxfp4")
    assert data.dtype == torch.float4_e2m1fn_x2 and data.shape == (1, 16)
    assert _bits(scales) == [[127 + k]]
    packed = data.view(torch.uint8)[0].tolist()
    assert packed[:8] == [0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE] and packed[8:] == [0] * 8
    got = _exact(data, scales, "mxfp4")[0]
    assert got[:16].tolist() == [v * 2.0 ** k for v in values] and torch.all(got[16:] == 0)


def test_mxfp4_rounding_ties_to_even_and_nibble_order():
    # amax 6: exponent 0. Midpoints round to the even code: 0.25->0, 0.75->1.0, 1.25->1.0,
    # 1.75->2.0, 2.5->2.0, 3.5->4.0, 5.0->4.0; -5.5 -> -6 (nearest).
    values = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.5, 6.0, -3.2]
    data, scales = mx.quantize(_block(values), "mxfp4")
    assert _bits(scales) == [[127]]
    assert mx.dequantize(data, scales, "mxfp4")[0, :10].float().tolist() == \
        [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -6.0, 6.0, -3.0]
    codes = [0x0, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6, 0xF, 0x7, 0xD]
    assert data.view(torch.uint8)[0, :5].tolist() == [codes[i] | codes[i + 1] << 4 for i in range(0, 10, 2)]


def test_mxfp4_saturates_and_small_scales():
    # amax 7: exponent floor(log2 7) - 2 = 0 -> 7 saturates to 6.
    data, scales = mx.quantize(_block([7.0, -0.5, -7.9]), "mxfp4")
    assert mx.dequantize(data, scales, "mxfp4")[0, :3].float().tolist() == [6.0, -0.5, -6.0]
    # amax 0.1: floor(log2 0.1) = -4 -> exponent -6 (biased 121); 0.1 / 2**-6 = 6.4 -> 6 -> 0.09375.
    data, scales = mx.quantize(_block([0.1, 0.05]), "mxfp4")
    assert _bits(scales) == [[121]]
    assert mx.dequantize(data, scales, "mxfp4")[0, :2].float().tolist() == [0.09375, 0.046875]


@pytest.mark.parametrize("fmt", mx.FORMATS)
def test_zero_tiny_nan_and_inf_blocks(fmt):
    blocks = [_block([]), _block([2.0 ** -140]), _block([float("inf"), 1.0]), _block([2.0, float("nan")]),
              _block([1.5, -0.5])]
    data, scales = mx.quantize(torch.cat(blocks, dim=1), fmt)
    # zero block and the FP32-subnormal block: the smallest scale 2**-127; Inf and NaN blocks: NaN (255).
    assert _bits(scales)[0][:4] == [0, 0, 255, 255]
    got = _exact(data, scales, fmt)[0]
    assert torch.all(got[:64] == 0)
    assert torch.isnan(got[64:128]).all()
    assert got[128:130].tolist() == [1.5, -0.5]  # a normal block next to them is untouched


def test_clamped_small_scale_keeps_representable_values():
    # amax 2**-126 wants exponent -134: clamped to -127 (byte 0); the elements, 2**-126 * 2**127 = 2,
    # 2**-127 (an FP32 subnormal) -> 1 and 3 * 2**-130 -> 0.375, are still exact in E4M3.
    x = torch.tensor([2.0 ** -126, 2.0 ** -127, 3 * 2.0 ** -130] + [0.0] * 29).reshape(1, 32)
    data, scales = mx.quantize(x, "mxfp8")
    assert _bits(scales) == [[0]]
    assert data.float()[0, :3].tolist() == [2.0, 1.0, 0.375]
    assert _exact(data, scales, "mxfp8")[0, :3].tolist() == [2.0 ** -126, 2.0 ** -127, 3 * 2.0 ** -130]


def test_largest_fp32_block():
    x = _block([3.0e38, -1.0e38])  # floor(log2 3e38) = 127 -> mxfp8 exponent 119, mxfp4 exponent 125
    for fmt, biased in (("mxfp8", 246), ("mxfp4", 252)):
        data, scales = mx.quantize(x, fmt)
        assert _bits(scales) == [[biased]]
        assert torch.isfinite(mx.dequantize(data, scales, fmt, dtype=torch.float32)).all()


def test_extreme_scales_dequantize_exactly():
    # Hand-built operands: scale bytes 0 (2**-127) and 254 (2**127) on the same E4M3 / E2M1 values.
    fp8 = torch.tensor([1.0, 448.0, FP8_TINY, -2.0] + [0.0] * 28).to(torch.float8_e4m3fn).repeat(1, 2)
    fp4 = torch.tensor([0x31, 0xF1] + [0] * 14, dtype=torch.uint8).repeat(1, 2)  # 0.5, 1.5, 0.5, -6
    scales = torch.tensor([[0, 254]], dtype=torch.uint8).view(torch.float8_e8m0fnu)
    lo, hi = 2.0 ** -127, 2.0 ** 127
    got = _exact(fp8, scales, "mxfp8")[0]
    assert got[[0, 1, 2, 3, 32, 33, 34, 35]].tolist() == \
        [lo, 448 * lo, FP8_TINY * lo, -2 * lo, hi, 448 * hi, FP8_TINY * hi, -2 * hi]
    got = _exact(fp4.view(torch.float4_e2m1fn_x2), scales, "mxfp4")[0]
    assert got[[0, 1, 2, 3, 32, 33, 34, 35]].tolist() == \
        [0.5 * lo, 1.5 * lo, 0.5 * lo, -6 * lo, 0.5 * hi, 1.5 * hi, 0.5 * hi, -6 * hi]
    # FP32: 2**-136 is a subnormal (exact); 448 * 2**127 passes FP32's range -> Inf.
    f32 = mx.dequantize(fp8, scales, "mxfp8", dtype=torch.float32)[0]
    assert f32[[0, 2, 32]].tolist() == [lo, FP8_TINY * lo, hi]
    assert f32[33].item() == math.inf and f32[35].item() == -math.inf
    # BF16 computed directly equals FP32 rounded to BF16 (2**-136 is below BF16's subnormals).
    assert torch.equal(mx.dequantize(fp8, scales, "mxfp8", dtype=torch.bfloat16), f32.to(torch.bfloat16)[None])


def test_fp16_output_goes_through_fp32():
    # Scales 2**20 and 2**-30 are outside FP16's range; the products are not.
    data = torch.tensor([FP8_TINY, 2.0 ** -8] + [0.0] * 30 + [448.0, 64.0] + [0.0] * 30).to(torch.float8_e4m3fn)
    scales = torch.tensor([127 + 20, 127 - 30], dtype=torch.uint8).view(torch.float8_e8m0fnu)
    got = mx.dequantize(data, scales, "mxfp8", dtype=torch.float16)
    assert got.dtype == torch.float16
    assert got[[0, 1, 32, 33]].tolist() == [2.0 ** 11, 2.0 ** 12, 448 * 2.0 ** -30, 2.0 ** -24]  # FP16 subnormals


def _element_error_bound(x: torch.Tensor, scale: torch.Tensor, fmt: str) -> torch.Tensor:
    """Round-to-nearest error of one element with its block scale s, plus saturation:
    E4M3 half-ulp |x| 2**-4 (normals) or s 2**-10 (subnormals), saturating past 448 s;
    E2M1 |x| / 4 (y >= 1) or s / 4 (y < 1), saturating past 6 s."""
    mag = x.abs()
    if fmt == "mxfp8":
        bound = torch.maximum(mag * 2.0 ** -4, scale * 2.0 ** -10)
        return torch.maximum(bound, mag - 448 * scale)
    return torch.maximum(torch.maximum(mag, scale) / 4, mag - 6 * scale)


@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_random_round_trip_within_element_precision(fmt, dtype):
    torch.manual_seed(0)
    x = (torch.randn(4, 8, 256) * torch.logspace(-3, 3, 8).unsqueeze(1)).to(dtype)
    data, scales = mx.quantize(x, fmt)
    assert data.shape == (4, 8, 256 // (2 if fmt == "mxfp4" else 1)) and scales.shape == (4, 8, 8)
    got = _exact(data, scales, fmt).reshape(4, 8, 8, 32)
    blocks = x.double().reshape(4, 8, 8, 32)
    # the shared exponent, recomputed in float64: floor(log2(amax)) - emax
    amax = blocks.abs().amax(-1)
    emax = 8 if fmt == "mxfp8" else 2
    scale = torch.exp2(torch.floor(torch.log2(amax)) - emax)
    assert torch.equal(scales.view(torch.uint8).double(), torch.log2(scale) + 127)
    err = (got - blocks).abs()
    assert torch.all(err <= _element_error_bound(blocks, scale.unsqueeze(-1), fmt))
    # and the error really is that of the element format, not far below it
    rel = (err.amax(-1) / amax).max().item()
    assert (2.0 ** -6 < rel <= 2.0 ** -3) if fmt == "mxfp8" else (2.0 ** -3 < rel <= 2.0 ** -2)


def test_input_dtypes_agree():
    torch.manual_seed(1)
    x = torch.randn(3, 64).to(torch.bfloat16)
    assert torch.equal(x.to(torch.float16).to(torch.bfloat16), x)  # the same values in all three dtypes
    for fmt in mx.FORMATS:
        ref_data, ref_scales = mx.quantize(x.float(), fmt)
        for dtype in (torch.bfloat16, torch.float16):
            data, scales = mx.quantize(x.to(dtype), fmt)
            assert torch.equal(data.view(torch.uint8), ref_data.view(torch.uint8))
            assert torch.equal(scales.view(torch.uint8), ref_scales.view(torch.uint8))


@pytest.mark.parametrize("fmt", mx.FORMATS)
def test_swizzled_scales_and_leading_dims(fmt):
    torch.manual_seed(2)
    x = torch.randn(2, 3, 96)
    data, plain = mx.quantize(x, fmt)
    data_sw, blocked = mx.quantize(x, fmt, swizzle="32_4_4")
    assert torch.equal(data.view(torch.uint8), data_sw.view(torch.uint8))
    assert plain.shape == (2, 3, 3) and blocked.shape == (mx.blocked_numel(6, 3),) == (512,)
    assert blocked.dtype == torch.float8_e8m0fnu
    assert torch.equal(blocked.view(torch.uint8), mx.to_blocked(plain.view(torch.uint8).reshape(6, 3)))
    expected = _exact(data, plain, fmt)
    assert expected.shape == (2, 3, 96)
    assert torch.equal(_exact(data_sw, blocked, fmt, swizzle="32_4_4"), expected)
    assert torch.equal(_exact(data, plain, fmt, shape=(6, 96)), expected.reshape(6, 96))
    # uint8 views (what compiled graphs carry) dequantize the same
    assert torch.equal(_exact(data.view(torch.uint8), plain.view(torch.uint8), fmt), expected)
    if hasattr(F, "SwizzleType"):
        _, enum_blocked = mx.quantize(x, fmt, swizzle=F.SwizzleType.SWIZZLE_32_4_4)
        assert torch.equal(enum_blocked.view(torch.uint8), blocked.view(torch.uint8))
        assert torch.equal(_exact(data, plain, fmt, swizzle=F.SwizzleType.NO_SWIZZLE), expected)


def _q(fmt="mxfp8", **kw):
    return mx.quantize(torch.randn(2, 64), fmt, **kw)


@pytest.mark.parametrize("call,error,match", [
    (lambda: mx.quantize(torch.randn(2, 33), "mxfp8"), ValueError, "x must have a last dim"),
    (lambda: mx.quantize(torch.randn(2, 0), "mxfp8"), ValueError, "positive multiple of 32"),
    (lambda: mx.quantize(torch.tensor(1.0), "mxfp8"), ValueError, "x must have a last dim"),
    (lambda: mx.quantize(torch.ones(2, 32, dtype=torch.int32), "mxfp8"), TypeError, "x must be float32"),
    (lambda: mx.quantize(_q()[0], "mxfp8"), TypeError, "x must be float32"),
    (lambda: mx.quantize(torch.randn(2, 32), "mxfp6"), ValueError, "fmt must be one of"),
    (lambda: mx.quantize(torch.randn(2, 32), "mxfp8", swizzle="128x4"), ValueError, "swizzle must be one of"),
    (lambda: mx.quantize(torch.randn(2, 32), "mxfp8", block=16), ValueError, "block must be 32"),
    (lambda: mx.dequantize(*_q("mxfp8"), "mxfp4"), TypeError, r"data must be torch.float4_e2m1fn_x2.*fmt='mxfp8'"),
    (lambda: mx.dequantize(*_q("mxfp4"), "mxfp8"), TypeError, r"data must be torch.float8_e4m3fn.*fmt='mxfp4'"),
    (lambda: mx.dequantize(_q()[0], _q()[1].float(), "mxfp8"), TypeError, "scales must be float8_e8m0fnu"),
    (lambda: mx.dequantize(*_q(), "mxfp8", dtype=torch.int32), TypeError, "dtype must be one of"),
    (lambda: mx.dequantize(_q()[0], torch.zeros(3, 2, dtype=torch.uint8), "mxfp8"), ValueError,
     r"scales has shape \(3, 2\), but data of shape \(2, 64\) \(mxfp8, K = 64\) needs \(2, 2\)"),
    (lambda: mx.dequantize(_q()[0], _q()[1][:, :1], "mxfp8"), ValueError, r"needs \(2, 2\) with swizzle='none'"),
    (lambda: mx.dequantize(*_q(), "mxfp8", swizzle="32_4_4"), ValueError, "scales has 4 elements.*needs 512"),
    (lambda: mx.dequantize(*_q(swizzle="32_4_4"), "mxfp8"), ValueError, "scales has shape"),
    (lambda: mx.dequantize(*_q(), "mxfp8", shape=(64, 2)), ValueError, "last dim must be K = 64"),
    (lambda: mx.dequantize(_q()[0][:, :48], _q()[1], "mxfp8"), ValueError, "not a multiple of 32"),
])
def test_errors_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()


# ---- which implementation quantizes (quant.quantize_rows); its bits: the interpreter checks
# (tilefly.ops.mx_gemm.checks, run by tests/ops/mx_gemm/test_mx_requant.py) and test_mx_cuda.py

def test_cpu_tensors_take_the_ops_and_say_why(monkeypatch):
    from tilefly.mx import formats, quant

    monkeypatch.setattr(quant, "quantize_rows_kernel", lambda *a: pytest.fail("the kernel ran on a CPU tensor"))
    x = torch.randn(4, 64)
    assert "cpu" in quant.kernel_reason(x)
    data, scales = quant.quantize_rows(x, formats.ELEMENTS["mxfp8"])
    want_data, want_scales = quant.quantize_rows_ops(x, formats.ELEMENTS["mxfp8"])
    assert torch.equal(data.view(torch.uint8), want_data.view(torch.uint8)) and torch.equal(scales, want_scales)


def test_a_failing_kernel_leaves_the_ops_to_serve_and_is_remembered(monkeypatch, caplog):
    from tilefly.mx import formats, quant

    def broken(x, spec):
        raise RuntimeError("no kernel image for this device")

    monkeypatch.setattr(quant, "kernel_reason", lambda x: quant._kernel_failed.get(x.get_device()))
    monkeypatch.setattr(quant, "quantize_rows_kernel", broken)
    monkeypatch.setattr(quant, "_kernel_failed", {})
    x = torch.randn(3, 96)
    spec = formats.ELEMENTS["mxfp4"]
    with caplog.at_level("WARNING", logger="tilefly.mx"):
        data, scales = quant.quantize_rows(x, spec)
    want_data, want_scales = quant.quantize_rows_ops(x, spec)
    assert torch.equal(data, want_data) and torch.equal(scales, want_scales)
    assert "no kernel image" in caplog.text
    assert "no kernel image" in quant._kernel_failed[x.get_device()]
    assert quant.quantize_rows(x, spec)[1].equal(want_scales)      # second call: straight to the ops


@pytest.mark.parametrize("fmt, rows, k", [("mxfp8", 3, 96), ("mxfp4", 129, 4096), ("mxfp8", 1, 14336)])
def test_one_kernel_launch_covers_every_block(monkeypatch, fmt, rows, k):
    from tilefly import _triton_launch
    from tilefly.mx import formats, kernels_quant, quant

    seen = {}
    monkeypatch.setattr(_triton_launch, "launch_direct", lambda cache, kernel_of, grid, tensors, ints, constexprs,
                        num_warps, launch_pdl: seen.update(kernel=kernel_of(), grid=grid, tensors=tensors, ints=ints,
                                                           constexprs=constexprs, pdl=launch_pdl))
    spec = formats.ELEMENTS[fmt]
    x = torch.randn(rows, 2 * k)[:, ::2]                 # strided rows: the launcher makes them contiguous
    data, scales = quant.quantize_rows_kernel(x, spec)
    assert seen["kernel"] is kernels_quant.mx_quantize_kernel
    assert seen["tensors"][0].is_contiguous() and torch.equal(seen["tensors"][0], x)
    assert seen["tensors"][1].data_ptr() == data.data_ptr() and data.shape == (rows, k // spec.per_byte)
    assert seen["tensors"][2].data_ptr() == scales.data_ptr() and scales.shape == (rows, k // 32)
    assert seen["ints"] == (rows * k // 32,)
    assert seen["grid"] == (-(-rows * k // 32 // quant.KERNEL_BLOCKS), 1)
    assert seen["constexprs"] == dict(EMAX=spec.emax, FP4=fmt == "mxfp4", BLOCKS=quant.KERNEL_BLOCKS, PDL=False)
    assert seen["pdl"] is False                          # CPU tensors: never PDL (config.mx_pdl is for CUDA)
    assert data.dtype == (torch.float8_e4m3fn if fmt == "mxfp8" else torch.uint8)


def test_no_rows_no_launch(monkeypatch):
    from tilefly import _triton_launch
    from tilefly.mx import formats, quant

    monkeypatch.setattr(_triton_launch, "launch_direct", lambda *a, **kw: pytest.fail("launched for no rows"))
    data, scales = quant.quantize_rows_kernel(torch.randn(0, 64), formats.ELEMENTS["mxfp4"])
    assert data.shape == (0, 32) and scales.shape == (0, 2)

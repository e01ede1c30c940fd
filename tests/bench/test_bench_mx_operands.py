"""The MX quantizer that makes the mxfp_gemm suite's inputs, against hand-computed blocks."""
import pytest
import torch

from tilefly.bench import mx_operands as mx


def _block(values, fill=0.0):
    row = torch.full((1, 32), fill)
    row[0, : len(values)] = torch.tensor(values)
    return row


def _scale_bits(op):
    return op.scale.view(torch.uint8).tolist()


def test_mxfp8_block():
    # amax 1.0: floor(log2 1) = 0, E4M3 emax = 8 -> shared exponent -8, biased 119.
    x = _block([1.0, 0.3, -0.5, 2.0 ** -12])
    q = mx.quantize(x, "mxfp8")
    assert q.data.dtype == torch.float8_e4m3fn and q.scale.dtype == torch.float8_e8m0fnu
    assert _scale_bits(q) == [[119]]
    scaled = q.data.float()[0, :4].tolist()
    # 0.3 * 256 = 76.8 -> 80 (E4M3 step is 8 in [64, 128)); 2**-12 * 256 = 2**-4 exactly.
    assert scaled == [256.0, 80.0, -128.0, 0.0625]
    assert mx.dequantize(q)[0, :4].float().tolist() == [1.0, 0.3125, -0.5, 2.0 ** -12]


def test_mxfp8_saturates_and_scales_per_block():
    # Block 0: amax 500 -> floor(log2) = 8 -> exponent 0, 500 saturates to 448.
    # Block 1: amax 3.0 -> floor(log2) = 1 -> exponent -7, biased 120.
    x = torch.cat([_block([500.0, -1.0]), _block([3.0, 0.75])], dim=1)
    q = mx.quantize(x, "mxfp8")
    assert _scale_bits(q) == [[127, 120]]
    assert q.data.float()[0, [0, 1, 32, 33]].tolist() == [448.0, -1.0, 384.0, 96.0]


def test_mxfp4_rounding_ties_to_even_and_packing():
    # amax 6: floor(log2 6) = 2, E2M1 emax = 2 -> exponent 0, biased 127: values are taken as they are.
    values = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.5, 6.0, -3.2]
    q = mx.quantize(_block(values), "mxfp4")
    assert q.data.dtype == torch.float4_e2m1fn_x2 and q.data.shape == (1, 16)
    assert _scale_bits(q) == [[127]]
    expected = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -6.0, 6.0, -3.0]
    assert mx.dequantize(q)[0, :10].float().tolist() == expected
    # codes: 0.25->0, 0.75->2 (1.0), 1.25->2, 1.75->4 (2.0); low nibble = even element
    packed = q.data.view(torch.uint8)[0, :5].tolist()
    assert packed == [0x00 | 0x2 << 4, 0x2 | 0x4 << 4, 0x4 | 0x6 << 4, 0x6 | 0xF << 4, 0x7 | 0xD << 4]


def test_mxfp4_saturates_and_small_scales():
    # amax 7: exponent floor(log2 7) - 2 = 0 -> 7 saturates to 6.
    q = mx.quantize(_block([7.0, -0.5]), "mxfp4")
    assert mx.dequantize(q)[0, :2].float().tolist() == [6.0, -0.5]
    # amax 0.1: floor(log2 0.1) = -4 -> exponent -6 (biased 121); 0.1 / 2**-6 = 6.4 -> 6 -> 0.09375
    q = mx.quantize(_block([0.1, 0.05]), "mxfp4")
    assert _scale_bits(q) == [[121]]
    assert mx.dequantize(q)[0, :2].float().tolist() == [0.09375, 0.046875]


def test_zero_tiny_and_nonfinite_blocks():
    x = torch.cat([_block([]), _block([2.0 ** -140]), _block([float("inf"), 1.0])], dim=1)
    for fmt in mx.FORMATS:
        q = mx.quantize(x, fmt)
        assert _scale_bits(q) == [[0, 0, 255]]       # zero block and clamped tiny block: 2**-127; Inf: NaN scale
        d = mx.dequantize(q).float()
        assert torch.all(d[0, :32] == 0)
        assert torch.isnan(d[0, 64:]).all()


@pytest.mark.parametrize("fmt,rel", [("mxfp8", 2 ** -3), ("mxfp4", 2 ** -1)])
def test_random_round_trip_error_bound(fmt, rel):
    torch.manual_seed(0)
    x = torch.randn(16, 256) * torch.logspace(-3, 3, 16).unsqueeze(1)
    d = mx.dequantize(mx.quantize(x, fmt)).float()
    blocks = x.reshape(16, -1, 32)
    bound = blocks.abs().amax(-1, keepdim=True) * rel
    assert torch.all((d.reshape(16, -1, 32) - blocks).abs() <= bound)
    assert not torch.equal(d, torch.zeros_like(d))


def test_bad_input():
    with pytest.raises(ValueError):
        mx.quantize(torch.randn(2, 33), "mxfp8")
    with pytest.raises(ValueError):
        mx.quantize(torch.randn(2, 32), "mxfp6")
    assert mx.quantize(torch.randn(3, 64), "mxfp8").nbytes == 3 * 64 + 3 * 2
    assert mx.quantize(torch.randn(3, 64), "mxfp4").nbytes == 3 * 32 + 3 * 2

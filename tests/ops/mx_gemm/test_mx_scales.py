"""The scale helpers of the MX kernels (tilefly/ops/mx_gemm/scales.py) transcribed to Python where
they are bit tricks: the plain decode of a staged scale word (GPU tests run it in the kernels)."""
import struct

import pytest

from tilefly.ops.mx_gemm import scales


def _f32(bits):
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


def _exponent_scale(word, j):
    """scales.exponent_scale: byte j moved into the FP32 exponent field by one shift and one mask
    (int32 arithmetic: the right shift of byte 3 replicates the sign, which the mask drops)."""
    word = word - (1 << 32) if word >= 1 << 31 else word        # as the kernel's int32
    bits = (word >> 1) & 0x7F800000 if j == 3 else (word << (23 - 8 * j)) & 0x7F800000
    return _f32(bits)


@pytest.mark.parametrize("j", range(4))
def test_exponent_scale_is_two_to_the_byte_for_every_normal_exponent(j):
    for e in range(1, 255):
        for other in (0x00, 0x7F, 0xFF, 0xA5):        # the other bytes must not leak in
            word = sum((e if i == j else other) << (8 * i) for i in range(4))
            assert _exponent_scale(word, j) == 2.0 ** (e - 127), (e, j, hex(word))


def test_exponent_scale_is_not_used_for_zero_or_nan_bytes():
    """Byte 0 would decode to +0 (not 2^-127) and 255 to +inf (not NaN): why ``plain`` needs every
    byte within 2^+-MODERATE_EXP and none NaN."""
    assert _exponent_scale(0x00, 0) == 0.0
    assert _exponent_scale(0xFF, 0) == float("inf")
    assert 127 - scales.MODERATE_EXP.value >= 1 and 127 + scales.MODERATE_EXP.value <= 254

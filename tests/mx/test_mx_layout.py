"""to_blocked / from_blocked: cuBLAS's 128 x 4 tile layout of E8M0 scales (SWIZZLE_32_4_4)."""
import pytest
import torch

from tilefly import mx


def _reference_blocked(scales: torch.Tensor) -> torch.Tensor:
    """Element by element from the formula: tiles of 128 x 4 in row-major tile order; inside a
    tile, (r, c) at (r % 32) * 16 + (r // 32) * 4 + c."""
    rows, cols = scales.shape
    col_tiles = -(-cols // 4)
    out = torch.zeros(mx.blocked_numel(rows, cols), dtype=scales.dtype)
    for r in range(rows):
        for c in range(cols):
            tile = (r // 128) * col_tiles + c // 4
            rr, cc = r % 128, c % 4
            out[tile * 512 + (rr % 32) * 16 + (rr // 32) * 4 + cc] = scales[r, c]
    return out


def test_hand_checked_offsets():
    rows, cols = 130, 5
    s = torch.zeros(rows, cols, dtype=torch.uint8)
    s[0, 0], s[0, 3], s[1, 0], s[33, 1], s[64, 0], s[127, 3] = 1, 2, 3, 4, 5, 6
    s[0, 4], s[128, 0], s[129, 4] = 7, 8, 9
    blocked = mx.to_blocked(s)
    assert blocked.shape == (256 * 8,)  # rows padded to 256, cols to 8: 2 x 2 tiles of 512
    expected = {0: 1, 3: 2, 16: 3,
                1 * 16 + 1 * 4 + 1: 4,          # r = 33: r % 32 = 1, r // 32 = 1
                0 * 16 + 2 * 4 + 0: 5,          # r = 64
                31 * 16 + 3 * 4 + 3: 6,         # r = 127, c = 3: the tile's last byte
                512 + 0: 7,                     # (0, 4): second column tile
                2 * 512 + 0: 8,                 # (128, 0): second row tile
                3 * 512 + 1 * 16 + 0: 9}        # (129, 4): row tile 1, column tile 1, r % 32 = 1
    nonzero = {i: v for i, v in enumerate(blocked.tolist()) if v}
    assert nonzero == expected


@pytest.mark.parametrize("rows,cols", [(1, 1), (3, 2), (32, 4), (128, 4), (130, 5), (257, 9)])
def test_matches_formula_and_inverts(rows, cols):
    torch.manual_seed(rows * 100 + cols)
    s = torch.randint(1, 256, (rows, cols), dtype=torch.uint8)  # never 0, so padding is visible
    blocked = mx.to_blocked(s)
    assert blocked.shape == (mx.blocked_numel(rows, cols),)
    assert torch.equal(blocked, _reference_blocked(s))
    assert int((blocked != 0).sum()) == rows * cols  # the padding is zero bytes
    back = mx.from_blocked(blocked, rows, cols)
    assert back.shape == (rows, cols) and back.is_contiguous() and torch.equal(back, s)
    # any shape holding the right elements, e.g. torch's (32 * row tiles, 16 * col tiles)
    assert torch.equal(mx.from_blocked(blocked.reshape(-1, 16), rows, cols), s)


def test_keeps_e8m0_dtype():
    s = torch.randint(0, 255, (5, 3), dtype=torch.uint8).view(torch.float8_e8m0fnu)
    blocked = mx.to_blocked(s)
    assert blocked.dtype == torch.float8_e8m0fnu
    back = mx.from_blocked(blocked, 5, 3)
    assert back.dtype == torch.float8_e8m0fnu and torch.equal(back.view(torch.uint8), s.view(torch.uint8))


def test_errors():
    with pytest.raises(ValueError, match="scales must be 2-D"):
        mx.to_blocked(torch.zeros(8, dtype=torch.uint8))
    with pytest.raises(TypeError, match="one-byte dtype"):
        mx.to_blocked(torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"blocked has 511 elements.*\(3, 2\) scales has 512"):
        mx.from_blocked(torch.zeros(511, dtype=torch.uint8), 3, 2)

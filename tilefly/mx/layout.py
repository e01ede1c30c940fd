"""The SWIZZLE_32_4_4 scale layout (cuBLAS's "block scaling factors layout") and its inverse.

A (rows, cols) scale matrix (cols = K / 32) is padded with zero bytes to rows a multiple of 128
and cols a multiple of 4, then cut into 128 x 4 tiles stored one after another, row tile by row
tile, column tiles in order within a row tile. Inside a tile, scale (r, c) sits at byte

    (r % 32) * 16 + (r // 32) * 4 + c          (r < 128, c < 4 within the tile)

i.e. a tile is a [32][4][4] array indexed [r % 32][r // 32][c]. The result is flattened to 1-D,
as torch's own tests pass it to ``F.scaled_mm``; it has ``blocked_numel(rows, cols)`` elements.
Both functions are a pad/slice plus one permutation of a 5-D view, so they trace under
``torch.compile`` and work for any one-byte dtype (uint8, float8_e8m0fnu).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

TILE_ROWS, TILE_COLS = 128, 4
# (row tile, r // 32, r % 32, col tile, c) <-> (row tile, col tile, r % 32, r // 32, c): the same
# swap of axes 1 and 3 both ways.
_TILE_ORDER = (0, 3, 2, 1, 4)


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def blocked_numel(rows: int, cols: int) -> int:
    """Elements of the blocked layout of a (rows, cols) scale matrix, padding included."""
    return _round_up(rows, TILE_ROWS) * _round_up(cols, TILE_COLS)


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    if t.element_size() != 1:
        raise TypeError(f"scales must have a one-byte dtype (float8_e8m0fnu or uint8), got {t.dtype}")
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


def to_blocked(scales: torch.Tensor) -> torch.Tensor:
    """(rows, cols) scales -> the 1-D SWIZZLE_32_4_4 layout, padding bytes zero; same dtype."""
    if scales.dim() != 2:
        raise ValueError(f"scales must be 2-D (rows, K / 32), got shape {tuple(scales.shape)}")
    rows, cols = scales.shape
    row_tiles, col_tiles = -(-rows // TILE_ROWS), -(-cols // TILE_COLS)
    padded = F.pad(_as_bytes(scales), (0, col_tiles * TILE_COLS - cols, 0, row_tiles * TILE_ROWS - rows))
    tiles = padded.reshape(row_tiles, 4, 32, col_tiles, TILE_COLS).permute(_TILE_ORDER)
    return tiles.reshape(-1).view(scales.dtype)


def from_blocked(blocked: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """The inverse of ``to_blocked``: the (rows, cols) scales out of their blocked layout
    (any shape holding ``blocked_numel(rows, cols)`` contiguous elements); same dtype."""
    expected = blocked_numel(rows, cols)
    if blocked.numel() != expected:
        raise ValueError(f"blocked has {blocked.numel()} elements; the SWIZZLE_32_4_4 layout of "
                         f"({rows}, {cols}) scales has {expected} (rows padded to {TILE_ROWS}, cols to {TILE_COLS})")
    row_tiles, col_tiles = -(-rows // TILE_ROWS), -(-cols // TILE_COLS)
    tiles = _as_bytes(blocked).reshape(row_tiles, col_tiles, 32, 4, TILE_COLS).permute(_TILE_ORDER)
    padded = tiles.reshape(row_tiles * TILE_ROWS, col_tiles * TILE_COLS)
    return padded[:rows, :cols].contiguous().view(blocked.dtype)

"""Which output tile a program computes.

Grouped order: tiles are numbered so that GROUP_M consecutive tile rows are
swept column by column. Programs running at the same time then share GROUP_M
LHS row panels and a few RHS column panels, which stay in L2 instead of every
program streaming its own panels from HBM.

Persistent kernels launch one program per SM; program p takes tiles p,
p + P, p + 2P, ... of the grouped order (P programs in all), so neighbours in
time stay neighbours in the output.

Split-K kernels launch a (tiles, splits) grid: axis 0 numbers the output tiles
row-major (column tiles vary fastest, so programs sharing an LHS row panel run
together), axis 1 the K-splits.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):
    """(pid_m, pid_n) of tile ``tile_id`` in grouped order."""
    tiles_per_group = GROUP_M * num_pid_n
    group = tile_id // tiles_per_group
    first_m = group * GROUP_M
    rows_in_group = gl.minimum(num_pid_m - first_m, GROUP_M)
    within = tile_id % tiles_per_group
    return first_m + within % rows_in_group, within // rows_in_group


@gluon.jit
def persistent_tile_count(num_tiles):
    """How many tiles this program of a persistent grid runs."""
    start = gl.program_id(0)
    stride = gl.num_programs(0)
    return gl.cdiv(num_tiles - start, stride)


@gluon.jit
def persistent_tile_id(i):
    """The grouped-order number of this program's i-th tile."""
    return gl.program_id(0) + i * gl.num_programs(0)


@gluon.jit
def splitk_tile(N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """(tile, off_m, off_n, split, num_splits) of this program of a split-K grid."""
    tile = gl.program_id(0)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    return tile, (tile // num_pid_n) * BLOCK_M, (tile % num_pid_n) * BLOCK_N, gl.program_id(1), gl.num_programs(1)

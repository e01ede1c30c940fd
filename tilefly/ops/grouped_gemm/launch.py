"""Host side of the grouped GEMM kernel: descriptors, grid, cached launch.

``run(cfg, a, b, offs, out)`` writes ``_grouped_mm(a, b, offs)`` into ``out`` (rows
0 .. offs[-1]; rows past the last group are left as they were, as ATen leaves
them) or raises ``Unsupported`` before writing anything.

Nothing here reads ``offs``: the kernel turns it into its tile schedule on the
device, so a launch never synchronises with the GPU and ``offs`` may change
between calls at the same address. The grid is one program per SM, capped by
the most tiles any ``offs`` could give (cdiv(M, BM) + G - 1 row tiles, each
group adding at most one partial tile, times the column tiles).

Launch cost: the first call for a (config, tensors) signature decides everything
and launches through Triton's JIT; later calls with the same addresses, shapes
and strides replay the compiled kernel directly, as the dense GEMM does
(tilefly.ops.gemm.launch; not imported: importing that package registers the
dense family).
"""
from __future__ import annotations

import functools

import torch
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from tilefly import _device, _triton_launch
from tilefly._triton_launch import CachedLaunch
from tilefly.ops.grouped_gemm.configs import GroupedConfig, groups_pad, kernel_of, problem_reason
from tilefly.ops.grouped_gemm.eligibility import TMA_ALIGN, a_row_stride, b_view


class Unsupported(ValueError):
    """The tensors are not something this kernel config serves (nothing was written)."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@functools.lru_cache(maxsize=None)
def _shared_layout(block: tuple[int, int], dtype: torch.dtype):
    from tilefly.gluon.layouts import gl_dtype, shared_tile_layout

    return shared_tile_layout(block, gl_dtype(dtype))


def _descriptor(base: torch.Tensor, rows: int, cols: int, row_stride: int, block: list[int]):
    return TensorDescriptor(base, [rows, cols], [row_stride, 1], block, _shared_layout(tuple(block), base.dtype))


class Launch:
    """One decided launch: grid, arguments in signature order, compile-time flags."""

    def __init__(self, cfg: GroupedConfig, grid: tuple[int, int, int], args: list, constexprs: dict):
        self.cfg, self.grid, self.args, self.constexprs = cfg, grid, args, constexprs

    def first(self):
        """Launch through the JIT (compiling on first use); returns the compiled kernel."""
        return kernel_of(self.cfg)[self.grid](*self.args, **self.constexprs)


def prepare(cfg: GroupedConfig, a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor,
            out: torch.Tensor) -> Launch | None:
    """Validate the tensors and decide the launch; None when there is nothing to compute."""
    if not (a.is_cuda and b.is_cuda and offs.is_cuda and out.is_cuda):
        raise Unsupported("tensors are not on a CUDA device")
    if a.dim() != 2 or b.dim() != 3 or offs.dim() != 1 or out.dim() != 2:
        raise Unsupported("tilefly's grouped GEMM takes A (sum M x K), B (G x K x N), 1-D offs")
    m, k = a.shape
    g, k2, n = b.shape
    if k2 != k or offs.shape[0] != g or tuple(out.shape) != (m, n):
        raise Unsupported(f"shapes {tuple(a.shape)} x {tuple(b.shape)} (offs {tuple(offs.shape)}) -> "
                          f"{tuple(out.shape)}")
    if a.dtype not in (torch.float16, torch.bfloat16) or b.dtype != a.dtype or offs.dtype != torch.int32:
        raise Unsupported(f"dtypes {a.dtype}, {b.dtype}, offs {offs.dtype}")
    if out.dtype != a.dtype and out.dtype != torch.float32:
        raise Unsupported(f"output dtype {out.dtype}")
    if n > 1 and out.stride(1) != 1:
        raise Unsupported(f"output strides {tuple(out.stride())}: columns must be contiguous")
    if m == 0 or n == 0:
        return None
    if k == 0 or not 1 <= g <= 1024:
        raise Unsupported(f"K={k}, G={g}")
    a_stride = a_row_stride((m, k), tuple(a.stride()), a.element_size())
    view = b_view((g, k, n), tuple(b.stride()), b.element_size())
    if a_stride is None or view is None or a.data_ptr() % TMA_ALIGN or b.data_ptr() % TMA_ALIGN:
        raise Unsupported(f"operand strides {tuple(a.stride())}, {tuple(b.stride())} are not TMA-readable")
    reason = problem_reason(cfg, k, view.kmajor, out.element_size())
    if reason is not None:
        raise Unsupported(reason)
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    a_desc = _descriptor(a, m, k, a_stride, [bm, bk])
    b_desc = _descriptor(b, view.rows, view.cols, view.row_stride, [bn, bk] if view.kmajor else [bk, bn])
    most_tiles = (_cdiv(m, bm) + g - 1) * _cdiv(n, bn)
    grid = (min(_device.sm_count(out), most_tiles), 1, 1)
    constexprs = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, B_KMAJOR=view.kmajor, STAGES=cfg.stages,
                      GROUP_M=cfg.group_m, GROUPS_PAD=groups_pad(g, cfg.num_warps),
                      OUT_CONVERT=out.element_size() == 2, num_warps=cfg.num_warps)
    return Launch(cfg, grid, [a_desc, b_desc, out, offs, m, n, k, g, out.stride(0) if m > 1 else n], constexprs)


def run(cfg: GroupedConfig, a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out[rows of group g] = a[rows of group g] @ b[g] with ``cfg``; raises Unsupported
    before writing anything."""
    key = (cfg, a.device, a.dtype, a.data_ptr(), a.shape, a.stride(), b.data_ptr(), b.shape, b.stride(),
           offs.dtype, offs.data_ptr(), offs.shape, out.dtype, out.data_ptr(), out.shape, out.stride())
    _triton_launch.replay_or_keep(_plans, key, _capturing, _MAX_PLANS, _first_launch, cfg, a, b, offs, out)
    return out


def _first_launch(cfg, a, b, offs, out) -> CachedLaunch | None:
    launch = prepare(cfg, a, b, offs, out)
    if launch is None:
        return None
    capturing = _capturing()
    compiled = launch.first()
    if capturing:
        return None
    return CachedLaunch(compiled, kernel_of(launch.cfg).arg_names, launch.args, launch.constexprs, launch.grid,
                        out.device.index)


_MAX_PLANS = 1024
_plans: dict[tuple, CachedLaunch] = {}


def _capturing() -> bool:
    return torch.cuda.is_current_stream_capturing()


def warm(cfg: GroupedConfig, dtype: torch.dtype, out_dtype: torch.dtype, b_kmajor: bool, groups: int, n: int,
         stride_cm: int) -> None:
    """Compile (without running) the binary ``run`` will launch for this problem (N and the
    output row stride keep Triton's % 16 specialization); raises what the compiler raises.
    Needs a CUDA device (the JIT asks the driver)."""
    from triton.runtime.jit import MockTensor

    def mock_desc(rows, cols):
        return TensorDescriptor(MockTensor(dtype, [rows, cols]), [rows, cols], [max(cols, 8), 1], [rows, cols],
                                _shared_layout((rows, cols), dtype))

    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    b_desc = mock_desc(bn, bk) if b_kmajor else mock_desc(bk, bn)
    kernel_of(cfg).warmup(mock_desc(bm, bk), b_desc, out_dtype, torch.int32, 1, n, 1, 1, stride_cm,
                          BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, B_KMAJOR=b_kmajor, STAGES=cfg.stages,
                          GROUP_M=cfg.group_m, GROUPS_PAD=groups_pad(groups, cfg.num_warps),
                          OUT_CONVERT=out_dtype != torch.float32, num_warps=cfg.num_warps, grid=(1,))

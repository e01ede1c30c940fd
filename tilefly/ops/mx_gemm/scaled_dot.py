"""Host side of the ``tl.dot_scaled`` MX GEMM (kernels_scaled_dot.py): an experiment that no call is
routed to yet. ``run`` writes ``scaled_mm(a, b) (+ bias)`` into ``out`` with one launch;
``CONFIGS`` are the builds scripts/mx_scaled_dot_probe.py races. Written without a GPU (session 20):
its GPU tests (tests/ops/mx_gemm/test_mx_scaled_dot.py) have not run yet.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tilefly.ops.mx_gemm.eligibility import MXProblem

SCALE_BLOCK = 32
GROUP_M = 8
_launches: dict = {}


@dataclass(frozen=True)
class DotConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int

    @property
    def name(self) -> str:
        return f"dot{self.block_m}x{self.block_n}x{self.block_k}_s{self.num_stages}_w{self.num_warps}"


# Tiles of Triton's usual Hopper GEMM builds; 64-row tiles for few tokens. With a 128-deep K step,
# 128x64 and 64x128 over 4 warps spill (the two upcasts hold both tiles in registers): they take 64.
CONFIGS = (DotConfig(128, 128, 64, 8, 4), DotConfig(128, 128, 128, 8, 3), DotConfig(128, 64, 64, 4, 4),
           DotConfig(64, 128, 64, 4, 4), DotConfig(64, 64, 128, 4, 5))


def _kernel():
    from tilefly.ops.mx_gemm.kernels_scaled_dot import mx_scaled_dot_kernel

    return mx_scaled_dot_kernel


def _scale_strides(s: torch.Tensor, swizzled: bool) -> tuple[int, int]:
    return (0, 0) if swizzled else (s.stride(0), s.stride(1))


def run(p: MXProblem, a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
        out: torch.Tensor, bias: torch.Tensor | None = None, cfg: DotConfig = CONFIGS[0]) -> torch.Tensor:
    """out = scaled_mm(a, b) (+ bias); a M x K row-major, b K x N column-major, as eligibility.parse
    accepted them; out M x N with any strides."""
    from tilefly import _triton_launch

    fp4 = p.fmt == "mxfp4"
    b_nk = b.t()
    if fp4:   # packed nibbles travel as bytes; dot_scaled reads them as "e2m1"
        a, b_nk = a.view(torch.uint8), b_nk.view(torch.uint8)
    sa, sb = scale_a.view(torch.uint8), scale_b.view(torch.uint8)
    grid = -(-p.m // cfg.block_m) * -(-p.n // cfg.block_n)
    _triton_launch.launch_direct(
        _launches, _kernel, (grid, 1), (a, sa, b_nk, sb, out, out if bias is None else bias),
        (p.m, p.n, p.k, a.stride(0), b_nk.stride(0), *_scale_strides(sa, p.swizzled_a),
         *_scale_strides(sb, p.swizzled_b), out.stride(0), out.stride(1), 0 if bias is None else bias.stride(0)),
        dict(FORMAT="e2m1" if fp4 else "e4m3", A_SWIZZLED=p.swizzled_a, B_SWIZZLED=p.swizzled_b,
             BIAS=bias is not None, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=GROUP_M),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out

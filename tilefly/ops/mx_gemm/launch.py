"""Host side of the MX GEMM: orientation, descriptors, split-K, launch, and a per-signature cache.

``run(problem, a, b, scale_a, scale_b, out, bias)`` writes ``scaled_mm(a, b) (+ bias)`` into
``out`` (M x N). The kernel computes ``C = X @ Y^T`` from two K-major row matrices, so:

- X = A (M x K bytes, row-major) and Y = B^T (N x K bytes: B is column-major), C = out; or,
  when M < N, the swap X = B^T, Y = A, C = out^T (a column-major view), bias along C's rows.
  The big side then fills the wgmma M slot and the small side (tokens) its N slot;
- MXFP4 operands are passed as their uint8 bytes (TMA copies bytes; the kernel unpacks);
- scales are read in place: NO_SWIZZLE through their (row, column) strides, SWIZZLE_32_4_4
  through the blocked offsets, so no call copies or reorders anything.

K-splits: the small-M shapes have few row tiles (4096 / 128 = 32 for a 4096-wide weight), so
K is split over enough programs to fill the SMs, ``configs.resident`` programs each
(tilefly.ops.gemm.configs.choose_splits), or as many as the GPU's split tuning database measured
fastest for a staged build on that exact shape (``split_tuning``); the
partials and per-tile tickets live in the dense GEMM's grow-only per-stream buffers.

v2 configs (``cfg.kernel == 2``, kernels_v2) take 128-K-element boxes and split K in such slots;
their scales are read as one 32-bit word per row and slot when the layout allows it
(``_scale_words``), byte by byte otherwise. Staged builds (``cfg.scale_slots``) load every scale of a
program's K-range before its loop, so K is split into at least ``cfg.min_splits`` parts.

Cache: the first call for a (config, addresses, shapes, strides, dtypes) signature builds the
descriptors and argument list (a dense-GEMM ``Launch``) and launches through Triton's JIT; later
calls replay the compiled kernel from that plan through the dense GEMM's ``run_cached``
(descriptors over bare addresses, the split-K buffers looked up per stream; CUDA graph capture
keeps the JIT). Through the JIT, binding and specializing the descriptor arguments cost 48-97 us
of host time a call on the H200 host, more than the kernel itself on the decode shapes (measured
at cfd3494, BENCHMARKS.md).
"""
from __future__ import annotations

import functools
from dataclasses import replace

import torch
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from tilefly import _device, config
from tilefly.ops.gemm.configs import choose_splits
from tilefly._triton_launch import Address
from tilefly.ops.gemm.launch import Launch, run_cached
from tilefly.ops.mx_gemm import configs, split_tuning
from tilefly.ops.mx_gemm.configs import MXConfig
from tilefly.mx import expanded, weight_operand
from tilefly.ops.mx_gemm.eligibility import MXProblem

SCALE_BLOCK = 32
_MAX_PLANS = 1024


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@functools.lru_cache(maxsize=None)
def _shared_layout(rows: int, width: int, fp4: bool):
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout.get_default_for([rows, width], gl.uint8 if fp4 else gl.float8e4nv)


def _descriptor(rows_view: torch.Tensor, block_rows: int, fp4: bool, item: int):
    rows, width = rows_view.shape
    # A single row's stride is never used; TMA still wants it 16-byte aligned.
    stride = rows_view.stride(0) if rows > 1 else _cdiv(width, 16) * 16
    base = Address(rows_view.data_ptr(), rows_view.dtype)
    return TensorDescriptor(base, [rows, width], [stride, 1], [block_rows, item], _shared_layout(block_rows, item, fp4))


def _scale_strides(scale: torch.Tensor, swizzled: bool) -> tuple[int, int]:
    return (0, 0) if swizzled else (scale.stride(0), scale.stride(1))


def _scale_words(scale: torch.Tensor, swizzled: bool, k_blocks: int) -> bool:
    """Whether the 4 scale bytes of a row's 4 K-blocks (from a multiple of 4) are one aligned
    32-bit word: always in SWIZZLE_32_4_4 (K-blocks padded to 4); in NO_SWIZZLE when K-blocks
    are unit-stride, rows 4-byte aligned and K a multiple of 128 (no word runs past a row)."""
    if scale.data_ptr() % 4:
        return False
    if swizzled:
        return True
    return scale.stride(1) == 1 and (scale.shape[0] <= 1 or scale.stride(0) % 4 == 0) and k_blocks % 4 == 0


_plans: dict[tuple, object] = {}
WORKSPACE_AT = 6        # position of the split-K partials and tickets among the kernels' arguments


def plan_key(p: MXProblem, a, b, scale_a, scale_b, out, bias=None, cfg: MXConfig | None = None,
             offer: tuple | None = None) -> tuple:
    """The ``_plans`` key of one call: the problem, the options that shape its launch and each operand's address
    (``offer``: the activation's expanded copy, ``_expanded_offer``)."""
    tensors = (a, b, scale_a, scale_b, out, bias) + (offer or ())
    # MXLinear's weight word matters only to PDL launches (prefetch_x): not read on the default path
    return (cfg, p, out.device, config.mx_pdl, config.mx_pdl and weight_operand.constant(), offer is None) + tuple(
        None if t is None else (t.dtype, t.data_ptr(), t.shape, t.stride()) for t in tensors)


def _expanded_offer(p: MXProblem, a: torch.Tensor) -> tuple | None:
    """The expanded copy of the activation (tilefly.mx.expanded) when MXLinear offers one for this call's A
    and A goes into the Y slot (MXFP4, M < N); None otherwise."""
    if p.fmt != "mxfp4" or p.m >= p.n or expanded.offered() is None:
        return None
    return expanded.matching(a.view(torch.uint8))


def run(p: MXProblem, a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
        out: torch.Tensor, bias: torch.Tensor | None = None, cfg: MXConfig | None = None) -> torch.Tensor:
    """out = scaled_mm(a, b, scale_a, scale_b) (+ bias), for a problem ``eligibility.parse`` accepted. A
    ``cfg`` with ``expanded_y`` needs the activation's expanded copy on offer (tilefly.mx.expanded)."""
    offer = _expanded_offer(p, a)
    if cfg is not None and cfg.expanded_y and offer is None:
        raise ValueError(f"{cfg.name} reads the activation expanded: offer its copy (tilefly.mx.expanded.offering)")
    key = plan_key(p, a, b, scale_a, scale_b, out, bias, cfg, offer)
    run_cached(_plans, key, lambda: _prepare(p, a, b, scale_a, scale_b, out, bias, cfg, offer))
    return out


def plan_splits(cfg, tiles: int, k: int, fmt: str, sms: int, measured: int | None = None) -> tuple[int, int]:
    """(K-splits, K-steps a split) of ``tiles`` output tiles of ``cfg`` on ``sms`` SMs; ``measured``:
    the split tuning database's count for the shape, which replaces the model's."""
    k_steps = _cdiv(k, cfg.block_k)              # ring slots along K (v1: the K-blocks)
    splits = measured or choose_splits(cfg, tiles, k_steps, sms * configs.resident(cfg, fmt),
                                       configs.SPLIT_COST_STEPS)
    splits = min(splits, k_steps)
    per_split = _cdiv(k_steps, max(splits, cfg.min_splits(k)))
    return _cdiv(k_steps, per_split), per_split


def _prepare(p: MXProblem, a, b, scale_a, scale_b, out, bias, cfg, offer=None) -> Launch:
    fp4 = p.fmt == "mxfp4"
    x, y = a, b.t()                              # [M, K bytes], [N, K bytes], both row-major
    if fp4:
        x, y = x.view(torch.uint8), y.view(torch.uint8)
    sx, sy = scale_a.view(torch.uint8), scale_b.view(torch.uint8)
    swz_x, swz_y = p.swizzled_a, p.swizzled_b
    c, bias_mode = out, (0 if bias is None else 1)
    swapped = p.m < p.n
    if swapped:                                  # the big side goes into the wgmma M slot
        x, y, sx, sy, swz_x, swz_y, c = y, x, sy, sx, swz_y, swz_x, out.t()
        bias_mode = 0 if bias is None else 2
    rows, cols = x.shape[0], y.shape[0]
    cfg = cfg or configs.pick(rows, cols, p.k, p.fmt)
    if offer is not None and configs.can_read_expanded(cfg):
        # the build reads the offered expanded copy of Y (the activation) instead of unpacking it
        cfg = replace(cfg, expanded_y=1)
        y, sy, swz_y = offer[0].view(torch.float8_e4m3fn), offer[1], False
    if config.mx_pdl and cfg.kernel in (2, 4):
        # X is B, an MXLinear weight, only when swapped and MXLinear says so (tilefly.mx.weight_operand)
        cfg = replace(cfg, pdl=True, prefetch_x=cfg.kernel == 2 and swapped and weight_operand.constant())
    x_desc = _descriptor(x, cfg.block_m, fp4, cfg.row_bytes(p.fmt))
    y_desc = _descriptor(y, cfg.block_n, fp4 and not cfg.expanded_y, cfg.y_row_bytes(p.fmt))
    tiles = _cdiv(rows, cfg.block_m) * _cdiv(cols, cfg.block_n)
    k_blocks = p.k // SCALE_BLOCK
    measured = split_tuning.splits_for(out.device.index, p.fmt, cfg, rows, cols, p.k) if cfg.scale_slots else None
    splits, per_split = plan_splits(cfg, tiles, p.k, p.fmt, _device.sm_count(out), measured)

    bias_arg = out if bias is None else bias
    args = [x_desc, y_desc, Address(sx.data_ptr(), torch.uint8), Address(sy.data_ptr(), torch.uint8),
            Address(c.data_ptr(), c.dtype), Address(bias_arg.data_ptr(), bias_arg.dtype), None, None,
            rows, cols, p.k, *_scale_strides(sx, swz_x), *_scale_strides(sy, swz_y),
            c.stride(0), c.stride(1), 0 if bias is None else bias.stride(0), per_split]
    constexprs = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, FP4=fp4, X_SWIZZLED=swz_x, Y_SWIZZLED=swz_y)
    if cfg.kernel in (2, 3, 4):
        constexprs.update(X_WORDS=_scale_words(sx, swz_x, k_blocks), Y_WORDS=_scale_words(sy, swz_y, k_blocks))
    if cfg.kernel == 3:
        constexprs.update(SETS=cfg.bf16_sets)
    constexprs.update(BIAS=bias_mode, C_ROWS_CONTIGUOUS=c.stride(0) == 1 and c.stride(1) != 1,
                      STAGES=cfg.stages)
    constexprs.update(configs.build_constexprs(cfg))
    if cfg.pdl:
        constexprs.update(launch_pdl=True)   # a launch option of Triton's, not a kernel parameter
    workspace = (tiles * splits * cfg.block_m * cfg.block_n, tiles) if splits > 1 else None
    return Launch(cfg, configs.kernel_of(cfg), (tiles, splits, 1), args, constexprs, out.device, workspace,
                  WORKSPACE_AT)

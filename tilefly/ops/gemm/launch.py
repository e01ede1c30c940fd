"""Host side of the dense GEMM kernels: orientation, descriptors, grids, launch.

``run(cfg, a, b, out, bias)`` writes ``a @ b (+ bias)`` into ``out`` with config
``cfg`` or raises ``Unsupported`` (nothing written) when the tensors are not
what the kernels take; callers fall back to ATen then.

Orientation. The kernels compute ``C[M, N] = L[M, K] @ R[K, N]`` from a TMA
descriptor per operand. Each operand is read K-major (rows with K contiguous)
or MN-major (its transpose is row-major); both are the same bytes, so no copy
is ever made. Two kernels also swap the problem, computing ``C^T = B^T A^T``:
- ``tile``/``tilews`` write C with a TMA store, so C must be row-major; a
  column-major C is served by swapping;
- ``splitk`` puts the larger of M and N in the wgmma M slot (64/128 rows per
  tile) and the smaller in the N slot (8..256), so decode GEMMs stream the
  weight matrix with full-width instructions.
A bias vector along N becomes a vector along M under a swap.

Launch cost. Inductor times candidates with events around each call after an
L2 flush of ~15 us, so a host path slower than that shows up as GPU time. The
first call for a (config, tensors) signature decides everything in Python and
launches through Triton's JIT; it leaves a ``_Plan`` (the compiled kernel and
its arguments, tensors as bare addresses) that later calls with the same
addresses, shapes and strides replay directly. Split-K partials and tickets
live in one grow-only pair of buffers per (device, stream); nothing syncs.
Under CUDA graph capture partials come fresh from the graph's pool and tickets
from a zeroed arena outside it (``_captured_tickets``): no fill kernel in the graph.
"""
from __future__ import annotations

import functools

import torch
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from tilefly import _device, _triton_launch
from tilefly._triton_launch import CachedLaunch
from tilefly.ops.gemm.configs import GemmConfig, choose_splits, kernel_of, layout_reason, resident
from tilefly.ops.gemm.eligibility import TMA_ALIGN, MatrixFacts, bias_mode, facts_from_tensor, row_major_ok


class Unsupported(ValueError):
    """The tensors are not something this kernel config serves (nothing was written)."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _row_ok(t: torch.Tensor) -> bool:
    return row_major_ok(t.shape, t.stride(), t.element_size()) and t.data_ptr() % TMA_ALIGN == 0


def _lhs(t: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """The TMA view of a logical [rows, K] operand and whether it is K-major."""
    if _row_ok(t):
        return t, True
    if _row_ok(t.T):
        return t.T, False
    raise Unsupported(f"operand strides {tuple(t.stride())} are not TMA-readable")


def _rhs(t: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """The TMA view of a logical [K, cols] operand and whether it is K-major."""
    if _row_ok(t.T):
        return t.T, True
    if _row_ok(t):
        return t, False
    raise Unsupported(f"operand strides {tuple(t.stride())} are not TMA-readable")


@functools.lru_cache(maxsize=None)
def _shared_layout(block: tuple[int, int], dtype: torch.dtype):
    from tilefly.gluon.layouts import gl_dtype, shared_tile_layout

    return shared_tile_layout(block, gl_dtype(dtype))


def _descriptor(view: torch.Tensor, block: list[int]):
    rows, cols = view.shape
    # A single row's stride is never used; TMA still wants it 16-byte aligned.
    row_stride = view.stride(0) if rows > 1 else _cdiv(cols * view.element_size(), TMA_ALIGN) * TMA_ALIGN
    return TensorDescriptor(view, [rows, cols], [row_stride, 1], block, _shared_layout(tuple(block), view.dtype))


def _operand_descriptors(cfg: GemmConfig, lhs: torch.Tensor, rhs: torch.Tensor):
    a_view, a_kmajor = _lhs(lhs)
    b_view, b_kmajor = _rhs(rhs)
    reason = layout_reason(cfg, a_kmajor, b_kmajor)
    if reason is not None:
        raise Unsupported(reason)
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    a_desc = _descriptor(a_view, [bm, bk] if a_kmajor else [bk, bm])
    b_desc = _descriptor(b_view, [bn, bk] if b_kmajor else [bk, bn])
    return a_desc, b_desc, a_kmajor, b_kmajor


def _bias(bias: torch.Tensor | None, m: int, n: int) -> tuple[int, int]:
    if bias is None:
        return 0, 0
    if bias.dtype != torch.float16 and bias.dtype != torch.bfloat16:
        raise Unsupported(f"bias dtype {bias.dtype}")
    mode = bias_mode(facts_from_tensor(bias), m, n)
    if mode is None:
        raise Unsupported(f"bias of shape {tuple(bias.shape)} is not a broadcast vector")
    return mode


_SWAPPED_BIAS = {0: 0, 1: 2, 2: 1}


def _on_cuda(*tensors: torch.Tensor) -> bool:
    return all(t.is_cuda for t in tensors)


def run(cfg: GemmConfig, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor,
        bias: torch.Tensor | None = None) -> torch.Tensor:
    """out = a @ b (+ bias) with ``cfg``; raises Unsupported before writing anything.

    The first call for a given (config, tensors) signature decides everything and
    launches through Triton's JIT; later calls with the same addresses, shapes and
    strides replay the cached ``_Plan`` (a few microseconds of Python)."""
    key = (cfg, a.device, a.dtype, a.data_ptr(), a.shape, a.stride(), b.dtype, b.data_ptr(), b.shape, b.stride(),
           out.dtype, out.data_ptr(), out.shape, out.stride(),
           None if bias is None else (bias.dtype, bias.data_ptr(), bias.shape, bias.stride()))
    run_cached(_plans, key, lambda: prepare(cfg, a, b, out, bias))
    return out


def run_cached(plans: dict, key: tuple, prepare_launch) -> None:
    """Replay ``plans[key]``, or build the Launch (``prepare_launch()``), launch it through the JIT
    and keep its plan; under CUDA graph capture always the JIT (the split-K buffers of a capture
    belong to its graph). The dense and the MX GEMMs launch through this; the cache itself is the
    one every cached launch shares (tilefly._triton_launch.replay_or_keep)."""
    _triton_launch.replay_or_keep(plans, key, _capturing, _MAX_PLANS, _first_launch, prepare_launch)


def _first_launch(prepare_launch) -> "_Plan | None":
    launch = prepare_launch()
    capturing = _capturing()
    compiled = launch.first(capturing)
    return None if capturing else _Plan(compiled, launch)


def prepare(cfg: GemmConfig, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor,
            bias: torch.Tensor | None = None) -> "Launch":
    """Validate and orient the problem; the Launch it returns has not run yet."""
    if not _on_cuda(a, b, out):
        raise Unsupported("tensors are not on a CUDA device")
    if a.dim() != 2 or b.dim() != 2 or out.dim() != 2:
        raise Unsupported("tilefly's GEMM takes 2-D operands")
    m, k = a.shape
    n = b.shape[1]
    if min(m, n, k) == 0:
        raise Unsupported("empty GEMM")
    if b.shape[0] != k or tuple(out.shape) != (m, n):
        raise Unsupported(f"shapes {tuple(a.shape)} @ {tuple(b.shape)} -> {tuple(out.shape)}")
    if not (a.dtype == b.dtype == out.dtype) or a.dtype not in (torch.float16, torch.bfloat16):
        raise Unsupported(f"dtypes {a.dtype}, {b.dtype} -> {out.dtype}")
    mode, stride_bias = _bias(bias, m, n)
    bias_arg = out if bias is None else bias
    if cfg.persistent:
        return _prepare_tile(cfg, a, b, out, bias_arg, mode, stride_bias)
    return _prepare_splitk(cfg, a, b, out, bias_arg, mode, stride_bias)


def _prepare_tile(cfg, a, b, out, bias_arg, mode, stride_bias) -> "Launch":
    if not _row_ok(out):
        if not _row_ok(out.T):
            raise Unsupported(f"output strides {tuple(out.stride())} are not TMA-writable")
        a, b, out, mode = b.T, a.T, out.T, _SWAPPED_BIAS[mode]
    m, k = a.shape
    n = b.shape[1]
    a_desc, b_desc, a_kmajor, b_kmajor = _operand_descriptors(cfg, a, b)
    c_desc = _descriptor(out, [cfg.block_m, cfg.block_n])
    tiles = _cdiv(m, cfg.block_m) * _cdiv(n, cfg.block_n)
    return _gemm_launch(cfg, (min(_device.sm_count(out), tiles), 1, 1),
                        [a_desc, b_desc, c_desc, bias_arg, m, n, k, stride_bias],
                        dict(A_KMAJOR=a_kmajor, B_KMAJOR=b_kmajor, BIAS=mode, GROUP_M=cfg.group_m), out.device)


def _prepare_splitk(cfg, a, b, out, bias_arg, mode, stride_bias) -> "Launch":
    if a.shape[0] < b.shape[1]:
        a, b, out, mode = b.T, a.T, out.T, _SWAPPED_BIAS[mode]
    m, k = a.shape
    n = b.shape[1]
    a_desc, b_desc, a_kmajor, b_kmajor = _operand_descriptors(cfg, a, b)
    tiles = _cdiv(m, cfg.block_m) * _cdiv(n, cfg.block_n)
    k_iters = _cdiv(k, cfg.block_k)
    splits = choose_splits(cfg, tiles, k_iters, _device.sm_count(out) * resident(cfg))
    per_split = _cdiv(k_iters, splits)
    splits = _cdiv(k_iters, per_split)
    workspace = (tiles * splits * cfg.block_m * cfg.block_n, tiles) if splits > 1 else None
    rows_contiguous = out.stride(0) == 1 and out.stride(1) != 1
    return _gemm_launch(cfg, (tiles, splits, 1),
                        [a_desc, b_desc, out, bias_arg, None, None, m, n, k, out.stride(0), out.stride(1),
                         stride_bias, per_split],
                        dict(A_KMAJOR=a_kmajor, B_KMAJOR=b_kmajor, BIAS=mode, C_ROWS_CONTIGUOUS=rows_contiguous),
                        out.device, workspace=workspace, workspace_at=4)


def _gemm_launch(cfg: GemmConfig, grid, args, flags, device, workspace=None, workspace_at=None) -> "Launch":
    constexprs = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, STAGES=cfg.stages,
                      num_warps=cfg.num_warps, **flags)
    return Launch(cfg, kernel_of(cfg), grid, args, constexprs, device, workspace, workspace_at)


class Launch:
    """One decided kernel launch: the config and kernel, grid, runtime arguments (the split-K
    workspace and tickets slots, at ``workspace_at``, left empty until launch time) and
    compile-time values."""

    def __init__(self, cfg, kernel, grid, args, constexprs, device, workspace=None, workspace_at=None):
        self.cfg, self.kernel, self.grid, self.args, self.constexprs = cfg, kernel, grid, args, constexprs
        self.device = device
        self.workspace, self.workspace_at = workspace, workspace_at

    def with_buffers(self, capturing: bool) -> list:
        if self.workspace_at is None:
            return self.args
        if self.workspace is None:
            buffers = _placeholders(self.device)
        else:
            buffers = splitk_buffers(self.device, *self.workspace, capturing)
        args = list(self.args)
        args[self.workspace_at:self.workspace_at + 2] = buffers
        return args

    def first(self, capturing: bool):
        """Launch through the JIT (compiling on first use); returns the compiled kernel."""
        return self.kernel[self.grid](*self.with_buffers(capturing), **self.constexprs)


class _Plan(CachedLaunch):
    """A cached launch (tilefly._triton_launch.CachedLaunch) whose split-K workspace and
    tickets are looked up per call (per stream: tilefly keeps one pair per stream)."""

    __slots__ = ("device", "workspace", "workspace_at")

    def __init__(self, compiled, launch: Launch):
        super().__init__(compiled, launch.kernel.arg_names, launch.with_buffers(False), launch.constexprs,
                         launch.grid, launch.device.index)
        self.device = launch.device
        self.workspace, self.workspace_at = launch.workspace, launch.workspace_at

    def __call__(self) -> None:
        if self.workspace is None:
            return super().__call__()
        stream = _triton_launch.current_stream(self.index)
        partials, tickets = splitk_buffers(self.device, *self.workspace, False, stream)
        return super().__call__(stream, ((self.workspace_at, partials.data_ptr()),
                                         (self.workspace_at + 1, tickets.data_ptr())))


_MAX_PLANS = 1024
_plans: dict[tuple, _Plan] = {}


def _capturing() -> bool:
    return torch.cuda.is_current_stream_capturing()


# ---- split-K buffers --------------------------------------------------------------------------

_buffers: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
_placeholder: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
_retired: list[tuple[torch.Tensor, torch.Tensor]] = []   # outgrown pairs, never freed (see _kept_pair)

# Tickets of launches captured into CUDA graphs. Zeroing a fresh ticket buffer per captured launch
# puts a fill kernel beside every split-K GEMM of the graph (Llama-3.1-8B MXFP8 decode at 16
# requests, BENCHMARKS.md session 26: 224 fills, 186 us of a 5.8 ms step). Instead each captured
# launch gets its own slice of one arena per device, zeroed once when it is made (outside any
# capture, beside the first per-stream pair) and kept outside every graph pool: the kernel leaves
# its tickets zero, so the slice is zero at every replay. A slice is never handed out twice, so no
# two graphs (which may replay concurrently on different streams) share tickets, and one graph's
# launches are serialized by CUDA. Slices are not reclaimed (a graph's lifetime is not visible
# here): once the arena is spent, captures fall back to tickets zeroed in the graph.
TICKET_ARENA_INTS = 1 << 22      # 16 MB a device; a captured launch takes its tile count rounded up to 32
_TICKET_SLICE_ALIGN = 32         # ints: slices start 128 bytes apart at least
_ticket_arenas: dict[int | None, list] = {}   # device index -> [zeroed int32 arena, next free offset]


def _kept_pair(device: torch.device, partials: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A partials/tickets pair kept across calls, outside any CUDA graph tree's pool
    (tilefly._device.kept). It comes from another thread's stream, so an outgrown pair is
    retired instead of freed: no other stream's allocation may take memory a launch still uses."""
    return _device.kept(lambda: (torch.empty(partials, dtype=torch.float32, device=device),
                                 torch.zeros(tiles, dtype=torch.int32, device=device)), device)


def splitk_buffers(device: torch.device, partials: int, tiles: int, capturing: bool,
                   stream: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """FP32 partials and per-tile tickets. Tickets are zero between launches (the last
    program of a tile resets its own), so one pair per (device, stream), grown as needed,
    serves every launch on that stream in turn. Under CUDA graph capture fresh partials from the
    graph's pool belong to the graph instead, and the tickets are ``_captured_tickets``'s."""
    if capturing:
        return torch.empty(partials, dtype=torch.float32, device=device), _captured_tickets(device, tiles)
    key = (device.index, _triton_launch.current_stream(device.index) if stream is None else stream)
    pair = _buffers.get(key)
    if pair is None or pair[0].numel() < partials or pair[1].numel() < tiles:
        if device.index not in _ticket_arenas:
            _ticket_arenas[device.index] = [_device.kept(
                lambda: torch.zeros(TICKET_ARENA_INTS, dtype=torch.int32, device=device), device), 0]
        old = (0, 0) if pair is None else (pair[0].numel(), pair[1].numel())
        if pair is not None:
            _retired.append(pair)
        pair = _buffers[key] = _kept_pair(device, max(partials, old[0]), max(tiles, old[1], 4096))
    return pair


def _captured_tickets(device: torch.device, tiles: int) -> torch.Tensor:
    """Zero tickets for one launch being captured: a slice of the device's arena never handed
    out before, or, without an arena or room in it, a fresh buffer zeroed in the graph."""
    arena = _ticket_arenas.get(device.index)
    if arena is None or arena[1] + tiles > arena[0].numel():
        return torch.zeros(tiles, dtype=torch.int32, device=device)
    start = arena[1]
    arena[1] = start + -(-tiles // _TICKET_SLICE_ALIGN) * _TICKET_SLICE_ALIGN
    return arena[0][start:start + tiles]


def _placeholders(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Unused workspace/ticket arguments of a launch without split-K."""
    pair = _placeholder.get(device.index)
    if pair is None:
        pair = _placeholder[device.index] = _kept_pair(device, 64, 64)
    return pair


# ---- compile ahead (Inductor choice time) ------------------------------------------------------

def variant(cfg: GemmConfig, a: MatrixFacts, b: MatrixFacts, out_rows: bool, bias: int) -> dict:
    """The compile-time flags ``run`` will pick for operands with these facts, a
    row-major (else column-major) output and bias mode: mirrors _lhs/_rhs and the swaps."""
    (m, _), (_, n) = a.shape, b.shape
    a_kmajor = row_major_ok(a.shape, a.stride, a.itemsize)
    b_kmajor = row_major_ok(b.shape[::-1], b.stride[::-1], b.itemsize)
    swap = (not out_rows) if cfg.persistent else m < n
    if swap:  # L' = B^T is K-major exactly when B is; R' = A^T likewise
        a_kmajor, b_kmajor, bias = b_kmajor, a_kmajor, _SWAPPED_BIAS[bias]
    flags = dict(A_KMAJOR=a_kmajor, B_KMAJOR=b_kmajor, BIAS=bias)
    if not cfg.persistent:
        flags["C_ROWS_CONTIGUOUS"] = swap == out_rows
    return flags


def warm(cfg: GemmConfig, dtype: torch.dtype, flags: dict, m: int, n: int) -> None:
    """Compile (without running) the binary ``run`` will launch for an m x n output
    (row-major, as Inductor allocates it) with these flags; raises what the compiler
    raises. Needs a CUDA device (the JIT asks the driver)."""
    from triton.runtime.jit import MockTensor

    def mock_desc(rows, cols):
        return TensorDescriptor(MockTensor(dtype, [rows, cols]), [rows, cols], [max(cols, 8), 1], [rows, cols],
                                _shared_layout((rows, cols), dtype))

    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    a_desc = mock_desc(bm, bk) if flags["A_KMAJOR"] else mock_desc(bk, bm)
    b_desc = mock_desc(bn, bk) if flags["B_KMAJOR"] else mock_desc(bk, bn)
    common = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, STAGES=cfg.stages, num_warps=cfg.num_warps, grid=(1,), **flags)
    if cfg.persistent:
        kernel_of(cfg).warmup(a_desc, b_desc, mock_desc(bm, bn), dtype, 1, 1, 1, 0, GROUP_M=cfg.group_m, **common)
        return
    # The split-K kernel specializes M, N and the output strides: use the values run() will pass.
    if m < n:
        m, n = n, m
        stride_cm, stride_cn = 1, m      # out.T of a row-major out
    else:
        stride_cm, stride_cn = n, 1
    kernel_of(cfg).warmup(a_desc, b_desc, dtype, dtype, torch.float32, torch.int32, m, n, 1, stride_cm, stride_cn,
                          0, 1, **common)

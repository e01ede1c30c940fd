"""``aten::_fused_rms_norm`` (what ``F.rms_norm`` calls on CUDA) on tilefly's kernels.

Eligibility (``rms_norm_reason``; None = served, else a one-line reason and ATen runs):

| condition                                                  | otherwise                              |
|------------------------------------------------------------|----------------------------------------|
| CUDA tensor on an sm_90 GPU                                | ATen (``_device.hopper_reason``)       |
| input float16, bfloat16 or float32                         | ATen                                   |
| ``normalized_shape`` = the input's trailing dims (>= 1)     | ATen (it raises the error)             |
| weight None, or same dtype, device and shape as normalized | ATen (F.rms_norm already keeps mixed   |
|   dims, contiguous                                         |   dtypes off this op)                  |
| 1 <= N <= 2**24 elements per row (N = prod(normalized))    | ATen                                   |
| rows: the normalized dims one contiguous block, the        | ATen (it copies to contiguous first)   |
|   leading dims one uniform row stride < 2**31 (contiguous, |                                        |
|   row slices ``x[..., :k]`` of a wider buffer, expanded    |                                        |
|   rows); M < 2**31 rows                                    |                                        |
| performance band: input >= MIN_SERVED_BYTES                | ATen: launch cost dominates            |
|   (skipped with ``tilefly.config.force``)                  |                                        |

Outputs are ATen's: ``y`` contiguous in the input's dtype and shape, ``rstd`` FP32 contiguous,
shaped ``input.shape[:-n] + [1] * n``; ``eps=None`` means FP32 epsilon (ATen's choice for every
served dtype, whose accumulation type is FP32); an input with no rows returns empty outputs.
The backward is ATen's: autograd calls ``_fused_rms_norm_backward`` with this ``rstd``.

Eager only: under ``torch.compile`` Inductor decomposes ``_fused_rms_norm`` into its own fused
kernel and never reaches this override (a compiled model with tilefly enabled runs unchanged).

Launch cost: the first call per (device, dtype, N, row layout, alignment, config) goes through
Triton's JIT and keeps the compiled kernel; later calls check the same key and call its
launcher directly with raw pointers (no argument binding, no custom_op).
"""
from __future__ import annotations

import math

import torch

from tilefly import _device, config
from tilefly.ops.rms_norm import configs

SERVED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_N = 1 << 24                  # FP32 holds N exactly, so sum/N is ATen's mean
MAX_INT32 = (1 << 31) - 1        # rows and row stride stay 32-bit kernel arguments
FLOAT32_EPS = torch.finfo(torch.float32).eps

# Performance band, a first guess to be tuned on the H200 (sweep.py prints ATen beside tilefly):
# below this many input bytes both kernels take ~2-3 us and the launch path decides.
MIN_SERVED_BYTES = 1 << 20


def row_stride(x: torch.Tensor, n: int) -> int | None:
    """Elements between consecutive rows of ``x`` viewed as [M, N] (N = its last n dims), or None
    when the last n dims are not one contiguous block or the leading dims not one stride."""
    shape, strides = x.shape, x.stride()
    lead = len(shape) - n
    n_elems = 1
    for size, stride in zip(reversed(shape[lead:]), reversed(strides[lead:])):
        if size != 1 and stride != n_elems:
            return None
        n_elems *= size
    row, rows_inside = None, 1
    for size, stride in zip(reversed(shape[:lead]), reversed(strides[:lead])):
        if size == 1:
            continue
        if row is None:
            row = stride
        elif stride != row * rows_inside:
            return None
        rows_inside *= size
    return n_elems if row is None else row


def rms_norm_reason(input, normalized_shape, weight=None, eps=None) -> str | None:
    reason = _device.hopper_reason(input)
    if reason is not None:
        return reason
    dtype = input.dtype
    if dtype not in SERVED_DTYPES:
        return f"dtype {dtype} is not served (float16, bfloat16, float32)"
    n = len(normalized_shape)
    shape = input.shape
    if n == 0 or n > len(shape) or tuple(shape[len(shape) - n:]) != tuple(normalized_shape):
        return f"normalized_shape {list(normalized_shape)} is not the trailing dims of input {list(shape)}"
    if weight is not None:
        if weight.dtype != dtype:
            return f"weight dtype {weight.dtype} differs from input dtype {dtype}"
        if weight.device != input.device:
            return f"weight is on {weight.device}, input on {input.device}"
        if tuple(weight.shape) != tuple(normalized_shape):
            return f"weight shape {list(weight.shape)} is not normalized_shape {list(normalized_shape)}"
        if not weight.is_contiguous():
            return "weight is not contiguous"
    N = math.prod(normalized_shape)
    if not 1 <= N <= MAX_N:
        return f"row length N={N} outside 1..{MAX_N}"
    if input.is_contiguous():
        stride = N
    else:
        stride = row_stride(input, n)
        if stride is None:
            return "input rows are not one contiguous block at a uniform row stride (ATen copies first)"
    numel = input.numel()
    if numel // N > MAX_INT32 or stride > MAX_INT32:
        return "more than 2**31 rows or a row stride beyond 2**31 elements"
    if not config.force and numel * input.element_size() < MIN_SERVED_BYTES:
        return f"input of {numel * input.element_size()} bytes < {MIN_SERVED_BYTES}: launch-bound, ATen is as fast"
    return None


def rms_norm_forward(input, normalized_shape, weight=None, eps=None, *, kernel_config=None):
    """``aten::_fused_rms_norm`` for inputs ``rms_norm_reason`` accepts: returns (y, rstd).
    ``kernel_config`` (a configs.Config) overrides the heuristic."""
    n = len(normalized_shape)
    shape = input.shape
    N = math.prod(normalized_shape)
    y = torch.empty_like(input, memory_format=torch.contiguous_format)
    rstd = input.new_empty(shape[:len(shape) - n] + (1,) * n, dtype=torch.float32)
    M = input.numel() // N
    if M:
        stride = N if input.is_contiguous() else row_stride(input, n)
        _launch(input, weight, y, rstd, M, N, stride, FLOAT32_EPS if eps is None else eps, kernel_config)
    return y, rstd


def launch(x: torch.Tensor, weight, y: torch.Tensor, rstd: torch.Tensor, eps, config=None) -> None:
    """Normalize the rows of a 2-D ``x`` ([M, N], unit column stride) into contiguous ``y`` and
    ``rstd`` (M floats). ``config`` overrides the heuristic (sweep.py, tests)."""
    M, N = x.shape
    if x.stride(1) != 1 and N > 1:
        raise ValueError("launch: x needs unit column stride")
    if M:
        _launch(x, weight, y, rstd, M, N, x.stride(0) if M > 1 else N,
                FLOAT32_EPS if eps is None else eps, config)


# Compiled kernels by everything Triton specialized them on (pointer alignment, N and the row
# stride's divisibility by 16 and equality to 1) plus layout and config. M is never specialized.
_compiled: dict = {}
_knobs = None


def _launch(x, w, y, rstd, M, N, stride, eps, cfg) -> None:
    x_ptr = x.data_ptr()
    w_ptr = x_ptr if w is None else w.data_ptr()
    y_ptr, rstd_ptr = y.data_ptr(), rstd.data_ptr()
    layout = configs.row_layout(N, stride, x_ptr % 16 == 0, x.element_size(), cfg is None or cfg.split)
    device = x.device
    key = (device, x.dtype, N, layout, stride % 16 == 0, stride == 1, w is None, w_ptr % 16 == 0,
           (y_ptr | rstd_ptr) % 16 == 0, cfg)
    entry = _compiled.get(key)
    if device.type == "cuda" and device.index != torch.cuda.current_device():
        # A Python kernel gets no device guard from the dispatcher; Triton launches on the current one.
        with torch.cuda.device(device):
            _launch(x, w, y, rstd, M, N, stride, eps, cfg)
        return
    if entry is None or getattr(_knobs.runtime.launch_enter_hook, "calls", None):
        _jit_launch(key, layout, x, w, y, rstd, M, N, stride, float(eps), cfg)
        return
    compiled, constexprs, rows_per_program, programs = entry
    grid = min(M, programs) if programs else (M + rows_per_program - 1) // rows_per_program
    compiled.run(grid, 1, 1, torch._C._cuda_getCurrentRawStream(device.index), compiled.function,
                 compiled.packed_metadata, None, None, None,
                 x_ptr, w_ptr, y_ptr, rstd_ptr, M, N, stride, float(eps), *constexprs)


def _jit_launch(key, layout, x, w, y, rstd, M, N, stride, eps, cfg) -> None:
    """First launch of a key (or a launch with Triton hooks set): Triton's JIT binds, compiles and
    launches; the compiled kernel is kept for the fast path."""
    global _knobs
    import triton

    from tilefly.ops.rms_norm import kernels

    _knobs = triton.knobs
    size = x.element_size()
    cfg_ = cfg or configs.heuristic(N, size, layout)
    configs.validate(cfg_, N, size, layout)
    flags = {"V": configs.vec(size), "ALIGNED": layout == configs.ALIGNED,
             "SPLIT": layout == configs.SPLIT, "HAS_W": w is not None}
    if cfg_.kernel == "rows":
        kernel = kernels.rms_norm_rows_kernel
        constexprs = {"BLOCK_N": cfg_.block, "ROWS": cfg_.rows, **flags}
        rows_per_program, programs = cfg_.rows, 0
        grid = triton.cdiv(M, cfg_.rows)
    else:
        kernel = kernels.rms_norm_chunked_kernel
        constexprs = {"CHUNK": cfg_.block, "STAGES": cfg_.stages, **flags}
        rows_per_program = 1
        programs = (_device.sm_count(x) if x.is_cuda else 4) * cfg_.programs_per_sm
        grid = min(M, programs)
    compiled = kernel[(grid,)](x, x if w is None else w, y, rstd, M, N, stride, eps,
                               num_warps=cfg_.num_warps, num_stages=cfg_.stages, **constexprs)
    if x.is_cuda and hasattr(compiled, "packed_metadata"):  # not under TRITON_INTERPRET
        _compiled[key] = (compiled, tuple(constexprs.values()), rows_per_program, programs)

"""Host side of the skinny MX GEMM (kernels_skinny.py): orientation, K-splits, a cached launch.

``run(problem, a, b, scale_a, scale_b, out, bias, cfg)`` writes ``scaled_mm(a, b) (+ bias)`` into
``out`` (M x N) with a skinny config (``configs.SKINNY_KERNELS``). The kernel computes C = X @ Y^T
with the big side as X (the weight: B^T, N x K bytes, when M < N) and the small side (the tokens)
as Y; C is then ``out.t()`` and the bias runs along C's rows. Scales are read in place, NO_SWIZZLE
through their strides, SWIZZLE_32_4_4 through the tile offsets; MXFP8 and MXFP4 operands are
passed as their bytes. SKINNY_DEQUANT configs build the kernel with DEQUANT (scaled BF16, one dot
per 128 K, exact fallback per program), SKINNY ones without.

K-splits: a 4096-row weight makes 64 row tiles of 64, far fewer than the ~264 programs (two per
SM on 132 SMs) that stream the weight at HBM speed, so K is split in steps of 128 elements
(``tilefly.ops.gemm.configs.choose_splits`` over ``configs.resident`` programs an SM). Partials go
to the dense GEMM's grow-only per-stream workspace and tickets (the last program of a tile sums
them in split order and resets its ticket), so a call is one launch.

Launch: a decode step is ~5-60 us of GPU work, and Triton's ``kernel[grid](...)`` binds and
specializes every argument in Python for tens of microseconds, so the GPU would wait on the host.
The first call of a (config, problem, addresses, strides, dtypes) key launches through the JIT and
keeps a ``_Plan``: the compiled kernel's C launcher (``tilefly._triton_launch.direct``; its
``CompiledKernel.run`` under another Triton), the grid and every argument as a plain int; a later
call looks up only the current stream and the split-K buffers of that stream. The JIT path stays
for CUDA graph capture (the graph owns fresh buffers), Triton launch hooks (profilers see every
launch), ``splits=`` overrides and the interpreter.
"""
from __future__ import annotations

import os

import torch

from tilefly.ops.mx_gemm import configs
from tilefly.ops.mx_gemm.configs import MXConfig
from tilefly.ops.mx_gemm.eligibility import MXProblem

SCALE_BLOCK = 32
BLOCKS_PER_STEP = 4        # scale blocks a kernel loop iteration covers (128 K elements)
INTERPRETER_SMS = 4        # the "SM count" that sizes K-splits under TRITON_INTERPRET (CPU checks)
WORKSPACE_AT = 6           # ws_ptr, ticket_ptr: the kernel's 7th and 8th arguments
_MAX_PLANS = 1024


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _scale_strides(scale: torch.Tensor, swizzled: bool) -> tuple[int, int]:
    return (0, 0) if swizzled else (scale.stride(0), scale.stride(1))


def _workspace(device: torch.device, partials: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    if device.type != "cuda":  # interpreter runs: fresh buffers (tickets start at zero)
        return torch.empty(partials, dtype=torch.float32), torch.zeros(tiles, dtype=torch.int32)
    from tilefly.ops.gemm.launch import _capturing, _splitk_buffers

    return _splitk_buffers(device, partials, tiles, _capturing())


def splits_for(cfg: MXConfig, fmt: str, rows: int, cols: int, k: int, num_sms: int) -> tuple[int, int]:
    """(K-splits, scale blocks per split) for a rows x cols x k problem on ``num_sms`` SMs."""
    from tilefly.ops.gemm.configs import choose_splits

    tiles = _cdiv(rows, cfg.block_m) * _cdiv(cols, cfg.block_n)
    steps = _cdiv(k // SCALE_BLOCK, BLOCKS_PER_STEP)
    splits = choose_splits(cfg, tiles, steps, num_sms * configs.resident(cfg, fmt))
    per_split = _cdiv(steps, splits)
    return _cdiv(steps, per_split), per_split * BLOCKS_PER_STEP


class _Plan:
    """A compiled launch with every argument an int (tensors as addresses), the split-K buffers
    looked up per call on the current stream."""

    # stream_of, buffers, run_compiled: tilefly._triton_launch.current_stream, the dense GEMM's
    # _splitk_buffers and _triton_launch.run_compiled, kept so that a call imports nothing
    __slots__ = ("direct", "compiled", "grid", "args", "workspace", "device", "index", "stream_of", "buffers",
                 "run_compiled")

    def __call__(self) -> None:
        stream = self.stream_of(self.index)
        args = self.args
        if self.workspace is not None:
            ws, tickets = self.buffers(self.device, *self.workspace, False, stream)
            args = list(args)
            args[WORKSPACE_AT:WORKSPACE_AT + 2] = ws.data_ptr(), tickets.data_ptr()
        if self.direct is not None:
            self.direct(self.grid[0], self.grid[1], stream, args)
        else:
            self.run_compiled(self.compiled, self.grid, stream, args)


_plans: dict[tuple, _Plan] = {}


_knobs = None             # triton.knobs, once a launch went through the JIT


def _key(cfg: MXConfig, p: MXProblem, a, b, scale_a, scale_b, out, bias) -> tuple:
    """Everything a plan depends on; the operand and scale dtypes follow from ``p.fmt``."""
    return (cfg, p, a.data_ptr(), a.stride(), b.data_ptr(), b.stride(), scale_a.data_ptr(), scale_a.stride(),
            scale_b.data_ptr(), scale_b.stride(), out.data_ptr(), out.stride(), out.dtype,
            None if bias is None else (bias.data_ptr(), bias.stride(), bias.dtype))


def run(p: MXProblem, a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
        out: torch.Tensor, bias: torch.Tensor | None = None, cfg: MXConfig | None = None,
        splits: int | None = None) -> torch.Tensor:
    """out = scaled_mm(a, b, scale_a, scale_b) (+ bias); a M x K row-major, b K x N column-major
    (MXFP4: K / 2 bytes), as ``eligibility.parse`` accepted them. ``splits`` overrides the K-split
    count (checks only)."""
    cfg = cfg or configs.skinny_configs(max(p.m, p.n), min(p.m, p.n), p.k, p.fmt)[0]
    if cfg.kernel not in configs.SKINNY_KERNELS:
        raise ValueError(f"{cfg.name} is not a skinny config")
    key = None
    if splits is None and out.is_cuda:
        key = _key(cfg, p, a, b, scale_a, scale_b, out, bias)
        plan = _plans.get(key)
        if plan is not None and not _jit_only():
            plan()
            return out
    compiled, launch = _jit_run(p, a, b, scale_a, scale_b, out, bias, cfg, splits)
    if key is not None and not _jit_only():
        if len(_plans) >= _MAX_PLANS:
            _plans.clear()
        _plans[key] = _plan(compiled, *launch, out.device)
    return out


def _jit_only() -> bool:
    """Launches the cached plan must leave to the JIT: graph capture and Triton launch hooks (as
    ``_triton_launch.hooks_active``, without its import on every call)."""
    if torch.cuda.is_current_stream_capturing():
        return True
    hook = _knobs.runtime.launch_enter_hook
    return bool(getattr(hook, "calls", hook))


def _plan(compiled, grid, args, workspace, device) -> _Plan:
    from tilefly import _triton_launch
    from tilefly.ops.gemm.launch import _splitk_buffers

    plan = _Plan()
    plan.direct, plan.compiled, plan.grid = _triton_launch.direct(compiled), compiled, grid
    plan.args = tuple(_triton_launch.detached(v) for v in args)
    plan.workspace, plan.device, plan.index = workspace, device, device.index
    plan.stream_of, plan.buffers = _triton_launch.current_stream, _splitk_buffers
    plan.run_compiled = _triton_launch.run_compiled
    return plan


def _jit_run(p: MXProblem, a, b, scale_a, scale_b, out, bias, cfg: MXConfig, splits: int | None):
    """Decide and launch through Triton's JIT; returns the compiled kernel and (grid, every
    argument in signature order, split-K workspace sizes or None)."""
    global _knobs
    from triton import knobs

    from tilefly.ops.mx_gemm.kernels_skinny import mx_skinny_kernel

    _knobs = knobs
    x, y = a.view(torch.uint8), b.t().view(torch.uint8)      # [M, K bytes], [N, K bytes], row-major
    sx, sy = scale_a.view(torch.uint8), scale_b.view(torch.uint8)
    swz_x, swz_y = p.swizzled_a, p.swizzled_b
    c, bias_mode = out, (0 if bias is None else 1)
    if p.m < p.n:                                            # the weight rows go to the dot's M side
        x, y, sx, sy, swz_x, swz_y, c = y, x, sy, sx, swz_y, swz_x, out.t()
        bias_mode = 0 if bias is None else 2
    rows, cols = x.shape[0], y.shape[0]
    k_blocks = p.k // SCALE_BLOCK
    if splits is None:
        num_sms = INTERPRETER_SMS if os.environ.get("TRITON_INTERPRET") == "1" else _sms(out)
        splits, per_split = splits_for(cfg, p.fmt, rows, cols, p.k, num_sms)
    else:
        per_split = _cdiv(_cdiv(k_blocks, BLOCKS_PER_STEP), splits) * BLOCKS_PER_STEP
        splits = _cdiv(k_blocks, per_split)
    tiles = _cdiv(rows, cfg.block_m) * _cdiv(cols, cfg.block_n)
    grid = (tiles, splits)
    workspace = (tiles * splits * cfg.block_m * cfg.block_n, tiles) if splits > 1 else None
    ws, tickets = _workspace(out.device, *(workspace or (1, tiles)))
    args = [x, y, sx, sy, c, c if bias is None else bias, ws, tickets, rows, cols, p.k,
            x.stride(0) if rows > 1 else x.shape[1], y.stride(0) if cols > 1 else y.shape[1],
            *_scale_strides(sx, swz_x), *_scale_strides(sy, swz_y), c.stride(0), c.stride(1),
            0 if bias is None else bias.stride(0), per_split]
    constexprs = dict(BLOCK_R=cfg.block_m, BLOCK_C=cfg.block_n, FP4=p.fmt == "mxfp4", X_SWIZZLED=swz_x,
                      Y_SWIZZLED=swz_y, BIAS=bias_mode, DEQUANT=cfg.kernel == configs.SKINNY_DEQUANT)
    compiled = mx_skinny_kernel[grid](*args, **constexprs, num_warps=cfg.num_warps, num_stages=cfg.stages)
    return compiled, (grid, [*args, *constexprs.values()], workspace)


def _sms(out: torch.Tensor) -> int:
    from tilefly import _device

    return _device.sm_count(out)


# ---- compile specs: every shipped skinny config, compiled for sm_90a in CI ----------------------

_INT_ARGS = ("ROWS", "COLS", "K", "stride_x", "stride_y", "stride_sxr", "stride_sxc", "stride_syr", "stride_syc",
             "stride_cr", "stride_cc", "stride_bias", "blocks_per_split")
# What Triton's launch specializes for the suite's calls: operand pointers, the output and the
# workspace 16-byte aligned, row strides and K multiples of 16 (eligibility's TMA alignment).
_ALIGNED = ("x_ptr", "y_ptr", "sx_ptr", "sy_ptr", "c_ptr", "ws_ptr", "ticket_ptr", "K", "stride_x", "stride_y")


def kernel_signature(cfg: MXConfig, fmt: str, x_swizzled: bool, y_swizzled: bool, bias: int,
                     out: str = "bf16") -> tuple[dict[str, str], dict[str, object], dict]:
    sig = {"x_ptr": "*u8", "y_ptr": "*u8", "sx_ptr": "*u8", "sy_ptr": "*u8", "c_ptr": f"*{out}",
           "bias_ptr": f"*{out}", "ws_ptr": "*fp32", "ticket_ptr": "*i32", **{name: "i32" for name in _INT_ARGS}}
    constexprs = dict(BLOCK_R=cfg.block_m, BLOCK_C=cfg.block_n, FP4=fmt == "mxfp4", X_SWIZZLED=x_swizzled,
                      Y_SWIZZLED=y_swizzled, BIAS=bias, DEQUANT=cfg.kernel == configs.SKINNY_DEQUANT)
    sig.update({name: "constexpr" for name in constexprs})
    names = list(sig)
    attrs = {(names.index(name),): [["tt.divisibility", 16]] for name in _ALIGNED}
    return sig, constexprs, attrs


def shipped() -> list[tuple[str, MXConfig]]:
    """Every skinny (format, config) ``configs.offered`` can return: each token slot (16, 32, 64)."""
    return list(dict.fromkeys((fmt, cfg) for fmt in configs.FORMATS for tokens in (16, 32, 64)
                              for cfg in configs.skinny_configs(4096, tokens, 4096, fmt)))


# SASS each build must contain: the reduction's ticket (ATOMG), the exact path's FP8 wgmma (QGMMA)
# and, with DEQUANT, the BF16 wgmma (HGMMA ... .BF16).
SASS_MARKERS = {configs.SKINNY: ("QGMMA", "ATOMG"), configs.SKINNY_DEQUANT: ("QGMMA", "HGMMA", "ATOMG")}


def compile_specs():
    """Each shipped skinny (format, config) with the benchmark's variant (unswizzled scales, no
    bias, BF16 out), plus swizzled scales with both bias modes and FP16 on the pick of each
    format."""
    from tilefly.compile_check import KernelSpec

    variants = [(fmt, cfg, False, False, 0, "bf16") for fmt, cfg in shipped()]
    for fmt in configs.FORMATS:
        cfg = configs.skinny_configs(4096, 16, 4096, fmt)[0]
        variants += [(fmt, cfg, True, True, 2, "fp16"), (fmt, cfg, False, True, 1, "bf16")]
    specs = []
    for fmt, cfg, xs, ys, bias, out in variants:
        sig, constexprs, attrs = kernel_signature(cfg, fmt, xs, ys, bias, out)
        specs.append(KernelSpec(
            name=f"mx_gemm.{cfg.name}[{fmt},swz={int(xs)}{int(ys)},bias={bias},{out}]", kernel=_kernel,
            signature=sig, constexprs=constexprs, attrs=attrs, num_warps=cfg.num_warps, num_stages=cfg.stages,
            sass_must_contain=SASS_MARKERS[cfg.kernel]))
    return specs


def _kernel():
    from tilefly.ops.mx_gemm.kernels_skinny import mx_skinny_kernel

    return mx_skinny_kernel

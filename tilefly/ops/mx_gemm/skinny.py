"""Host side of the skinny MX GEMM (kernels_skinny.py): orientation, K-splits, launch.

``run(problem, a, b, scale_a, scale_b, out, bias, cfg)`` writes ``scaled_mm(a, b) (+ bias)`` into
``out`` (M x N) with a skinny config (``configs.SKINNY``). The kernel computes C = X @ Y^T with
the big side as X (the weight: B^T, N x K bytes, when M < N) and the small side (the tokens) as
Y; C is then ``out.t()`` and the bias runs along C's rows. Scales are read in place, NO_SWIZZLE
through their strides, SWIZZLE_32_4_4 through the tile offsets; MXFP8 and MXFP4 operands are
passed as their bytes.

K-splits: a 4096-row weight makes 64 row tiles of 64, far fewer than the ~264 programs (two per
SM on 132 SMs) that stream the weight at HBM speed, so K is split in steps of 128 elements
(``tilefly.ops.gemm.configs.choose_splits`` over ``configs.resident`` programs an SM). Partials go
to the dense GEMM's grow-only per-stream workspace and tickets (the last program of a tile sums
them in split order and resets its ticket), so a call is one launch.

No plan cache: the arguments are a handful of integers and pointers (no TMA descriptors to build),
and Triton's own launch dominates the host time.
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


def run(p: MXProblem, a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
        out: torch.Tensor, bias: torch.Tensor | None = None, cfg: MXConfig | None = None,
        splits: int | None = None) -> torch.Tensor:
    """out = scaled_mm(a, b, scale_a, scale_b) (+ bias); a M x K row-major, b K x N column-major
    (MXFP4: K / 2 bytes), as ``eligibility.parse`` accepted them. ``splits`` overrides the K-split
    count (checks only)."""
    from tilefly.ops.mx_gemm.kernels_skinny import mx_skinny_kernel

    x, y = a.view(torch.uint8), b.t().view(torch.uint8)      # [M, K bytes], [N, K bytes], row-major
    sx, sy = scale_a.view(torch.uint8), scale_b.view(torch.uint8)
    swz_x, swz_y = p.swizzled_a, p.swizzled_b
    c, bias_mode = out, (0 if bias is None else 1)
    if p.m < p.n:                                            # the weight rows go to the dot's M side
        x, y, sx, sy, swz_x, swz_y, c = y, x, sy, sx, swz_y, swz_x, out.t()
        bias_mode = 0 if bias is None else 2
    rows, cols = x.shape[0], y.shape[0]
    cfg = cfg or configs.skinny_configs(rows, cols, p.k, p.fmt)[0]
    if cfg.kernel != configs.SKINNY:
        raise ValueError(f"{cfg.name} is not a skinny config")
    k_blocks = p.k // SCALE_BLOCK
    if splits is None:
        num_sms = INTERPRETER_SMS if os.environ.get("TRITON_INTERPRET") == "1" else _sms(out)
        splits, per_split = splits_for(cfg, p.fmt, rows, cols, p.k, num_sms)
    else:
        per_split = _cdiv(_cdiv(k_blocks, BLOCKS_PER_STEP), splits) * BLOCKS_PER_STEP
        splits = _cdiv(k_blocks, per_split)
    grid = (_cdiv(rows, cfg.block_m), splits, _cdiv(cols, cfg.block_n))
    tiles = grid[0] * grid[2]
    ws, tickets = _workspace(out.device, tiles * splits * cfg.block_m * cfg.block_n if splits > 1 else 1, tiles)
    bias_arg = c if bias is None else bias
    mx_skinny_kernel[grid](
        x, y, sx, sy, c, bias_arg, ws, tickets, rows, cols, p.k, x.stride(0) if rows > 1 else x.shape[1],
        y.stride(0) if cols > 1 else y.shape[1], *_scale_strides(sx, swz_x), *_scale_strides(sy, swz_y),
        c.stride(0), c.stride(1), 0 if bias is None else bias.stride(0), per_split,
        BLOCK_R=cfg.block_m, BLOCK_C=cfg.block_n, FP4=p.fmt == "mxfp4", X_SWIZZLED=swz_x, Y_SWIZZLED=swz_y,
        BIAS=bias_mode, num_warps=cfg.num_warps, num_stages=cfg.stages)
    return out


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
                      Y_SWIZZLED=y_swizzled, BIAS=bias)
    sig.update({name: "constexpr" for name in constexprs})
    names = list(sig)
    attrs = {(names.index(name),): [["tt.divisibility", 16]] for name in _ALIGNED}
    return sig, constexprs, attrs


def shipped() -> list[tuple[str, MXConfig]]:
    """Every skinny (format, config) ``configs.offered`` can return: each token slot (16, 32, 64)."""
    return list(dict.fromkeys((fmt, cfg) for fmt in configs.FORMATS for tokens in (16, 32, 64)
                              for cfg in configs.skinny_configs(4096, tokens, 4096, fmt)))


def compile_specs():
    """Each shipped skinny (format, config) with the benchmark's variant (unswizzled scales, no
    bias, BF16 out), plus swizzled scales with both bias modes and FP16 on one config per format.
    The FP8 dot must become a wgmma (QGMMA) and the reduction's ticket an atomic."""
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
            sass_must_contain=("QGMMA", "ATOMG")))
    return specs


def _kernel():
    from tilefly.ops.mx_gemm.kernels_skinny import mx_skinny_kernel

    return mx_skinny_kernel

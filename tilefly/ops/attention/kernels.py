"""tilefly's own flash-attention kernels, as backends.TileflyFA calls them (the canonical
interface of backends.py): CONFIGS, unsupported(), forward(), backward().

Served (first failing row gives the reason; the router then keeps or reroutes to a stock kernel):

    | condition                                         | reason                                    |
    |---------------------------------------------------|-------------------------------------------|
    | direction is backward                             | forward only: stock backward kernels take |
    |                                                   |   this forward's out and lse              |
    | dtype not FP16/BF16, or q, k, v dtypes differ     | dtype                                     |
    | not 4-D, batch/heads/lengths disagree, Hq % Hkv   | layout                                    |
    | empty batch, heads or sequence                    | empty                                     |
    | head dim 512                                      | needs the split-accumulator kernel        |
    | head dim not 32, 64, 96, 128, 192 or 256          | head dim                                  |
    | last dim not contiguous, other strides or base    | TMA                                       |
    |   not 16-byte aligned                             |                                           |
    | B * Hq > 65535                                    | grid                                      |
    | not on an sm_90 GPU                               | _device.hopper_reason                     |

Head dims 96 and 192 run the 128 and 256 kernels: TMA zero-fills the padding columns of Q, K
and V (so they add nothing to Q K^T and give zero output columns) and the store clips them.
Causal is PyTorch's top-left mask (row i sees keys 0..i), also when Sq != Sk.

The output is allocated like ``q`` (``empty_like``: what the flash and cuDNN ops return; the
router copies into the efficient op's B x S x H x D); lse is B x Hq x Sq float32 contiguous.
"""
from __future__ import annotations

import functools
import math

import torch

from tilefly import _device
from tilefly.ops.attention.configs import (CONFIGS, FWD_CONFIGS, HEAD_DIMS, FwdConfig,  # noqa: F401 - CONFIGS
                                           default_config, kernel_head_dim)

DTYPES = (torch.float16, torch.bfloat16)
TMA_ALIGN = 16
MAX_GRID_Y = 65535
LOG2E = 1.4426950408889634
FORWARD = ("fwd", "forward")


def _tma_reason(name: str, t: torch.Tensor) -> str | None:
    if t.stride(-1) != 1:
        return f"{name} needs a contiguous last dimension"
    if t.data_ptr() % TMA_ALIGN:
        return f"{name}'s base address is not {TMA_ALIGN}-byte aligned"
    for size, stride in zip(t.shape[:-1], t.stride()[:-1]):
        if size > 1 and (stride <= 0 or stride * t.element_size() % TMA_ALIGN):
            return f"{name}'s strides {tuple(t.stride())} are not multiples of {TMA_ALIGN} bytes (TMA)"
    return None


def unsupported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, direction: str) -> str | None:
    if direction not in FORWARD:
        return "tilefly attention serves the forward only; stock backward kernels take its out and lse"
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"dtypes {q.dtype}, {k.dtype}, {v.dtype}: tilefly attention takes FP16 or BF16 q, k, v alike"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "q, k and v must be 4-D (B x H x S x D)"
    (b, hq, sq, d), (bk, hk, sk, dk) = q.shape, k.shape
    if tuple(v.shape) != (bk, hk, sk, dk) or bk != b or dk != d:
        return f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} disagree"
    if min(b, hq, sq, hk, sk) == 0:
        return "empty batch, heads or sequence"
    if hq % hk:
        return f"q heads ({hq}) are not a multiple of k/v heads ({hk})"
    if d == 512:
        return "head dim 512 needs the split-accumulator kernel (not built yet)"
    if d not in HEAD_DIMS:
        return f"head dim {d}: tilefly attention serves {', '.join(map(str, HEAD_DIMS))}"
    for name, t in (("q", q), ("k", k), ("v", v)):
        reason = _tma_reason(name, t)
        if reason:
            return reason
    if b * hq > MAX_GRID_Y:
        return f"batch x heads = {b * hq} exceeds the grid's {MAX_GRID_Y}"
    return _device.hopper_reason(q)


def config_for(config: str | None, head_dim: int, sq: int) -> FwdConfig:
    cfg = FWD_CONFIGS[config] if config is not None else default_config(head_dim, sq)
    if not cfg.serves(head_dim):
        raise ValueError(f"attention config {cfg.name} does not serve head dim {head_dim}")
    return cfg


@functools.lru_cache(maxsize=None)
def _shared_layout(rows: int, head_dim: int, dtype: torch.dtype):
    from tilefly.gluon.layouts import gl_dtype, shared_tile_layout

    return shared_tile_layout((1, 1, rows, head_dim), gl_dtype(dtype))


def _descriptor(t: torch.Tensor, rows: int, head_dim: int):
    """A 4-D TMA descriptor over t's [B, H, S, D] with boxes [1, 1, rows, head_dim]."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    shape = list(t.shape)
    strides = list(t.stride())
    # A size-1 dimension's stride is never used, but TMA still wants it aligned.
    for i in (2, 1, 0):
        if shape[i] == 1:
            dense = shape[i + 1] * strides[i + 1]
            strides[i] = -(-dense * t.element_size() // TMA_ALIGN) * TMA_ALIGN // t.element_size()
    return TensorDescriptor(t, shape, strides, [1, 1, rows, head_dim], _shared_layout(rows, head_dim, t.dtype))


@functools.lru_cache(maxsize=None)
def _no_lse(device: torch.device) -> torch.Tensor:
    return torch.empty(1, dtype=torch.float32, device=device)


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None,
            need_lse: bool, config: str | None = None, *, out: torch.Tensor | None = None,
            lse: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(out B x Hq x Sq x D like q, lse B x Hq x Sq float32 or None). The caller checked unsupported().
    ``out`` / ``lse`` given: written in place (out: q's shape and dtype, TMA-legal strides; lse:
    contiguous float32)."""
    from tilefly.ops.attention.kernels_fwd import attention_fwd_kernel

    b, hq, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    cfg = config_for(config, d, sq)
    kd = kernel_head_dim(d)
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or _tma_reason("out", out):
        raise ValueError(f"out {tuple(out.shape)} {out.dtype} strides {out.stride()} cannot take this output")
    if need_lse and lse is None:
        lse = torch.empty(b, hq, sq, dtype=torch.float32, device=q.device)
    elif need_lse and (lse.shape != (b, hq, sq) or lse.dtype != torch.float32 or not lse.is_contiguous()):
        raise ValueError(f"lse must be a contiguous float32 {(b, hq, sq)} tensor")
    elif not need_lse:
        lse = None
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    descs = (_descriptor(q, cfg.block_m, kd), _descriptor(k, cfg.block_n, kd), _descriptor(v, cfg.block_n, kd),
             _descriptor(out, cfg.block_m, kd))
    grid = (-(-sq // cfg.block_m), b * hq)
    with torch.cuda.device(q.device):
        attention_fwd_kernel[grid](*descs, lse if need_lse else _no_lse(q.device), scale * LOG2E, sq, sk, hq,
                                   hq // hk, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HEAD_DIM=kd,
                                   STAGES=cfg.stages(kd), CAUSAL=bool(causal), STORE_LSE=bool(need_lse),
                                   OVERLAP=cfg.overlap, num_warps=cfg.num_warps)
    return out, lse


def backward(grad_out, q, k, v, out, lse, causal, scale, config=None):
    raise NotImplementedError("tilefly attention has no backward kernel yet (unsupported() says so)")

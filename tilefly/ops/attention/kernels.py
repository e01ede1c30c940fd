"""tilefly's own flash-attention kernels, as backends.TileflyFA calls them (the canonical
interface of backends.py): CONFIGS, unsupported(), forward(), backward().

Served (first failing row gives the reason; the router then keeps or reroutes to a stock kernel):

    | condition                                         | reason                                    |
    |---------------------------------------------------|-------------------------------------------|
    | direction not fwd/forward/bwd/backward            | direction                                 |
    | dtype not FP16/BF16, or q, k, v dtypes differ     | dtype                                     |
    | not 4-D, batch/heads/lengths disagree, Hq % Hkv   | layout                                    |
    | empty batch, heads or sequence                    | empty                                     |
    | head dim not 32, 64, 96, 128, 192, 256 or 512     | head dim                                  |
    | last dim not contiguous, other strides or base    | TMA                                       |
    |   not 16-byte aligned                             |                                           |
    | B * Hq > 65535                                    | grid                                      |
    | not on an sm_90 GPU                               | _device.hopper_reason                     |

Head dims 96 and 192 run the 128 and 256 kernels: TMA zero-fills the padding columns of Q, K
and V (so they add nothing to Q K^T and give zero output columns) and the store clips them.
Causal is PyTorch's top-left mask (row i sees keys 0..i), also when Sq != Sk.

The output is allocated like ``q`` (``empty_like``: what the flash and cuDNN ops return; the
router copies into the efficient op's B x S x H x D); lse is B x Hq x Sq float32 contiguous.

Backward (kernels_bwd.py) takes any implementation's out (any strides) and canonical lse, and
grad_out in any layout (copied to a contiguous one when TMA cannot read it, e.g. the stride-0
gradient of a sum); dq, dk and dv are allocated like q, k and v. Head dim 512 runs
kernels_bwd512g.py instead (config ``bwd512g``, the default: all Gluon; faster than bwd512 on 38 of
the ship grid's 40 head-dim-512 workloads and within 1% on the other two, BENCHMARKS.md session 16)
where its predicate (``kernels_bwd512g.unserved``) admits the problem, else kernels_bwd512.py
(config ``bwd512``: cuBLAS batched GEMMs around one Triton elementwise kernel), same contract; the
tuner times both.

Configs: one name space (``CONFIGS``) holds the forward configs ``m..n..`` and the backward
configs ``bwd..x..`` (configs.py), because the tuner pairs one config name with both calls when
it times a backward. A backward config named to ``forward`` runs the default forward config; a
forward config named to ``backward`` is refused (ValueError); ``bwd512`` serves head dim 512
only. ``configs_for(direction)`` lists the names that choose a kernel in one direction.
"""
from __future__ import annotations

import functools
import math

import torch

from tilefly import _device
from tilefly._triton_launch import launch_cached
from tilefly.ops.attention.configs import BWD512_CONFIG_NAMES, FWD512_CONFIG_NAMES
from tilefly.ops.attention.configs import (BWD_CONFIGS, CONFIGS,  # noqa: F401 - CONFIGS
                                           FWD_CONFIGS, HEAD_DIMS, BwdConfig, FwdConfig, default_bwd_config,
                                           default_config, delta_blocks, dkdv_chunk, kernel_head_dim)

DTYPES = (torch.float16, torch.bfloat16)
TMA_ALIGN = 16
MAX_GRID_Y = 65535
LOG2E = 1.4426950408889634
FORWARD = ("fwd", "forward")
BACKWARD = ("bwd", "backward")


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
    if direction not in FORWARD and direction not in BACKWARD:
        return f"direction {direction!r}: tilefly attention serves fwd and bwd"
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
    if d not in HEAD_DIMS and d != 512:
        return f"head dim {d}: tilefly attention serves {', '.join(map(str, HEAD_DIMS))} and 512"
    for name, t in (("q", q), ("k", k), ("v", v)):
        reason = _tma_reason(name, t)
        if reason:
            return reason
    if b * hq > MAX_GRID_Y:
        return f"batch x heads = {b * hq} exceeds the grid's {MAX_GRID_Y}"
    return _device.hopper_reason(q)


def configs_for(direction: str, head_dim: int | None = None) -> tuple[str, ...]:
    """The config names that select a kernel in ``direction`` (what a tuner should time there),
    only those that serve ``head_dim`` when it is given."""
    for names, configs, configs512 in ((FORWARD, FWD_CONFIGS, FWD512_CONFIG_NAMES),
                                       (BACKWARD, BWD_CONFIGS, BWD512_CONFIG_NAMES)):
        if direction in names:
            if head_dim is None:
                return tuple(configs) + configs512
            if head_dim == 512:
                return configs512
            return tuple(name for name, cfg in configs.items() if cfg.serves(head_dim))
    return ()


def config_for(config: str | None, head_dim: int, sq: int) -> FwdConfig:
    if config in FWD512_CONFIG_NAMES or config in BWD512_CONFIG_NAMES:
        raise ValueError(f"attention config {config} serves head dim 512 only")
    if config is not None and config not in FWD_CONFIGS and config not in BWD_CONFIGS:
        raise ValueError(f"unknown attention config {config!r}")
    cfg = FWD_CONFIGS[config] if config in FWD_CONFIGS else default_config(head_dim, sq)
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


def _no_lse(out: torch.Tensor) -> torch.Tensor:
    """The lse argument of a forward that stores none (STORE_LSE off: never dereferenced): an
    FP32 view of ``out``, so that no tensor is kept for it (a kept one made during a CUDA graph
    tree's warm-up would live in the graph's pool; see tilefly._device.kept)."""
    return out.view(torch.float32)


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None,
            need_lse: bool, config: str | None = None, *, out: torch.Tensor | None = None,
            lse: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(out B x Hq x Sq x D like q, lse B x Hq x Sq float32 or None). The caller checked unsupported().
    ``out`` / ``lse`` given: written in place (out: q's shape and dtype, TMA-legal strides; lse:
    contiguous float32)."""
    if q.shape[-1] == 512:
        from tilefly.ops.attention.kernels_fwd512 import forward512

        # As below, a backward config named to the forward runs the default forward config.
        backward_config = config in BWD_CONFIGS or config in BWD512_CONFIG_NAMES
        return forward512(q, k, v, causal, scale, need_lse, None if backward_config else config,
                          out=out, lse=lse)
    from tilefly.ops.attention.kernels_fwd import attention_fwd_kernel

    b, hq, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    cfg = config_for(config, d, sq)
    kd = kernel_head_dim(d)
    out, lse = forward_outputs(q, need_lse, out, lse)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    descs = (_descriptor(q, cfg.box_rows, kd), _descriptor(k, cfg.block_n, kd), _descriptor(v, cfg.block_n, kd),
             _descriptor(out, cfg.box_rows, kd))
    grid = (-(-sq // cfg.block_m), b * hq)
    args = [*descs, lse if need_lse else _no_lse(out), scale * LOG2E, sq, sk, hq, hq // hk]
    consts = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HEAD_DIM=kd, STAGES=cfg.stages(kd), CAUSAL=bool(causal),
                  STORE_LSE=bool(need_lse), num_warps=cfg.num_warps)
    if cfg.pingpong:
        from tilefly.ops.attention.kernels_fwd_ws import attention_fwd_ws_kernel as kernel
    else:
        kernel = attention_fwd_kernel
        consts["OVERLAP"] = cfg.overlap
    with torch.cuda.device(q.device):
        replay(kernel, grid, args, consts, q)
    return out, lse


# Replayed launches (tilefly._triton_launch.launch_cached) of the attention kernels: Triton's JIT
# binds a launch's arguments (TMA descriptors among them) in tens of microseconds of host time,
# which an SDPA override pays on every call. A model's layers each have their own addresses, so
# the cache holds thousands (a few hundred bytes each) before it starts over.
_plans: dict[tuple, object] = {}
_MAX_PLANS = 4096


def replay(kernel, grid, args: list, constexprs: dict, like: torch.Tensor) -> None:
    """``kernel[grid](*args, **constexprs)`` on ``like``'s device, replayed from a cached plan when
    every argument repeats (keyed by the arguments themselves: tilefly._triton_launch.args_key)."""
    launch_cached(_plans, None, kernel, lambda: (grid, args, constexprs), like.device.index if like.is_cuda else 0,
                  _MAX_PLANS)


def forward_outputs(q: torch.Tensor, need_lse: bool, out: torch.Tensor | None,
                    lse: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The forward's (out, lse): the caller's, checked, or fresh ones (out like q, lse B x Hq x Sq
    contiguous float32; None when not needed)."""
    b, hq, sq, _ = q.shape
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or out.device != q.device or _tma_reason("out", out):
        raise ValueError(f"out {tuple(out.shape)} {out.dtype} strides {out.stride()} cannot take this output")
    if not need_lse:
        return out, None
    if lse is None:
        lse = torch.empty(b, hq, sq, dtype=torch.float32, device=q.device)
    elif lse.shape != (b, hq, sq) or lse.dtype != torch.float32 or not lse.is_contiguous():
        raise ValueError(f"lse must be a contiguous float32 {(b, hq, sq)} tensor")
    return out, lse


def bwd_config_for(config: str | None, head_dim: int, sk: int) -> BwdConfig:
    if config in BWD512_CONFIG_NAMES:
        raise ValueError(f"attention config {config} serves head dim 512 only")
    if config is not None and config not in BWD_CONFIGS:
        raise ValueError(f"attention config {config!r} is not a backward config ({', '.join(BWD_CONFIGS)})")
    cfg = BWD_CONFIGS[config] if config is not None else default_bwd_config(head_dim, sk)
    if not cfg.serves(head_dim):
        raise ValueError(f"attention config {cfg.name} does not serve head dim {head_dim}")
    return cfg


def _tma_legal_like(t: torch.Tensor) -> torch.Tensor:
    """An empty tensor like t (its strides when TMA can write them, else contiguous)."""
    out = torch.empty_like(t)
    return out if _tma_reason("grad", out) is None else torch.empty(t.shape, dtype=t.dtype, device=t.device)


def backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
             lse: torch.Tensor, causal: bool, scale: float | None, config: str | None = None, *,
             grads: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) shaped like q, k, v in their dtype. The caller checked unsupported(q, k, v, causal, "bwd");
    ``out`` is the forward's output (any strides), ``lse`` the canonical B x Hq x Sq log-sum-exp.
    ``grads`` given: (dq, dk, dv) written in place (shapes and dtypes of q, k, v, TMA-legal strides)."""
    if q.shape[-1] == 512:
        from tilefly.ops.attention.kernels_bwd512 import backward512

        if config is not None and config not in BWD512_CONFIG_NAMES:
            raise ValueError(f"attention config {config!r} is not a head dim 512 backward config "
                             f"({', '.join(BWD512_CONFIG_NAMES)})")
        if config in (None, "bwd512g"):
            from tilefly.ops.attention import kernels_bwd512g

            # Problems it does not serve (kernels_bwd512g.unserved says why) run bwd512.
            if kernels_bwd512g.unserved(q, k) is None:
                return kernels_bwd512g.backward512g(grad_out, q, k, v, out, lse, causal, scale, grads=grads)
        return backward512(grad_out, q, k, v, out, lse, causal, scale, grads=grads)
    from tilefly.ops.attention.kernels_bwd import (attention_bwd_delta_kernel, attention_bwd_dkdv_kernel,
                                                   attention_bwd_dq_kernel)

    b, hq, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    if grad_out.shape != q.shape or out.shape != q.shape:
        raise ValueError(f"grad_out {tuple(grad_out.shape)} and out {tuple(out.shape)} must be shaped like q "
                         f"{tuple(q.shape)}")
    if lse.shape != (b, hq, sq):
        raise ValueError(f"lse must be {(b, hq, sq)}, got {tuple(lse.shape)}")
    cfg = bwd_config_for(config, d, sk)
    kd = kernel_head_dim(d)
    grad_out = grad_out.to(q.dtype)
    if _tma_reason("grad_out", grad_out):
        grad_out = grad_out.contiguous()
    if _tma_reason("out", out):   # the delta kernel loads rows as 16-byte vectors
        out = out.contiguous()
    lse = lse.to(torch.float32).contiguous()
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    if grads is None:
        grads = (_tma_legal_like(q), _tma_legal_like(k), _tma_legal_like(v))
    for name, g, like in zip(("dq", "dk", "dv"), grads, (q, k, v)):
        if g.shape != like.shape or g.dtype != like.dtype or _tma_reason(name, g):
            raise ValueError(f"{name} {tuple(g.shape)} {g.dtype} strides {g.stride()} cannot take this gradient")
    dq, dk, dv = grads
    delta = torch.empty(b, hq, sq, dtype=torch.float32, device=q.device)
    block_s, block_d = delta_blocks(d)
    stages = cfg.stages(kd)
    chunk = dkdv_chunk(d)
    scalars = (lse, delta, scale * LOG2E, scale, sq, sk, hq, hq // hk)
    with torch.cuda.device(q.device):
        replay(attention_bwd_delta_kernel, (-(-sq // block_s), b * hq),
               [out, grad_out, delta, sq, hq, d, *out.stride()[:3], *grad_out.stride()[:3]],
               dict(BLOCK_S=block_s, BLOCK_D=block_d), q)
        replay(attention_bwd_dkdv_kernel, (-(-sk // cfg.rows) * (kd // chunk), b * hk),
               [_descriptor(q, cfg.step, chunk), _descriptor(k, cfg.rows, chunk), _descriptor(v, cfg.rows, chunk),
                _descriptor(grad_out, cfg.step, chunk), _descriptor(dk, cfg.rows, chunk),
                _descriptor(dv, cfg.rows, chunk), *scalars],
               dict(BLOCK_N=cfg.rows, BLOCK_M=cfg.step, HEAD_DIM=kd, STAGES=stages, CAUSAL=bool(causal),
                    num_warps=cfg.num_warps), q)
        replay(attention_bwd_dq_kernel, (-(-sq // cfg.rows), b * hq),
               [_descriptor(q, cfg.rows, kd), _descriptor(k, cfg.step, kd), _descriptor(v, cfg.step, kd),
                _descriptor(grad_out, cfg.rows, kd), _descriptor(dq, cfg.rows, kd), *scalars],
               dict(BLOCK_M=cfg.rows, BLOCK_N=cfg.step, HEAD_DIM=kd, STAGES=stages, CAUSAL=bool(causal),
                    num_warps=cfg.num_warps), q)
    return dq, dk, dv

"""Implementations that can serve an SDPA backend op.

Every implementation speaks the same canonical interface, so the router can serve
any backend op with any of them and the tuner can time them all alike:

    unsupported(q, k, v, causal, direction) -> None | reason
    forward(q, k, v, causal, scale, need_lse, config) -> (out B x Hq x Sq x D, lse B x Hq x Sq or None)
    backward(grad_out, q, k, v, out, lse, causal, scale, config) -> (dq, dk, dv)

``lse`` is always the canonical float32 log-sum-exp (formats.py). Backward accepts the
output and log-sum-exp of *any* implementation's forward: that is what keeps forward and
backward consistent when they are served by different implementations (the database
decides the two directions separately).

- ``StockBackend``: one of PyTorch's fused kernels (cudnn, flash, efficient), called
  through its captured original kernel, never through the dispatcher (which would
  re-enter tilefly's override of that op).
- ``TileflyFA``: tilefly's own flash-attention kernels. The module
  ``tilefly.ops.attention.kernels`` provides them (CONFIGS, configs_for, unsupported,
  forward, backward with the signatures above; what each serves is in ``unsupported``);
  without that module every call gets the reason "tilefly attention kernels not built yet".
"""
from __future__ import annotations

import functools
import importlib
from typing import Any

import torch

from tilefly import _dispatch
from tilefly.ops.attention import formats

HALF_DTYPES = (torch.float16, torch.bfloat16)
GRAD_MASK = [True, True, True, False]  # dq, dk, dv; no bias gradient (masks are never rerouted)
CUDNN_MAX_DIM = 65535                  # cuDNN SDPA's limit on batch and heads
# Head dims each stock kernel is rerouted to. Conservative on purpose: cuDNN's limit depends on
# the cuDNN build (256 needs > 9.22 and backward has holes), flash stops at 256.
CUDNN_MAX_HEAD_DIM = 128
FLASH_MAX_HEAD_DIM = 256
_SEED_OUTPUTS = {"cudnn": (6, 7), "flash": (6, 7), "efficient": (2, 3)}  # forward outputs holding RNG state
_ENABLED = {
    "cudnn": lambda: torch.backends.cuda.cudnn_sdp_enabled(),
    "flash": lambda: torch.backends.cuda.flash_sdp_enabled(),
    "efficient": lambda: torch.backends.cuda.mem_efficient_sdp_enabled(),
}

_originals: dict[tuple[str, str], Any] = {}


def original_kernel(op: str, dispatch_key: str):
    """The kernel tilefly's route captured for ``op`` (ATen's), or the current one when not routed."""
    routed = _dispatch.original(op, dispatch_key)
    if routed is not None:
        return routed
    kernel = _originals.get((op, dispatch_key))
    if kernel is None:
        kernel = _originals[(op, dispatch_key)] = torch.library.get_kernel(op, dispatch_key)
    return kernel


def forget_originals() -> None:
    """Drop kernels looked up while not routed (tests that register stand-in kernels call this)."""
    _originals.clear()


def _common_reason(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str | None:
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        return "q, k and v need a contiguous last dimension"
    if q.shape[0] == 0 or q.shape[2] == 0 or k.shape[2] == 0:
        return "empty batch or sequence"
    if k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2] or q.shape[1] % k.shape[1]:
        return "k and v heads/lengths disagree, or q heads are not a multiple of k heads"
    return None


class StockBackend:
    """PyTorch's ``name`` kernel ("cudnn", "flash" or "efficient") on ``dispatch_key``."""

    def __init__(self, name: str, dispatch_key: str = "CUDA"):
        self.name = name
        self.dispatch_key = dispatch_key
        self.fwd = formats.OpSpec(name, "fwd")
        self.bwd = formats.OpSpec(name, "bwd")
        self._keyset = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, dispatch_key))

    def __repr__(self) -> str:
        return f"StockBackend({self.name!r}, {self.dispatch_key!r})"

    def unsupported(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                    direction: str) -> str | None:
        if not _ENABLED[self.name]():
            return f"{self.name} is disabled (torch.backends.cuda / sdpa_kernel)"
        if torch.are_deterministic_algorithms_enabled():
            return "deterministic algorithms requested: PyTorch's own selection decides"
        reason = _common_reason(q, k, v)
        if reason:
            return reason
        d, sq, sk = q.shape[-1], q.shape[2], k.shape[2]
        gqa = q.shape[1] != k.shape[1]
        if d % 8:
            return f"{self.name} needs a head dim that is a multiple of 8, got {d}"
        if causal and sq != sk and self.name != "efficient":
            return f"{self.name} is not rerouted to for causal attention with Sq != Sk"
        if self.name == "cudnn":
            if d > CUDNN_MAX_HEAD_DIM:
                return f"cudnn is rerouted to for head dims <= {CUDNN_MAX_HEAD_DIM}, got {d}"
            if sk == 1 or q.shape[0] > CUDNN_MAX_DIM or q.shape[1] > CUDNN_MAX_DIM:
                return "cudnn does not take Sk == 1 or batch/heads > 65535"
        elif self.name == "flash":
            if d > FLASH_MAX_HEAD_DIM:
                return f"flash stops at head dim {FLASH_MAX_HEAD_DIM}, got {d}"
        else:
            if gqa:
                return "efficient is not rerouted to for grouped-query attention"
            if any((t.storage_offset() * t.element_size()) % 16 for t in (q, k, v)):
                return "efficient needs 16-byte aligned q, k, v"
        return None

    def _call(self, spec: formats.OpSpec, args: tuple, kwargs: dict):
        return original_kernel(spec.op, self.dispatch_key).call_boxed(self._keyset, *args, **kwargs)

    def _forward_call(self, q, k, v, causal, scale, need_lse) -> tuple[tuple, dict]:
        return self.fwd.build(dict(query=q, key=k, value=v, attn_bias=None, compute_log_sumexp=need_lse,
                                   dropout_p=0.0, is_causal=causal, return_debug_mask=False, scale=scale))

    def forward(self, q, k, v, causal: bool, scale: float | None, need_lse: bool, config: str | None = None):
        args, kwargs = self._forward_call(q, k, v, causal, scale, need_lse)
        outs = self._call(self.fwd, args, kwargs)
        lse = formats.lse_canonical(outs[1], q.shape[2]) if need_lse or self.name == "flash" else None
        return outs[0], lse

    def backward(self, grad_out, q, k, v, out, lse, causal: bool, scale: float | None, config: str | None = None):
        sq, sk, device = q.shape[2], k.shape[2], q.device
        # Lay out out/lse/RNG state as this kernel's own forward would have returned them.
        fwd = self.fwd.template(*self._forward_call(q, k, v, causal, scale, True))
        seed, offset = (formats.fill(fwd[i], device) for i in _SEED_OUTPUTS[self.name])
        values = dict(grad_out=grad_out, grad_out_=grad_out, query=q, key=k, value=v,
                      out=formats.conform(out, fwd[0]), logsumexp=formats.lse_as(fwd[1], lse, sq, device),
                      philox_seed=seed, philox_offset=offset, attn_bias=None, cum_seq_q=None, cum_seq_k=None,
                      max_q=sq, max_k=sk, dropout_p=0.0, grad_input_mask=list(GRAD_MASK), is_causal=causal,
                      scale=scale)
        args, kwargs = self.bwd.build(values)
        grads = self._call(self.bwd, args, kwargs)
        return grads[0], grads[1], grads[2]


class TileflyFA:
    """tilefly's own kernels, loaded from ``MODULE`` on first use."""

    name = "tilefly_fa"
    MODULE = "tilefly.ops.attention.kernels"
    NOT_BUILT = "tilefly attention kernels not built yet"

    def unavailable(self) -> str | None:
        kernels, reason = self._load()
        return reason

    def configs(self, direction: str | None = None, head_dim: int | None = None) -> tuple[str, ...]:
        """Config names (all, or those serving ``direction`` and ``head_dim``)."""
        kernels, _ = self._load()
        if not kernels:
            return ()
        if direction is None:
            return tuple(getattr(kernels, "CONFIGS", ()))
        return kernels.configs_for(direction, head_dim)

    def unsupported(self, q, k, v, causal: bool, direction: str) -> str | None:
        kernels, reason = self._load()
        return reason or kernels.unsupported(q, k, v, causal, direction)

    def forward(self, q, k, v, causal, scale, need_lse, config=None, out=None):
        """``out``: where to write the output (the kernels check it; a layout they cannot store to
        raises, and the router recomputes with the op's own kernel)."""
        return self._load()[0].forward(q, k, v, causal, scale, need_lse, config, out=out)

    def backward(self, grad_out, q, k, v, out, lse, causal, scale, config=None):
        return self._load()[0].backward(grad_out, q, k, v, out, lse, causal, scale, config)

    @staticmethod
    @functools.lru_cache(maxsize=1)
    def _load():
        try:
            return importlib.import_module(TileflyFA.MODULE), None
        except ModuleNotFoundError as exc:
            if exc.name == TileflyFA.MODULE:
                return None, TileflyFA.NOT_BUILT
            return None, f"tilefly attention kernels unavailable: {exc}"
        except Exception as exc:  # noqa: BLE001 - a broken kernel module must not break SDPA
            return None, f"tilefly attention kernels failed to import: {type(exc).__name__}: {exc}"


TILEFLY_FA = TileflyFA()
STOCK_NAMES = ("cudnn", "flash", "efficient")


@functools.lru_cache(maxsize=None)
def stock(name: str, dispatch_key: str = "CUDA") -> StockBackend:
    return StockBackend(name, dispatch_key)


def implementation(name: str, dispatch_key: str = "CUDA"):
    """The implementation called ``name`` ("cudnn", "flash", "efficient" or "tilefly_fa")."""
    return TILEFLY_FA if name == TileflyFA.name else stock(name, dispatch_key)

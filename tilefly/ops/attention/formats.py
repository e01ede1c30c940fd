"""The six SDPA backend ops as the router sees them: arguments by name, and outputs laid out
exactly as each op's meta kernel promises.

Arguments come from the op's own schema (``torch.ops.aten.<op>.default._schema``), read
at import, so positions and defaults follow whichever torch is installed (2.11 on the
GPU machine, 2.13 in CI) instead of a copy that could drift.

Output layouts come from the op's meta kernel, run on meta tensors with the call's
sizes and strides and cached per distinct call: a rerouted call returns tensors with
the very sizes, strides and dtypes a compiled graph asserts (the efficient op's
output lives as B x S x H x D; cuDNN's log-sum-exp is B x H x S x 1, flash's
B x H x S, the efficient op's B x H x ceil32(S) padded with +inf), and the
non-tensor outputs (sequence lengths) the meta kernel computes.

Between implementations the log-sum-exp travels in one canonical form: float32
B x H x Sq, natural log of sum(exp(scale * q.k)) per query row, which is what all
three stock kernels store (GPU test: ``test_stock_lse_conventions_agree``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

# backend name -> (forward op, backward op); backend names follow torch.nn.attention.SDPBackend.
OPS: dict[str, tuple[str, str]] = {
    "cudnn": ("aten::_scaled_dot_product_cudnn_attention", "aten::_scaled_dot_product_cudnn_attention_backward"),
    "flash": ("aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_flash_attention_backward"),
    "efficient": ("aten::_scaled_dot_product_efficient_attention",
                  "aten::_scaled_dot_product_efficient_attention_backward"),
}

_TEMPLATE_CACHE_SIZE = 256


@dataclass(frozen=True)
class TensorSlot:
    """A tensor output as the meta kernel describes it."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype

    def empty(self, device: torch.device) -> torch.Tensor:
        return torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device=device)


class OpSpec:
    """One backend op: ``backend`` ("cudnn", ...) and ``direction`` ("fwd" or "bwd")."""

    def __init__(self, backend: str, direction: str):
        self.backend = backend
        self.direction = direction
        self.op = OPS[backend][0 if direction == "fwd" else 1]
        self.overload = getattr(torch.ops.aten, self.op.split("::")[1]).default
        schema = self.overload._schema
        self.names = tuple(a.name for a in schema.arguments)
        self.kwarg_only = frozenset(a.name for a in schema.arguments if a.kwarg_only)
        self.positions = {a.name: i for i, a in enumerate(schema.arguments) if not a.kwarg_only}
        self.defaults = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
        self.n_returns = len(schema.returns)
        self._templates: dict[Any, tuple] = {}

    def __repr__(self) -> str:
        return f"OpSpec({self.op})"

    def arg(self, args: tuple, kwargs: dict, name: str, absent: Any = None) -> Any:
        """The value of argument ``name`` in a call (its default when the caller left it out);
        ``absent`` when this torch's schema has no such argument."""
        i = self.positions.get(name)
        if i is not None and i < len(args):
            return args[i]
        if name in kwargs:
            return kwargs[name]
        return self.defaults.get(name, absent)

    def build(self, values: dict[str, Any]) -> tuple[tuple, dict]:
        """Positional args and kwargs for a call, from values by argument name (extra names ignored)."""
        args, kwargs = [], {}
        for name in self.names:
            if name in values:
                value = values[name]
            elif name in self.kwarg_only and name in self.defaults:
                continue
            elif name in self.defaults:
                value = self.defaults[name]
            else:
                raise TypeError(f"{self.op}: no value for required argument {name!r}")
            if name in self.kwarg_only:
                kwargs[name] = value
            else:
                args.append(value)
        return tuple(args), kwargs

    def template(self, args: tuple, kwargs: dict) -> tuple:
        """Per output: a TensorSlot, an int, or None, as the meta kernel returns for this call."""
        key = (tuple(_key(a) for a in args), tuple(sorted((k, _key(v)) for k, v in kwargs.items())))
        hit = self._templates.get(key)
        if hit is None:
            outs = self.overload(*[_meta(a) for a in args], **{k: _meta(v) for k, v in kwargs.items()})
            hit = tuple(_slot(o) for o in outs)
            if len(self._templates) >= _TEMPLATE_CACHE_SIZE:
                self._templates.clear()
            self._templates[key] = hit
        return hit


def _key(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        return (tuple(a.shape), a.stride(), a.dtype)
    if isinstance(a, list):
        return tuple(a)
    return a


def _meta(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta")
    return a


def _slot(o: Any) -> Any:
    if isinstance(o, torch.Tensor):
        return TensorSlot(tuple(o.shape), tuple(o.stride()), o.dtype)
    return o


def conform(t: torch.Tensor, slot: TensorSlot) -> torch.Tensor:
    """``t`` itself when it already has the slot's sizes, strides and dtype, else a copy that does."""
    if tuple(t.shape) == slot.shape and t.stride() == slot.stride and t.dtype == slot.dtype:
        return t
    out = slot.empty(t.device)
    out.copy_(t)
    return out


def fill(slot: Any, device: torch.device) -> Any:
    """An output tilefly does not compute (sequence lengths, unused RNG state, debug mask)."""
    return slot.empty(device) if isinstance(slot, TensorSlot) else slot


def lse_canonical(lse: torch.Tensor, sq: int) -> torch.Tensor:
    """B x H x Sq view of an op's log-sum-exp (drops cuDNN's trailing 1 and the efficient op's padding)."""
    if lse.dim() == 4:
        lse = lse.select(-1, 0)
    if lse.shape[-1] != sq:
        lse = lse.narrow(-1, 0, sq)
    return lse


def lse_as(slot: TensorSlot, lse: torch.Tensor | None, sq: int, device: torch.device) -> torch.Tensor:
    """The canonical log-sum-exp in the layout ``slot`` asks for."""
    if lse is None or slot.shape[-1] == 0:
        return slot.empty(device)  # not computed (inference), or the op was asked for none
    if len(slot.shape) == 4:
        return conform(lse.unsqueeze(-1), slot)
    if slot.shape[-1] > sq:
        # Rows past Sq are padding the efficient kernels never use; +inf makes any stray read give p = 0.
        out = slot.empty(device)
        out.narrow(-1, 0, sq).copy_(lse)
        out.narrow(-1, sq, slot.shape[-1] - sq).fill_(float("inf"))
        return out
    return conform(lse, slot)

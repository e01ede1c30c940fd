"""tilefly's side of the mxfp_gemm benchmark: one timed callable per offered config.

``tilefly_providers(a, b, scale_a, scale_b, fmt)``: a is M x K (MXFP4: K / 2 bytes) row-major,
b is K x N column-major (``b_nk.t()``), scales (M, K/32) and (N, K/32) unswizzled E8M0, as the
suite passes them. Each ``fn()`` writes BF16 M x N into an output allocated once (timing sees
the kernel, not the allocator); configs that fail are logged and left out. With
``tilefly.config.mx_requantize`` on, the requantizing path (requant.py) races too where it serves;
so does the BF16 route (upcast.py) wherever ``tilefly.config.mx_upcast`` sends the shape.
"""
from __future__ import annotations

import logging
from typing import Callable

import torch

from tilefly.ops.mx_gemm import configs, eligibility

_log = logging.getLogger("tilefly.mx_gemm")


def tilefly_providers(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                      fmt: str, swizzled: bool = False) -> dict[str, Callable[[], torch.Tensor]]:
    from tilefly.ops.mx_gemm import launch, requant, upcast

    p = eligibility.parse(a, b, scale_a, scale_b, swizzled, swizzled)
    if p.fmt != fmt:
        raise ValueError(f"operands are {p.fmt}, the case says {fmt}")
    out = torch.empty(p.m, p.n, dtype=torch.bfloat16, device=a.device)
    rows, cols = max(p.m, p.n), min(p.m, p.n)
    providers: dict[str, Callable[[], torch.Tensor]] = {}
    for cfg in configs.offered(rows, cols, p.k, fmt):
        try:
            launch.run(p, a, b, scale_a, scale_b, out, cfg=cfg)  # compiles outside the timed calls
        except Exception as exc:  # noqa: BLE001 - a broken config is reported and skipped
            _log.warning("tilefly mx_gemm config %s failed on %s %sx%sx%s: %s: %s", cfg.name, fmt, p.m, p.n, p.k,
                         type(exc).__name__, exc)
            continue
        providers[cfg.name] = lambda cfg=cfg: launch.run(p, a, b, scale_a, scale_b, out, cfg=cfg)
    if requant.serves(p, out.dtype):  # TILEFLY_MX_REQUANTIZE=1: the path F.scaled_mm then takes here
        providers["requant"] = lambda: requant.run(p, a, b, scale_a, scale_b, out)
    if upcast.serves(p, out.dtype):  # where F.scaled_mm takes the BF16 route (TILEFLY_MX_UPCAST)
        upcast.run(p, a, b, scale_a, scale_b, out)
        providers["upcast"] = lambda: upcast.run(p, a, b, scale_a, scale_b, out)
    return providers

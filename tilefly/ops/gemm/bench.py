"""tilefly's side of the dense_gemm benchmark: one timed callable per config.

``tilefly_providers(a, b)`` (a is M x K, b is K x N, any of the four layouts)
returns ``{config name: fn}`` for the default configs Inductor would race on
this shape (``configs.offered``), each ``fn()`` computing ``a @ b`` into an
output allocated once, so timing sees the kernel, not the allocator. The
harness takes the best of them, as Inductor's autotuning would. Configs that
cannot serve these tensors (strides, alignment) are left out.
"""
from __future__ import annotations

import logging
from typing import Callable

import torch

from tilefly.ops.gemm import configs
from tilefly.ops.gemm.eligibility import facts_from_tensor, gemm_reason

_log = logging.getLogger("tilefly.gemm")


def tilefly_providers(a: torch.Tensor, b: torch.Tensor, search: str = "default",
                      bias: torch.Tensor | None = None) -> dict[str, Callable[[], torch.Tensor]]:
    from tilefly import _device
    from tilefly.ops.gemm import launch

    capability = _device.capability(a.device.index or 0) if a.device.type == "cuda" else None
    reason = gemm_reason(facts_from_tensor(a), facts_from_tensor(b), device_type=a.device.type,
                         capability=capability, bias=None if bias is None else facts_from_tensor(bias))
    if reason is not None:
        return {}
    m, k = a.shape
    n = b.shape[1]
    out = torch.empty(m, n, dtype=a.dtype, device=a.device)
    providers: dict[str, Callable[[], torch.Tensor]] = {}
    for cfg in configs.offered(m, n, k, search):
        try:
            launch.run(cfg, a, b, out, bias)  # also compiles, outside the timed calls
        except launch.Unsupported:
            continue
        except Exception as exc:  # noqa: BLE001 - a broken config is reported and skipped
            _log.warning("tilefly gemm config %s failed on %sx%sx%s: %s: %s", cfg.name, m, n, k,
                         type(exc).__name__, exc)
            continue
        providers[cfg.name] = lambda cfg=cfg: launch.run(cfg, a, b, out, bias)
    return providers

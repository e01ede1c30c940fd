"""tilefly's side of the grouped_gemm benchmark: one timed callable per config.

``tilefly_providers(a, b, offs)`` (A sum M x K, B G x K x N in either per-group
layout, int32 offs on the GPU) returns ``{config name: fn}`` for the configs
Inductor would race on this problem (``configs.offered``), each ``fn()`` computing
``_grouped_mm(a, b, offs)`` into an output allocated once with Inductor's layout
(row stride padded to 16 bytes). Configs that cannot serve the tensors are left out.
"""
from __future__ import annotations

import logging
from typing import Callable

import torch

from tilefly.ops.grouped_gemm import configs
from tilefly.ops.grouped_gemm.eligibility import b_view, facts_from_tensor, grouped_reason

_log = logging.getLogger("tilefly.grouped_gemm")


def output_like_inductor(a: torch.Tensor, n: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The M x N output with Inductor's grouped layout: row stride padded to 16 bytes."""
    dtype = dtype or a.dtype
    align = 16 // dtype.itemsize
    padded = -(-n // align) * align
    return torch.empty_strided((a.shape[0], n), (padded, 1), dtype=dtype, device=a.device)


def tilefly_providers(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor,
                      search: str = "default") -> dict[str, Callable[[], torch.Tensor]]:
    from tilefly import _device
    from tilefly.ops.grouped_gemm import launch

    capability = _device.capability(a.device.index or 0) if a.device.type == "cuda" else None
    reason = grouped_reason(facts_from_tensor(a), facts_from_tensor(b), facts_from_tensor(offs),
                            device_type=a.device.type, offs_device_type=offs.device.type, capability=capability)
    if reason is not None:
        _log.info("tilefly grouped GEMM declines: %s", reason)
        return {}
    g, k, n = b.shape
    view = b_view(tuple(b.shape), tuple(b.stride()), b.element_size())
    out = output_like_inductor(a, n)
    providers: dict[str, Callable[[], torch.Tensor]] = {}
    for cfg in configs.offered(a.shape[0], g, n, k, view.kmajor, search):
        try:
            launch.run(cfg, a, b, offs, out)  # also compiles, outside the timed calls
        except launch.Unsupported:
            continue
        except Exception as exc:  # noqa: BLE001 - a broken config is reported and skipped
            _log.warning("tilefly grouped config %s failed: %s: %s", cfg.name, type(exc).__name__, exc)
            continue
        providers[cfg.name] = lambda cfg=cfg: launch.run(cfg, a, b, offs, out)
    return providers

"""Grouped GEMM candidates for Inductor's max-autotune (``torch._grouped_mm``, ``F.grouped_mm``).

Inductor lowers ``_grouped_mm`` in ``kernel/mm_grouped.py`` without asking
``InductorChoices.get_template_configs``, so tilefly's ``TileflyChoices`` never sees
it. Instead ``GroupedProvider.prepare()`` (run by ``tilefly._inductor.install()``)
adds ``append_grouped_choices`` to the algorithm selector's preprocessing
functions (``select_algorithm.add_preprocessing_fn``), which see every choice
list before it is benchmarked. For a list that holds ATen's ``at::_grouped_mm``
choice (or, with ATen left out of the backends, Triton's grouped template), the
function binds one ``ExternKernelChoice`` per offered config to the same input
nodes [A, B, offs] and the same output layout, so the output strides match
Inductor's exactly (row stride padded to 16 bytes). Generated code then calls

    tilefly_grouped_mm_<config>_v1(a, b, offs, out=buf)

It does nothing unless tilefly is installed, max-autotune is on and
``max_autotune_gemm_backends`` names TILEFLY (tilefly._inductor.requested()). The
wrapper re-checks the real tensors and computes with ATen when the kernel cannot
serve them, so a result is never wrong. Default vs exhaustive configs follow
``tilefly.config.gemm_autotune``, as for the dense GEMM.
"""
from __future__ import annotations

import logging
import re
from typing import Any

import torch

from tilefly import _inductor, config
from tilefly.ops.grouped_gemm import configs
from tilefly.ops.grouped_gemm.configs import VERSION, GroupedConfig
from tilefly.ops.tensor_facts import device_of_node as _device_of  # patched in CPU tests

_log = logging.getLogger("tilefly.grouped_gemm")
OP = "grouped_mm"
_TRITON_GROUPED = re.compile(r"triton_grouped_mm_\d+$")


def choice_name(cfg: GroupedConfig) -> str:
    return f"tilefly_grouped_mm_{cfg.name}_{VERSION}"


# ---- what Inductor's generated code calls ------------------------------------------------------

def _serve(cfg: GroupedConfig, a, b, offs, out) -> None:
    from tilefly.ops.grouped_gemm import launch

    def aten() -> None:
        out_dtype = None if out.dtype == a.dtype else out.dtype
        out.copy_(torch._grouped_mm(a, b, offs=offs, out_dtype=out_dtype))

    _inductor.serve_or_fallback(f"tilefly grouped GEMM {cfg.name}", lambda: launch.run(cfg, a, b, offs, out),
                                launch.Unsupported, aten)


def _kernel(cfg: GroupedConfig):
    def tilefly_grouped_mm(a, b, offs, *, out):
        _serve(cfg, a, b, offs, out)
        return out

    tilefly_grouped_mm.__name__ = tilefly_grouped_mm.__qualname__ = choice_name(cfg)
    return tilefly_grouped_mm


# ---- the preprocessing function and the provider -------------------------------------------------

def _call_site(choices: list[Any]) -> tuple[list[Any], Any] | None:
    """(input nodes, output layout) of a _grouped_mm choice list, else None."""
    from torch._inductor.kernel import mm_grouped

    for choice in choices:
        if getattr(choice, "name", "").startswith("tilefly_grouped_mm_"):
            return None  # already appended (the function runs once per selection)
    for choice in choices:
        if getattr(choice, "choice", None) is mm_grouped.aten__grouped_mm or _TRITON_GROUPED.match(
                getattr(choice, "name", "")):
            return list(choice.input_nodes), choice.layout
    return None


def append_grouped_choices(choices: list[Any]) -> list[Any]:
    """Preprocessing function: ``choices`` plus tilefly's for a _grouped_mm call site."""
    if not (_inductor.installed() and _inductor.enabled(PROVIDER) and _inductor.requested()):
        return choices
    try:
        site = _call_site(choices)
        if site is None:
            return choices
        extra = PROVIDER.bound(*site)
    except Exception as exc:  # noqa: BLE001 - a broken provider must never break compilation
        _log.warning("tilefly: grouped GEMM candidates skipped (%s: %s)", type(exc).__name__, exc)
        return choices
    return [*choices, *extra] if extra else choices


_CHOICES: dict[GroupedConfig, Any] = {}   # config -> ExternKernelChoice, made once


class GroupedProvider:
    """tilefly._inductor provider for "grouped_mm" (reached through a preprocessing function)."""

    name = "grouped_gemm"

    def __init__(self) -> None:
        self._compiled: dict[tuple, bool] = {}

    def prepare(self) -> None:
        """Create every config's choice (a cached graph may name any) and hook the selector."""
        from torch._inductor import select_algorithm

        if not _CHOICES:
            from torch._inductor.select_algorithm import extern_kernels

            for cfg in configs.exhaustive():
                name = choice_name(cfg)
                if hasattr(extern_kernels, name):  # left by an earlier import of this module
                    delattr(extern_kernels, name)
                _CHOICES[cfg] = _inductor.extern_choice(_kernel(cfg), name)
        # Once per process: the function stays registered and checks installed()/requested() itself.
        if append_grouped_choices not in select_algorithm.get_algorithm_selector_cache().preprocessing_fns:
            select_algorithm.add_preprocessing_fn(append_grouped_choices)

    def candidates(self, kernel_inputs: Any, op_name: str) -> list[Any]:
        return []  # _grouped_mm never reaches get_template_configs; see append_grouped_choices

    def bound(self, input_nodes: list[Any], layout: Any) -> list[Any]:
        """Bound choices for one call site, after the eligibility predicate."""
        self.prepare()
        reason, problem = self._check(input_nodes, layout)
        if reason is not None:
            _log.debug("tilefly grouped_mm: no candidates (%s)", reason)
            return []
        picked = [_CHOICES[cfg].bind(input_nodes, layout) for cfg in self._configs(*problem)]
        _log.debug("tilefly grouped_mm %s: %d candidates", problem[:4], len(picked))
        return picked

    def _check(self, input_nodes, layout):
        from torch._inductor.virtualized import V

        from tilefly.ops.grouped_gemm.eligibility import b_view, facts_from_node, grouped_reason

        try:
            if V.graph.cpp_wrapper:
                return "C++ wrapper (AOTInductor) cannot call Python kernels", None
        except Exception:  # noqa: BLE001 - no graph in tests
            pass
        if len(input_nodes) != 3:
            return "no offs: the batched 3-D x 3-D case is not served", None
        mat_a, mat_b, offs = input_nodes
        device_type, capability = _device_of(mat_a)
        # offs must sit on the operands' device; its type is then the one _device_of reports
        offs_device = offs.get_device()
        offs_device_type = device_type if offs_device == mat_a.get_device() else getattr(offs_device, "type", None)
        a, b, o = facts_from_node(mat_a), facts_from_node(mat_b), facts_from_node(offs)
        reason = grouped_reason(a, b, o, out_dtype=layout.dtype, device_type=device_type,
                                offs_device_type=offs_device_type, capability=capability)
        if reason is None and tuple(int(s) for s in layout.size) != (a.shape[0], b.shape[2]):
            reason = f"output layout {list(layout.size)} is not sum M x N"
        if reason is not None:
            return reason, None
        g, k, n = b.shape
        view = b_view(b.shape, b.stride, b.itemsize)
        return None, (a.shape[0], g, n, k, view.kmajor, a.dtype, layout.dtype, int(layout.stride[0]))

    def _configs(self, m, g, n, k, b_kmajor, dtype, out_dtype, stride_cm) -> list[GroupedConfig]:
        picked = []
        for cfg in configs.offered(m, g, n, k, b_kmajor, config.gemm_autotune, out_dtype.itemsize):
            if self._compiles(cfg, dtype, out_dtype, b_kmajor, g, n, stride_cm):
                picked.append(cfg)
        return picked

    def _compiles(self, cfg, dtype, out_dtype, b_kmajor, g, n, stride_cm) -> bool:
        """Compile the binary ahead of benchmarking (needs a GPU); False drops the config."""
        from tilefly.ops.grouped_gemm.configs import groups_pad

        key = (cfg, dtype, out_dtype, b_kmajor, groups_pad(g, cfg.num_warps), n % 16 == 0, stride_cm % 16 == 0)
        if key not in self._compiled:
            ok = True
            if torch.cuda.is_available():
                from triton.errors import TritonError

                from tilefly.ops.grouped_gemm import launch

                try:
                    launch.warm(cfg, dtype, out_dtype, b_kmajor, g, n, stride_cm)
                except (TritonError, RuntimeError) as exc:  # the compiler's own failures: drop the config
                    ok = False
                    _log.debug("tilefly grouped config %s does not compile, dropped: %s: %s",
                               cfg.name, type(exc).__name__, exc)
                except Exception as exc:  # noqa: BLE001 - compiling ahead failed, not the config
                    _log.debug("tilefly grouped config %s not compiled ahead (%s: %s); it compiles on first use",
                               cfg.name, type(exc).__name__, exc)
            self._compiled[key] = ok
        return self._compiled[key]


PROVIDER = GroupedProvider()

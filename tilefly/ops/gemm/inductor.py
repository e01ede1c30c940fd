"""Dense GEMM candidates for Inductor's max-autotune (``mm``, ``@``, ``addmm``).

One ``ExternKernelChoice`` per (op, config), named ``tilefly_<op>_<config>_v1``
(the version enters Inductor's autotune cache key, which hashes the name and the
wrapper's source, not the kernel). Each is called by Inductor's generated code as

    tilefly_mm_<config>_v1(a, b, out=buf)              # out = a @ b
    tilefly_addmm_<config>_v1(bias, a, b, out=buf)     # out = bias + a @ b

and writes straight into ``out``. Every choice has a template heuristic
registered for its uid ("aten::<name>"), without which Inductor silently drops
it; the heuristic yields one empty config.

At a call site (``GemmProvider.candidates``): the eligibility predicate
(tilefly.ops.gemm.eligibility) runs on Inductor's input nodes; the shape gets
``configs.offered(...)``; each config's binary is compiled ahead (``launch.warm``)
and dropped with a debug log if that fails. At run time the wrapper re-checks the
real tensors (strides can differ from what the nodes said) and computes with
ATen when tilefly cannot serve them, so a result is never wrong.
"""
from __future__ import annotations

import logging
import weakref
from typing import Any

import torch

from tilefly import _inductor, config
from tilefly.ops.gemm import configs
from tilefly.ops.gemm.configs import VERSION, GemmConfig
from tilefly.ops.tensor_facts import device_of_node as _device_of  # patched in CPU tests

_log = logging.getLogger("tilefly.gemm")
OPS = ("mm", "addmm")


def choice_name(op: str, cfg: GemmConfig) -> str:
    return f"tilefly_{op}_{cfg.name}_{VERSION}"


# ---- what Inductor's generated code calls ------------------------------------------------------

def _serve(cfg: GemmConfig, a, b, out, bias) -> None:
    from tilefly.ops.gemm import launch

    def aten() -> None:
        if bias is None:
            torch.mm(a, b, out=out)
        else:
            torch.addmm(bias, a, b, out=out)

    _inductor.serve_or_fallback(f"tilefly GEMM {cfg.name}", lambda: launch.run(cfg, a, b, out, bias),
                                launch.Unsupported, aten)


def _mm_kernel(cfg: GemmConfig):
    def tilefly_mm(a, b, *, out):
        _serve(cfg, a, b, out, None)
        return out

    tilefly_mm.__name__ = tilefly_mm.__qualname__ = choice_name("mm", cfg)
    return tilefly_mm


def _addmm_kernel(cfg: GemmConfig):
    def tilefly_addmm(bias, a, b, *, out, alpha=1, beta=1):
        if alpha != 1 or beta != 1:  # never offered so; kept correct for direct callers
            return torch.addmm(bias, a, b, alpha=alpha, beta=beta, out=out)
        _serve(cfg, a, b, out, bias)
        return out

    tilefly_addmm.__name__ = tilefly_addmm.__qualname__ = choice_name("addmm", cfg)
    return tilefly_addmm


# ---- the provider -------------------------------------------------------------------------------

def _facts(node):
    from tilefly.ops.gemm.eligibility import facts_from_node

    return facts_from_node(node)


def _name(node) -> Any:
    try:
        return node.get_name()
    except Exception:  # noqa: BLE001 - unnamed views: identity is enough to deduplicate
        return id(node)


_CHOICES: dict[tuple[str, GemmConfig], Any] = {}   # (op, config) -> ExternKernelChoice, made once


class GemmProvider:
    """tilefly._inductor provider for "mm" and "addmm"."""

    name = "gemm"

    def __init__(self) -> None:
        self._compiled: dict[tuple, bool] = {}
        self._seen: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def prepare(self) -> None:
        """Create every config's choices (all exhaustive ones: a cached graph may name any)."""
        if _CHOICES:
            return
        from torch._inductor.select_algorithm import extern_kernels

        for cfg in configs.exhaustive():
            for op, make in (("mm", _mm_kernel), ("addmm", _addmm_kernel)):
                name = choice_name(op, cfg)
                if hasattr(extern_kernels, name):  # left by an earlier import of this module
                    delattr(extern_kernels, name)
                _CHOICES[(op, cfg)] = _inductor.extern_choice(make(cfg), name)
        register_heuristics("cuda")

    def choice(self, op: str, cfg: GemmConfig) -> Any:
        self.prepare()
        return _CHOICES[(op, cfg)]

    def candidates(self, kernel_inputs: Any, op_name: str) -> list[Any]:
        if op_name not in OPS:
            return []
        self.prepare()
        nodes = kernel_inputs.nodes()
        mat1, mat2 = nodes[-2], nodes[-1]
        bias = nodes[0] if op_name == "addmm" else None
        if self._already_offered(op_name, nodes):
            return []
        reason, problem = self._check(kernel_inputs, op_name, mat1, mat2, bias)
        if reason is not None:
            _log.debug("tilefly %s: no candidates (%s)", op_name, reason)
            return []
        picked = [_CHOICES[(op_name, cfg)] for cfg in self._configs(*problem)]
        _log.debug("tilefly %s %s: %d candidates", op_name, problem[:3], len(picked))
        return picked

    def _already_offered(self, op_name: str, nodes: list[Any]) -> bool:
        # torch 2.13 lowers addmm through up to three get_template_configs calls (ATen
        # bias, contiguous subgraph, unified); offer tilefly's choices on the first only.
        from torch._inductor.virtualized import V

        try:
            graph = V.graph
            seen = self._seen.setdefault(graph, set())
        except Exception:  # noqa: BLE001 - no graph (tests): nothing to deduplicate
            return False
        key = (op_name, *(_name(n) for n in nodes))
        if key in seen:
            return True
        seen.add(key)
        return False

    def _check(self, kernel_inputs, op_name, mat1, mat2, bias):
        from torch._inductor.virtualized import V

        from tilefly.ops.gemm.eligibility import bias_mode, gemm_reason

        try:
            if V.graph.cpp_wrapper:
                return "C++ wrapper (AOTInductor) cannot call Python kernels", None
        except Exception:  # noqa: BLE001 - no graph in tests
            pass
        device_type, capability = _device_of(mat1)
        alpha = beta = 1
        if op_name == "addmm":
            alpha, beta = kernel_inputs.get_scalar("alpha"), kernel_inputs.get_scalar("beta")
        a, b = _facts(mat1), _facts(mat2)
        bias_facts = _facts(bias) if bias is not None else None
        reason = gemm_reason(a, b, out_dtype=kernel_inputs.out_dtype(), bias=bias_facts, alpha=alpha, beta=beta,
                             device_type=device_type, capability=capability)
        if reason is not None:
            return reason, None
        (m, k), n = a.shape, b.shape[1]
        mode = bias_mode(bias_facts, m, n)[0] if bias_facts is not None else 0
        return None, (m, n, k, a, b, mode)

    def _configs(self, m, n, k, a, b, mode) -> list[GemmConfig]:
        from tilefly.ops.gemm import launch
        from tilefly.ops.gemm.eligibility import row_major_ok

        # Inductor's output buffer is row-major unless a consumer asks otherwise;
        # tile kernels need it TMA-writable (launch.run re-checks the real one).
        out_tma = row_major_ok((m, n), (n, 1), a.itemsize)
        picked = []
        for cfg in configs.offered(m, n, k, config.gemm_autotune):
            if cfg.persistent and not out_tma:
                continue
            flags = launch.variant(cfg, a, b, True, mode)
            if configs.layout_reason(cfg, flags["A_KMAJOR"], flags["B_KMAJOR"]) is not None:
                continue
            if self._compiles(cfg, a.dtype, flags, m, n):
                picked.append(cfg)
        return picked

    def _compiles(self, cfg: GemmConfig, dtype: torch.dtype, flags: dict, m: int, n: int) -> bool:
        """Compile the binary ahead of benchmarking (needs a GPU); False drops the config."""
        key = (cfg, dtype, tuple(sorted(flags.items())), *((m, n) if cfg.kind == "splitk" else ()))
        if key not in self._compiled:
            ok = True
            if torch.cuda.is_available():
                from triton.errors import TritonError

                from tilefly.ops.gemm import launch

                try:
                    launch.warm(cfg, dtype, flags, m, n)
                except (TritonError, RuntimeError) as exc:  # the compiler's own failures: drop the config
                    ok = False
                    _log.debug("tilefly gemm config %s %s does not compile, dropped: %s: %s",
                               cfg.name, flags, type(exc).__name__, exc)
                except Exception as exc:  # noqa: BLE001 - compiling ahead failed, not the config
                    _log.debug("tilefly gemm config %s %s not compiled ahead (%s: %s); it compiles on first use",
                               cfg.name, flags, type(exc).__name__, exc)
            self._compiled[key] = ok
        return self._compiled[key]


def _heuristic_class():
    from torch._inductor.template_heuristics.base import TemplateConfigHeuristics

    class TileflyGemmHeuristic(TemplateConfigHeuristics):
        """One choice per config, no per-config kwargs (alpha = beta = 1 by eligibility)."""

        def _get_template_configs_impl(self, kernel_inputs, op_name):
            yield {}

    return TileflyGemmHeuristic


def register_heuristics(device_type: str) -> None:
    """Register the template heuristic of every choice for ``device_type``; Inductor
    silently drops an ExternKernelChoice whose uid has none. tilefly's choices are
    offered on CUDA only; tests register "cpu" to trace the flow without a GPU."""
    from torch._inductor.template_heuristics.registry import register_template_heuristic

    heuristic = _heuristic_class()
    for (op, _), choice in _CHOICES.items():
        register_template_heuristic(choice.uid, device_type, op_name=op)(heuristic)


PROVIDER = GemmProvider()

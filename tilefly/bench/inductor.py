"""Compiled providers: ``torch.compile`` with max-autotune restricted to chosen GEMM backends,
with the autotuning bounded so a suite fits in one 10-minute run, and a look at which
kernel Inductor put in the generated code.

How Inductor's Triton autotuning is kept bounded (README-ready):

- ``max_autotune_gemm_search_space = "DEFAULT"``: Inductor's curated config list
  (roughly 10-20 Triton configs per mm shape after its own pruning), never
  ``EXHAUSTIVE``, even when the environment asks for it;
- ``compile_threads`` = the machine's cores (at most 32): candidates precompile in
  parallel worker processes, so a shape costs about one Triton compile wave plus
  ~0.1 s of benchmarking per candidate;
- ``autotune_in_subproc`` off (no extra process per benchmark); the mode's
  coordinate-descent tuning stays on but only touches pointwise and reduction
  kernels, which these one-GEMM graphs do not have;
- ``torch._dynamo.reset()`` before every compiled provider of every case and
  ``dynamic=False``, so each shape gets its own static graph and no guard or
  dynamic-shape recompilation happens during timing;
- Triton's and Inductor's on-disk caches are left on: a second run of a suite on
  the same machine skips the compiles (the timings are unaffected: compile and
  tuning are excluded from them anyway).

Measured on the H200 (torch 2.11, 16 cores, cold caches): dense_gemm's 15 shapes
took 95 s in all (~18 Triton configs a shape); grouped_gemm's 24 cases took 8.5 min
(40 Triton configs a case: 3-7 s precompiling, 1-2 s benchmarking, but one ragged
case spent 26 s in Inductor's own benchmarking). With warm caches a grouped case
takes ~2.5 s. Inductor has no search-space knob for the grouped template, so when
tilefly's configs join it, run grouped_gemm in two calls (``--cases std_`` and
``--cases kn_ ragged_``) to stay well inside a 10-minute device call.
"""
from __future__ import annotations

import contextlib
import os
import re
from typing import Any, Callable, Iterator

import torch


def _bounded(backends: str) -> dict[str, Any]:
    return {
        "max_autotune": True,
        "max_autotune_gemm": True,
        "max_autotune_gemm_backends": backends,
        "max_autotune_gemm_search_space": "DEFAULT",
        "compile_threads": max(1, min(32, os.cpu_count() or 1)),
        "autotune_in_subproc": False,
        "autotune_num_choices_displayed": 0,  # keep Inductor's AUTOTUNE tables and stats off the console
        "max_autotune_report_choices_stats": False,
    }


@contextlib.contextmanager
def autotune(backends: str) -> Iterator[None]:
    """Inductor max-autotune for GEMMs over ``backends`` (e.g. "TRITON"), bounded as above.
    Options this torch does not know are skipped (2.11 and 2.13 differ)."""
    from torch._inductor import config

    known = {k: v for k, v in _bounded(backends).items() if hasattr(config, k)}
    with config.patch(known):
        yield


def compile_static(fn: Callable[..., Any], mode: str | None = None) -> Callable[..., Any]:
    """A fresh static compile of ``fn`` (Dynamo state reset first)."""
    torch._dynamo.reset()
    return torch.compile(fn, mode=mode, dynamic=False)


# A kernel launched from Inductor's wrapper code: an extern kernel (ATen's or a registered
# choice such as tilefly's), a custom op, or a generated Triton kernel's ``.run``. Inductor's own
# helper ops (``torch.ops.inductor._alloc_from_pool`` carves a buffer out of a pool) launch nothing.
_CALL = re.compile(r"\b((?:extern_kernels|torch\.ops\.(?!inductor\.)\w+)\.\w+|triton_\w+(?=\.run\())")


def kernel_calls(code: list[str]) -> list[str]:
    """The kernels Inductor's wrapper code launches, in order, each once. Comments are left out:
    the wrapper's source-node comments name ``aten.mm`` whatever kernel the node became."""
    calls: dict[str, None] = {}
    for module in code:
        for line in module.splitlines():
            for match in _CALL.finditer(line.split("#", 1)[0]):
                calls[match.group(1)] = None
    return list(calls)


class CodeWatch:
    """Compile on the first call while capturing Inductor's generated code, then say what
    kernel the GEMM became: ``pick()`` -> "Triton template", "ATen", "tilefly", or the
    launches themselves when they are none of those (e.g. a decomposition)."""

    def __init__(self, compiled: Callable[..., Any], *args: Any):
        self.compiled = compiled
        self.args = args
        self.code: list[str] | None = None

    def __call__(self) -> Any:
        if self.code is None:
            from torch._inductor.utils import run_and_get_code

            # run_and_get_code resets Dynamo itself, then compiles on this first call.
            out, self.code = run_and_get_code(self.compiled, *self.args)
            return out
        return self.compiled(*self.args)

    def pick(self, aten_calls: tuple[str, ...]) -> str | None:
        """``aten_calls``: the wrapper's names for ATen's kernel (e.g. "extern_kernels.mm")."""
        return pick_from_code(self.code, aten_calls) if self.code else None


def pick_from_code(code: list[str], aten_calls: tuple[str, ...]) -> str | None:
    calls = kernel_calls(code)
    if any("tilefly" in call for call in calls):
        kind = "tilefly"
    elif any(call.startswith("triton_tem") for call in calls):
        kind = "Triton template"
    elif any(call in aten_calls for call in calls):
        kind = "ATen"
    else:
        return " + ".join(calls) or None
    if len(calls) > 1:   # one GEMM node should be one launch: say what else ran
        kind += " (launches: " + ", ".join(calls) + ")"
    return kind

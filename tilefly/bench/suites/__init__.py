"""The benchmark suites, by name. Each module defines ``SUITE`` (a ``runner.Suite``); modules
are imported on demand so listing suites or loading cases needs no GPU."""
from __future__ import annotations

import importlib

from tilefly.bench.runner import Suite

NAMES = ("rmsnorm", "rmsnorm_llm", "topk", "dense_gemm", "grouped_gemm", "grouped_gemm_small", "mxfp_gemm", "attention")


def get(name: str) -> Suite:
    if name not in NAMES:
        raise ValueError(f"unknown suite {name!r}; known: {', '.join(NAMES)}")
    return importlib.import_module(f"tilefly.bench.suites.{name}").SUITE

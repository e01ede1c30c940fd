"""Shared test setup: the ``cuda`` marker skips without an sm_90 GPU; every test
starts and ends with tilefly disabled and default options. With TILEFLY_TEST_FAILURES=<file>
each failure's report is appended to that file as it happens, so a run stopped by a time
limit still tells which tests failed and why (pytest prints its summary only at the end)."""
import os

import pytest
import torch

import tilefly
from tilefly import config


def _has_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def pytest_collection_modifyitems(config, items):
    if _has_hopper():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA Hopper (sm_90) GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def pytest_runtest_logreport(report):
    path = os.environ.get("TILEFLY_TEST_FAILURES")
    if not path or not report.failed or os.environ.get("PYTEST_XDIST_WORKER"):
        return     # under xdist the controller writes: it sees every worker's reports
    with open(path, "a") as f:
        f.write(f"==== {report.nodeid} ({report.when}, {report.duration:.1f} s)\n{report.longreprtext}\n\n")


@pytest.fixture(autouse=True)
def _clean_tilefly(monkeypatch):
    for opt in config.OPTIONS:
        monkeypatch.delenv(opt.env, raising=False)
    config.reload()
    tilefly.disable()
    yield
    tilefly.disable()
    for opt in config.OPTIONS:
        setattr(config, opt.name, opt.default)


@pytest.fixture
def graph_tree_pool():
    """A CUDA graph trees' private pool: ``warmup()`` routes this thread's allocations into it as
    the trees' warm-up does (on a stream of its own); ``check()`` fails if a tensor is still
    live in it ("tensors in the cudagraph pool not tracked as outputs")."""
    import types

    trees = pytest.importorskip("torch._inductor.cudagraph_trees")
    device = torch.cuda.current_device()
    pool = torch.cuda.graph_pool_handle()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):     # the pool exists once a capture used it
        torch.empty(1, device="cuda")

    def check():
        torch.cuda.synchronize()
        trees.check_memory_pool(device, pool, [])

    # the namespace holds the graph: the pool lives only while a graph that captured into it does
    # (beginAllocateCurrentThreadToPool asserts the pool's use count)
    return types.SimpleNamespace(
        warmup=lambda: trees._use_cuda_memory_pool_manager(device, pool, torch.cuda.Stream()), check=check,
        graph=graph)

"""Shared test setup: the ``cuda`` marker skips without an sm_90 GPU; every test
starts and ends with tilefly disabled and default options."""
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

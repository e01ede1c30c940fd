"""Attention tests route every fused backend op (config.attention_routes = "all"): most of them
install the routes first and choose a database afterwards. Tests of the default ("auto": only ops
the database serves otherwise) set it themselves."""
import pytest

from tilefly import config


@pytest.fixture(autouse=True)
def _route_every_backend_op():
    config.attention_routes = "all"
    yield

import logging

import pytest

from tilefly import config


def test_every_option_reads_its_environment_variable(monkeypatch):
    monkeypatch.setenv("TILEFLY_DISABLE", "1")
    monkeypatch.setenv("TILEFLY_OPS", "rms_norm, topk")
    monkeypatch.setenv("TILEFLY_LOG_LEVEL", "debug")
    monkeypatch.setenv("TILEFLY_ON_ERROR", "raise")
    monkeypatch.setenv("TILEFLY_FORCE", "yes")
    monkeypatch.setenv("TILEFLY_GEMM_AUTOTUNE", "exhaustive")
    monkeypatch.setenv("TILEFLY_ATTENTION_DB", "/tmp/db.json")
    config.reload()
    assert config.disable is True
    assert config.ops == ("rms_norm", "topk")
    assert config.log_level == "DEBUG" and logging.getLogger("tilefly").level == logging.DEBUG
    assert config.on_error == "raise"
    assert config.force is True
    assert config.gemm_autotune == "exhaustive"
    assert config.attention_db == "/tmp/db.json"


def test_defaults_without_environment():
    config.reload()
    assert (config.disable, config.ops, config.on_error, config.force) == (False, None, "fallback", False)


def test_bad_environment_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("TILEFLY_ON_ERROR", "explode")
    with pytest.raises(ValueError, match="TILEFLY_ON_ERROR: expected one of fallback, raise"):
        config.reload()


def test_assignment_is_validated_and_names_the_option():
    config.on_error = "RAISE"
    assert config.on_error == "raise"
    with pytest.raises(ValueError, match="expected one of fallback, raise"):
        config.on_error = "sometimes"
    with pytest.raises(TypeError, match="tilefly.config.force"):
        config.force = 2
    config.ops = ["topk"]
    assert config.ops == ("topk",)


def test_describe_lists_every_option_with_its_variable():
    text = config.describe()
    for opt in config.OPTIONS:
        assert opt.name in text and opt.env in text

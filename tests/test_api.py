"""Public API: enable/disable/enabled/enabled_ops and their errors."""
from dataclasses import replace

import pytest
import torch

import tilefly
from tilefly import _dispatch, config


def test_enable_rejects_unknown_names_and_lists_known_ones():
    with pytest.raises(ValueError, match="unknown names \\['nope'\\]; known: .*topk"):
        tilefly.enable(["nope"])


def test_tilefly_disable_env_installs_nothing(monkeypatch):
    monkeypatch.setenv("TILEFLY_DISABLE", "1")
    config.reload()
    assert tilefly.enable(["rms_norm"]) == ()
    assert tilefly.enabled_ops() == ()


def test_enable_disable_roundtrip_restores_the_original_kernels():
    before = torch.library.get_kernel("aten::_fused_rms_norm", "CUDA")
    assert tilefly.enable("rms_norm") == ("rms_norm",)
    assert tilefly.enable("rms_norm") == ("rms_norm",)
    tilefly.disable()
    assert tilefly.enabled_ops() == ()
    assert ("aten::_fused_rms_norm", "CUDA") not in _dispatch._routes
    assert before is not None


def test_enabled_context_restores_the_previous_set():
    tilefly.enable("topk")
    with tilefly.enabled("rms_norm") as now:
        assert set(now) == {"rms_norm", "topk"}
    assert tilefly.enabled_ops() == ("topk",)


def test_enabled_context_restores_even_on_error():
    with pytest.raises(KeyError):
        with tilefly.enabled("rms_norm"):
            raise KeyError("boom")
    assert tilefly.enabled_ops() == ()


def test_config_ops_chooses_the_default_families():
    config.ops = ["topk"]
    assert tilefly.enable() == ("topk",)


def test_import_does_not_import_triton_kernels():
    import subprocess
    import sys

    code = ("import sys, tilefly; tilefly.enable(['rms_norm', 'topk']); "
            "bad = [m for m in sys.modules if m.endswith('.kernels') or m.startswith('triton.experimental')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_enable_without_ops_installs_the_default_families_only(monkeypatch):
    from tilefly import ops

    tilefly.disable()
    monkeypatch.setitem(ops.FAMILIES, "topk", replace(ops.FAMILIES["topk"], default=False))
    enabled = tilefly.enable()
    assert set(enabled) == set(ops.defaults()) and "topk" not in enabled
    tilefly.enable(["topk"])
    assert "topk" in tilefly.enabled_ops()


@pytest.mark.parametrize("bad", [3, [1, 2]])
def test_enable_names_the_argument_on_bad_types(bad):
    with pytest.raises(TypeError, match="ops must"):
        tilefly.enable(bad)

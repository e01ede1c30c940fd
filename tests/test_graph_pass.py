"""tilefly._graph_pass's chaining, for every tilefly post-grad pass: enable() puts the pass in its Inductor
slot ahead of a user's pass (once), runs both, keys the FX graph cache on both, and disable() gives the slot
back; a displaced pass without a key keeps graphs out of the cache."""
import pytest
import torch
from torch._inductor import config as inductor_config
from torch._inductor.custom_graph_pass import CustomGraphPass

import tilefly
from tilefly.mx.shared_quant_pass import SharedQuantization
from tilefly.ops.attention.mask_pass import SharedAttentionMask

PASSES = [("mx_gemm", "post_grad_custom_pre_pass", SharedQuantization),
          ("attention", "post_grad_custom_post_pass", SharedAttentionMask)]


class _UserPass(CustomGraphPass):
    def __init__(self, key="user-1"):
        self.key, self.calls = key, 0

    def __call__(self, graph):
        self.calls += 1

    def uuid(self):
        return self.key


@pytest.mark.parametrize("family, slot, kind", PASSES)
def test_enable_chains_a_users_pass_and_disable_restores_it(monkeypatch, family, slot, kind):
    user = _UserPass()
    monkeypatch.setattr(inductor_config, slot, user)
    tilefly.enable(family)
    tilefly.enable(family)                      # idempotent: not wrapped twice
    try:
        installed = getattr(inductor_config, slot)
        assert isinstance(installed, kind) and installed.then is user
        installed(torch.fx.symbolic_trace(lambda x: x + 1).graph)
        assert user.calls == 1
        assert installed.uuid() == (kind().uuid(), "user-1")
        tilefly.disable("rms_norm")             # another family: the pass stays
        assert getattr(inductor_config, slot) is installed
    finally:
        tilefly.disable()
    assert getattr(inductor_config, slot) is user


@pytest.mark.parametrize("family, slot, kind", PASSES)
def test_uuid_is_none_when_the_displaced_pass_has_no_key(family, slot, kind):
    # A plain function in the slot keeps graphs out of Inductor's FX graph cache; wrapping it must too.
    assert kind(then=lambda graph: None).uuid() is None
    assert kind(then=_UserPass(key=None)).uuid() is None
    assert isinstance(kind().uuid(), bytes)     # a hash of the pass's source

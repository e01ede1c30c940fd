"""Eligibility of attention calls, decided on CPU tensors with the device check mocked, and the
op schemas the routing reads (torch 2.13 here; the GPU machine runs 2.11)."""
import pytest
import torch

from tilefly import _device, _dispatch, config
from tilefly.ops.attention import backends, database, eager, formats
from attention_standins import db_entry, write_db


@pytest.fixture
def hopper(monkeypatch, tmp_path):
    monkeypatch.setattr(_device, "hopper_reason", lambda t: None)
    database.reload()
    config.attention_db = write_db(tmp_path / "db.json", [
        db_entry("fwd", head_dim=d, sq_bin=64, sk_bin=64, serve={"cudnn": ["flash"], "efficient": ["flash"]})
        for d in (64, 512)])
    yield
    database.reload()


def _args(backend="cudnn", d=64, sq=64, sk=64, hq=4, hk=4, dtype=torch.bfloat16, **kw):
    q = torch.randn(2, hq, sq, d, dtype=dtype)
    k = torch.randn(2, hk, sk, d, dtype=dtype)
    v = torch.randn(2, hk, sk, kw.pop("dv", d), dtype=dtype)
    if backend == "flash":
        return (q, k, v, kw.get("dropout_p", 0.0), kw.get("causal", False)), {}
    return (q, k, v, kw.get("attn_bias"), False, kw.get("dropout_p", 0.0), kw.get("causal", False)), {}


def _decide(backend="cudnn", direction="fwd", **kw):
    args, kwargs = _args(backend, **kw)
    return eager.BackendOp(backend, direction, "CPU").decide(args, kwargs)


def test_eligible_call_gets_the_database_choice(hopper):
    assert _decide() == eager.Decision("flash", None, None)


@pytest.mark.parametrize("kw,reason", [
    (dict(attn_bias=torch.zeros(64, 64, dtype=torch.bfloat16)), "attention mask given"),
    (dict(dropout_p=0.1), "dropout_p > 0"),
    (dict(dtype=torch.float32), "dtype torch.float32"),
    (dict(d=80), "untuned workload (bf16 d=80 non-causal Sq=64 Sk=64 fwd)"),
    (dict(dv=32), "head dims differ"),
    (dict(sq=63), "untuned workload"),          # below the lowest tuned Sq bin
    (dict(causal=True), "untuned workload"),
])
def test_ineligible_calls_say_why(hopper, kw, reason):
    decision = _decide(**kw)
    assert decision.impl is None and reason in decision.reason


def test_larger_sequences_fall_to_the_bin_below(hopper):
    assert _decide(sq=4000, sk=100).impl == "flash"


def test_head_dim_512_is_refused_by_flash(hopper):
    decision = _decide("efficient", d=512)
    assert decision.impl is None
    assert "flash: flash stops at head dim 256, got 512" in decision.reason


def test_gqa_on_the_efficient_op_is_not_rerouted(hopper):
    decision = _decide("efficient", hq=4, hk=2)
    assert decision.impl is None and "grouped-query" in decision.reason


def test_non_hopper_tensors_keep_the_op_kernel(tmp_path):
    config.attention_db = write_db(tmp_path / "db.json", [db_entry("fwd", sq_bin=64, sk_bin=64,
                                                                   serve={"cudnn": ["flash"]})])
    decision = _decide()
    assert decision.impl is None and "tensor is on cpu" in decision.reason


def test_user_disabled_backend_is_not_a_target(hopper):
    with torch.nn.attention.sdpa_kernel([torch.nn.attention.SDPBackend.CUDNN_ATTENTION]):
        decision = _decide()
    assert decision.impl is None and "flash is disabled" in decision.reason


def test_predicates_report_the_tilefly_slot_and_the_reroute(hopper, monkeypatch):
    monkeypatch.setattr(backends.TILEFLY_FA, "unavailable", lambda: backends.TileflyFA.NOT_BUILT)
    route = eager.BackendOp("cudnn", "fwd", "CPU")
    args, kwargs = _args()
    assert route.tilefly_predicate(*args, **kwargs) == "tilefly attention kernels not built yet"
    assert route.reroute_predicate(*args, **kwargs) is None
    args, kwargs = _args(dropout_p=0.5)
    route.tilefly_predicate(*args, **kwargs)
    assert "dropout_p > 0" in route.reroute_predicate(*args, **kwargs)


def test_tilefly_slot_without_kernel_module(monkeypatch):
    monkeypatch.setattr(backends.TileflyFA, "MODULE", "tilefly.ops.attention._no_kernels_here")
    backends.TileflyFA._load.cache_clear()
    try:
        assert backends.TILEFLY_FA.unavailable() == "tilefly attention kernels not built yet"
        assert backends.TILEFLY_FA.configs() == ()
    finally:
        backends.TileflyFA._load.cache_clear()


def test_registration_covers_all_six_ops_with_tilefly_first():
    import tilefly.ops.attention  # noqa: F401 - registers

    impls = _dispatch.registered("attention")
    ops = {op for pair in formats.OPS.values() for op in pair}
    assert {i.op for i in impls} == ops
    masked_fwd = {"aten::_scaled_dot_product_cudnn_attention", "aten::_scaled_dot_product_efficient_attention"}
    for op in ops:
        first = ["tilefly_decode"] if op in masked_fwd else []     # the ops that take a mask, forward
        assert [i.name for i in impls if i.op == op] == [*first, "tilefly_fa", "sdpa_reroute"]
        assert all(i.dispatch_key == "CUDA" for i in impls)


def test_decode_entry_and_its_overrides_follow_the_option(monkeypatch):
    from tilefly.ops.attention import eager

    routes = {(r.backend, r.direction): r for r in eager.backend_ops()}
    decode_gates = [i.install_reason for i in eager.impls() if i.name == eager.DECODE]
    monkeypatch.setattr(config, "attention_decode", "off")
    assert len(decode_gates) == 2 and all(g() == "config.attention_decode is off" for g in decode_gates)
    monkeypatch.setattr(config, "attention_decode", "auto")          # the default: the database decides
    assert all(g().startswith("config.attention_decode is auto: ") for g in decode_gates)   # no GPU here
    monkeypatch.setattr(database, "route_reason", lambda backend, direction: "database: no saving")
    assert eager._route_reason(routes[("cudnn", "fwd")]) == "database: no saving"
    monkeypatch.setattr(eager.decode_tuning, "install_reason", lambda device: None)   # a database that wins
    assert all(g() is None for g in decode_gates)
    assert eager._route_reason(routes[("cudnn", "fwd")]) is None
    monkeypatch.undo()
    monkeypatch.setattr(config, "attention_decode", "on")
    assert all(g() is None for g in decode_gates)
    assert eager._route_reason(routes[("cudnn", "fwd")]) is None         # installed whatever the database says
    assert eager._route_reason(routes[("efficient", "fwd")]) is None
    monkeypatch.setattr(database, "route_reason", lambda backend, direction: "database: no saving")
    assert eager._route_reason(routes[("cudnn", "bwd")]) == "database: no saving"
    assert eager._route_reason(routes[("flash", "fwd")]) == "database: no saving"   # flash takes no mask


# ---- the schemas the routing reads -----------------------------------------------------------

FWD_NAMES = {"cudnn": ("query", "key", "value", "attn_bias", "compute_log_sumexp", "dropout_p", "is_causal",
                       "return_debug_mask"),
             "flash": ("query", "key", "value", "dropout_p", "is_causal", "return_debug_mask"),
             "efficient": ("query", "key", "value", "attn_bias", "compute_log_sumexp", "dropout_p", "is_causal")}
BWD_READ = ("query", "key", "value", "out", "logsumexp", "dropout_p", "is_causal")


@pytest.mark.parametrize("backend", ["cudnn", "flash", "efficient"])
def test_op_schemas_match_what_the_routing_assumes(backend):
    fwd = formats.OpSpec(backend, "fwd")
    assert fwd.names[:len(FWD_NAMES[backend])] == FWD_NAMES[backend]
    assert "scale" in fwd.kwarg_only
    assert fwd.n_returns == (4 if backend == "efficient" else 9)
    bwd = formats.OpSpec(backend, "bwd")
    assert bwd.names[0].startswith("grad_out") and bwd.names[1:4] == ("query", "key", "value")
    assert set(BWD_READ) <= set(bwd.names) and "scale" in bwd.kwarg_only
    assert bwd.n_returns == (4 if backend == "efficient" else 3)
    # Every argument a stock backward call needs is one the routing provides (StockBackend.backward).
    provided = {"grad_out", "grad_out_", "query", "key", "value", "out", "logsumexp", "philox_seed",
                "philox_offset", "attn_bias", "cum_seq_q", "cum_seq_k", "max_q", "max_k", "dropout_p",
                "grad_input_mask", "is_causal", "scale"}
    assert {n for n in bwd.names if n not in bwd.defaults} <= provided


def test_op_spec_reads_defaults_and_builds_calls():
    spec = formats.OpSpec("cudnn", "fwd")
    q = torch.randn(1, 1, 4, 8)
    args = (q, q, q, None, True)
    assert spec.arg(args, {}, "is_causal") is False and spec.arg(args, {}, "dropout_p") == 0.0
    assert spec.arg(args, {"scale": 0.5}, "scale") == 0.5
    assert spec.arg(args, {}, "no_such_arg", "absent") == "absent"
    built, kwargs = spec.build(dict(query=q, key=q, value=q, attn_bias=None, compute_log_sumexp=False,
                                    is_causal=True, scale=0.25, unrelated=1))
    assert built[4:] == (False, 0.0, True, False) and kwargs == {"scale": 0.25}
    with pytest.raises(TypeError, match="required argument 'value'"):
        spec.build(dict(query=q, key=q))


def test_tilefly_candidate_with_unknown_config_is_refused(hopper, tmp_path, monkeypatch):
    class FakeKernels:
        CONFIGS = ("m128n64",)

        @staticmethod
        def unsupported(q, k, v, causal, direction):
            return None

    monkeypatch.setattr(backends.TileflyFA, "_load", staticmethod(lambda: (FakeKernels, None)))
    config.attention_db = write_db(tmp_path / "t.json", [
        db_entry("fwd", sq_bin=64, sk_bin=64, serve={"cudnn": ["tilefly_fa/old", "tilefly_fa/m128n64"]})])
    database.reload()
    assert _decide() == eager.Decision("tilefly_fa", "m128n64", None)
    config.attention_db = write_db(tmp_path / "u.json", [
        db_entry("fwd", sq_bin=64, sk_bin=64, serve={"cudnn": ["tilefly_fa/old"]})])
    database.reload()
    decision = _decide()
    assert decision.impl is None and "config 'old' is not among the kernels' configs" in decision.reason
    route = eager.BackendOp("cudnn", "fwd", "CPU")
    args, kwargs = _args()
    assert route.tilefly_predicate(*args, **kwargs).startswith("tuning database prefers tilefly_fa/old")

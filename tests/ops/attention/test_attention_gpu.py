"""Attention routing on the H200 with PyTorch's real kernels: rerouted workloads give the
stock results (against a float64 reference) eagerly and compiled, forward and backward;
user-disabled backends are never targets; masks, dropout and FP32 still reach PyTorch's
kernels; no database changes nothing; outputs have the meta kernels' layouts; the tuner's
measurement produces valid entries.

Two facts of the real stack shape these tests:
- Decisions are recorded with ``all_thread_decisions``: autograd runs CUDA backward on its
  own device thread, which ``_dispatch.recording()`` (this thread only) does not see.
- PyTorch is made to reach backend X's op with X first in SDPA's priority order and every
  other fused backend still enabled (``_reaching``): ``sdpa_kernel([X])`` alone would
  disable the rerouting targets, and the routing rightly refuses a disabled backend
  (that refusal has its own test).
"""
import contextlib
import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import tilefly.ops.attention  # noqa: F401 - registers the routes
from tilefly import _dispatch, config
from tilefly.ops.attention import backends, database, eager, formats, tuner
from attention_standins import all_thread_decisions, db_entry, write_db

pytestmark = pytest.mark.cuda

SDP = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
       "efficient": SDPBackend.EFFICIENT_ATTENTION}
OPS = {b: getattr(torch.ops.aten, f"_scaled_dot_product_{b}_attention") for b in SDP}
FWD_OP = {b: formats.OPS[b][0] for b in SDP}
BWD_OP = {b: formats.OPS[b][1] for b in SDP}
REROUTE = eager.REROUTE
NO_DB = "no usable tuning database"


@pytest.fixture
def routed(tmp_path):
    database.reload()
    config.attention_db = str(tmp_path / "absent.json")
    _settle_sdpa_priority()
    _dispatch.install(["attention"])
    yield
    _dispatch.uninstall(["attention"])
    database.reload()


def _settle_sdpa_priority():
    # SDPA sets its default priority order (cuDNN first on recent builds) on its first call in the
    # process and may overwrite an order set before that call: make the first call here, outside
    # any test's sdpa_kernel(set_priority=True).
    x = torch.randn(1, 1, 8, 64, device="cuda", dtype=torch.bfloat16)
    F.scaled_dot_product_attention(x, x, x)


@contextlib.contextmanager
def _reaching(served_as):
    """PyTorch's selection picks ``served_as`` first; the other fused backends stay enabled."""
    order = [served_as] + [b for b in SDP if b != served_as]
    with sdpa_kernel([SDP[b] for b in order], set_priority=True):
        yield


@contextlib.contextmanager
def _fresh_compile():
    # SDPA's backend is chosen when the graph is traced, under the flags of that moment. The FX
    # graph and AOTAutograd caches do not key on those flags, so a graph cached by another test
    # (or an earlier session) would call another backend's op: trace afresh, cache nothing.
    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False, fx_graph_remote_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False, enable_remote_autograd_cache=False):
        yield
    torch._dynamo.reset()


@contextlib.contextmanager
def _deterministic(on):
    was, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(on)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn_only)


def _use_db(tmp_path, entries):
    config.attention_db = write_db(tmp_path / f"db{len(list(tmp_path.iterdir()))}.json", entries)
    database.reload()


def _qkv(b=2, hq=4, hk=4, sq=256, sk=256, d=64, dtype=torch.bfloat16, grad=True):
    g = torch.Generator(device="cuda").manual_seed(1)
    ts = [torch.randn(b, h, s, d, device="cuda", dtype=dtype, generator=g) for h, s in ((hq, sq), (hk, sk), (hk, sk))]
    return [t.requires_grad_(grad) for t in ts]


def _reference(q, k, v, causal, scale=None):
    """float64 math attention, output and gradients of sum(out * w) for a fixed w."""
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    ke, ve = kd.repeat_interleave(group, 1), vd.repeat_interleave(group, 1)
    s = (qd @ ke.transpose(-1, -2)) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device="cuda").triu(1), float("-inf"))
    out = torch.softmax(s, -1) @ ve
    w = torch.randn(out.shape, dtype=out.dtype, device="cuda", generator=torch.Generator(device="cuda").manual_seed(2))
    (out * w).sum().backward()
    return out.detach(), w, (qd.grad, kd.grad, vd.grad), torch.logsumexp(s, -1).detach()


def _rel(got, ref):
    return ((got.double() - ref).norm() / ref.norm()).item()


def _sdpa(causal, scale=None, compiled=False):
    def f(a, b, c):
        return F.scaled_dot_product_attention(a, b, c, is_causal=causal, scale=scale,
                                              enable_gqa=a.shape[1] != b.shape[1])
    return torch.compile(f) if compiled else f


def _backward(out, inputs, w):
    for t in inputs:
        t.grad = None
    (out.double() * w).sum().backward()
    return tuple(t.grad for t in inputs)


def _served(decisions):
    return [(d.op, d.impl) for d in decisions]


def _assert_accurate(out, grads, ref, ref_grads):
    assert _rel(out, ref) < 1e-2
    for name, got, want in zip("qkv", grads, ref_grads):
        assert _rel(got, want) < 2e-2, f"d{name}"


def test_stock_lse_conventions_agree():
    """The canonical log-sum-exp every conversion relies on: all three stock kernels store the same."""
    q, k, v = _qkv(grad=False)
    _, _, _, ref_lse = _reference(q, k, v, causal=True)
    checked = []
    for name in SDP:
        if tuner.pytorch_pick(q.requires_grad_(), k, v, True, only=name) != name:
            continue
        out, lse = backends.stock(name).forward(q, k, v, True, None, True)
        torch.testing.assert_close(lse.double(), ref_lse, atol=2e-3, rtol=1e-3, msg=f"{name} lse")
        checked.append(name)
    assert checked == list(SDP), f"PyTorch refused {set(SDP) - set(checked)} for bf16 d=64 causal S=256"


def test_real_kernels_return_what_their_meta_kernels_promise():
    q, k, v = _qkv()
    checked = []
    for name in SDP:
        if tuner.pytorch_pick(q, k, v, False, only=name) != name:
            continue
        spec = backends.stock(name).fwd
        args, kwargs = backends.stock(name)._forward_call(q, k, v, False, None, True)
        outs = OPS[name](*args, **kwargs)
        slots = spec.template(args, kwargs)
        for i in (0, 1):
            assert (tuple(outs[i].shape), outs[i].stride(), outs[i].dtype) == \
                   (slots[i].shape, slots[i].stride, slots[i].dtype), f"{name} output {i}"
        checked.append(name)
    assert checked == list(SDP), f"PyTorch refused {set(SDP) - set(checked)} for bf16 d=64 S=256"


PAIRS = list(itertools.product(SDP, repeat=3))


@pytest.mark.parametrize("served_as,fwd_impl,bwd_impl", PAIRS)
@pytest.mark.parametrize("causal", [False, True])
def test_rerouted_eager_matches_reference(routed, tmp_path, served_as, fwd_impl, bwd_impl, causal):
    """PyTorch reaches ``served_as``'s ops with every fused backend enabled; the database sends the
    forward to ``fwd_impl`` and the backward to ``bwd_impl``. Where that is ``served_as`` itself,
    the database ranks its own kernel fastest and the op keeps it although the others could serve."""
    serve_f = {served_as: [fwd_impl]} if fwd_impl != served_as else {}
    serve_b = {served_as: [bwd_impl]} if bwd_impl != served_as else {}
    _use_db(tmp_path, [db_entry("fwd", causal=causal, sq_bin=128, sk_bin=128, serve=serve_f),
                       db_entry("bwd", causal=causal, sq_bin=128, sk_bin=128, serve=serve_b)])
    q, k, v = _qkv(sq=200, sk=200)
    ref, w, ref_grads, _ = _reference(q, k, v, causal, scale=0.2)
    with all_thread_decisions() as decisions:
        with _reaching(served_as):
            out = _sdpa(causal, scale=0.2)(q, k, v)
        grads = _backward(out, (q, k, v), w)
    assert _served(decisions) == [(FWD_OP[served_as], None if fwd_impl == served_as else REROUTE),
                                  (BWD_OP[served_as], None if bwd_impl == served_as else REROUTE)], decisions
    for decision, impl in zip(decisions, (fwd_impl, bwd_impl)):
        if impl == served_as:
            assert f"{served_as}'s own kernel is fastest" in decision.reason, decision
    _assert_accurate(out, grads, ref, ref_grads)


@pytest.mark.parametrize("served_as,target", [("cudnn", "flash"), ("flash", "cudnn")])
def test_rerouted_gqa(routed, tmp_path, served_as, target):
    _use_db(tmp_path, [db_entry(d, dtype="fp16", head_dim=128, causal=True, gqa=True, sq_bin=128, sk_bin=128,
                                serve={served_as: [target]}) for d in ("fwd", "bwd")])
    q, k, v = _qkv(hq=8, hk=2, sq=300, sk=300, d=128, dtype=torch.float16)
    ref, w, ref_grads, _ = _reference(q, k, v, True)
    with all_thread_decisions() as decisions:
        with _reaching(served_as):
            out = _sdpa(True)(q, k, v)
        grads = _backward(out, (q, k, v), w)
    assert _served(decisions) == [(FWD_OP[served_as], REROUTE), (BWD_OP[served_as], REROUTE)], decisions
    _assert_accurate(out, grads, ref, ref_grads)


@pytest.mark.parametrize("served_as,target", [("efficient", "cudnn"), ("cudnn", "flash"), ("flash", "efficient")])
def test_rerouted_compiled_matches_reference(routed, tmp_path, served_as, target):
    _use_db(tmp_path, [db_entry(d, sq_bin=128, sk_bin=128, serve={served_as: [target]}) for d in ("fwd", "bwd")])
    q, k, v = _qkv(sq=256, sk=256)
    ref, w, ref_grads, _ = _reference(q, k, v, False)
    with _fresh_compile(), all_thread_decisions() as decisions:
        with _reaching(served_as):
            out = _sdpa(False, compiled=True)(q, k, v)
        grads = _backward(out, (q, k, v), w)
    assert _served(decisions) == [(FWD_OP[served_as], REROUTE), (BWD_OP[served_as], REROUTE)], decisions
    _assert_accurate(out, grads, ref, ref_grads)


@pytest.mark.parametrize("served_as,target", [("cudnn", "flash"), ("flash", "efficient"), ("efficient", "cudnn")])
def test_user_disabled_backend_is_never_a_target(routed, tmp_path, served_as, target):
    """The database prefers ``target``, but the user enabled only ``served_as`` (sdpa_kernel):
    forward and backward keep ``served_as``'s kernels and say why. Enabling ``target`` again
    reroutes both, so the refusal came from the user's flags alone."""
    _use_db(tmp_path, [db_entry(d, sq_bin=128, sk_bin=128, serve={served_as: [target]}) for d in ("fwd", "bwd")])
    q, k, v = _qkv(sq=200, sk=200)
    ref, w, ref_grads, _ = _reference(q, k, v, False)
    with all_thread_decisions() as decisions, sdpa_kernel([SDP[served_as]]):
        out = _sdpa(False)(q, k, v)
        grads = _backward(out, (q, k, v), w)
    assert _served(decisions) == [(FWD_OP[served_as], None), (BWD_OP[served_as], None)], decisions
    for decision in decisions:
        assert f"{target}: {target} is disabled (torch.backends.cuda / sdpa_kernel)" in decision.reason, decision
    _assert_accurate(out, grads, ref, ref_grads)

    with all_thread_decisions() as decisions:
        with _reaching(served_as):
            out = _sdpa(False)(q, k, v)
        _backward(out, (q, k, v), w)
    assert _served(decisions) == [(FWD_OP[served_as], REROUTE), (BWD_OP[served_as], REROUTE)], decisions


@pytest.mark.parametrize("served_as", list(SDP))
def test_rerouted_outputs_have_meta_layouts(routed, tmp_path, served_as):
    target = next(b for b in SDP if b != served_as)
    _use_db(tmp_path, [db_entry("fwd", sq_bin=128, sk_bin=128, serve={served_as: [target]})])
    q, k, v = _qkv(sq=130, sk=130)
    ref = _reference(q, k, v, False)[0]
    route = eager.BackendOp(served_as, "fwd")
    args, kwargs = route.spec.build(dict(query=q, key=k, value=v, attn_bias=None, compute_log_sumexp=True,
                                         is_causal=False))
    with torch.no_grad(), all_thread_decisions() as decisions:
        outs = route.spec.overload(*args, **kwargs)
    assert _served(decisions) == [(FWD_OP[served_as], REROUTE)], decisions
    metas = route.spec.template(args, kwargs)
    for got, slot in zip(outs, metas):
        if isinstance(slot, formats.TensorSlot):
            assert (tuple(got.shape), got.stride(), got.dtype) == (slot.shape, slot.stride, slot.dtype)
        else:
            assert got == slot
    assert _rel(outs[0], ref) < 1e-2


@pytest.mark.parametrize("case", ["mask", "dropout", "fp32"])
def test_masks_dropout_fp32_reach_pytorch(routed, tmp_path, case):
    _use_db(tmp_path, [db_entry(d, dtype=dt, sq_bin=128, sk_bin=128, serve={b: [o for o in SDP if o != b]
                                                                            for b in SDP})
                       for d in ("fwd", "bwd") for dt in ("bf16", "fp16")])
    q, k, v = _qkv(dtype=torch.float32 if case == "fp32" else torch.bfloat16)
    mask = torch.rand(256, 256, device="cuda") > 0.3 if case == "mask" else None
    dropout = 0.3 if case == "dropout" else 0.0
    with all_thread_decisions() as decisions:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
        out.float().sum().backward()
    assert [x.op.endswith("_backward") for x in decisions] == [False, True], f"forward and backward: {decisions}"
    assert all(x.impl is None for x in decisions), decisions
    if case != "dropout":
        with torch.no_grad():
            with_tilefly = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            _dispatch.uninstall(["attention"])
            assert torch.equal(with_tilefly, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
@pytest.mark.parametrize("head_dim,causal", [(64, True), (128, False), (256, True), (512, False)])
def test_no_database_gives_identical_results(routed, head_dim, causal, deterministic):
    """Routes installed without a database leave every call to the kernel PyTorch picked: the same
    backend op and bit-identical outputs. Gradients: the stock backward kernels are not bitwise
    reproducible run to run (cuDNN and flash accumulate dQ with atomics, efficient sums split-key
    partials), so by default they are compared to within one BF16 unit in the last place. Under
    torch.use_deterministic_algorithms(True) flash and efficient run deterministic backward kernels
    and PyTorch's selection leaves cuDNN out (it is not deterministic): gradients match bit for bit."""
    q, k, v = _qkv(d=head_dim, sq=512, sk=512)
    w = torch.randn(2, 4, 512, head_dim, device="cuda", dtype=torch.float64,
                    generator=torch.Generator(device="cuda").manual_seed(3))

    def run():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return out, [g.clone() for g in _backward(out, (q, k, v), w)]

    with _deterministic(deterministic):
        with all_thread_decisions() as decisions:
            out1, g1 = run()
        _dispatch.uninstall(["attention"])
        out2, g2 = run()
    assert [x.op.endswith("_backward") for x in decisions] == [False, True], decisions
    assert all(x.impl is None and NO_DB in x.reason for x in decisions), decisions
    assert type(out1.grad_fn) is type(out2.grad_fn), "the same backend ran"
    if deterministic:
        assert "Cudnn" not in type(out1.grad_fn).__name__, "PyTorch picked cuDNN in deterministic mode"
    assert torch.equal(out1, out2)
    for name, a, b in zip("qkv", g1, g2):
        if deterministic:
            assert torch.equal(a, b), f"d{name}"
        else:
            torch.testing.assert_close(a, b, rtol=2 ** -7, atol=1e-4 * b.abs().max().item(), msg=f"d{name}")


def test_auto_routes_override_only_the_ops_the_database_serves_otherwise(tmp_path):
    """config.attention_routes = "auto" (the default): with a database that reroutes only the
    efficient forward, that op gets tilefly's handler; every other backend op keeps PyTorch's
    kernel untouched (no Python handler, no host cost), and explain() says why."""
    import tilefly

    config.attention_routes = "auto"
    _use_db(tmp_path, [db_entry("fwd", head_dim=64, sq_bin=64, sk_bin=64, serve={"efficient": ["cudnn"]})])
    _settle_sdpa_priority()
    with tilefly.enabled("attention"):
        assert _dispatch.original(FWD_OP["efficient"]) is not None
        for op in [FWD_OP["cudnn"], FWD_OP["flash"], *BWD_OP.values()]:
            assert _dispatch.original(op) is None, op
            assert "never serves" in _dispatch.unrouted_reason(op), op
        q, k, v = _qkv(grad=False)
        with _reaching("cudnn"):
            report = tilefly.explain(F.scaled_dot_product_attention, q, k, v)
        assert [d.op for d in report.decisions] == [FWD_OP["cudnn"]] and "not routed" in report.decisions[0].reason
        with _reaching("efficient"), all_thread_decisions() as decisions:
            out = F.scaled_dot_product_attention(q, k, v)
        assert [(d.op, d.impl) for d in decisions] == [(FWD_OP["efficient"], REROUTE)], decisions
    ref = _reference(q, k, v, False)[0]
    assert _rel(out, ref) < 1e-2


def test_tuner_measures_valid_entries():
    measure = tuner.GpuMeasure(quick=True)
    workloads = (tuner.Workload("bf16", 128, True, False, 512, 512), tuner.Workload("fp16", 512, False, True, 1, 1024))
    for w in workloads:
        entries = measure(w)
        assert [e["direction"] for e in entries] == ["fwd", "bwd"]
        for e in entries:
            assert database.validate_entry(e) is None, e
            if w.head_dim == 512 and w.gqa and e["direction"] == "bwd":
                # no stock fused backward runs head dim 512 with GQA (the efficient kernel takes no
                # GQA): PyTorch's math path; tilefly's two head-dim-512 backwards are timed alone
                assert e["default"] == "math" and set(e["times_us"]) == {"tilefly_fa/bwd512",
                                                                         "tilefly_fa/bwd512g"}, e
                continue
            assert e["times_us"], f"nothing was measured: {e}"
            if e["default"] in database.BACKENDS:
                assert e["default"] in e["times_us"], e
            assert not [r for r in e.get("rejected", {}).values() if r.startswith("mismatch")], e
            if w is workloads[0]:  # all three stock backends run bf16 d=128 causal S=512 on an H200
                assert set(database.BACKENDS) <= set(e["times_us"]), e

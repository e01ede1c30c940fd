"""Attention routing on the H200 with PyTorch's real kernels: rerouted workloads give the
stock results (against a float64 reference) eagerly and compiled, forward and backward;
masks, dropout and FP32 still reach PyTorch's kernels; no database changes nothing;
outputs have the meta kernels' layouts; the tuner's measurement produces valid entries."""
import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import tilefly.ops.attention  # noqa: F401 - registers the routes
from tilefly import _dispatch, config
from tilefly.ops.attention import backends, database, eager, formats, tuner
from attention_standins import db_entry, write_db

pytestmark = pytest.mark.cuda

SDP = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
       "efficient": SDPBackend.EFFICIENT_ATTENTION}
OPS = {b: getattr(torch.ops.aten, f"_scaled_dot_product_{b}_attention") for b in SDP}


@pytest.fixture
def routed(tmp_path):
    database.reload()
    config.attention_db = str(tmp_path / "absent.json")
    _dispatch.install(["attention"])
    yield
    _dispatch.uninstall(["attention"])
    database.reload()


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


def _run(fn, q, k, v, causal, w):
    for t in (q, k, v):
        t.grad = None
    out = fn(q, k, v)
    (out.double() * w).sum().backward()
    return out, (q.grad, k.grad, v.grad)


def _sdpa(backend, causal, scale=None, compiled=False):
    def f(a, b, c):
        return F.scaled_dot_product_attention(a, b, c, is_causal=causal, scale=scale,
                                              enable_gqa=a.shape[1] != b.shape[1])
    if compiled:
        torch._dynamo.reset()
        f = torch.compile(f)

    def call(a, b, c):
        with sdpa_kernel([SDP[backend]]):
            return f(a, b, c)
    return call


def test_stock_lse_conventions_agree():
    """The canonical log-sum-exp every conversion relies on: all three stock kernels store the same."""
    q, k, v = _qkv(grad=False)
    _, _, _, ref_lse = _reference(q, k, v, causal=True)
    for name in SDP:
        if tuner.pytorch_pick(q.requires_grad_(), k, v, True, only=name) != name:
            continue
        out, lse = backends.stock(name).forward(q, k, v, True, None, True)
        torch.testing.assert_close(lse.double(), ref_lse, atol=2e-3, rtol=1e-3, msg=f"{name} lse")


def test_real_kernels_return_what_their_meta_kernels_promise():
    q, k, v = _qkv()
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


PAIRS = list(itertools.product(SDP, repeat=3))


@pytest.mark.parametrize("served_as,fwd_impl,bwd_impl", PAIRS)
@pytest.mark.parametrize("causal", [False, True])
def test_rerouted_eager_matches_reference(routed, tmp_path, served_as, fwd_impl, bwd_impl, causal):
    serve_f = {served_as: [fwd_impl]} if fwd_impl != served_as else {}
    serve_b = {served_as: [bwd_impl]} if bwd_impl != served_as else {}
    _use_db(tmp_path, [db_entry("fwd", causal=causal, sq_bin=128, sk_bin=128, serve=serve_f),
                       db_entry("bwd", causal=causal, sq_bin=128, sk_bin=128, serve=serve_b)])
    q, k, v = _qkv(sq=200, sk=200)
    ref, w, ref_grads, _ = _reference(q, k, v, causal, scale=0.2)
    with _dispatch.recording() as decisions:
        out, grads = _run(_sdpa(served_as, causal, scale=0.2), q, k, v, causal, w)
    served = {d.op.split("_attention")[-1]: d.impl for d in decisions}
    assert served == {"": None if fwd_impl == served_as else "sdpa_reroute",
                      "_backward": None if bwd_impl == served_as else "sdpa_reroute"}, decisions
    assert _rel(out, ref) < 1e-2
    for name, got, want in zip("qkv", grads, ref_grads):
        assert _rel(got, want) < 2e-2, f"d{name}"


@pytest.mark.parametrize("served_as,target", [("cudnn", "flash"), ("flash", "cudnn")])
def test_rerouted_gqa(routed, tmp_path, served_as, target):
    _use_db(tmp_path, [db_entry(d, dtype="fp16", head_dim=128, causal=True, gqa=True, sq_bin=128, sk_bin=128,
                                serve={served_as: [target]}) for d in ("fwd", "bwd")])
    q, k, v = _qkv(hq=8, hk=2, sq=300, sk=300, d=128, dtype=torch.float16)
    ref, w, ref_grads, _ = _reference(q, k, v, True)
    with _dispatch.recording() as decisions:
        out, grads = _run(_sdpa(served_as, True), q, k, v, True, w)
    assert [d.impl for d in decisions] == ["sdpa_reroute", "sdpa_reroute"]
    assert _rel(out, ref) < 1e-2 and all(_rel(g, r) < 2e-2 for g, r in zip(grads, ref_grads))


@pytest.mark.parametrize("served_as,target", [("efficient", "cudnn"), ("cudnn", "flash"), ("flash", "efficient")])
def test_rerouted_compiled_matches_reference(routed, tmp_path, served_as, target):
    _use_db(tmp_path, [db_entry(d, sq_bin=128, sk_bin=128, serve={served_as: [target]}) for d in ("fwd", "bwd")])
    q, k, v = _qkv(sq=256, sk=256)
    ref, w, ref_grads, _ = _reference(q, k, v, False)
    with _dispatch.recording() as decisions:
        out, grads = _run(_sdpa(served_as, False, compiled=True), q, k, v, False, w)
    assert [d.impl for d in decisions] == ["sdpa_reroute", "sdpa_reroute"], decisions
    assert _rel(out, ref) < 1e-2 and all(_rel(g, r) < 2e-2 for g, r in zip(grads, ref_grads))


@pytest.mark.parametrize("served_as", list(SDP))
def test_rerouted_outputs_have_meta_layouts(routed, tmp_path, served_as):
    others = [b for b in SDP if b != served_as]
    _use_db(tmp_path, [db_entry("fwd", sq_bin=128, sk_bin=128, serve={served_as: [o]}) for o in others[:1]])
    q, k, v = _qkv(sq=130, sk=130)
    route = eager.BackendOp(served_as, "fwd")
    args, kwargs = route.spec.build(dict(query=q, key=k, value=v, attn_bias=None, compute_log_sumexp=True,
                                         is_causal=False))
    with torch.no_grad():
        outs = route.spec.overload(*args, **kwargs)
    metas = route.spec.template(args, kwargs)
    for got, slot in zip(outs, metas):
        if isinstance(slot, formats.TensorSlot):
            assert (tuple(got.shape), got.stride(), got.dtype) == (slot.shape, slot.stride, slot.dtype)
        else:
            assert got == slot


@pytest.mark.parametrize("case", ["mask", "dropout", "fp32"])
def test_masks_dropout_fp32_reach_pytorch(routed, tmp_path, case):
    _use_db(tmp_path, [db_entry(d, dtype=dt, sq_bin=128, sk_bin=128, serve={b: [o for o in SDP if o != b]
                                                                            for b in SDP})
                       for d in ("fwd", "bwd") for dt in ("bf16", "fp16")])
    q, k, v = _qkv(dtype=torch.float32 if case == "fp32" else torch.bfloat16, grad=False)
    mask = torch.rand(256, 256, device="cuda") > 0.3 if case == "mask" else None
    with _dispatch.recording() as decisions:
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.3 if case == "dropout" else 0.0)
    assert decisions, "the call reached a fused backend op"
    assert all(d.impl is None for d in decisions), decisions
    if case != "dropout":
        with_tilefly = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        _dispatch.uninstall(["attention"])
        assert torch.equal(with_tilefly, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


@pytest.mark.parametrize("d,causal", [(64, True), (128, False), (256, True), (512, False)])
def test_no_database_gives_identical_results(routed, d, causal):
    q, k, v = _qkv(d=d, sq=512, sk=512)
    w = torch.randn(2, 4, 512, d, device="cuda", dtype=torch.float64)
    out1, g1 = _run(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=causal), q, k, v, causal, w)
    g1 = [g.clone() for g in g1]
    _dispatch.uninstall(["attention"])
    out2, g2 = _run(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=causal), q, k, v, causal, w)
    assert torch.equal(out1, out2) and all(torch.equal(a, b) for a, b in zip(g1, g2))


def test_tuner_measures_valid_entries():
    measure = tuner.GpuMeasure(quick=True)
    for w in (tuner.Workload("bf16", 128, True, False, 512, 512), tuner.Workload("fp16", 512, False, True, 1, 1024)):
        entries = measure(w)
        assert [e["direction"] for e in entries] == ["fwd", "bwd"]
        for e in entries:
            assert database.validate_entry(e) is None, e
            if e["default"] in database.BACKENDS:
                assert e["default"] in e["times_us"], e
            assert not [r for r in e.get("rejected", {}).values() if r.startswith("mismatch")], e

"""The attention routing proven on CPU: the real router, predicates, database and output
packing, installed on the CPU key over stand-in kernels with the real kernels' formats
(attention_standins.py). Calls go straight to the backend ops, as SDPA's C++ would."""
import itertools
import threading

import pytest
import torch

from tilefly import _device, _dispatch, config
from tilefly.ops.attention import backends, database, eager
from attention_standins import StandIns, all_thread_decisions, db_entry, reference, write_db

FAMILY = "attention_cpu_test"
OPS = {b: getattr(torch.ops.aten, f"_scaled_dot_product_{b}_attention") for b in ("cudnn", "flash", "efficient")}


@pytest.fixture
def routed(monkeypatch, tmp_path):
    """Stand-in kernels on CPU, tilefly's attention routes installed over them; yields the call log."""
    standins = StandIns()
    monkeypatch.setattr(_device, "hopper_reason", lambda t: None)
    monkeypatch.setattr(backends.TILEFLY_FA, "unavailable", lambda: backends.TileflyFA.NOT_BUILT)
    backends.forget_originals()
    database.reload()
    for impl in eager.impls("CPU", family=FAMILY):
        _dispatch.register(impl)
    _dispatch.install([FAMILY])
    config.attention_db = str(tmp_path / "absent.json")
    yield standins.log
    _dispatch.uninstall([FAMILY])
    _dispatch._registry.pop(FAMILY, None)
    standins.close()
    backends.forget_originals()
    database.reload()


def _qkv(b=2, hq=4, hk=4, sq=40, sk=40, d=64, dtype=torch.bfloat16, grad=True):
    torch.manual_seed(0)
    q = torch.randn(b, hq, sq, d, dtype=dtype)
    k = torch.randn(b, hk, sk, d, dtype=dtype)
    v = torch.randn(b, hk, sk, d, dtype=dtype)
    return [t.requires_grad_(grad) for t in (q, k, v)]


def _call(backend, q, k, v, causal=False, scale=None, **extra):
    if backend == "flash":
        return OPS[backend](q, k, v, extra.get("dropout_p", 0.0), causal, scale=scale)
    return OPS[backend](q, k, v, extra.get("attn_bias"), q.requires_grad, extra.get("dropout_p", 0.0), causal,
                        scale=scale)


def _check_against_reference(backend, q, k, v, causal=False, scale=None):
    outs = _call(backend, q, k, v, causal, scale)
    out = outs[0]
    grad = torch.randn_like(out)
    (out.float() * grad.float()).sum().backward()
    ref_q, ref_k, ref_v = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref_out, ref_lse = reference(ref_q, ref_k, ref_v, causal, scale)
    (ref_out * grad.double()).sum().backward()
    tol = dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(out.double(), ref_out.detach(), **tol)
    for name, got, ref in (("dq", q.grad, ref_q.grad), ("dk", k.grad, ref_k.grad), ("dv", v.grad, ref_v.grad)):
        err = ((got.double() - ref).norm() / ref.norm()).item()
        assert err < 1e-2, f"{name}: relative error {err:.2e}"  # BF16 saved output: ~3e-3
    return outs


def _meta_outputs(backend, q, k, v, causal=False, scale=None):
    m = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta") for t in (q, k, v)]
    if backend == "flash":
        return OPS[backend](*m, 0.0, causal, scale=scale)
    return OPS[backend](*m, None, q.requires_grad, 0.0, causal, scale=scale)


def _assert_like_meta(outs, metas):
    assert len(outs) == len(metas)
    for got, want in zip(outs, metas):
        if isinstance(want, torch.Tensor):
            assert isinstance(got, torch.Tensor)
            assert (got.shape, got.stride(), got.dtype) == (want.shape, want.stride(), want.dtype)
        else:
            assert got == want


def test_without_database_every_call_reaches_the_stock_kernel(routed):
    q, k, v = _qkv()
    _check_against_reference("cudnn", q, k, v, causal=True)
    assert routed == ["cudnn", "cudnn_bwd"]


PAIRS = [(x, f, b) for x, f, b in itertools.product(("cudnn", "flash", "efficient"), repeat=3)]


@pytest.mark.parametrize("served_as,fwd_impl,bwd_impl", PAIRS)
def test_rerouted_forward_and_backward_match_the_reference(routed, tmp_path, served_as, fwd_impl, bwd_impl):
    """Every combination: op X reached, forward by implementation F, backward by B. B consumes F's
    saved output and log-sum-exp converted through X's format: any mismatch shows in the gradients."""
    serve_f = {served_as: [fwd_impl]} if fwd_impl != served_as else {}
    serve_b = {served_as: [bwd_impl]} if bwd_impl != served_as else {}
    config.attention_db = write_db(tmp_path / "db.json", [
        db_entry("fwd", sq_bin=32, sk_bin=32, serve=serve_f), db_entry("bwd", sq_bin=32, sk_bin=32, serve=serve_b)])
    q, k, v = _qkv(sq=40, sk=40)
    outs = _check_against_reference(served_as, q, k, v, scale=0.3)
    assert routed == [fwd_impl, f"{bwd_impl}_bwd"]
    _assert_like_meta(outs, _meta_outputs(served_as, q, k, v, scale=0.3))


@pytest.mark.parametrize("served_as", ["cudnn", "flash"])
def test_gqa_causal_and_unequal_lengths(routed, tmp_path, served_as):
    # causal with Sq != Sk: only cuDNN and efficient take it as targets; GQA: never efficient.
    target = {"cudnn": "flash", "flash": "cudnn"}[served_as]
    config.attention_db = write_db(tmp_path / "db.json", [
        db_entry(d, causal=True, gqa=True, sq_bin=16, sk_bin=16, serve={served_as: [target]}) for d in ("fwd", "bwd")])
    q, k, v = _qkv(hq=4, hk=2, sq=24, sk=24)
    _check_against_reference(served_as, q, k, v, causal=True)
    assert routed == [target, f"{target}_bwd"]


def test_refused_target_keeps_the_op_kernel_with_reasons(routed, tmp_path):
    config.attention_db = write_db(tmp_path / "db.json", [
        db_entry("fwd", causal=True, sq_bin=16, sk_bin=32, serve={"cudnn": ["flash", "efficient"]})])
    q, k, v = _qkv(sq=20, sk=40, grad=False)
    with _dispatch.recording() as decisions:
        _call("cudnn", q, k, v, causal=True)
    assert routed == ["efficient"], "flash refuses causal Sq != Sk; the next candidate serves"
    q, k, v = _qkv(hq=4, hk=2, sq=20, sk=40, grad=False)
    config.attention_db = write_db(tmp_path / "db2.json", [
        db_entry("fwd", causal=True, gqa=True, sq_bin=16, sk_bin=32, serve={"cudnn": ["flash", "efficient"]})])
    database.reload()
    with _dispatch.recording() as decisions:
        _call("cudnn", q, k, v, causal=True)
    assert routed[-1] == "cudnn"
    reason = decisions[0].reason
    assert "flash: flash is not rerouted to for causal attention with Sq != Sk" in reason
    assert "efficient: efficient is not rerouted to for grouped-query attention" in reason


def test_decisions_are_recorded_from_every_thread(routed, tmp_path):
    """CUDA backward runs on autograd's device thread, so the GPU tests record with
    all_thread_decisions: it must see a call made in another thread as well as this thread's."""
    config.attention_db = write_db(tmp_path / "db.json", [
        db_entry("fwd", sq_bin=32, sk_bin=32, serve={"cudnn": ["flash"]})])
    q, k, v = _qkv(grad=False)
    with all_thread_decisions() as decisions:
        worker = threading.Thread(target=_call, args=("cudnn", q, k, v))
        worker.start()
        worker.join()
        _call("efficient", q, k, v)
    assert [(d.op, d.impl) for d in decisions] == [("aten::_scaled_dot_product_cudnn_attention", "sdpa_reroute"),
                                                   ("aten::_scaled_dot_product_efficient_attention", None)]
    assert routed == ["flash", "efficient"]


@pytest.mark.parametrize("case", ["mask", "dropout", "fp32", "debug"])
def test_masks_dropout_fp32_reach_the_stock_kernel(routed, tmp_path, case):
    config.attention_db = write_db(tmp_path / "db.json", [
        db_entry(d, dtype=dt, sq_bin=16, sk_bin=16, serve={"cudnn": ["flash"]})
        for d in ("fwd", "bwd") for dt in ("bf16", "fp16")])
    q, k, v = _qkv(sq=16, sk=16, dtype=torch.float32 if case == "fp32" else torch.bfloat16, grad=False)
    with _dispatch.recording() as decisions:
        if case == "mask":
            OPS["cudnn"](q, k, v, torch.zeros(16, 16, dtype=q.dtype), False)
        elif case == "dropout":
            OPS["cudnn"](q, k, v, None, False, 0.25)
        elif case == "debug":
            OPS["cudnn"](q, k, v, None, False, 0.0, False, True)
        else:
            OPS["cudnn"](q, k, v, None, False)
    assert routed == ["cudnn"]
    expected = {"mask": "attention mask given", "dropout": "dropout_p > 0", "fp32": "dtype torch.float32",
                "debug": "debug attention mask"}[case]
    assert decisions[0].impl is None and expected in decisions[0].reason
    assert "tilefly_fa: tilefly attention kernels not built yet" in decisions[0].reason


def test_inference_forward_returns_what_the_meta_kernel_promises(routed, tmp_path):
    config.attention_db = write_db(tmp_path / "db.json", [
        db_entry("fwd", sq_bin=32, sk_bin=32, serve={"efficient": ["cudnn"], "cudnn": ["efficient"]})])
    q, k, v = _qkv(sq=33, sk=47, grad=False)
    for backend in ("efficient", "cudnn"):
        outs = _call(backend, q, k, v)
        _assert_like_meta(outs, _meta_outputs(backend, q, k, v))
        torch.testing.assert_close(outs[0].double(), reference(q, k, v)[0], atol=2e-2, rtol=2e-2)
    assert routed == ["cudnn", "efficient"]


def test_transposed_inputs_keep_their_layout(routed, tmp_path):
    """q, k, v that are B x S x H x D in memory (the usual projection layout): outputs follow the meta kernel."""
    config.attention_db = write_db(tmp_path / "db.json", [
        db_entry(d, sq_bin=32, sk_bin=32, serve={"cudnn": ["efficient"]}) for d in ("fwd", "bwd")])
    q, k, v = (t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for t in _qkv(sq=48, sk=48))
    outs = _check_against_reference("cudnn", q, k, v)
    _assert_like_meta(outs, _meta_outputs("cudnn", q, k, v))
    assert routed == ["efficient", "efficient_bwd"]


def test_compiled_graph_reaches_the_routes(routed, tmp_path):
    config.attention_db = write_db(tmp_path / "db.json", [
        db_entry(d, sq_bin=32, sk_bin=32, serve={"efficient": ["flash"]}) for d in ("fwd", "bwd")])
    torch._dynamo.reset()
    q, k, v = _qkv(sq=32, sk=32)
    f = torch.compile(lambda a, b, c: OPS["efficient"](a, b, c, None, True)[0] * 2, backend="aot_eager")
    out = f(q, k, v)
    out.sum().backward()
    torch.testing.assert_close(out.double(), 2 * reference(q, k, v)[0], atol=4e-2, rtol=2e-2)
    assert routed == ["flash", "flash_bwd"]
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_inductor_compiled_graph_gets_meta_layouts(routed, tmp_path):
    """Inductor asserts the sizes and strides of fallback outputs (the efficient op's B x S x H x D
    output, its dq/dk/dv): rerouted calls must pass those asserts, forward and backward."""
    config.attention_db = write_db(tmp_path / "db.json", [
        db_entry(d, sq_bin=32, sk_bin=32, serve={"efficient": ["cudnn"]}) for d in ("fwd", "bwd")])
    torch._dynamo.reset()
    q, k, v = _qkv(sq=40, sk=40)
    f = torch.compile(lambda a, b, c: OPS["efficient"](a, b, c, None, True)[0].float().sin(), backend="inductor")
    out = f(q, k, v)
    out.sum().backward()
    ref_q, ref_k, ref_v = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = reference(ref_q, ref_k, ref_v)[0].sin()
    ref.sum().backward()
    torch.testing.assert_close(out.double(), ref.detach(), atol=2e-2, rtol=2e-2)
    err = ((q.grad.double() - ref_q.grad).norm() / ref_q.grad.norm()).item()
    assert err < 1e-2
    assert routed == ["cudnn", "cudnn_bwd"]


def test_a_tilefly_kernel_module_plugs_into_the_slot(routed, tmp_path, monkeypatch):
    """What the Gluon kernels will provide (backends.TileflyFA): served forward and backward for
    any op, its saved tensors converted through that op's formats, outputs as the meta kernels say."""
    from attention_standins import _grads

    calls, written = [], []

    class Kernels:
        CONFIGS = ("m128n128",)

        @staticmethod
        def unsupported(q, k, v, causal, direction):
            return None

        @staticmethod
        def forward(q, k, v, causal, scale, need_lse, config, out=None):
            calls.append(("fwd", config))
            result, lse = reference(q, k, v, causal, scale)
            written.append(out is not None)
            if out is None:
                out = torch.empty_like(q)
            out.copy_(result)
            return out, lse.float() if need_lse else None

        @staticmethod
        def backward(grad_out, q, k, v, out, lse, causal, scale, config):
            calls.append(("bwd", config))
            assert lse.shape == q.shape[:3]
            return tuple(g.to(q.dtype) for g in _grads(grad_out, q, k, v, out, lse, causal, scale))

    monkeypatch.setattr(backends.TileflyFA, "_load", staticmethod(lambda: (Kernels, None)))
    for served_as in ("cudnn", "flash", "efficient"):
        config.attention_db = write_db(tmp_path / f"{served_as}.json", [
            db_entry(d, causal=True, sq_bin=32, sk_bin=32, serve={served_as: ["tilefly_fa/m128n128"]})
            for d in ("fwd", "bwd")])
        database.reload()
        q, k, v = _qkv(sq=45, sk=45)
        outs = _check_against_reference(served_as, q, k, v, causal=True)
        _assert_like_meta(outs, _meta_outputs(served_as, q, k, v, causal=True))
    assert calls == [("fwd", "m128n128"), ("bwd", "m128n128")] * 3 and routed == []
    assert written == [True] * 3     # each forward wrote straight into the op's own output layout


def _decode_stand_in(calls):
    """decode.run's contract through its float64 reference (the kernel itself runs in
    the interpreter checks)."""
    import math

    from tilefly.ops.attention import decode

    def fake(q, k, v, bias=None, scale=None, splits=None):
        calls.append((tuple(q.shape), None if bias is None else tuple(bias.shape)))
        out, lse = decode._reference(q, k, v, bias, scale or 1 / math.sqrt(q.shape[-1]))
        return out.to(q.dtype), lse.float()
    return fake


@pytest.mark.parametrize("backend", ["cudnn", "efficient"])
def test_masked_decode_is_served_under_the_option(routed, monkeypatch, backend):
    from tilefly.ops.attention import decode

    calls = []
    monkeypatch.setattr(decode, "run", _decode_stand_in(calls))
    monkeypatch.setattr(config, "attention_decode", "on")
    _dispatch.uninstall([FAMILY])
    _dispatch.install([FAMILY])                    # the decode entry is installed with the option on
    q, k, v = _qkv(b=3, hq=8, hk=2, sq=4, sk=100, grad=False)
    bias = torch.zeros(3, 1, 1, 100, dtype=q.dtype)
    bias[1, ..., 60:] = float("-inf")
    with _dispatch.recording() as decisions:
        outs = _call(backend, q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1), attn_bias=bias) \
            if backend == "efficient" else _call(backend, q, k, v, attn_bias=bias)
    assert decisions[0].impl == eager.DECODE and routed == [] and len(calls) == 1
    _assert_like_meta(outs, _meta_outputs(backend, q, *((k.repeat_interleave(4, 1), v.repeat_interleave(4, 1))
                                                       if backend == "efficient" else (k, v))))
    ref_k, ref_v = k.double().repeat_interleave(4, 1), v.double().repeat_interleave(4, 1)
    logits = q.double() @ ref_k.transpose(-1, -2) / 8 + bias.double()
    torch.testing.assert_close(outs[0].double(), torch.softmax(logits, -1) @ ref_v, atol=2e-2, rtol=2e-2)

    with _dispatch.recording() as decisions:       # 40 query rows: not a decode; the op's kernel keeps it
        q40 = _qkv(b=1, hq=2, hk=2, sq=40, sk=40, grad=False)
        _call(backend, *q40, attn_bias=torch.zeros(1, 1, 40, 40, dtype=q.dtype))
    assert decisions[0].impl is None and "1..16 query rows" in decisions[0].reason and routed == [backend]


def test_masked_decode_follows_the_decode_database_under_auto(routed, monkeypatch):
    from tilefly.ops.attention import decode, decode_tuning

    calls, asked = [], []
    monkeypatch.setattr(decode, "run", _decode_stand_in(calls))
    monkeypatch.setattr(decode_tuning, "install_reason", lambda device: None)   # a database that wins somewhere
    verdicts = {64: None, 256: "decode tuning database: 30.0 us against SDPA's 25.0"}
    monkeypatch.setattr(decode_tuning, "verdict",
                        lambda device, programs, keys, rows, head_dim:
                        asked.append((programs, keys, rows, head_dim)) or verdicts[keys])
    monkeypatch.setattr(config, "attention_decode", "auto")
    _dispatch.uninstall([FAMILY])
    _dispatch.install([FAMILY])
    q, k, v = _qkv(b=2, hq=2, hk=2, sq=1, sk=64, grad=False)
    with _dispatch.recording() as decisions:
        _call("cudnn", q, k, v, attn_bias=torch.zeros(2, 1, 1, 64, dtype=q.dtype))
    assert decisions[0].impl == eager.DECODE and len(calls) == 1 and asked == [(4, 64, 1, q.shape[3])]
    q, k, v = _qkv(b=2, hq=2, hk=2, sq=1, sk=256, grad=False)
    with _dispatch.recording() as decisions:
        _call("cudnn", q, k, v, attn_bias=torch.zeros(2, 1, 1, 256, dtype=q.dtype))
    assert decisions[0].impl is None and len(calls) == 1 and routed == ["cudnn"]
    assert "tilefly_decode: attention mask given; decode: decode tuning database: 30.0 us" in decisions[0].reason


def test_masked_decode_stays_with_the_op_when_the_option_is_off(routed, monkeypatch):
    from tilefly.ops.attention import decode

    calls = []
    monkeypatch.setattr(decode, "run", _decode_stand_in(calls))
    monkeypatch.setattr(config, "attention_decode", "off")
    q, k, v = _qkv(b=2, hq=2, hk=2, sq=1, sk=64, grad=False)
    with _dispatch.recording() as decisions:
        _call("cudnn", q, k, v, attn_bias=torch.zeros(2, 1, 1, 64, dtype=q.dtype))
    assert calls == [] and routed == ["cudnn"] and "attention mask given" in decisions[0].reason

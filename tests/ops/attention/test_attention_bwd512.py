"""tilefly's head-dim-512 attention backward (kernels_bwd512: cuBLAS batched GEMMs around one Triton
kernel): on CPU, how kernels.py routes d512 backward and its config, the chunking arithmetic, the
launcher's argument checks, its kernels compiled for sm_90a and the whole backward under the Triton
interpreter; on the H200, dq, dk and dv against float64 (causal and not, Sq != Sk, GQA, tails,
scale, FP16, strided layouts, chunked workspaces, NaN) and through F.scaled_dot_product_attention."""
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from tilefly import _device, _dispatch, config  # noqa: E402
from tilefly.ops.attention import configs, database, kernels, kernels_bwd512  # noqa: E402
from attention_standins import (LENGTHS, all_thread_decisions, assert_compiles_without_spills,  # noqa: E402
                                cuda_inputs, db_entry, write_db)
from test_attention_bwd import _assert_grads_close, _check, _reference_grads  # noqa: E402

BF16 = torch.bfloat16
D = 512


@pytest.fixture
def hopper(monkeypatch):
    monkeypatch.setattr(_device, "hopper_reason", lambda t: None)


def _cpu(b=1, hq=2, hk=2, sq=8, sk=8):
    return (torch.randn(b, hq, sq, D, dtype=BF16), torch.randn(b, hk, sk, D, dtype=BF16),
            torch.randn(b, hk, sk, D, dtype=BF16))


# ---- CPU: routing and configs ----------------------------------------------------------------

@pytest.mark.parametrize("hq,hk,sq,sk,causal", [(2, 2, 8, 8, False), (8, 2, 17, 40, True), (4, 1, 100, 3, False)])
def test_head_dim_512_backward_is_served(hopper, hq, hk, sq, sk, causal):
    for direction in ("bwd", "backward"):
        assert kernels.unsupported(*_cpu(2, hq, hk, sq, sk), causal, direction) is None


def test_bwd512_and_bwd512g_are_the_configs_of_head_dim_512_backward():
    assert configs.BWD512_CONFIG_NAMES == ("bwd512", "bwd512g")
    assert kernels.configs_for("bwd", 512) == kernels.configs_for("backward", 512) == ("bwd512", "bwd512g")
    assert "bwd512" in kernels.CONFIGS and "bwd512" in kernels.configs_for("bwd")
    assert "bwd512" not in kernels.configs_for("fwd") and "bwd512" not in kernels.configs_for("fwd", 512)
    for d in configs.HEAD_DIMS:
        assert "bwd512" not in kernels.configs_for("bwd", d)
    with pytest.raises(ValueError, match="head dim 512 only"):
        kernels.config_for("bwd512", 64, 1000)
    with pytest.raises(ValueError, match="head dim 512 only"):
        kernels.bwd_config_for("bwd512", 64, 1000)


def test_backward_dispatches_head_dim_512(monkeypatch):
    calls = []
    monkeypatch.setattr(kernels_bwd512, "backward512", lambda *a, **kw: calls.append((a, kw)) or "grads")
    q, k, v = _cpu()
    lse = torch.zeros(1, 2, 8)
    for cfg in (None, "bwd512"):
        assert kernels.backward(q, q, k, v, q, lse, True, 0.5, cfg) == "grads"
    assert [(a[6], a[7], kw["grads"]) for a, kw in calls] == [(True, 0.5, None)] * 2
    for cfg in ("bwd64x64", "d512n64p", "m128n64"):
        with pytest.raises(ValueError, match="not a head dim 512 backward config"):
            kernels.backward(q, q, k, v, q, lse, True, None, cfg)


@pytest.mark.parametrize("name", ["bwd512", "bwd512g"])
def test_forward_takes_bwd512_as_its_default(monkeypatch, name):
    """The tuner times a head-dim-512 backward after a forward called with the same config name."""
    from tilefly.ops.attention import kernels_fwd512

    seen = []
    monkeypatch.setattr(kernels_fwd512, "forward512", lambda *a, **kw: seen.append(a[6]) or ("out", "lse"))
    q, k, v = _cpu()
    assert kernels.forward(q, k, v, False, None, True, name) == ("out", "lse")
    assert seen == [None]


def test_chunking_keeps_the_workspace_under_its_bound():
    per_score = kernels_bwd512.BYTES_PER_SCORE
    assert per_score == 12
    # B=4, H=8, S=2048: all 32 groups in one chunk (1.5 GiB).
    assert kernels_bwd512.chunking(32, 2048, 2048) == (32, 2048)
    # Whole groups per chunk, as many as fit.
    assert kernels_bwd512.chunking(64, 2 * 4096, 4096) == (5, 2 * 4096)   # 384 MiB a group
    # One group too big: its rows split in BLOCK_R multiples.
    groups, rows = kernels_bwd512.chunking(8, 4 * 16384, 16384)
    assert groups == 1 and rows % kernels_bwd512.BLOCK_R == 0 and rows * 16384 * per_score <= 2 << 30
    assert kernels_bwd512.chunking(3, 100, 20, workspace_bytes=40 * 20 * per_score) == (1, 32)
    assert kernels_bwd512.chunking(3, 100, 20, workspace_bytes=5 * 20 * per_score) == (1, 5)
    assert kernels_bwd512.chunking(3, 100, 20, workspace_bytes=1) == (1, 1)


def test_backward512_checks_its_arguments():
    q, k, v = _cpu()
    lse = torch.zeros(1, 2, 8)
    with pytest.raises(ValueError, match="shaped like q"):
        kernels_bwd512.backward512(q[:, :, :4], q, k, v, q, lse, False, None)
    with pytest.raises(ValueError, match="lse must be"):
        kernels_bwd512.backward512(q, q, k, v, q, lse[..., :4], False, None)
    with pytest.raises(ValueError, match="cannot take this gradient"):
        kernels_bwd512.backward512(q, q, k, v, q, lse, False, None, grads=(q, k, v[..., :8]))
    small = torch.randn(1, 2, 8, 64, dtype=BF16)
    with pytest.raises(ValueError, match="head dim 512"):
        kernels_bwd512.backward512(small, small, small, small, small, lse, False, None)


def test_causal_edges():
    assert kernels_bwd512.causal_edges(2048, 2048) == list(range(0, 2049, 256))
    assert kernels_bwd512.causal_edges(4096, 4096) == list(range(0, 4097, 512))
    assert kernels_bwd512.causal_edges(530, 700) == [0, 320, 530]
    assert kernels_bwd512.causal_edges(511, 511) is None and kernels_bwd512.causal_edges(4096, 64) is None
    for sq, sk in ((1000, 1000), (777, 5000), (3000, 100), (16384, 16384)):
        edges = kernels_bwd512.causal_edges(sq, sk)
        assert edges[0] == 0 and edges[-1] == sq and edges == sorted(set(edges))
        assert all(e % 64 == 0 for e in edges[:-1]) and len(edges) - 1 <= kernels_bwd512.CAUSAL_BLOCKS


# ---- CPU: compile and interpret ----------------------------------------------------------------

def test_kernels_compile_for_sm90a_without_spills():
    specs = kernels_bwd512.compile_specs()
    assert len(specs) == 6 and len({s.name for s in specs}) == 6
    for spec in specs:
        assert_compiles_without_spills(spec)


def test_softmax_grad_loads_16_byte_vectors():
    """Tiles off the causal diagonal load S and dP 16 bytes at a time (the kernel is memory bound)."""
    from tilefly.compile_check import _compile

    for spec in kernels_bwd512.compile_specs()[:4]:
        ptx = _compile(spec).asm["ptx"]
        assert "ld.global.v4.b32" in ptx and "st.global.v4.b32" in ptx, spec.name


def test_whole_backward_under_the_interpreter():
    """Delta and softmax_grad kernels interpreted, the GEMMs on FP32 copies, against float64."""
    code = ("from tilefly._interpreter import numpy_compat; numpy_compat()\n"
            "from tilefly.ops.attention import kernels_bwd512 as m\n"
            "for name, fn in m.interpreter_checks():\n"
            "    fn(); print('ok', name, flush=True)\n")
    proc = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, TRITON_INTERPRET="1"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("ok ") == len(kernels_bwd512.interpreter_checks()) == 6, proc.stdout


# ---- GPU: gradients against float64 ------------------------------------------------------------

BOTH = ["bwd512", "bwd512g"]     # bwd512g is the default where served (kernels.backward)

@pytest.mark.cuda
@pytest.mark.parametrize("sq,sk", LENGTHS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b,h", [(1, 1), (3, 5)])
@pytest.mark.parametrize("config", BOTH)
def test_backward512_matches_float64(b, h, causal, sq, sk, config):
    _check(*cuda_inputs(b, h, h, sq, sk, D), causal, config=config)


@pytest.mark.cuda
def test_scores_come_from_bmm_with_fp32_output():
    """torch's aten::bmm.dtype writes FP32 scores from BF16 operands straight into the workspace
    (else the backward still works, from FP32 operand copies, several times slower)."""
    q, k, v = cuda_inputs(1, 2, 2, 64, 64, D)
    out, lse = kernels.forward(q, k, v, False, None, True)
    kernels.backward(torch.randn_like(q), q, k, v, out, lse, False, None, "bwd512")
    assert kernels_bwd512._score_path == "out" and kernels_bwd512.fallback_reason is None, \
        kernels_bwd512.fallback_reason


@pytest.mark.cuda
@pytest.mark.parametrize("sq,sk", [(333, 333), (77, 1000), (1000, 17)])
@pytest.mark.parametrize("hq,hk", [(4, 2), (8, 1)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("config", BOTH)
def test_grouped_query_attention(hq, hk, causal, sq, sk, config):
    """dK and dV of a kv head: one GEMM whose inner dimension runs over its G q heads' rows."""
    _check(*cuda_inputs(2, hq, hk, sq, sk, D), causal, config=config)


@pytest.mark.cuda
@pytest.mark.parametrize("b,h,sq,sk", [(2, 3, 1000, 1000), (1, 2, 600, 2000), (2, 2, 1500, 700), (1, 1, 4096, 4096)])
def test_causal_blocks(b, h, sq, sk):
    """Causal without GQA skips the GEMM blocks above the diagonal (kernels_bwd512.causal_edges)."""
    assert kernels_bwd512.causal_edges(sq, sk)
    _check(*cuda_inputs(b, h, h, sq, sk, D), True)


@pytest.mark.cuda
@pytest.mark.parametrize("scale", [0.05, 0.3, 2.0])
@pytest.mark.parametrize("config", BOTH)
def test_scale(scale, config):
    _check(*cuda_inputs(2, 3, 3, 150, 260, D), True, scale=scale, config=config)


@pytest.mark.cuda
@pytest.mark.parametrize("causal", [False, True])
def test_fp16(causal):
    _check(*cuda_inputs(2, 3, 3, 300, 500, D, torch.float16), causal)


@pytest.mark.cuda
def test_bshd_inputs_expanded_grad_out_and_efficient_saved_tensors():
    """B x S x H x D inputs (copied for the GEMMs), the stride-0 gradient of a sum, out as
    B x S x H x D and a padded lse view (the efficient op's); gradients come back like q, k, v."""
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in cuda_inputs(2, 4, 2, 129, 257, D))
    grad_out = torch.randn(1, 1, 1, D, device="cuda", dtype=BF16).expand(q.shape)
    _check(q, k, v, True, grad_out=grad_out)
    out, lse = kernels.forward(q, k, v, True, None, True)
    padded = torch.full((2, 4, 160), float("inf"), device="cuda")
    padded[..., :129] = lse
    out_bshd = out.transpose(1, 2).contiguous().transpose(1, 2)
    dq, dk, dv = kernels.backward(grad_out, q, k, v, out_bshd, padded[..., :129], True, None)
    assert dq.stride() == q.stride() and dk.stride() == k.stride() and dv.stride() == v.stride()
    _assert_grads_close((dq, dk, dv), _reference_grads(q, k, v, grad_out.contiguous(), True), BF16)


@pytest.mark.cuda
@pytest.mark.parametrize("hq,hk,sq,sk,causal,groups_per_chunk", [
    (4, 2, 300, 200, False, 1),     # one group a chunk, last chunk full
    (3, 3, 100, 700, True, 2),      # two groups a chunk, last chunk short
    (4, 1, 250, 250, True, 0),      # a group's rows split: dK, dV summed in FP32 across row blocks
])
def test_chunked_workspaces(hq, hk, sq, sk, causal, groups_per_chunk):
    q, k, v = cuda_inputs(3, hq, hk, sq, sk, D)
    group_rows = hq // hk * sq
    per_group = group_rows * sk * kernels_bwd512.BYTES_PER_SCORE
    bound = groups_per_chunk * per_group if groups_per_chunk else per_group // 3
    out, lse = kernels.forward(q, k, v, causal, None, True)
    grad_out = torch.randn_like(q)
    poisoned = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
    got = kernels_bwd512.backward512(grad_out, q, k, v, out, lse, causal, None, grads=poisoned, workspace_bytes=bound)
    assert all(g is p for g, p in zip(got, poisoned))
    _assert_grads_close(got, _reference_grads(q, k, v, grad_out, causal), BF16)


@pytest.mark.cuda
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("config", BOTH)
def test_nan_in_a_query_row(causal, config):
    """A NaN in q row 40 of one (batch, head): NaN exactly where PyTorch's float64 math backward has
    it, except for keys the causal mask hides from row 40. There math's softmax spreads the NaN
    into dV (its masked row is all NaN) and its dS^T Q product puts 0 * NaN into column 7 of dK,
    while a kernel that masks P keeps dV finite and has such NaNs in dK only where it multiplies
    rather than skips the masked score blocks (as PyTorch's fused kernels do). The keys row 40
    sees are NaN in full; other heads and batches stay finite."""
    q, k, v = cuda_inputs(2, 2, 2, 64, 64, D)
    q[0, 1, 40, 7] = float("nan")
    out, lse = kernels.forward(q, k, v, causal, None, True)
    grad_out = torch.randn_like(q)
    got = kernels.backward(grad_out, q, k, v, out, lse, causal, None, config)
    want = _reference_grads(q, k, v, grad_out, causal)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert torch.isfinite(g[1]).all() and torch.isfinite(g[0, 0]).all(), f"{name}: NaN leaked"
        if causal and name in ("dk", "dv"):
            assert g[0, 1, :41].isnan().all() and w[0, 1, :41].isnan().all(), name
            if name == "dv":
                assert torch.isfinite(g[0, 1, 41:]).all()
        else:
            assert g.isnan().any() and torch.equal(g.isnan(), w.isnan()), f"{name}: NaN pattern differs from math"


# ---- GPU: through F.scaled_dot_product_attention -----------------------------------------------

@pytest.fixture
def bwd512_db(tmp_path):
    """A database where tilefly serves head-dim-512 backward (and, with ``forward_too``, the forward
    with d512n64p) on the efficient op; the routes installed."""
    database.reload()
    x = torch.randn(1, 1, 8, 64, device="cuda", dtype=BF16)
    F.scaled_dot_product_attention(x, x, x)   # SDPA fixes its priority order on its first call

    def use(causal, forward_too):
        serve_fwd = {"efficient": ["tilefly_fa/d512n64p"]} if forward_too else {}
        config.attention_db = write_db(tmp_path / f"db_{causal}_{forward_too}.json", [
            db_entry("fwd", head_dim=D, causal=causal, serve=serve_fwd, default="efficient"),
            db_entry("bwd", head_dim=D, causal=causal, serve={"efficient": ["tilefly_fa/bwd512"]},
                     default="efficient")])
        database.reload()
        _dispatch.install(["attention"])

    yield use
    _dispatch.uninstall(["attention"])
    database.reload()


@pytest.mark.cuda
@pytest.mark.parametrize("causal,forward_too", [(False, False), (True, False), (True, True)])
def test_sdpa_autograd_serves_the_backward(bwd512_db, monkeypatch, causal, forward_too):
    """PyTorch reaches the efficient op at head dim 512; its backward is served by bwd512 on the
    efficient forward's saved tensors (B x S x H x D out, padded lse) or on tilefly's forward's."""
    q, k, v = cuda_inputs(2, 4, 4, 200, 200, D)
    grad_out = torch.randn_like(q)
    qs, ks, vs = (t.detach().clone().requires_grad_() for t in (q, k, v))
    F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal).backward(grad_out)   # stock, before the routes
    bwd512_db(causal, forward_too)
    runs = []
    original = kernels_bwd512.backward512
    monkeypatch.setattr(kernels_bwd512, "backward512", lambda *a, **kw: runs.append(1) or original(*a, **kw))
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    with all_thread_decisions() as decisions:
        F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal).backward(grad_out)
    assert [dec.impl for dec in decisions] == [("tilefly_fa" if forward_too else None), "tilefly_fa"], decisions
    assert decisions[1].op.endswith("_efficient_attention_backward") and runs == [1], decisions
    grads = (qg.grad, kg.grad, vg.grad)
    _assert_grads_close(grads, _reference_grads(q, k, v, grad_out, causal), BF16)
    for name, got, stock in zip("qkv", grads, (qs.grad, ks.grad, vs.grad)):
        err = ((got.double() - stock.double()).norm() / stock.double().norm()).item()
        assert err < 2e-2, f"d{name} differs from stock PyTorch's by {err:.3g}"


@pytest.mark.cuda
def test_gemm_backward_is_faster_than_pytorchs():
    """The point of this path (issue 7 wants >= 3x fwd+bwd at d512): at B=4, H=8, S=2048 the GEMM
    backward beats the efficient kernel's backward several times over (loose bound: 3x)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = cuda_inputs(4, 8, 8, 2048, 2048, D)
    grad_out = torch.randn_like(q)
    out, lse = kernels.forward(q, k, v, False, None, True)
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        ref = F.scaled_dot_product_attention(qg, kg, vg)

    def ms(fn, reps=5):
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / reps

    ours = ms(lambda: kernels.backward(grad_out, q, k, v, out, lse, False, None))
    stock = ms(lambda: torch.autograd.grad(ref, (qg, kg, vg), grad_out, retain_graph=True))
    assert ours * 3 < stock, f"bwd512 {ours:.2f} ms, efficient backward {stock:.2f} ms"
    assert math.isfinite(ours)

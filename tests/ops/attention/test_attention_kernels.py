"""tilefly's flash-attention forward kernel (tilefly.ops.attention.kernels): on CPU, what it
refuses and why, its configs and a compile of a few of them for sm_90a (the full set runs in
tests/test_compile_check.py); on the H200, forward against a float64 math reference (output and
log-sum-exp) and through the router with a database that picks it."""

import pytest
import torch
import torch.nn.functional as F

from tilefly import _device, _dispatch, config
from tilefly.ops.attention import backends, configs, database, kernels
from attention_standins import (LENGTHS, all_thread_decisions, assert_compiles_without_spills,
                                cuda_inputs as _inputs, db_entry,
                                poisoned_outputs, reference as _reference, write_db)

BF16 = torch.bfloat16


def _cpu(b=2, hq=4, hk=4, sq=64, sk=64, d=64, dtype=BF16):
    return (torch.randn(b, hq, sq, d, dtype=dtype), torch.randn(b, hk, sk, d, dtype=dtype),
            torch.randn(b, hk, sk, d, dtype=dtype))


@pytest.fixture
def hopper(monkeypatch):
    monkeypatch.setattr(_device, "hopper_reason", lambda t: None)


# ---- CPU: eligibility ------------------------------------------------------------------------

def _narrow_last(t, width):
    """t's values in a tensor whose rows are ``width`` elements apart (a view, last dim contiguous)."""
    wide = torch.zeros(*t.shape[:-1], width, dtype=t.dtype)
    wide[..., :t.shape[-1]] = t
    return wide[..., :t.shape[-1]]


REFUSALS = [
    ("sideways", lambda q, k, v: (q, k, v), "direction"),
    ("fwd", lambda q, k, v: (q.float(), k.float(), v.float()), "FP16 or BF16"),
    ("fwd", lambda q, k, v: (q, k.half(), v), "FP16 or BF16"),
    ("fwd", lambda q, k, v: (q[0], k[0], v[0]), "must be 4-D"),
    ("fwd", lambda q, k, v: (q, k, v[:, :, :10]), "disagree"),
    ("fwd", lambda q, k, v: (q, k[:1], v[:1]), "disagree"),
    ("fwd", lambda q, k, v: (q, k[:, :3], v[:, :3]), "not a multiple of k/v heads"),
    ("fwd", lambda q, k, v: (q[:, :, :0], k, v), "empty"),
    ("fwd", lambda q, k, v: tuple(torch.randn(1, 2, 8, 80, dtype=BF16) for _ in range(3)), "head dim 80"),
    ("fwd", lambda q, k, v: (q.transpose(-1, -2).contiguous().transpose(-1, -2), k, v), "contiguous last"),
    ("fwd", lambda q, k, v: (q, _narrow_last(k, 68), v), "multiples of 16 bytes"),
    ("fwd", lambda q, k, v: (q, k, torch.randn(v.numel() + 1, dtype=BF16)[1:].view(v.shape)), "16-byte aligned"),
    ("fwd", lambda q, k, v: tuple(torch.randn(1, 65536, 1, 32, dtype=BF16) for _ in range(3)), "grid"),
]


@pytest.mark.parametrize("direction,make,reason", REFUSALS, ids=[r[2] + f"-{i}" for i, r in enumerate(REFUSALS)])
def test_refusals_say_why(hopper, direction, make, reason):
    q, k, v = make(*_cpu())
    why = kernels.unsupported(q, k, v, False, direction)
    assert why is not None and reason in why, why


def test_cpu_tensors_get_the_device_reason():
    assert "tensor is on cpu" in kernels.unsupported(*_cpu(), False, "fwd")


@pytest.mark.parametrize("case", ["plain", "gqa", "causal_sq_ne_sk", "bshd", "unit_dims_odd_strides", "padded_rows"])
@pytest.mark.parametrize("d", configs.HEAD_DIMS)
def test_served_layouts(hopper, case, d):
    q, k, v = _cpu(d=d)
    causal = case == "causal_sq_ne_sk"
    if case == "gqa":
        q = torch.randn(2, 8, 64, d, dtype=BF16)
    elif causal:
        q = torch.randn(2, 4, 17, d, dtype=BF16)
    elif case == "bshd":
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    elif case == "unit_dims_odd_strides":
        q, k, v = (torch.empty_strided((1, 1, 1, d), (3, 5, 7, 1), dtype=BF16).normal_() for _ in range(3))
    elif case == "padded_rows":  # rows 16-byte aligned but not dense
        q, k, v = (_narrow_last(t, d + 8) for t in (q, k, v))
    assert kernels.unsupported(q, k, v, causal, "fwd") is None
    # The descriptors the launcher would build are legal (TMA rules checked by the descriptor itself).
    kd = configs.kernel_head_dim(d)
    for t in (q, k, v):
        desc = kernels._descriptor(t, 64, kd)
        assert desc.block_shape == [1, 1, 64, kd] and all(s * 2 % 16 == 0 for s in desc.strides[:-1])


# ---- CPU: configs ----------------------------------------------------------------------------

def test_config_names_and_what_they_serve():
    """Forward configs here; the backward's (also in kernels.CONFIGS) in test_attention_bwd.py."""
    assert tuple(configs.FWD_CONFIGS) == ("m128n64", "m128n128", "m64n64", "m128n64p", "m128n128p",
                                          "m128n64w", "m128n128w")
    assert kernels.CONFIGS[:len(configs.FWD_CONFIGS)] == tuple(configs.FWD_CONFIGS)   # the tuner times them all
    assert kernels.config_for("m128n64w", 256, 1000) is configs.FWD_CONFIGS["m128n64w"]
    # Defaults: ping-pong from head dim 96 on, one warpgroup for short query runs.
    assert [kernels.config_for(None, d, 4096).name for d in (32, 64, 96, 128, 192, 256)] == \
        ["m128n128", "m128n128", "m128n128w", "m128n128w", "m128n64w", "m128n64w"]
    assert kernels.config_for(None, 128, 64).name == "m64n64"
    for name, cfg in configs.FWD_CONFIGS.items():
        assert name == f"m{cfg.block_m}n{cfg.block_n}{'p' if cfg.overlap else ''}{'w' if cfg.pingpong else ''}"
        if cfg.pingpong:   # the launch holds consumer warpgroup 0; Q/O boxes are one warpgroup's rows
            assert cfg.block_m == 128 and cfg.num_warps == 4 and cfg.box_rows == 64 and not cfg.overlap
        else:
            assert cfg.num_warps == cfg.block_m // 16 and cfg.box_rows == cfg.block_m
    # Every served head dim has a config, and the defaults serve what they are picked for.
    for d in configs.HEAD_DIMS:
        assert any(cfg.serves(d) for cfg in configs.FWD_CONFIGS.values())
        for sq in (1, 64, 65, 4096):
            assert kernels.config_for(None, d, sq).serves(d)
    assert not configs.FWD_CONFIGS["m128n128"].serves(192) and not configs.FWD_CONFIGS["m128n128p"].serves(192)
    with pytest.raises(ValueError, match="does not serve head dim 256"):
        kernels.config_for("m128n128", 256, 1024)


def test_padded_head_dims_and_ring_depths():
    assert [configs.kernel_head_dim(d) for d in configs.HEAD_DIMS] == [32, 64, 128, 128, 256, 256]
    for cfg in configs.FWD_CONFIGS.values():
        for d in (32, 64, 128, 256):
            stages = cfg.stages(d)
            if cfg.serves(d):
                assert 2 <= stages <= configs.MAX_STAGES
                assert cfg.smem_bytes(d, stages) <= configs.SMEM_LIMIT
                assert stages == configs.MAX_STAGES or cfg.smem_bytes(d, stages + 1) > configs.SMEM_LIMIT


def test_slot_loads_the_kernel_module():
    backends.TileflyFA._load.cache_clear()
    try:
        assert backends.TILEFLY_FA.unavailable() is None
        assert backends.TILEFLY_FA.configs() == kernels.CONFIGS
    finally:
        backends.TileflyFA._load.cache_clear()


def test_compile_specs_cover_every_config_dtype_head_dim_and_mask():
    specs = [s for s in configs.compile_specs() if s.name.startswith("attention.fwd.")]
    names = [s.name for s in specs]
    assert len(set(names)) == len(names)
    expected = {(cfg.name, dtype, d, causal) for cfg in configs.FWD_CONFIGS.values() for dtype in ("bf16", "fp16")
                for d in (32, 64, 128, 256) if cfg.serves(d) for causal in (False, True)}
    got = {(n.split(".")[2].split("[")[0], n.split("[")[1].split(",")[0], s.constexprs["HEAD_DIM"],
            s.constexprs["CAUSAL"]) for n, s in zip(names, specs)}
    assert got == expected


@pytest.mark.parametrize("cfg,dtype,d,causal", [("m128n64", "bf16", 96, True), ("m64n64", "fp16", 256, False),
                                                 ("m128n64p", "bf16", 64, True), ("m128n64w", "bf16", 256, True),
                                                 ("m128n128w", "fp16", 128, False)])
def test_a_few_configs_compile_for_sm90a(cfg, dtype, d, causal):
    pytest.importorskip("triton")
    assert_compiles_without_spills(configs.spec(configs.FWD_CONFIGS[cfg], dtype, configs.kernel_head_dim(d), causal))


@pytest.mark.parametrize("cfg,d", [("m128n64", 128), ("m128n64p", 128), ("m128n128p", 64), ("m128n128w", 128),
                                   ("m128n64w", 256)])
def test_wgmmas_are_not_serialized(cfg, d):
    """ptxas serializes every wgmma of a kernel (warning C7514) when other instructions touch an
    accumulator while its wgmma is in flight: the schedule would silently lose its overlap."""
    pytest.importorskip("triton")
    from tilefly.compile_check import ptxas_report

    spec = configs.spec(configs.FWD_CONFIGS[cfg], "bf16", d, True)
    report = ptxas_report(spec)
    assert "Used" in report and "C7514" not in report, report


def test_pingpong_kernel_partitions_and_barriers():
    """The warp-specialized kernel's shape in PTX: a loader at 24 registers and consumers raised
    by setmaxnreg, and every mbarrier arrive made by one thread after its partition's bar.sync
    (the empty barriers count two arrivals: one per consumer warpgroup, not one per thread)."""
    pytest.importorskip("triton")
    from tilefly.compile_check import _compile

    ptx = _compile(configs.spec(configs.FWD_CONFIGS["m128n128w"], "bf16", 128, True)).asm["ptx"]
    assert "setmaxnreg.dec.sync.aligned.u32 \t24;" in ptx and "setmaxnreg.inc.sync.aligned.u32 \t240;" in ptx
    assert "mbarrier.init.shared::cta.b64 [%r" in ptx and ", 2;" in ptx    # k_empty / v_empty: count 2
    lines = ptx.splitlines()
    arrives = [i for i, line in enumerate(lines) if "mbarrier.arrive.shared" in line and "expect" not in line]
    assert len(arrives) >= 8
    for i in arrives:
        assert lines[i].lstrip().startswith("@%p"), lines[i]                        # predicated: one thread
        assert any("bar.sync" in line for line in lines[i - 8:i]), lines[i - 8:i + 1]


# ---- GPU: forward against float64 ------------------------------------------------------------

def _check(q, k, v, causal, scale=None, config=None):
    assert kernels.unsupported(q, k, v, causal, "fwd") is None
    out, lse = poisoned_outputs(q)
    got, got_lse = kernels.forward(q, k, v, causal, scale, True, config, out=out, lse=lse)
    assert got is out and got_lse is lse
    ref, ref_lse = _reference(q, k, v, causal, scale)
    tol = 2e-2 if q.dtype == BF16 else 4e-3
    torch.testing.assert_close(got.double(), ref, atol=tol, rtol=tol)
    torch.testing.assert_close(got_lse.double(), ref_lse, atol=2e-3, rtol=1e-4)


@pytest.mark.cuda
@pytest.mark.parametrize("sq,sk", LENGTHS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", configs.HEAD_DIMS)
@pytest.mark.parametrize("b,h", [(1, 1), (3, 5)])
def test_forward_matches_float64(b, h, d, causal, sq, sk):
    _check(*_inputs(b, h, h, sq, sk, d), causal)


@pytest.mark.cuda
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", configs.HEAD_DIMS)
def test_forward_fp16(d, causal):
    _check(*_inputs(2, 3, 3, 300, 500, d, torch.float16), causal)


EVERY_CONFIG_CASES = [(d, causal, sq, sk) for d in (32, 96, 256) for causal in (False, True)
                      for sq, sk in ((77, 1000), (1000, 1000), (200, 64))]
PINGPONG = [name for name, cfg in configs.FWD_CONFIGS.items() if cfg.pingpong]


@pytest.mark.cuda
@pytest.mark.parametrize("d,causal,sq,sk", EVERY_CONFIG_CASES)
@pytest.mark.parametrize("cfg", [name for name in configs.FWD_CONFIGS if name not in PINGPONG])  # those: below
def test_every_config(cfg, d, causal, sq, sk):
    if not configs.FWD_CONFIGS[cfg].serves(d):
        pytest.skip(f"{cfg} does not serve head dim {d}")
    _check(*_inputs(2, 2, 2, sq, sk, d), causal, config=cfg)


_PINGPONG_CHILD = """
import sys
sys.path.insert(0, {tests!r})
import test_attention_kernels as t
for d, causal, sq, sk in t.EVERY_CONFIG_CASES + [(128, True, 1, 1), (64, False, 4096, 4096)]:
    if t.configs.FWD_CONFIGS[{cfg!r}].serves(d):
        t._check(*t._inputs(2, 2, 2, sq, sk, d), causal, config={cfg!r})
        t._check(*t._inputs(1, 4, 2, sq, sk, d, t.torch.float16), causal, config={cfg!r})   # GQA, FP16
print("pingpong ok")
"""


@pytest.mark.cuda
@pytest.mark.parametrize("cfg", PINGPONG)
def test_pingpong_configs_under_a_watchdog(cfg):
    """The warp-specialized kernels' cases of test_every_config (plus GQA, FP16, a single row and
    long rows) in a child process with a time limit: a barrier protocol that deadlocks fails this
    test instead of hanging the GPU run."""
    import os
    import subprocess
    import sys

    tests = os.path.dirname(__file__)
    proc = subprocess.run([sys.executable, "-c", _PINGPONG_CHILD.format(tests=tests, cfg=cfg)],
                          capture_output=True, text=True, timeout=300, cwd=tests,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])))
    assert proc.returncode == 0 and "pingpong ok" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]


@pytest.mark.cuda
@pytest.mark.parametrize("hq,hk", [(6, 2), (8, 1)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_grouped_query_attention(hq, hk, causal, d):
    _check(*_inputs(2, hq, hk, 333, 333, d), causal)


@pytest.mark.cuda
@pytest.mark.parametrize("scale", [0.05, 0.3, 2.0])
def test_scale(scale):
    _check(*_inputs(2, 3, 3, 150, 260, 64), True, scale=scale)


@pytest.mark.cuda
def test_bshd_inputs_and_output_layout():
    """Projection outputs (B x S x H x D in memory) are read in place; out is laid out like q."""
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in _inputs(2, 4, 4, 129, 257, 128))
    out, lse = kernels.forward(q, k, v, False, None, True)
    assert out.stride() == q.stride() and lse.is_contiguous() and lse.shape == q.shape[:3]
    _check(q, k, v, False)


@pytest.mark.cuda
def test_without_lse():
    q, k, v = _inputs(1, 2, 2, 100, 100, 64)
    out, lse = kernels.forward(q, k, v, True, None, False)
    assert lse is None
    torch.testing.assert_close(out.double(), _reference(q, k, v, True)[0], atol=2e-2, rtol=2e-2)


@pytest.mark.cuda
@pytest.mark.parametrize("causal", [False, True])
def test_nan_in_q_propagates_like_pytorch(causal):
    """A NaN in a query row makes that row (output and lse) NaN, as PyTorch's math attention does;
    every other row stays exact."""
    q, k, v = _inputs(2, 2, 2, 150, 150, 64)
    q[1, 0, 70, 5] = float("nan")
    out, lse = kernels.forward(q, k, v, causal, None, True)
    ref, ref_lse = _reference(q, k, v, causal)
    math_out = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
    assert torch.equal(torch.isnan(out), torch.isnan(math_out)) and torch.isnan(out).any()
    assert torch.equal(torch.isnan(lse), torch.isnan(ref_lse))
    ok = ~torch.isnan(ref)
    torch.testing.assert_close(out.double()[ok], ref[ok], atol=2e-2, rtol=2e-2)


# ---- GPU: through the router -----------------------------------------------------------------

SDP = ("cudnn", "flash", "efficient")


@pytest.fixture
def tilefly_forward_db(tmp_path):
    """Routes installed, with a database where tilefly_fa serves the forward whichever fused op
    PyTorch reaches; the backward keeps each op's own kernel (fed tilefly's out and lse)."""
    database.reload()
    # SDPA fixes its default priority order on its first call in the process: make that call
    # before any test sets its own order.
    x = torch.randn(1, 1, 8, 64, device="cuda", dtype=BF16)
    F.scaled_dot_product_attention(x, x, x)

    def use(d, causal, gqa, cfg="m128n64"):
        serve = {b: [f"tilefly_fa/{cfg}"] for b in SDP}
        config.attention_db = write_db(tmp_path / f"db_{d}_{causal}_{gqa}.json", [
            db_entry("fwd", head_dim=d, causal=causal, gqa=gqa, sq_bin=1, sk_bin=1, serve=serve),
            db_entry("bwd", head_dim=d, causal=causal, gqa=gqa, sq_bin=1, sk_bin=1)])
        database.reload()

    _dispatch.install(["attention"])
    yield use
    _dispatch.uninstall(["attention"])
    database.reload()


def _grad_reference(q, k, v, causal, w):
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = _reference(qd, kd, vd, causal)[0]
    (ref * w).sum().backward()
    return ref.detach(), (qd.grad, kd.grad, vd.grad)


@pytest.mark.cuda
@pytest.mark.parametrize("first,d,causal,hq,hk", [
    ("cudnn", 64, True, 4, 4), ("efficient", 128, False, 4, 4), ("flash", 256, True, 4, 4),
    ("flash", 96, False, 8, 2), ("flash", 64, True, 8, 2), ("cudnn", 32, False, 4, 4)])
def test_router_serves_the_forward_and_stock_backward_takes_its_lse(tilefly_forward_db, first, d, causal, hq, hk):
    """``first`` leads SDPA's priority order (all fused backends stay enabled), so PyTorch reaches
    its op or the next that takes the call; tilefly_fa serves that op's forward, laid out as the
    op promises, and the op's own backward runs on tilefly's out and lse."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
               "efficient": SDPBackend.EFFICIENT_ATTENTION}
    tilefly_forward_db(d, causal, hq != hk)
    q, k, v = (t.requires_grad_() for t in _inputs(2, hq, hk, 200, 200, d))
    w = torch.randn(2, hq, 200, d, device="cuda", dtype=torch.float64)
    ref, ref_grads = _grad_reference(q, k, v, causal, w)
    order = [backend[first]] + [backend[b] for b in SDP if b != first]
    with all_thread_decisions() as decisions:
        with sdpa_kernel(order, set_priority=True):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hq != hk)
        (out.double() * w).sum().backward()
    served = [(dec.op.split("::")[1], dec.impl) for dec in decisions]
    assert len(served) == 2 and served[0][1] == "tilefly_fa" and served[1][1] is None, decisions
    assert served[1][0] == served[0][0] + "_backward"
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)
    for name, got, want in zip("qkv", (q.grad, k.grad, v.grad), ref_grads):
        err = ((got.double() - want).norm() / want.norm()).item()
        assert err < 2e-2, f"d{name}: {err}"


def test_configs_for_a_head_dim_are_only_those_that_serve_it():
    """What the tuner times per workload: a config of another head dim would only run a default."""
    assert kernels.configs_for("fwd", 512) == configs.FWD512_CONFIG_NAMES
    for d in (32, 64, 96, 128, 192, 256):
        fwd = kernels.configs_for("fwd", d)
        assert fwd and not set(fwd) & set(configs.FWD512_CONFIG_NAMES)
        assert all(configs.FWD_CONFIGS[name].serves(d) for name in fwd)
        bwd = kernels.configs_for("bwd", d)
        assert bwd and all(configs.BWD_CONFIGS[name].serves(d) for name in bwd)
    assert "bwd128x64" not in kernels.configs_for("bwd", 256)
    assert kernels.configs_for("sideways", 64) == ()

"""tilefly's flash-attention backward (kernels.backward, kernels_bwd.py): on CPU, what it refuses and
why, its configs, a compile of a few of them for sm_90a (the full set runs in
tests/test_compile_check.py) and the delta kernel under the Triton interpreter; on the H200, dq, dk
and dv against float64 autograd of the math attention, and gradients of
F.scaled_dot_product_attention through the router with a database that picks it for the backward."""
import math

import pytest
import torch
import torch.nn.functional as F

from tilefly import _device, _dispatch, config
from tilefly._interpreter import run_checks
from tilefly.ops.attention import configs, database, kernels
from attention_standins import (LENGTHS, all_thread_decisions, assert_compiles_without_spills,
                                cuda_inputs as _inputs, db_entry, write_db)

BF16 = torch.bfloat16


def _cpu(b=2, hq=4, hk=4, sq=64, sk=64, d=64, dtype=BF16):
    return (torch.randn(b, hq, sq, d, dtype=dtype), torch.randn(b, hk, sk, d, dtype=dtype),
            torch.randn(b, hk, sk, d, dtype=dtype))


@pytest.fixture
def hopper(monkeypatch):
    monkeypatch.setattr(_device, "hopper_reason", lambda t: None)


# ---- CPU: what the backward serves ---------------------------------------------------------------

def _dims(d):
    return lambda q, k, v: tuple(torch.randn(1, 2, 8, d, dtype=BF16) for _ in range(3))


BWD_REFUSALS = [
    (_dims(80), "head dim 80"),
    (lambda q, k, v: (q.float(), k.float(), v.float()), "FP16 or BF16"),
    (lambda q, k, v: (q, k[:, :3], v[:, :3]), "not a multiple of k/v heads"),
    (lambda q, k, v: (q.transpose(-1, -2).contiguous().transpose(-1, -2), k, v), "contiguous last"),
]


@pytest.mark.parametrize("direction", ["bwd", "backward"])
@pytest.mark.parametrize("make,reason", BWD_REFUSALS, ids=[r[1] + f"-{i}" for i, r in enumerate(BWD_REFUSALS)])
def test_backward_refusals_say_why(hopper, direction, make, reason):
    why = kernels.unsupported(*make(*_cpu()), False, direction)
    assert why is not None and reason in why, why


def test_unknown_direction_is_refused(hopper):
    assert "direction" in kernels.unsupported(*_cpu(), False, "sideways")


@pytest.mark.parametrize("case", ["plain", "gqa", "causal_sq_ne_sk", "bshd"])
@pytest.mark.parametrize("d", configs.HEAD_DIMS)
def test_backward_serves(hopper, case, d):
    q, k, v = _cpu(d=d)
    causal = case == "causal_sq_ne_sk"
    if case == "gqa":
        q = torch.randn(2, 16, 64, d, dtype=BF16)
    elif causal:
        q = torch.randn(2, 4, 17, d, dtype=BF16)
    elif case == "bshd":
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    assert kernels.unsupported(q, k, v, causal, "bwd") is None
    # The descriptors the launcher builds are legal (TMA rules checked by the descriptor itself),
    # dK/dV's boxes a column chunk wide.
    kd, chunk = configs.kernel_head_dim(d), configs.dkdv_chunk(d)
    for cfg in configs.BWD_CONFIGS.values():
        if not cfg.serves(d):
            continue
        for t, rows, width in ((q, cfg.step, chunk), (k, cfg.rows, chunk), (q, cfg.rows, kd), (k, cfg.step, kd)):
            desc = kernels._descriptor(t, rows, width)
            assert desc.block_shape == [1, 1, rows, width] and all(st * 2 % 16 == 0 for st in desc.strides[:-1])


def test_cpu_tensors_get_the_device_reason():
    assert "tensor is on cpu" in kernels.unsupported(*_cpu(), False, "bwd")


def test_backward_checks_its_arguments():
    q, k, v = _cpu()
    out, lse = torch.randn_like(q), torch.randn(2, 4, 64)
    with pytest.raises(ValueError, match="shaped like q"):
        kernels.backward(q[:, :, :10], q, k, v, out, lse, False, None)
    with pytest.raises(ValueError, match="lse must be"):
        kernels.backward(q, q, k, v, out, lse[:, :, :10], False, None)
    with pytest.raises(ValueError, match="not a backward config"):
        kernels.backward(q, q, k, v, out, lse, False, None, "m128n64")
    with pytest.raises(ValueError, match="cannot take this gradient"):
        kernels.backward(q, q, k, v, out, lse, False, None,
                         grads=(torch.empty_like(q), torch.empty_like(k), q[..., :8]))


# ---- CPU: configs ----------------------------------------------------------------------------

def test_backward_configs():
    assert tuple(configs.BWD_CONFIGS) == ("bwd64x64", "bwd128x64")
    assert kernels.CONFIGS[-4:] == tuple(configs.BWD_CONFIGS) + configs.BWD512_CONFIG_NAMES
    assert kernels.configs_for("bwd") == kernels.configs_for("backward") == kernels.CONFIGS[-4:]
    assert kernels.configs_for("fwd") == tuple(configs.FWD_CONFIGS) + configs.FWD512_CONFIG_NAMES
    assert set(kernels.configs_for("fwd")) | set(kernels.configs_for("bwd")) == set(kernels.CONFIGS)
    for name, cfg in configs.BWD_CONFIGS.items():
        assert name == f"bwd{cfg.rows}x{cfg.step}" and cfg.num_warps == cfg.rows // 16
        for d in configs.HEAD_DIMS:
            kd = configs.kernel_head_dim(d)
            stages = cfg.stages(kd)
            if cfg.serves(d):
                assert 2 <= stages <= configs.MAX_STAGES and cfg.smem_bytes(kd, stages) <= configs.SMEM_LIMIT
            else:
                assert cfg.smem_bytes(kd, 2) > configs.SMEM_LIMIT
    assert [d for d in configs.HEAD_DIMS if configs.BWD_CONFIGS["bwd64x64"].serves(d)] == list(configs.HEAD_DIMS)
    assert [d for d in configs.HEAD_DIMS if configs.BWD_CONFIGS["bwd128x64"].serves(d)] == [32, 64, 96, 128]
    assert [configs.dkdv_chunk(d) for d in configs.HEAD_DIMS] == [32, 64, 128, 128, 128, 128]
    for d in configs.HEAD_DIMS:
        for sk in (1, 128, 129, 4096):
            assert kernels.bwd_config_for(None, d, sk).serves(d)
    with pytest.raises(ValueError, match="does not serve head dim 192"):
        kernels.bwd_config_for("bwd128x64", 192, 1024)


def test_forward_takes_a_backward_config_name_as_its_default():
    """The tuner times a backward config's backward after a forward called with the same name."""
    assert kernels.config_for("bwd128x64", 64, 1000) == configs.default_config(64, 1000)
    with pytest.raises(ValueError, match="unknown attention config"):
        kernels.config_for("nope", 64, 1000)


def test_backward_compile_specs_cover_every_config_dtype_head_dim_mask_and_kernel():
    specs = configs.bwd_compile_specs()
    names = [s.name for s in specs]
    assert len(set(names)) == len(names)
    assert all(s in {x.name for x in configs.compile_specs()} for s in names)
    got = {(s.name.split(".")[1], s.name.split(".")[2].split("[")[0], s.name.split("[")[1].split(",")[0],
            s.constexprs["HEAD_DIM"], s.constexprs["CAUSAL"]) for s in specs if "delta" not in s.name}
    expected = {(f"bwd_{kernel}", cfg, dtype, d, causal) for kernel in ("dkdv", "dq")
                for cfg in configs.BWD_CONFIGS for dtype in ("bf16", "fp16") for d in (32, 64, 128, 256)
                for causal in (False, True) if configs.BWD_CONFIGS[cfg].serves(d)}
    assert got == expected and len(got) == 56
    assert {s.name for s in specs if "delta" in s.name} == {
        f"attention.bwd_delta[{dtype},d={d}]" for dtype in ("bf16", "fp16") for d in (32, 64, 128, 256)}


@pytest.mark.parametrize("kernel,cfg,dtype,d,causal", [("dkdv", "bwd64x64", "bf16", 256, True),
                                                       ("dq", "bwd128x64", "fp16", 128, True),
                                                       ("dkdv", "bwd128x64", "bf16", 32, False)])
def test_a_few_backward_kernels_compile_for_sm90a(kernel, cfg, dtype, d, causal):
    pytest.importorskip("triton")
    assert_compiles_without_spills(configs.bwd_spec(kernel, configs.BWD_CONFIGS[cfg], dtype, d, causal))


@pytest.mark.parametrize("kernel,cfg,d", [("dkdv", "bwd128x64", 128), ("dq", "bwd128x64", 128),
                                          ("dkdv", "bwd64x64", 256)])
def test_backward_wgmmas_are_not_serialized(kernel, cfg, d):
    """ptxas serializes every wgmma of a kernel (warning C7514) when an accumulator is touched while
    its wgmma is in flight."""
    pytest.importorskip("triton")
    from tilefly.compile_check import ptxas_report

    spec = configs.bwd_spec(kernel, configs.BWD_CONFIGS[cfg], "bf16", d, True)
    report = ptxas_report(spec)
    assert "Used" in report and "C7514" not in report, report


def test_delta_kernel_under_the_interpreter():
    pytest.importorskip("triton")
    proc = run_checks(["attention"], timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("ok ") == len(configs.interpreter_checks()) >= 3, proc.stdout


# ---- GPU: gradients against float64 ------------------------------------------------------------

def _reference_grads(q, k, v, grad_out, causal, scale=None):
    """float64 autograd of math attention (top-left causal mask, GQA by repeating k/v heads)."""
    group = q.shape[1] // k.shape[1]
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    s = (qd @ kd.repeat_interleave(group, 1).transpose(-1, -2)) * (scale if scale is not None
                                                                   else 1 / math.sqrt(q.shape[-1]))
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    out = torch.softmax(s, -1) @ vd.repeat_interleave(group, 1)
    out.backward(grad_out.double())
    return qd.grad, kd.grad, vd.grad


def _rms_rows(t):
    return t.norm(dim=-1).pow(2).mean().sqrt()


def _row_errors(got, want, dv_scale):
    """Each row's error relative to its own norm plus a floor (a quarter of the rms row norm, and 1%
    of dv's), because some exact gradients vanish (dq of causal row 0, dk of keys no query sees)."""
    floor = 0.25 * _rms_rows(want) + 0.01 * dv_scale
    return (got.double() - want).norm(dim=-1) / (want.norm(dim=-1) + floor)


def _stock_grads(q, k, v, grad_out, causal, scale=None):
    """PyTorch's own SDPA gradients of the same FP16/BF16 inputs (its default backend, tilefly off)."""
    qs, ks, vs = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, scale=scale,
                                         enable_gqa=q.shape[1] != k.shape[1])
    out.backward(grad_out)
    return qs.grad, ks.grad, vs.grad


def _assert_grads_close(got, want, dtype, stock=None):
    """Row by row (a wrong tail row or masked tile cannot hide in a global norm) and overall. A row
    passes within the dtype's tolerance or within twice PyTorch's own error on that tensor: where
    softmax is peaked (large scale, causal rows that see a few keys) dP - delta cancels and every
    FP16/BF16 kernel loses the same bits."""
    row_tol, total_tol = (6e-2, 1e-2) if dtype == BF16 else (1.5e-2, 2e-3)
    dv_scale = _rms_rows(want[2])
    for i, (name, g, w) in enumerate(zip(("dq", "dk", "dv"), got, want)):
        assert g.shape == w.shape and not torch.isnan(g).any(), f"{name}: NaN (an element left unwritten?)"
        rows = _row_errors(g, w, dv_scale)
        allowed = row_tol if stock is None else max(row_tol, 2 * _row_errors(stock[i], w, dv_scale).max().item())
        worst = rows.argmax()
        where = tuple(int(j) for j in torch.unravel_index(worst, rows.shape))
        assert rows.max() < allowed, f"{name}: row {where} (b, h, s) off by {rows.max():.3g} (allowed {allowed:.3g})"
        total = ((g.double() - w).norm() / (w.norm() + 0.01 * want[2].norm())).item()
        assert total < total_tol, f"{name}: relative error {total:.3g}"


def _check(q, k, v, causal, scale=None, config=None, grad_out=None):
    assert kernels.unsupported(q, k, v, causal, "bwd") is None
    out, lse = kernels.forward(q, k, v, causal, scale, True)
    if grad_out is None:
        grad_out = torch.randn_like(q)
    poisoned = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
    got = kernels.backward(grad_out, q, k, v, out, lse, causal, scale, config, grads=poisoned)
    assert all(g is p for g, p in zip(got, poisoned))
    _assert_grads_close(got, _reference_grads(q, k, v, grad_out, causal, scale), q.dtype,
                        _stock_grads(q, k, v, grad_out, causal, scale))


@pytest.mark.cuda
@pytest.mark.parametrize("sq,sk", LENGTHS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", configs.HEAD_DIMS)
@pytest.mark.parametrize("b,h", [(1, 1), (3, 5)])
def test_backward_matches_float64(b, h, d, causal, sq, sk):
    _check(*_inputs(b, h, h, sq, sk, d), causal)


@pytest.mark.cuda
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", configs.HEAD_DIMS)
def test_backward_fp16(d, causal):
    _check(*_inputs(2, 3, 3, 300, 500, d, torch.float16), causal)


@pytest.mark.cuda
@pytest.mark.parametrize("sq,sk", [(77, 1000), (1000, 1000), (200, 64), (1000, 130)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [32, 96, 128, 192, 256])
@pytest.mark.parametrize("cfg", list(configs.BWD_CONFIGS))
def test_every_backward_config(cfg, d, causal, sq, sk):
    if not configs.BWD_CONFIGS[cfg].serves(d):
        pytest.skip(f"{cfg} does not serve head dim {d}")
    _check(*_inputs(2, 2, 2, sq, sk, d), causal, config=cfg)


@pytest.mark.cuda
@pytest.mark.parametrize("sq,sk", [(333, 333), (77, 1000), (1000, 17)])
@pytest.mark.parametrize("hq,hk", [(4, 2), (8, 2), (8, 1)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_grouped_query_attention(hq, hk, causal, d, sq, sk):
    """dK and dV of a kv head sum over its q heads (GROUP = 2, 4, 8) in registers."""
    _check(*_inputs(2, hq, hk, sq, sk, d), causal)


@pytest.mark.cuda
@pytest.mark.parametrize("scale", [0.05, 0.3, 2.0])
def test_scale(scale):
    _check(*_inputs(2, 3, 3, 150, 260, 64), True, scale=scale)


@pytest.mark.cuda
def test_bshd_inputs_and_expanded_grad_out():
    """Projection layouts (B x S x H x D in memory) are read in place; the stride-0 gradient of a sum
    is copied once; gradients come back laid out like q, k, v."""
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in _inputs(2, 4, 2, 129, 257, 96))
    grad_out = torch.randn(1, 1, 1, 96, device="cuda", dtype=BF16).expand(q.shape)
    _check(q, k, v, True, grad_out=grad_out)
    out, lse = kernels.forward(q, k, v, True, None, True)
    dq, dk, dv = kernels.backward(grad_out, q, k, v, out, lse, True, None)
    assert dq.stride() == q.stride() and dk.stride() == k.stride() and dv.stride() == v.stride()


@pytest.mark.cuda
def test_out_and_lse_of_another_layout():
    """The backward takes any forward's saved tensors: out as B x S x H x D (the efficient op's) and a
    non-contiguous lse view (the efficient op's padded rows)."""
    q, k, v = _inputs(2, 3, 3, 100, 100, 64)
    out, lse = kernels.forward(q, k, v, False, None, True)
    out_bshd = out.transpose(1, 2).contiguous().transpose(1, 2)
    padded = torch.full((2, 3, 128), float("inf"), device="cuda")
    padded[..., :100] = lse
    grad_out = torch.randn_like(q)
    got = kernels.backward(grad_out, q, k, v, out_bshd, padded[..., :100], False, None)
    _assert_grads_close(got, _reference_grads(q, k, v, grad_out, False), BF16)


# ---- GPU: through the router -----------------------------------------------------------------

SDP = ("cudnn", "flash", "efficient")


@pytest.fixture
def tilefly_db(tmp_path):
    """``use(...)`` writes a database where tilefly_fa serves the backward (and, with
    ``forward_too``, the forward) whichever fused op PyTorch reaches, and installs the routes."""
    database.reload()
    # SDPA fixes its default priority order on its first call in the process: make that call
    # before any test sets its own order.
    x = torch.randn(1, 1, 8, 64, device="cuda", dtype=BF16)
    F.scaled_dot_product_attention(x, x, x)

    def use(d, causal, gqa, dtype, cfg, forward_too):
        serve_bwd = {b: [f"tilefly_fa/{cfg}"] for b in SDP}
        serve_fwd = {b: ["tilefly_fa/m128n64"] for b in SDP} if forward_too else {}
        config.attention_db = write_db(tmp_path / f"db_{d}_{causal}_{gqa}_{dtype}_{forward_too}.json", [
            db_entry("fwd", dtype=dtype, head_dim=d, causal=causal, gqa=gqa, sq_bin=1, sk_bin=1, serve=serve_fwd),
            db_entry("bwd", dtype=dtype, head_dim=d, causal=causal, gqa=gqa, sq_bin=1, sk_bin=1, serve=serve_bwd)])
        database.reload()
        _dispatch.install(["attention"])

    yield use
    _dispatch.uninstall(["attention"])
    database.reload()


def _sdpa_grads(q, k, v, causal, grad_out):
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
    out.backward(grad_out)
    return out.detach(), (qg.grad, kg.grad, vg.grad)


@pytest.mark.cuda
@pytest.mark.parametrize("first,d,causal,hq,hk,forward_too,dtype", [
    ("cudnn", 64, True, 4, 4, True, BF16), ("efficient", 128, False, 4, 4, True, BF16),
    ("flash", 96, True, 4, 4, True, BF16), ("flash", 64, False, 8, 2, True, BF16),
    ("flash", 128, True, 8, 2, False, BF16), ("cudnn", 32, False, 4, 4, False, BF16),
    ("efficient", 64, True, 4, 4, False, torch.float16), ("cudnn", 128, False, 4, 4, True, torch.float16),
    ("flash", 256, True, 4, 4, True, BF16), ("efficient", 192, False, 4, 4, False, BF16)])
def test_router_serves_the_backward(tilefly_db, first, d, causal, hq, hk, forward_too, dtype):
    """``first`` leads SDPA's priority order, so PyTorch reaches its op (or the next that takes the
    call); tilefly_fa serves that op's backward on whatever its forward saved (tilefly's own or the
    stock kernel's out and lse, in the op's layouts). Gradients match stock PyTorch's and float64."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
               "efficient": SDPBackend.EFFICIENT_ATTENTION}
    q, k, v = _inputs(2, hq, hk, 200, 200, d, dtype)
    grad_out = torch.randn_like(q)
    order = [backend[first]] + [backend[b] for b in SDP if b != first]
    with sdpa_kernel(order, set_priority=True):
        _, stock_grads = _sdpa_grads(q, k, v, causal, grad_out)   # before the routes are installed
        tilefly_db(d, causal, hq != hk, {BF16: "bf16", torch.float16: "fp16"}[dtype],
                   cfg="bwd128x64" if d <= 128 else "bwd64x64", forward_too=forward_too)
        with all_thread_decisions() as decisions:
            _, grads = _sdpa_grads(q, k, v, causal, grad_out)
    served = [(dec.op.split("::")[1], dec.impl) for dec in decisions]
    assert len(served) == 2 and served[1][0] == served[0][0] + "_backward", decisions
    assert served[0][1] == ("tilefly_fa" if forward_too else None) and served[1][1] == "tilefly_fa", decisions
    want = _reference_grads(q, k, v, grad_out, causal)
    _assert_grads_close(grads, want, dtype)
    tol = 2e-2 if dtype == BF16 else 5e-3
    for name, got, stock in zip("qkv", grads, stock_grads):
        err = ((got.double() - stock.double()).norm() / stock.double().norm()).item()
        assert err < tol, f"d{name} differs from stock PyTorch's by {err:.3g}"

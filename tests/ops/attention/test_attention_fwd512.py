"""tilefly's head-dim-512 flash-attention forward (tilefly.ops.attention.kernels_fwd512): on CPU,
its configs and compile specs, every spec compiled for sm_90a without spills or serialized
wgmmas, and the launcher's refusals; on the H200, output and log-sum-exp against a float64 math
reference (causal and not, Sq != Sk, GQA, tails, scale, NaN, strided layouts)."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from tilefly.ops.attention import configs, kernels_fwd512  # noqa: E402 - needs triton
from attention_standins import (assert_compiles_without_spills, cuda_inputs, poisoned_outputs,  # noqa: E402
                                reference as _reference)

BF16 = torch.bfloat16


# ---- CPU: configs and compile specs ----------------------------------------------------------

def test_configs_and_their_names():
    assert kernels_fwd512.CONFIGS == ("d512n64p",) and kernels_fwd512.DEFAULT_CONFIG == "d512n64p"
    for name, cfg in kernels_fwd512.FWD512_CONFIGS.items():
        assert name == f"d512n{cfg.block_n}p"
        # Q plus the K and V rings fit one block's shared memory, leaving room for the scratch.
        ring = 2 * cfg.stages * cfg.block_n * 512 * 2
        assert kernels_fwd512.BLOCK_M * 512 * 2 + ring <= configs.SMEM_LIMIT - 16 * 1024
    # No name is shared with the head dims 32..256 configs (the database names kernels by config).
    assert not set(kernels_fwd512.CONFIGS) & set(configs.FWD_CONFIGS)


def test_configs_py_lists_the_same_names_and_ships_the_specs():
    names = getattr(configs, "FWD512_CONFIG_NAMES", None)
    if names is None:
        pytest.skip("configs.py does not list the head-dim-512 configs yet")
    assert names == kernels_fwd512.CONFIGS
    assert {s.name for s in kernels_fwd512.compile_specs()} <= {s.name for s in configs.compile_specs()}


def test_compile_specs_cover_every_config_dtype_and_mask():
    specs = kernels_fwd512.compile_specs()
    names = [s.name for s in specs]
    assert len(set(names)) == len(names) == 4 * len(kernels_fwd512.CONFIGS)
    got = {(s.constexprs["BLOCK_N"], s.signature["q_desc"].split("[")[0], s.constexprs["CAUSAL"]) for s in specs}
    assert got == {(cfg.block_n, f"tensordesc<{dtype}", causal)
                   for cfg in kernels_fwd512.FWD512_CONFIGS.values()
                   for dtype in ("bf16", "fp16") for causal in (False, True)}
    for s in specs:
        cfg = kernels_fwd512.FWD512_CONFIGS[s.name.split(".")[2].split("[")[0]]
        assert s.constexprs["STAGES"] == cfg.stages and s.constexprs["BLOCK_N"] == cfg.block_n
    for s in specs:
        assert s.num_warps == 8 and s.gluon and "HGMMA" in s.sass_must_contain and s.constexprs["HEAD_DIM"] == 512
        assert all(f"[1, 1, {rows}, 512]" in s.signature[d] for d, rows in
                   (("q_desc", 64), ("o_desc", 64), ("k_desc", s.constexprs["BLOCK_N"]),
                    ("v_desc", s.constexprs["BLOCK_N"])))


@pytest.mark.parametrize("spec", kernels_fwd512.compile_specs(), ids=lambda s: s.name)
def test_every_spec_compiles_for_sm90a_without_spills(spec):
    assert_compiles_without_spills(spec, configs.SMEM_LIMIT)


@pytest.mark.parametrize("config", kernels_fwd512.CONFIGS)
def test_wgmmas_are_not_serialized(config):
    """ptxas serializes every wgmma of a kernel (warning C7514) when other instructions touch an
    accumulator while its wgmma is in flight; the head-dim loop of Q K^T keeps one in flight."""
    from tilefly.compile_check import ptxas_report

    spec = kernels_fwd512.spec(kernels_fwd512.FWD512_CONFIGS[config], "bf16", True)
    report = ptxas_report(spec)
    assert "Used" in report and "C7514" not in report, report


@pytest.mark.parametrize("config", kernels_fwd512.CONFIGS)
def test_score_wgmmas_split_the_columns_across_warpgroups(config):
    """Each warpgroup computes half of S's columns (m64n<BLOCK_N/2> wgmmas) and P V over its half
    of the head dim (m64n256), as the header's layout plan says."""
    from tilefly.compile_check import _compile

    cfg = kernels_fwd512.FWD512_CONFIGS[config]
    ptx = _compile(kernels_fwd512.spec(cfg, "bf16", False)).asm["ptx"]
    assert f"wgmma.mma_async.sync.aligned.m64n{cfg.block_n // 2}k16." in ptx
    assert f"wgmma.mma_async.sync.aligned.m64n{cfg.block_n}k16." not in ptx
    assert "wgmma.mma_async.sync.aligned.m64n256k16." in ptx


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("config", kernels_fwd512.CONFIGS)
def test_launcher_descriptors_match_the_compiled_specs(config, layout):
    """The descriptors forward512 builds (boxes, swizzled layouts) are the ones the specs compile."""
    from tilefly.ops.attention import kernels

    cfg = kernels_fwd512.FWD512_CONFIGS[config]
    t = torch.randn(2, 3, 100, 512, dtype=BF16)
    if layout == "bshd":
        t = t.transpose(1, 2).contiguous().transpose(1, 2)
    for dtype, torch_dtype in (("bf16", BF16), ("fp16", torch.float16)):
        sig, _ = kernels_fwd512.kernel_signature(cfg, dtype, False)
        for name, rows in (("q_desc", 64), ("k_desc", cfg.block_n), ("v_desc", cfg.block_n), ("o_desc", 64)):
            desc = kernels._descriptor(t.to(torch_dtype), rows, 512)
            assert sig[name] == f"tensordesc<{dtype}[{', '.join(map(str, desc.block_shape))}],{desc.layout!r}>"


# ---- CPU: what the launcher refuses before any launch --------------------------------------

def _cpu(d=512, sq=8):
    return [torch.randn(1, 2, sq, d, dtype=BF16) for _ in range(3)]


def test_refuses_other_head_dims():
    with pytest.raises(ValueError, match="head dim 512, not 256"):
        kernels_fwd512.forward512(*_cpu(d=256), False, None, True)


def test_refuses_configs_of_other_head_dims():
    with pytest.raises(ValueError, match="m128n64 does not serve head dim 512"):
        kernels_fwd512.forward512(*_cpu(), False, None, True, "m128n64")


def test_refuses_outputs_it_cannot_write():
    q, k, v = _cpu()
    with pytest.raises(ValueError, match="cannot take this output"):
        kernels_fwd512.forward512(q, k, v, False, None, True, out=torch.empty_like(q, dtype=torch.float16))
    with pytest.raises(ValueError, match="lse must be"):
        kernels_fwd512.forward512(q, k, v, False, None, True, lse=torch.empty(1, 2, 9))


# ---- GPU: forward against float64 ------------------------------------------------------------

def _inputs(b, hq, hk, sq, sk, dtype=BF16, seed=0):
    return cuda_inputs(b, hq, hk, sq, sk, 512, dtype, seed)


def _check(q, k, v, causal, scale=None, config=None, out=None):
    out_, lse = poisoned_outputs(q)
    out = out_ if out is None else out.fill_(float("nan"))
    got, got_lse = kernels_fwd512.forward512(q, k, v, causal, scale, True, config, out=out, lse=lse)
    assert got is out and got_lse is lse
    ref, ref_lse = _reference(q, k, v, causal, scale)
    tol = 2e-2 if q.dtype == BF16 else 4e-3
    torch.testing.assert_close(got.double(), ref, atol=tol, rtol=tol)
    torch.testing.assert_close(got_lse.double(), ref_lse, atol=2e-3, rtol=1e-4)


LENGTHS = [(s, s) for s in (1, 17, 77, 128, 300)] + [(17, 300), (300, 77), (1, 128), (128, 17), (77, 1)]


@pytest.mark.cuda
@pytest.mark.parametrize("sq,sk", LENGTHS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b,h", [(1, 1), (2, 3)])
@pytest.mark.parametrize("config", kernels_fwd512.CONFIGS)
def test_forward_matches_float64(config, b, h, causal, sq, sk):
    _check(*_inputs(b, h, h, sq, sk), causal, config=config)


@pytest.mark.cuda
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("config", kernels_fwd512.CONFIGS)
def test_forward_fp16(config, causal):
    _check(*_inputs(2, 3, 3, 300, 500, torch.float16), causal, config=config)


@pytest.mark.cuda
@pytest.mark.parametrize("hq,hk", [(6, 2), (8, 1)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("config", kernels_fwd512.CONFIGS)
def test_grouped_query_attention(config, hq, hk, causal):
    _check(*_inputs(2, hq, hk, 333, 333), causal, config=config)


@pytest.mark.cuda
@pytest.mark.parametrize("scale", [0.01, 0.3, 2.0])
@pytest.mark.parametrize("config", kernels_fwd512.CONFIGS)
def test_scale(config, scale):
    _check(*_inputs(2, 3, 3, 150, 260), True, scale=scale, config=config)


@pytest.mark.cuda
@pytest.mark.parametrize("config", kernels_fwd512.CONFIGS)
def test_long_sequences(config):
    """Many key tiles: the pipelined configs carry P and the running max across dozens of steps."""
    _check(*_inputs(1, 2, 2, 1000, 1000), True, config=config)
    _check(*_inputs(1, 2, 2, 129, 1000), False, config=config)
    _check(*_inputs(1, 2, 2, 1000, 333), True, config=config)


@pytest.mark.cuda
def test_bshd_inputs_and_a_strided_out():
    """Projection outputs (B x S x H x D in memory) are read in place; out may be any TMA-legal
    view (here the efficient op's B x S x H x D), and by default is laid out like q."""
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in _inputs(2, 4, 2, 129, 257))
    out, lse = kernels_fwd512.forward512(q, k, v, False, None, True)
    assert out.stride() == q.stride() and lse.is_contiguous() and lse.shape == q.shape[:3]
    bshd = torch.empty(2, 129, 4, 512, device="cuda", dtype=BF16).transpose(1, 2)
    _check(q, k, v, True, out=bshd)


@pytest.mark.cuda
def test_without_lse():
    q, k, v = _inputs(1, 2, 2, 100, 100)
    out, lse = kernels_fwd512.forward512(q, k, v, True, None, False)
    assert lse is None
    torch.testing.assert_close(out.double(), _reference(q, k, v, True)[0], atol=2e-2, rtol=2e-2)


@pytest.mark.cuda
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("config", kernels_fwd512.CONFIGS)
def test_nan_in_q_propagates_like_pytorch(config, causal):
    """A NaN in a query row makes that row (output and lse) NaN, as PyTorch's math attention
    does; every other row stays exact."""
    q, k, v = _inputs(2, 2, 2, 150, 150)
    q[1, 0, 70, 5] = float("nan")
    out, lse = poisoned_outputs(q)
    kernels_fwd512.forward512(q, k, v, causal, None, True, config, out=out, lse=lse)
    ref, ref_lse = _reference(q, k, v, causal)
    math_out = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
    assert torch.equal(torch.isnan(out), torch.isnan(math_out)) and torch.isnan(out).any()
    assert torch.equal(torch.isnan(lse), torch.isnan(ref_lse)) and torch.isnan(lse).sum() == 1
    ok = ~torch.isnan(ref)
    torch.testing.assert_close(out.double()[ok], ref[ok], atol=2e-2, rtol=2e-2)


@pytest.mark.cuda
@pytest.mark.parametrize("causal", [False, True])
def test_repeated_forwards_are_identical_and_complete(causal):
    """The same forward 40 times into NaN-poisoned outputs: every run writes every element and
    equals the first bit for bit (the kernel has no atomics, so any difference is a race). Why:
    at 14b1c52 a head-dim-512 backward test once saw NaN in both backwards' gradients of one
    forward output, on inputs that passed four runs before (BENCHMARKS.md, session 16)."""
    q, k, v = cuda_inputs(2, 3, 3, 2048, 2048, kernels_fwd512.HEAD_DIM)
    first = None
    for _ in range(40):
        out, lse = poisoned_outputs(q)
        kernels_fwd512.forward512(q, k, v, causal, None, True, out=out, lse=lse)
        if first is None:
            assert torch.isfinite(out).all() and torch.isfinite(lse).all()
            first = (out, lse)
        else:
            assert torch.equal(out, first[0]) and torch.equal(lse, first[1])

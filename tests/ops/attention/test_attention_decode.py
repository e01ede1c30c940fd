"""Split-KV decode attention (decode.py, kernels_decode.py): what it refuses and why, its split plan
on CPU, and on the H200 its results against float64 SDPA (the interpreter checks run with the
family's others, test_attention_bwd.py)."""
import math

import pytest
import torch
import torch.nn.functional as F

from tilefly.ops.attention import decode

BF16 = torch.bfloat16


def _qkv(b=2, h=8, hk=2, sq=4, sk=200, d=64, dtype=BF16, device="cpu"):
    return (torch.randn(b, h, sq, d, dtype=dtype, device=device), torch.randn(b, hk, sk, d, dtype=dtype, device=device),
            torch.randn(b, hk, sk, d, dtype=dtype, device=device))


@pytest.mark.parametrize("change, reason", [
    (lambda q, k, v, bias: (q.float(), k, v, bias), "share one dtype"),
    (lambda q, k, v, bias: (q[:, :, :1].expand(2, 8, 17, 64), k, v, bias), "1..16 query rows"),
    (lambda q, k, v, bias: (q[..., :48], k[..., :48], v[..., :48], bias), "head dim"),
    (lambda q, k, v, bias: (q[:, :6], k[:, :1].expand(2, 4, 200, 64), v[:, :1].expand(2, 4, 200, 64), bias),
     "multiple of KV heads"),
    (lambda q, k, v, bias: (q.transpose(2, 3).contiguous().transpose(2, 3), k, v, bias), "contiguous"),
    (lambda q, k, v, bias: (q, k, v, torch.zeros(3, 1, 1, 200)), "does not broadcast"),
    (lambda q, k, v, bias: (q, k, v, torch.ones(2, 1, 1, 200, dtype=torch.bool)), "floating-point"),
    (lambda q, k, v, bias: (q, k[:, :, :100], v, bias), "k and v must be"),
])
def test_unsupported_inputs_are_named(change, reason):
    q, k, v = _qkv()
    args = change(q, k, v, None)
    assert reason in decode.unsupported(*args)
    with pytest.raises(ValueError, match="decode_attention: "):
        decode.decode_attention(*args)


def test_supported_inputs_have_no_reason():
    q, k, v = _qkv()
    assert decode.unsupported(q, k, v, torch.zeros(2, 1, 1, 200, dtype=BF16)) is None
    assert decode.unsupported(q, k, v, None) is None


@pytest.mark.parametrize("programs, keys, splits, per_split", [
    (256, 768, 3, 256),      # 32 requests x 8 KV heads on 132 SMs: 528 program slots
    (64, 768, 6, 128),       # 8 requests: more splits (9 asked, 6 of 2 steps cover the keys)
    (8, 4096, 64, 64),       # few heads, long cache: capped at MAX_SPLITS
    (1024, 768, 1, 768),     # enough heads already
    (4, 10, 1, 64),          # one step of keys
])
def test_split_plan(programs, keys, splits, per_split):
    assert decode.plan_splits(programs, keys, 132) == (splits, per_split)
    got_splits, got_per_split = decode.plan_splits(programs, keys, 132)
    assert got_per_split % decode.DEFAULT.block_n == 0
    assert (got_splits - 1) * got_per_split < keys <= got_splits * got_per_split


# ---- GPU ----------------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.parametrize("hidden", [float("-inf"), -65504.0])   # -65504: PyTorch's boolean mask for cuDNN
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("b, hk, group, sk, d", [(32, 8, 4, 768, 128), (3, 2, 1, 1000, 64), (1, 4, 2, 5000, 128)])
def test_cuda_decode_matches_float64_sdpa(dtype, b, hk, group, sk, d, hidden):
    torch.manual_seed(b + sk)
    # the e2e grouped decode: the G query heads of a KV group as G query rows of one head
    q, k, v = _qkv(b, hk, hk, group, sk, d, dtype, "cuda")
    lengths = torch.randint(1, sk + 1, (b,), device="cuda")
    mask = torch.arange(sk, device="cuda")[None, :] < lengths[:, None]
    bias = torch.zeros(b, 1, 1, sk, dtype=dtype, device="cuda").masked_fill(~mask[:, None, None, :], hidden)
    out, lse = decode.decode_attention(q, k, v, bias)
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=bias.double())
    tol = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -9
    torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol * 4)
    logits = (q.double() @ k.double().transpose(-1, -2)) / math.sqrt(d) + bias.double()
    torch.testing.assert_close(lse.double(), torch.logsumexp(logits, -1), rtol=1e-4, atol=1e-4)


@pytest.mark.cuda
def test_cuda_decode_gqa_and_nan_propagation():
    q, k, v = _qkv(2, 8, 2, 3, 300, 128, BF16, "cuda")
    q[1, 5, 2, 7] = float("nan")
    out, _ = decode.decode_attention(q, k, v)
    assert torch.isnan(out[1, 5, 2]).all() and not torch.isnan(out[0]).any() and not torch.isnan(out[1, 4]).any()
    k[0, 1, 17, 3] = float("nan")                       # KV head 1 serves query heads 4..7
    out, _ = decode.decode_attention(q, k, v)
    assert torch.isnan(out[0, 4:]).all() and not torch.isnan(out[0, :4]).any()


@pytest.mark.cuda
def test_cuda_sdpa_masked_decode_is_served_under_the_option(monkeypatch):
    """The e2e model's call (a boolean (B, 1, 1, L) mask, the KV group's query heads as rows), routed
    through the attention family with config.attention_decode on, eager and inside a CUDA graph."""
    import tilefly
    from tilefly import _dispatch, config

    monkeypatch.setattr(config, "attention_decode", "on")
    q, k, v = _qkv(8, 8, 8, 4, 768, 128, BF16, "cuda")
    mask = (torch.arange(768, device="cuda") < 300).expand(8, 1, 1, 768)
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask)
    with tilefly.enabled("attention"):
        with _dispatch.recording() as decisions:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        assert [d.impl for d in decisions] == ["tilefly_decode"], decisions
        torch.testing.assert_close(out.double(), want, rtol=2.0 ** -7, atol=2.0 ** -5)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        graph.replay()
        torch.testing.assert_close(captured, out, rtol=0, atol=0)


@pytest.mark.cuda
def test_cuda_compiled_sdpa_masked_decode_is_served_under_the_option(monkeypatch):
    """Compiled, the e2e model's boolean mask reaches the cuDNN op as a -65504 bias (PyTorch's
    conversion for cuDNN); the decode entry serves that call and masks those keys."""
    import tilefly
    from tilefly import _dispatch, config

    monkeypatch.setattr(config, "attention_decode", "on")
    q, k, v = _qkv(8, 8, 8, 4, 768, 128, BF16, "cuda")
    lengths = torch.randint(1, 769, (8,), device="cuda")
    mask = (torch.arange(768, device="cuda")[None, :] < lengths[:, None])[:, None, None, :]
    k.masked_fill_(~mask.transpose(-1, -2), float("nan"))      # hidden keys must not be read
    v.masked_fill_(~mask.transpose(-1, -2), float("nan"))
    want = F.scaled_dot_product_attention(q.double(), k.double().nan_to_num(), v.double().nan_to_num(),
                                          attn_mask=mask)
    with tilefly.enabled("attention"):
        step = torch.compile(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), fullgraph=True)
        with _dispatch.recording() as decisions:
            out = step(q, k, v, mask)
    assert "tilefly_decode" in [d.impl for d in decisions], decisions
    torch.testing.assert_close(out.double(), want, rtol=2.0 ** -7, atol=2.0 ** -5)

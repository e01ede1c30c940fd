"""Stand-ins for PyTorch's three fused SDPA kernels on the CPU key, so the routing can be
proven on a CPU-only machine: same op schemas, same output formats as the real kernels
(efficient's B x S x H x D output and +inf-padded log-sum-exp, cuDNN's B x H x S x 1,
flash's B x H x S and uint64 RNG state), computed in float64.

Their backward kernels compute P from the *saved* log-sum-exp and D from the *saved*
output, as the real kernels do, so a saved tensor in the wrong layout or convention
gives wrong gradients instead of passing silently. Each call appends its name to ``log``.

Also here, shared by the CPU and GPU tests: database entries and files (``db_entry``,
``write_db``) and ``all_thread_decisions``, which sees the router's decisions in every thread.
"""
from __future__ import annotations

import math
import warnings

import torch

from tilefly import _dispatch


def _scores(q, k, causal, scale):
    q, k = q.double(), k.double()
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    s = (q @ k.transpose(-1, -2)) * (scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
    if causal:
        sq, sk = s.shape[-2:]
        s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    return s


def reference(q, k, v, causal=False, scale=None):
    """float64 attention output and log-sum-exp (B x H x Sq); top-left causal mask, GQA by
    repeating k/v heads."""
    s = _scores(q, k, causal, scale)
    lse = torch.logsumexp(s, -1)
    group = q.shape[1] // k.shape[1]
    return torch.exp(s - lse[..., None]) @ v.double().repeat_interleave(group, dim=1), lse


# (Sq, Sk) pairs the GPU tests of tilefly's kernels sweep: equal, ragged either way, single rows.
LENGTHS = [(s, s) for s in (1, 17, 77, 128, 1000)] + [(17, 1000), (1000, 77), (1, 128), (128, 17)]


def cuda_inputs(b, hq, hk, sq, sk, d, dtype=torch.bfloat16, seed=0):
    """q (B x Hq x Sq x d), k and v (B x Hk x Sk x d): fresh normal values on the GPU."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(b, h, s, d, device="cuda", dtype=dtype, generator=g) for h, s in ((hq, sq), (hk, sk), (hk, sk))]


def poisoned_outputs(q):
    """NaN-filled (out like q, lse B x H x Sq FP32): a forward that skips an element leaves NaN."""
    b, h, s, _ = q.shape
    return torch.full_like(q, float("nan")), torch.full((b, h, s), float("nan"), device=q.device)


def _grads(g, q, k, v, out, lse, causal, scale):
    sc = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    group = q.shape[1] // k.shape[1]
    s = _scores(q, k, causal, scale)
    p = torch.exp(s - lse.double()[..., None])               # from the saved lse
    vv = v.double().repeat_interleave(group, dim=1)
    g = g.double()
    dp = g @ vv.transpose(-1, -2)
    ds = p * (dp - (g * out.double()).sum(-1, keepdim=True))  # from the saved output
    dq = ds @ k.double().repeat_interleave(group, dim=1) * sc
    dk = (ds.transpose(-1, -2) @ q.double() * sc)
    dv = p.transpose(-1, -2) @ g
    b, hk = k.shape[0], k.shape[1]
    dk = dk.view(b, hk, group, *dk.shape[2:]).sum(2)
    dv = dv.view(b, hk, group, *dv.shape[2:]).sum(2)
    return dq, dk, dv


def _like(t, value):
    return torch.empty_like(t).copy_(value)


def _bshd(shape, value, dtype):
    b, h, s, d = shape
    return torch.empty(b, s, h, d, dtype=dtype).transpose(1, 2).copy_(value)


class StandIns:
    """Registers the six stand-in kernels on the CPU key while alive."""

    def __init__(self):
        self.log: list[str] = []
        self.lib = torch.library.Library("aten", "IMPL")
        kw = _dispatch._IMPL_KWARGS
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            for name, fn in (("_scaled_dot_product_cudnn_attention", self.cudnn),
                             ("_scaled_dot_product_cudnn_attention_backward", self.cudnn_bwd),
                             ("_scaled_dot_product_flash_attention", self.flash),
                             ("_scaled_dot_product_flash_attention_backward", self.flash_bwd),
                             ("_scaled_dot_product_efficient_attention", self.efficient),
                             ("_scaled_dot_product_efficient_attention_backward", self.efficient_bwd)):
                self.lib.impl(name, fn, "CPU", **kw)

    def close(self):
        self.lib._destroy()

    def cudnn(self, q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False,
              return_debug_mask=False, *, scale=None):
        self.log.append("cudnn")
        o, lse = reference(q, k, v, is_causal, scale)
        seed = torch.empty((), dtype=torch.int64)
        return (_like(q, o), lse.float().unsqueeze(-1).contiguous(), None, None, q.shape[2], k.shape[2],
                seed, seed.clone(), None)

    def cudnn_bwd(self, grad_out, q, k, v, out, logsumexp, philox_seed, philox_offset, attn_bias, cum_seq_q,
                  cum_seq_k, max_q, max_k, dropout_p, is_causal, *, scale=None):
        self.log.append("cudnn_bwd")
        assert logsumexp.shape == (*q.shape[:3], 1), logsumexp.shape
        dq, dk, dv = _grads(grad_out, q, k, v, out, logsumexp[..., 0], is_causal, scale)
        return _like(q, dq), _like(k, dk), _like(v, dv)

    def flash(self, q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
        self.log.append("flash")
        assert not (is_causal and q.shape[2] != k.shape[2]), "flash runs causal only when Sq == Sk"
        o, lse = reference(q, k, v, is_causal, scale)
        return (_like(q, o), lse.float().contiguous(), None, None, q.shape[2], k.shape[2],
                torch.empty(2, dtype=torch.uint64), torch.empty((), dtype=torch.uint64),
                torch.empty(0, dtype=q.dtype))

    def flash_bwd(self, grad_out, q, k, v, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
                  is_causal, philox_seed, philox_offset, *, scale=None):
        self.log.append("flash_bwd")
        assert logsumexp.shape == q.shape[:3] and logsumexp.is_contiguous()
        dq, dk, dv = _grads(grad_out, q, k, v, out, logsumexp, is_causal, scale)
        return _like(q, dq), _like(k, dk), _like(v, dv)

    def efficient(self, q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *, scale=None):
        self.log.append("efficient")
        assert q.shape[1] == k.shape[1], "the efficient op gets expanded heads"
        o, lse = reference(q, k, v, is_causal, scale)
        b, h, sq = q.shape[:3]
        padded = torch.full((b, h, -(-sq // 32) * 32 if compute_log_sumexp else 0), float("inf"))
        if compute_log_sumexp:
            padded[..., :sq] = lse
        seed = torch.empty((), dtype=torch.int64)
        return _bshd(q.shape, o, q.dtype), padded, seed, seed.clone()

    def efficient_bwd(self, grad_out_, q, k, v, attn_bias, out, logsumexp, philox_seed, philox_offset, dropout_p,
                      grad_input_mask, is_causal=False, *, scale=None):
        self.log.append("efficient_bwd")
        sq = q.shape[2]
        assert logsumexp.shape[-1] == -(-sq // 32) * 32, logsumexp.shape
        assert bool(torch.isinf(logsumexp[..., sq:]).all()), "padding rows must hold +inf"
        dq, dk, dv = _grads(grad_out_, q, k, v, out, logsumexp[..., :sq], is_causal, scale)
        return _bshd(q.shape, dq, q.dtype), _bshd(k.shape, dk, k.dtype), _bshd(v.shape, dv, v.dtype), None


def db_entry(direction="fwd", dtype="bf16", head_dim=64, causal=False, gqa=False, sq_bin=1, sk_bin=1,
             serve=None, default="cudnn"):
    """A database entry; ``serve`` maps backend -> list of implementation ids (fastest first,
    without the backend itself, which is appended); times are made up but ordered."""
    serve = serve or {}
    ranking = {}
    for backend in ("cudnn", "flash", "efficient"):
        faster = serve.get(backend, [])
        ranking[backend] = [[impl, 10.0 + i] for i, impl in enumerate(faster)] + [[backend, 100.0]]
    times = {impl: us for rows in ranking.values() for impl, us in rows}
    return {"dtype": dtype, "head_dim": head_dim, "causal": causal, "gqa": gqa, "sq_bin": sq_bin,
            "sk_bin": sk_bin, "direction": direction, "default": default, "times_us": times,
            "serve": ranking, "shape": [1, 2, 2, max(sq_bin, 1), max(sk_bin, 1)]}


def write_db(path, entries):
    from tilefly.tuning import db as tdb

    header = {"version": 1, "gpu": "NVIDIA H200", "torch": torch.__version__, "created": "test",
              "tuner_args": {"hand_made_for": "tests"}}
    tdb.write(path, header, entries)
    return str(path)


def all_thread_decisions():
    """The router's decisions made in any thread while open, in call order: autograd runs the
    backward of CUDA tensors on its own device thread, which a plain recording() does not see."""
    return _dispatch.recording(all_threads=True)


def assert_compiles_without_spills(spec, smem_limit=None):
    """Compile ``spec`` for sm_90a on CPU: it must build, with no local memory or stack (spills),
    and within ``smem_limit`` bytes of shared memory when given."""
    from tilefly.compile_check import compile_one

    result = compile_one(spec)
    assert result.ok, result.error
    assert result.local == 0 and result.stack == 0, result.row()
    if smem_limit is not None:
        assert result.shared <= smem_limit, result.row()
    return result

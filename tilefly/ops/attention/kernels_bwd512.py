"""Attention backward for head dim 512: cuBLAS batched GEMMs around one fused plain-Triton
elementwise kernel. Same contract as kernels.backward (FP16/BF16 q, k, v; any strides of out and
grad_out; canonical lse B x Hq x Sq float32 natural log; top-left causal; GQA; dq, dk, dv like
q, k, v or written into ``grads``).

Why not a flash-style kernel: a key tile's dK and dV accumulators are 2 x 64 x 512 FP32 (256 KB),
more than a CTA's registers and shared memory together; streaming them costs more than
materializing the scores at this head dim, where every GEMM has a 512-deep or 512-wide side.

Plan, per chunk of (batch, kv head) groups. Hq = G * Hk; q and dO are made contiguous (a copy
only when they are not: e.g. B x S x H x D projections), so the G q heads of kv head j are G * Sq
consecutive rows, R = G * Sq rows per group, and each product below is ONE bmm over the chunk's
groups (the GQA sum over q heads is the GEMM's own inner dimension, no extra reduction):

    delta = rowsum(dO * O)        FP32, kernels_bwd's delta kernel (B x Hq x Sq, = groups x R)
    S     = Q K^T                 [g, R, Sk] FP32 out (cuBLAS, FP32 accumulation)
    dP    = dO V^T                [g, R, Sk] FP32 out
    P, dS = softmax_grad(S, dP)   this module's Triton kernel, written in the input dtype (as
                                  flash kernels feed P and dS to their MMAs):
                                  P = exp(S * scale - lse), 0 where causal-masked;
                                  dS = P * (dP - delta) * scale
    dV    = P^T dO                [g, Sk, D]    dK = dS^T Q    dQ = dS K    [g, R, D]
                                  FP32 accumulation in cuBLAS, cast to the dtype on store.

``prepare`` (argument checks, the contiguous [groups, rows, D] operands, delta) and ``chunking``
also serve kernels_bwd512g (config ``bwd512g``), which replaces the GEMMs and the Triton kernel
with Gluon kernels.

Causal with one q head per kv head (no GQA): the products skip whole blocks above the diagonal.
Rows are cut into at most CAUSAL_BLOCKS blocks (``causal_edges``); S, dP and dQ run per row block
over the keys it sees, dK and dV per key block over the rows that see it (P and dS are zero above
the diagonal, so nothing is lost), ~56% of the full products at 8 blocks. GQA causal runs the
full products (a key block's rows would span G separate row ranges).

Workspace: it holds S and dP (FP32) and P and dS (dtype) of a chunk, 12 bytes per
score, under WORKSPACE_BYTES; one workspace serves every chunk. When a single group's scores
exceed it, its rows are split too and dK, dV sum the row blocks' products in FP32 buffers.
Traffic besides the GEMMs' operands: S and dP written (8 B/score) and read (8), P and dS written
(4) and read by three GEMMs (6): a memory-bound ~26 B/score against ~5 x 2 x 512 = 5120 FLOP/score.

Triton kernel layout plan (softmax_grad): a program owns BLOCK_R = 16 rows x BLOCK_K = 256 keys
of one group (grid: key blocks, row blocks, groups), 4 warps: each thread holds 32 elements as
8 runs of 4 consecutive FP32 keys (16-byte loads when Sk is a multiple of 4), plus its rows' lse
and delta. No shared memory, no barriers. Causal: query row i = (row0 + r) % Sq sees keys 0..i;
tiles wholly below the diagonal load as in the full case, tiles wholly above it only store zeros,
and tiles it crosses mask S and dP element by element (P and dS stored as 0 where hidden).

Precision: S and dP are exact FP32 GEMM results; P and dS are rounded to FP16/BF16 once, as in
flash kernels. NaN in q, k or v flows through the GEMMs into the rows and columns it touches; P
is an exact zero at causal-masked entries, so (unlike PyTorch's math path, whose softmax spreads a
NaN row onto masked keys) dV stays finite for keys the NaN row does not see.

bmm with out_dtype (aten::bmm.dtype, CUDA only, recent torch) gives FP32 scores from FP16/BF16
operands, written straight into the workspace; where it is missing or refuses (settled on the
first CUDA call), S and dP come from FP32 copies of the operands (slow, correct;
``fallback_reason`` says why). That path also serves CPU tensors, so the whole backward runs
under TRITON_INTERPRET=1 in the interpreter checks.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

HEAD_DIM = 512
WORKSPACE_BYTES = 2 << 30
BYTES_PER_SCORE = 4 + 4 + 2 + 2    # S, dP (FP32); P, dS (FP16/BF16)
BLOCK_R = 16
BLOCK_K = 256
NUM_WARPS = 4
DTYPES = ("bf16", "fp16")
LOG2E = 1.4426950408889634

fallback_reason: str | None = None   # why CUDA scores do not take bmm's FP32 output directly (None: they do)


@triton.jit
def _softmax_grad_tile(s_ptr, dp_ptr, p_ptr, ds_ptr, offs, inside, keep, lse2, delta, qk_scale, scale):
    s = tl.load(s_ptr + offs, mask=keep, other=0.0)
    dp = tl.load(dp_ptr + offs, mask=keep, other=0.0)
    p = tl.where(keep, tl.exp2(s * qk_scale - lse2[:, None]), 0.0)
    ds = p * (dp - delta[:, None]) * scale
    tl.store(p_ptr + offs, p.to(p_ptr.dtype.element_ty), mask=inside)
    tl.store(ds_ptr + offs, ds.to(ds_ptr.dtype.element_ty), mask=inside)


@triton.jit(do_not_specialize=["rows", "Sq", "group0", "row0", "group_rows"])
def attention_bwd512_softmax_grad_kernel(s_ptr, dp_ptr, lse_ptr, delta_ptr, p_ptr, ds_ptr, rows, Sk, Sq, group0,
                                         row0, group_rows, qk_scale, scale, BLOCK_R: tl.constexpr,
                                         BLOCK_K: tl.constexpr, CAUSAL: tl.constexpr):
    """S, dP, P, dS: the chunk's [groups, rows, Sk], contiguous. lse and delta: all [B * Hk,
    group_rows] rows; the chunk starts at group group0, row row0."""
    group = tl.program_id(2).to(tl.int64)
    r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    first = tl.program_id(0) * BLOCK_K
    c = first + tl.arange(0, BLOCK_K)
    row_in = r < rows
    inside = row_in[:, None] & (c < Sk)[None, :]
    stats = (group0 + group) * group_rows + row0 + r
    lse2 = tl.load(lse_ptr + stats, mask=row_in, other=0.0) * 1.4426950408889634
    delta = tl.load(delta_ptr + stats, mask=row_in, other=0.0)
    offs = (group * rows + r[:, None]) * Sk + c[None, :]
    if CAUSAL:
        # Whole tiles on one side of the diagonal keep the plain bounds mask (16-byte loads when
        # Sk is a multiple of 4); only tiles the diagonal crosses mask element by element.
        query = (row0 + r) % Sq
        lowest = tl.min(tl.where(row_in, query, Sk))
        highest = tl.max(tl.where(row_in, query, -1))
        if first + BLOCK_K <= lowest + 1:
            _softmax_grad_tile(s_ptr, dp_ptr, p_ptr, ds_ptr, offs, inside, inside, lse2, delta, qk_scale, scale)
        elif first > highest:
            zero = tl.zeros([BLOCK_R, BLOCK_K], dtype=tl.float32)
            tl.store(p_ptr + offs, zero.to(p_ptr.dtype.element_ty), mask=inside)
            tl.store(ds_ptr + offs, zero.to(ds_ptr.dtype.element_ty), mask=inside)
        else:
            keep = inside & (c[None, :] <= query[:, None])
            _softmax_grad_tile(s_ptr, dp_ptr, p_ptr, ds_ptr, offs, inside, keep, lse2, delta, qk_scale, scale)
    else:
        _softmax_grad_tile(s_ptr, dp_ptr, p_ptr, ds_ptr, offs, inside, inside, lse2, delta, qk_scale, scale)


# ---- GEMMs ---------------------------------------------------------------------------------------

def _scores(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    """out (FP32) = a @ b for FP16/BF16 batches: cuBLAS with FP32 output where torch has it (into
    ``out``, else through a copy), else on FP32 copies of the operands (also CPU tensors)."""
    if a.is_cuda and _score_path is None:
        _settle_score_path(a, b, out)
    elif a.is_cuda and _score_path == "out":
        torch.bmm(a, b, out_dtype=torch.float32, out=out)
    elif a.is_cuda and _score_path == "copy":
        out.copy_(torch.bmm(a, b, out_dtype=torch.float32))
    else:
        torch.bmm(a.float(), b.float(), out=out)


_score_path: str | None = None     # "out", "copy" or "fp32": how _scores runs on CUDA, once settled


def _settle_score_path(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    """The first CUDA product: the first path that works computes it and serves every later call."""
    global _score_path, fallback_reason
    reasons = []
    for path in ("out", "copy"):
        try:
            if path == "out":
                torch.bmm(a, b, out_dtype=torch.float32, out=out)
            else:
                out.copy_(torch.bmm(a, b, out_dtype=torch.float32))
            _score_path, fallback_reason = path, "; ".join(reasons) or None
            return
        except torch.cuda.OutOfMemoryError:
            raise
        except (RuntimeError, TypeError) as exc:   # torch without aten::bmm.dtype(_out), or it refuses
            reasons.append(f"bmm out_dtype ({path}): {type(exc).__name__}: {exc}"[:300])
    _score_path, fallback_reason = "fp32", "; ".join(reasons)
    torch.bmm(a.float(), b.float(), out=out)


def _sum_into(acc: torch.Tensor | None, a: torch.Tensor, b: torch.Tensor, target: torch.Tensor) -> None:
    """target = a @ b (acc None) or acc += a @ b in FP32 (rows of one group split across chunks)."""
    if acc is None:
        torch.bmm(a, b, out=target)
        return
    part = torch.empty(acc.shape, dtype=torch.float32, device=acc.device)
    _scores(a, b, part)
    acc += part


# ---- causal, one q head per kv head: the GEMMs skip blocks above the diagonal ------------------

CAUSAL_BLOCKS = 8            # at most this many row (and key) blocks
CAUSAL_MIN_ROWS = 256        # rows per block at least (smaller GEMMs lose more than they skip)


def causal_edges(sq: int, sk: int) -> list[int] | None:
    """Row-block edges [0, ..., Sq] (multiples of 64) for causal products, or None when blocking
    would not pay. Row r sees keys 0..r: row block [a, b) needs keys [0, min(b, Sk)) and key block
    [a, b) rows [a, Sq); keys from Sq on see no row. With n blocks the GEMMs do (n + 1) / 2n of the
    full products' work (56% at 8)."""
    blocks = min(CAUSAL_BLOCKS, sq // CAUSAL_MIN_ROWS, -(-sk // 64))
    if blocks < 2:
        return None
    step = -(-sq // (blocks * 64)) * 64
    return list(range(0, sq, step)) + [sq]


def _triangle_scores(q, do, k, v, s, dp, edges):
    """S and dP of the blocks on or below the diagonal (the Triton kernel reads nothing else)."""
    sk = k.shape[1]
    for a, b in zip(edges, edges[1:]):
        end = min(b, sk)
        _scores(q[:, a:b], k[:, :end].transpose(1, 2), s[:, a:b, :end])
        _scores(do[:, a:b], v[:, :end].transpose(1, 2), dp[:, a:b, :end])


def _triangle_grads(q, do, k, p, ds, dq, dk, dv, edges):
    """dQ by row blocks, dK and dV by key blocks, each from the visible part of P and dS (zeros
    above the diagonal, so skipping them changes nothing); keys no row sees get zero gradients."""
    sk = k.shape[1]
    for a, b in zip(edges, edges[1:]):
        end = min(b, sk)
        torch.bmm(ds[:, a:b, :end], k[:, :end], out=dq[:, a:b])
        if a < end:
            torch.bmm(p[:, a:, a:end].transpose(1, 2), do[:, a:], out=dv[:, a:end])
            torch.bmm(ds[:, a:, a:end].transpose(1, 2), q[:, a:], out=dk[:, a:end])
    dv[:, edges[-1]:].zero_()
    dk[:, edges[-1]:].zero_()


# ---- the launcher ----------------------------------------------------------------------------

def chunking(groups: int, group_rows: int, sk: int, workspace_bytes: int = WORKSPACE_BYTES,
             bytes_per_score: int = BYTES_PER_SCORE) -> tuple[int, int]:
    """(groups per chunk, rows per chunk): whole groups while one fits the workspace, else one
    group at a time in row blocks (multiples of BLOCK_R where possible)."""
    per_row = sk * bytes_per_score
    per_group = group_rows * per_row
    if per_group <= workspace_bytes:
        return max(1, min(groups, workspace_bytes // per_group)), group_rows
    rows = max(1, workspace_bytes // per_row)
    return 1, rows // BLOCK_R * BLOCK_R or rows


def _contiguous_target(g: torch.Tensor) -> torch.Tensor:
    return g if g.is_contiguous() else torch.empty(g.shape, dtype=g.dtype, device=g.device)


def device_of(t: torch.Tensor):
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


@dataclass
class Problem:
    """A head-dim-512 backward as both paths (this module's and kernels_bwd512g's) run it: the
    operands as [groups, rows, D] views of contiguous tensors (a group = one batch's kv head and
    its G q heads, R = G * Sq rows), gradient targets likewise; lse and delta B x Hq x Sq FP32,
    contiguous, which is [groups, R] in memory."""
    qs: torch.Tensor          # [groups, R, D]
    dos: torch.Tensor         # [groups, R, D]
    ks: torch.Tensor          # [groups, Sk, D]
    vs: torch.Tensor          # [groups, Sk, D]
    dqs: torch.Tensor         # views of the contiguous targets
    dks: torch.Tensor
    dvs: torch.Tensor
    lse: torch.Tensor
    delta: torch.Tensor
    scale: float
    group: int                # q heads per kv head
    sq: int
    sk: int
    grads: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    targets: list[torch.Tensor]

    @property
    def groups(self) -> int:
        return self.qs.shape[0]

    @property
    def group_rows(self) -> int:
        return self.qs.shape[1]

    def finish(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The gradients, copied into ``grads`` where a contiguous target stood in for them."""
        for g, t in zip(self.grads, self.targets):
            if g is not t:
                g.copy_(t)
        return self.grads


def prepare(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
            lse: torch.Tensor, scale: float | None,
            grads: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None) -> Problem:
    """Check the arguments, make the operands contiguous (copies only where they are not) and run
    the delta kernel."""
    from tilefly.ops.attention.configs import delta_blocks
    from tilefly.ops.attention.kernels import _tma_reason, replay
    from tilefly.ops.attention.kernels_bwd import attention_bwd_delta_kernel

    b, hq, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    if d != HEAD_DIM:
        raise ValueError(f"backward512 serves head dim {HEAD_DIM}, not {d}")
    if grad_out.shape != q.shape or out.shape != q.shape:
        raise ValueError(f"grad_out {tuple(grad_out.shape)} and out {tuple(out.shape)} must be shaped like q "
                         f"{tuple(q.shape)}")
    if lse.shape != (b, hq, sq):
        raise ValueError(f"lse must be {(b, hq, sq)}, got {tuple(lse.shape)}")
    if grads is None:
        grads = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    for name, g, like in zip(("dq", "dk", "dv"), grads, (q, k, v)):
        if g.shape != like.shape or g.dtype != like.dtype:
            raise ValueError(f"{name} {tuple(g.shape)} {g.dtype} cannot take this gradient")
    group = hq // hk
    groups, group_rows = b * hk, group * sq
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    grad_out = grad_out.to(q.dtype).contiguous()
    if _tma_reason("out", out):   # the delta kernel loads rows as 16-byte vectors
        out = out.contiguous()
    lse = lse.to(torch.float32).contiguous()
    qs, dos = (t.contiguous().view(groups, group_rows, d) for t in (q, grad_out))
    ks, vs = (t.contiguous().view(groups, sk, d) for t in (k, v))
    targets = [_contiguous_target(g) for g in grads]
    dqs = targets[0].view(groups, group_rows, d)
    dks, dvs = (t.view(groups, sk, d) for t in targets[1:])
    delta = torch.empty(b, hq, sq, dtype=torch.float32, device=q.device)
    block_s, block_d = delta_blocks(d)
    with device_of(q):
        replay(attention_bwd_delta_kernel, (-(-sq // block_s), b * hq),
               [out, grad_out, delta, sq, hq, d, *out.stride()[:3], *grad_out.stride()[:3]],
               dict(BLOCK_S=block_s, BLOCK_D=block_d), q)
    return Problem(qs, dos, ks, vs, dqs, dks, dvs, lse, delta, scale, group, sq, sk, grads, targets)


def backward512(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                lse: torch.Tensor, causal: bool, scale: float | None, *,
                grads: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                workspace_bytes: int = WORKSPACE_BYTES) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """kernels.backward for head dim 512: (dq, dk, dv) like q, k, v (or ``grads``, written in place).
    The caller checked kernels.unsupported()."""
    from tilefly.ops.attention.kernels import replay

    pb = prepare(grad_out, q, k, v, out, lse, scale, grads)
    qs, dos, ks, vs, dqs, dks, dvs = pb.qs, pb.dos, pb.ks, pb.vs, pb.dqs, pb.dks, pb.dvs
    groups, group_rows, sq, sk, d = pb.groups, pb.group_rows, pb.sq, pb.sk, HEAD_DIM

    n_groups, n_rows = chunking(groups, group_rows, sk, workspace_bytes)
    scores = n_groups * n_rows * sk
    s_ws = torch.empty(scores, dtype=torch.float32, device=q.device)
    dp_ws = torch.empty(scores, dtype=torch.float32, device=q.device)
    p_ws = torch.empty(scores, dtype=q.dtype, device=q.device)
    ds_ws = torch.empty(scores, dtype=q.dtype, device=q.device)
    split = n_rows < group_rows
    acc = [torch.empty(1, sk, d, dtype=torch.float32, device=q.device) for _ in range(2)] if split else [None, None]

    with device_of(q):
        for g0 in range(0, groups, n_groups):
            g1 = min(groups, g0 + n_groups)
            if split:
                for a in acc:
                    a.zero_()
            for r0 in range(0, group_rows, n_rows):
                r1 = min(group_rows, r0 + n_rows)
                shape = (g1 - g0, r1 - r0, sk)
                s, dp, p, ds = (w[:math.prod(shape)].view(shape) for w in (s_ws, dp_ws, p_ws, ds_ws))
                q_blk, do_blk = qs[g0:g1, r0:r1], dos[g0:g1, r0:r1]
                edges = causal_edges(sq, sk) if causal and pb.group == 1 and not split else None
                if edges:
                    _triangle_scores(q_blk, do_blk, ks[g0:g1], vs[g0:g1], s, dp, edges)
                else:
                    _scores(q_blk, ks[g0:g1].transpose(1, 2), s)
                    _scores(do_blk, vs[g0:g1].transpose(1, 2), dp)
                grid = (triton.cdiv(sk, BLOCK_K), triton.cdiv(r1 - r0, BLOCK_R), g1 - g0)
                replay(attention_bwd512_softmax_grad_kernel, grid,
                       [s, dp, pb.lse, pb.delta, p, ds, r1 - r0, sk, sq, g0, r0, group_rows, pb.scale * LOG2E,
                        pb.scale], dict(BLOCK_R=BLOCK_R, BLOCK_K=BLOCK_K, CAUSAL=bool(causal), num_warps=NUM_WARPS),
                       q)
                if edges:
                    _triangle_grads(q_blk, do_blk, ks[g0:g1], p, ds, dqs[g0:g1], dks[g0:g1], dvs[g0:g1], edges)
                    continue
                torch.bmm(ds, ks[g0:g1], out=dqs[g0:g1, r0:r1])
                _sum_into(acc[0], p.transpose(1, 2), do_blk, dvs[g0:g1])
                _sum_into(acc[1], ds.transpose(1, 2), q_blk, dks[g0:g1])
            if split:
                dvs[g0:g1].copy_(acc[0])
                dks[g0:g1].copy_(acc[1])
    return pb.finish()


# ---- compile specs and interpreter checks -----------------------------------------------------

def kernel_signature(dtype: str, causal: bool) -> tuple[dict, dict]:
    """Signature strings and constexprs of the softmax_grad kernel as backward512 launches it."""
    sig = {"s_ptr": "*fp32", "dp_ptr": "*fp32", "lse_ptr": "*fp32", "delta_ptr": "*fp32", "p_ptr": f"*{dtype}",
           "ds_ptr": f"*{dtype}", "rows": "i32", "Sk": "i32", "Sq": "i32", "group0": "i32", "row0": "i32",
           "group_rows": "i32",
           "qk_scale": "fp32", "scale": "fp32"}
    constexprs = dict(BLOCK_R=BLOCK_R, BLOCK_K=BLOCK_K, CAUSAL=causal)
    sig.update({name: "constexpr" for name in constexprs})
    return sig, constexprs


def _kernel():
    return attention_bwd512_softmax_grad_kernel


def compile_specs():
    """The softmax_grad kernel per dtype x causal (pointers and Sk 16-divisible, as in the common
    case where Triton specializes them), and the delta kernel at head dim 512."""
    from tilefly.compile_check import KernelSpec
    from tilefly.ops.attention.configs import delta_spec

    specs = []
    for dtype in DTYPES:
        for causal in (False, True):
            sig, constexprs = kernel_signature(dtype, causal)
            aligned = {(list(sig).index(n),): [["tt.divisibility", 16]] for n in sig
                       if sig[n].startswith("*") or n == "Sk"}
            specs.append(KernelSpec(name=f"attention.bwd512_softmax_grad[{dtype},{'causal' if causal else 'full'}]",
                                    kernel=_kernel, signature=sig, constexprs=constexprs, attrs=aligned,
                                    num_warps=NUM_WARPS))
    return specs + [delta_spec(dtype, HEAD_DIM) for dtype in DTYPES]


def _reference(q, k, v, grad_out, causal, scale):
    """float64 output, lse and gradients of math attention (top-left causal, GQA by repetition)."""
    group = q.shape[1] // k.shape[1]
    qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
    s = qd @ kd.repeat_interleave(group, 1).transpose(-1, -2) * scale
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    out = torch.exp(s - lse[..., None]) @ vd.repeat_interleave(group, 1)
    out.backward(grad_out.double())
    return out.detach(), lse.detach(), (qd.grad, kd.grad, vd.grad)


def _check(b, hq, hk, sq, sk, causal, dtype, workspace_bytes, bshd):
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    gen = torch.Generator().manual_seed(sq * 131 + sk)
    q, k, v, grad_out = (torch.randn(b, h, s, HEAD_DIM, generator=gen).to(torch_dtype)
                         for h, s in ((hq, sq), (hk, sk), (hk, sk), (hq, sq)))
    if bshd:   # B x S x H x D in memory: the copies and the copy-back of the gradients
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    scale = 0.3 / math.sqrt(HEAD_DIM) if causal else None
    out, lse, want = _reference(q, k, v, grad_out, causal, scale or 1 / math.sqrt(HEAD_DIM))
    poisoned = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
    got = backward512(grad_out, q, k, v, out.to(torch_dtype), lse.float(), causal, scale, grads=poisoned,
                      workspace_bytes=workspace_bytes)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        err = ((g.double() - w).norm() / w.norm()).item()
        if not err < 2e-2:
            raise AssertionError(f"{name} relative error {err:.3g}")
        if g.stride() != poisoned[0 if name == "dq" else 1].stride():
            raise AssertionError(f"{name} strides {g.stride()}")


def interpreter_checks():
    """The whole backward on CPU tensors (bmm through FP32 copies, both Triton kernels interpreted)
    against float64: causal and not, Sq != Sk, GQA, tails, B x S x H x D inputs, and workspaces
    small enough to force group chunks and split rows."""
    cases = [  # b, hq, hk, sq, sk, causal, dtype, workspace bytes, bshd
        (2, 2, 2, 17, 33, False, "bf16", WORKSPACE_BYTES, False),
        (1, 4, 2, 300, 300, True, "fp16", WORKSPACE_BYTES, False),   # tiles on, across, above the diagonal
        (3, 3, 1, 9, 300, False, "bf16", 2 * 27 * 300 * BYTES_PER_SCORE, True),   # chunks of 2 groups, 1
        (1, 2, 1, 50, 20, True, "bf16", 40 * 20 * BYTES_PER_SCORE, False),         # rows split in 3
        (2, 2, 2, 530, 700, True, "bf16", WORKSPACE_BYTES, False),    # causal blocks; keys no row sees
        (1, 2, 2, 600, 300, True, "fp16", WORKSPACE_BYTES, True),     # causal blocks past Sk
    ]
    return [(f"bwd512[{c[6]},B={c[0]},Hq={c[1]},Hk={c[2]},Sq={c[3]},Sk={c[4]},{'causal' if c[5] else 'full'}]",
             lambda c=c: _check(*c)) for c in cases]

"""Attention backward for head dim 512, all Gluon (config ``bwd512g``): kernels_bwd512's plan with
its cuBLAS GEMMs and Triton softmax_grad replaced by one Gluon scores kernel
(kernels_bwd512_scores) and three launches of tilefly's grouped Gluon GEMM
(tilefly.ops.grouped_gemm). Same contract as kernels_bwd512.backward512, whose argument checks,
contiguous [groups, rows, D] operands, delta kernel and chunking it shares (kernels_bwd512.prepare,
chunking).

Per chunk of groups (a group: one batch's kv head and its G q heads, R = G * Sq rows):

    scores kernel   P^T, dS^T [g, Sk, R] and dS [g, R, Sk] in the input dtype; S and dP stay in
                    registers. Workspace traffic: 6 B/score written, 6 read by the GEMMs (dS is
                    written in both orientations: the grouped GEMM reads A row-major only),
                    against kernels_bwd512's 26 (FP32 S and dP written and read on top)
    dV = P^T dO     grouped GEMM, A = P^T as [g * Sk, R], B = dO as [g, R, D]
    dK = dS^T Q     A = dS^T [g * Sk, R], B = Q [g, R, D]
    dQ = dS K       A = dS [g * R, Sk], B = K [g, Sk, D]

B is read row-major (the operands as prepare() leaves them) when its K (R for dK and dV, Sk for
dQ) is a multiple of the GEMMs' BLOCK_K (64). Otherwise a group's last K-step would read the next
group's first rows: times A's zero-filled tail columns that is exact zero for finite values, but
0 x Inf is NaN, which would carry one group's non-finite input into another's gradients. So such
a B is copied K-major ([g, D, K], rows padded), which the grouped GEMM reads through a [g * D, K]
view whose K tail TMA zero-fills per group. The copy is kernels_bwd512_kmajor's Triton kernel
(KMAJOR_COPY): torch's transposing copy ran at ~0.6 TB/s, 167 us against 217 us of kernels at B2 H8
S1000 (BENCHMARKS.md session 16); with the kernel the whole backward at B4 H8 S777 went from 558 to
352 us (session 17). Lengths off 64 still pay for the copies. The workspace's rows are padded to 8
elements (16 bytes, what TMA needs of a row stride) and its descriptors clip at R and Sk, so any R
and Sk run.

The grouped GEMM sums over its inner dimension, which for dK and dV runs over all G q heads' rows:
the GQA reduction is free. Its groups are uniform here (``offs`` = multiples of Sk or R, built
once per (groups, rows, device)). Outputs go straight into the gradient targets in the input
dtype; when one group's rows are split across chunks (its scores exceed the workspace), dK and
dV sum the row blocks' FP32 products.

What it serves (``unserved`` gives the first reason it does not; kernels.backward then runs
kernels_bwd512 instead, never a wrong result):

    head dim 512                               the scores kernel's 8 chunks of 64 columns
    the workspace holds 64 rows of a group     row blocks of a split group are multiples of 64 (a
                                               16-byte aligned start in Q and dO)
    at most 65535 row tiles per chunk          the scores kernel's grid
    CUDA tensors (checked last, so that the    the Gluon kernels
      shape conditions answer on any device)

Everything else the grouped GEMM asks for holds by construction: FP16/BF16 operands and outputs
of one dtype (or FP32 partials), at most MAX_GROUPS groups per chunk, 16-byte aligned rows and
bases (prepare makes q, k, v, dO contiguous; D = 512; K-major copies and workspace rows padded).

Causal with one q head per kv head (G = 1), no row split, Sq and Sk multiples of 64: the GEMMs
may skip the blocks above the diagonal, as kernels_bwd512 does (dQ by row blocks over the keys
they see, dK and dV by key blocks over the rows that see them; edges multiples of 64, the GEMMs'
BLOCK_K, so row-major B sub-views stay whole K-steps), still through the grouped GEMM, on
sub-views of the workspace and operands. What the grouped GEMM cannot express decides when that
pays:

    one K per launch        the triangle has a different K per block: one launch per block
    packed B groups         b_view takes B's group stride only as K x row stride (or one group):
                            K[:, :kend], Q[:, a:] and dO[:, a:] of several groups are not packed
                            (nor are several groups' row blocks of dS as A rows), so with n groups
                            in a chunk a block product is n launches of one group each
    no split-K              output-stationary tiles: a launch of m rows x 512 has ~m / 32 tiles,
                            fewer than the SMs below ~4k rows, and lasts one tile's K loop anyway

So blocks cost launches and idle SMs where bwd512's batched cuBLAS products cost neither: 8 groups
x 8 blocks are 192 launches. ``causal_edges`` picks the block count from a wave model of the
launches (chunk_us), full products included. Its two constants are fitted to the H200 sweep
(scripts/attn512_bwd_sweep.py --causal-blocks, BENCHMARKS.md session 16): the full products' GEMMs
took 623 and 1148 us at the suite's causal shapes (model 644 and 1288), and every forced block
count was slower, each one-group block launch adding 35-61 us. So the model takes the full
products wherever a chunk holds several groups or up to ~4k rows, and blocks only for long
single groups (2 at 8192 rows, 4 at 16384).
``causal_blocks`` forces a count (tests, the sweep).
"""
from __future__ import annotations

import functools

import torch
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from tilefly import _device
from tilefly._triton_launch import launch_cached
from tilefly.ops.attention import kernels_bwd512 as bwd512
from tilefly.ops.attention import kernels_bwd512_kmajor as kmajor
from tilefly.ops.attention import kernels_bwd512_scores as scores
from tilefly.ops.grouped_gemm import launch as grouped
from tilefly.ops.grouped_gemm.configs import MAX_GROUPS, GroupedConfig

HEAD_DIM = 512
BYTES_PER_SCORE = 2 + 2 + 2     # P^T, dS^T, dS (FP16/BF16)
ROW_MULTIPLE = 64               # BLOCK_K of both GEMM configs: row-major B's K a multiple of it
ROW_PAD = 8                     # elements of a 16-byte row (FP16/BF16): TMA's row stride unit
MAX_ROW_TILES = 65535           # grid axis 1 of the scores kernel
LOG2E = 1.4426950408889634
# Grouped GEMM configs (grouped_gemm.configs.DEFAULT[0] and [1]), untimed for these shapes: wide
# tiles while they alone fill the SMs, else half-width tiles for twice as many programs.
GEMM_WIDE = GroupedConfig(128, 256, 64, 3, 8)
GEMM_NARROW = GroupedConfig(128, 128, 64, 4, 4)


def chunks(groups: int, group_rows: int, sk: int, workspace_bytes: int) -> tuple[int, int]:
    """(groups per chunk, rows per chunk): kernels_bwd512.chunking at 6 B/score, at most
    MAX_GROUPS groups (the grouped GEMM's table), split rows in multiples of 64 (0: none fit)."""
    n_groups, n_rows = bwd512.chunking(groups, group_rows, sk, workspace_bytes, BYTES_PER_SCORE)
    if n_rows < group_rows:
        n_rows = n_rows // ROW_MULTIPLE * ROW_MULTIPLE
    return min(n_groups, MAX_GROUPS), n_rows


def unserved(q: torch.Tensor, k: torch.Tensor, workspace_bytes: int = bwd512.WORKSPACE_BYTES) -> str | None:
    """None when backward512g computes this backward (q B x Hq x Sq x D, k B x Hk x Sk x D, the
    caller having checked kernels.unsupported()), else why not, in one line."""
    b, hq, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    if d != HEAD_DIM:
        return f"head dim {d}: bwd512g serves {HEAD_DIM}"
    rows = hq // hk * sq
    _, n_rows = chunks(b * hk, rows, sk, workspace_bytes)
    if n_rows == 0:     # chunks() splits a group in multiples of 64 rows
        return f"a {workspace_bytes}-byte workspace holds fewer than {ROW_MULTIPLE} rows of one group's scores"
    if -(-n_rows // scores.BLOCK_M) > MAX_ROW_TILES:
        return f"{n_rows} rows per chunk: more than {MAX_ROW_TILES} row tiles for the scores kernel's grid"
    if not q.is_cuda:   # last, so that the shape conditions can be checked on any device
        return f"tensors on {q.device.type}: bwd512g's Gluon kernels run on CUDA"
    return None


def _offsets(groups: int, rows: int, device: torch.device) -> torch.Tensor:
    """The grouped GEMM's ``offs`` for uniform groups: the end row of each (int32, on the device),
    kept per (groups, rows, device) outside CUDA graph pools (tilefly._device.kept); made afresh
    under stream capture, where it belongs to the graph."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return _make_offsets(groups, rows, device)
    return _kept_offsets(groups, rows, device)


def _make_offsets(groups: int, rows: int, device: torch.device) -> torch.Tensor:
    return torch.arange(1, groups + 1, dtype=torch.int32, device=device) * rows


@functools.lru_cache(maxsize=64)
def _kept_offsets(groups: int, rows: int, device: torch.device) -> torch.Tensor:
    if device.type != "cuda":
        return _make_offsets(groups, rows, device)
    return _device.kept(lambda: _make_offsets(groups, rows, device), device)


def _config(m: int, sms: int) -> GroupedConfig:
    wide_tiles = -(-m // GEMM_WIDE.block_m) * (HEAD_DIM // GEMM_WIDE.block_n)
    return GEMM_WIDE if wide_tiles >= sms else GEMM_NARROW


def gemm_config(m: int, out: torch.Tensor) -> GroupedConfig:
    """The grouped GEMM config for an m x 512 output."""
    return _config(m, _device.sm_count(out))


def _desc(t: torch.Tensor, block: list[int]) -> TensorDescriptor:
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block, grouped._shared_layout(tuple(block), t.dtype))


_scores_plans: dict[tuple, object] = {}


def _launch_scores(pb: bwd512.Problem, g0: int, r0: int, q_blk, do_blk, k_blk, v_blk, pt, dst, ds, causal: bool):
    """P^T, dS^T and dS of one chunk (q_blk, do_blk [n, rows, D]; k_blk, v_blk [n, Sk, D];
    pt, dst [n, Sk, rows]; ds [n, rows, Sk]). The JIT's launch (binding seven descriptors) costs
    more host time than small problems take on the GPU, so a launch whose addresses, sizes and
    scalars repeat replays the compiled kernel (tilefly._triton_launch.launch_cached)."""
    n, rows, d = q_blk.shape
    sk = pb.sk
    key = (q_blk.device.index, q_blk.dtype, bool(causal), n, rows, sk, pb.sq, g0, r0, pb.group_rows, pb.scale,
           *(t.data_ptr() for t in (q_blk, do_blk, k_blk, v_blk, pt, dst, ds, pb.lse, pb.delta)),
           pt.stride(1), ds.stride(1))

    def build():
        kv_box, q_box = [scores.BLOCK_N, scores.CHUNK], [scores.BLOCK_M, scores.CHUNK]
        out_box = [1, scores.BLOCK_N, scores.BLOCK_M]     # = [1, BLOCK_M, BLOCK_N] of dS (square tiles)
        k2, v2 = (_desc(t.view(n * sk, d), kv_box) for t in (k_blk, v_blk))
        q2, do2 = (_desc(t.view(n * rows, d), q_box) for t in (q_blk, do_blk))
        grid = (-(-sk // scores.BLOCK_N), -(-rows // scores.BLOCK_M), n)
        args = [k2, q2, v2, do2, _desc(pt, out_box), _desc(dst, out_box), _desc(ds, out_box), pb.lse, pb.delta,
                rows, sk, pb.sq, g0, r0, pb.group_rows, pb.scale * LOG2E, pb.scale]
        return grid, args, dict(BLOCK_M=scores.BLOCK_M, BLOCK_N=scores.BLOCK_N, STAGES=scores.STAGES,
                                CAUSAL=bool(causal), num_warps=scores.NUM_WARPS)

    launch_cached(_scores_plans, key, scores.attention_bwd512_scores_kernel, build, q_blk.device.index)


def _padded(x: int) -> int:
    return -(-x // ROW_PAD) * ROW_PAD


# How _b_operand copies B K-major: "triton" (kernels_bwd512_kmajor) or "torch" (its transposing
# copy, ~0.6 TB/s on the H200). Whole backward on the H200 (scripts/attn512_bwd_sweep.py
# --kmajor-copy torch,triton at 0a93d23): B4 H8 S777 558 -> 352 us, B1 H8 S4095 causal
# 1353 -> 1083 us, B2 Hq8 Hk4 S1000 658 -> 371 us; B2 H8 S1000 read 749 -> 807 us, the sweep's
# first case, both above bwd512's 656 us (the database's 512 bin, which S1000 falls in, names bwd512).
KMAJOR_COPY = "triton"


def _b_operand(b: torch.Tensor) -> torch.Tensor:
    """b [g, K, D] as the GEMMs read it: itself when K is a multiple of BLOCK_K, else the same
    values K-major (a [g, D, K] copy with rows padded to 16 bytes, viewed back as [g, K, D])."""
    g, k, d = b.shape
    if k % ROW_MULTIPLE == 0:
        return b
    if KMAJOR_COPY == "triton":
        return kmajor.kmajor(b)
    copy = torch.empty(g, d, _padded(k), dtype=b.dtype, device=b.device)[:, :, :k]
    copy.copy_(b.transpose(1, 2))
    return copy.transpose(1, 2)


def _workspace(ws: torch.Tensor, n: int, rows: int, sk: int):
    """P^T, dS^T [n, Sk, rows] and dS [n, rows, Sk] over the workspace, rows padded to 16 bytes."""
    pt, dst = (w[:n * sk * _padded(rows)].view(n, sk, _padded(rows))[:, :, :rows] for w in ws[:2])
    return pt, dst, ws[2, :n * rows * _padded(sk)].view(n, rows, _padded(sk))[:, :, :sk]


def _gemm(a: torch.Tensor, b: torch.Tensor, groups: int, out: torch.Tensor) -> None:
    """out = a @ b group by group (a [groups * m, k], b [groups, k, 512], out [groups * m, 512])."""
    offs = _offsets(groups, a.shape[0] // groups, a.device)
    grouped.run(gemm_config(a.shape[0], out), a, b, offs, out)


# ---- causal, one q head per kv head: the GEMMs over the blocks on or below the diagonal ------------

CAUSAL_BLOCKS = bwd512.CAUSAL_BLOCKS          # at most this many row (and key) blocks
CAUSAL_MIN_ROWS = bwd512.CAUSAL_MIN_ROWS      # rows per block at least (unless forced)
# The wave model's constants, fitted to the H200 sweep (module docstring): the BF16 tensor
# throughput one SM sustains in a grouped-GEMM tile (~70% of 989 TFLOP/s over 132 SMs), and what
# one one-group block launch costs the host (35-61 us measured), which the GPU hides only behind
# launches that run longer.
SM_TFLOPS = 5.0
LAUNCH_US = 50.0


def block_edges(sq: int, blocks: int) -> list[int]:
    """Edges [0, ..., Sq] of at most ``blocks`` row blocks, all multiples of 64 for Sq one (the
    formula of kernels_bwd512.causal_edges, whose edges these are at its block count)."""
    step = -(-sq // (blocks * ROW_MULTIPLE)) * ROW_MULTIPLE
    return list(range(0, sq, step)) + [sq]


def causal_gemms(sq: int, sk: int, edges) -> list[tuple[str, int, int, int, int]]:
    """The block products as (gradient, out_lo, out_hi, inner_lo, inner_hi): dQ rows [a, b) over
    keys [0, min(b, Sk)), dV and dK keys [a, min(b, Sk)) over rows [a, Sq), since query i sees keys
    0..i. Every bound is a multiple of 64 (Sq and Sk are): the row-major B's K. Keys from Sq on
    are in no block: no row sees them."""
    gemms = []
    for a, b in zip(edges, edges[1:]):
        end = min(b, sk)
        gemms.append(("dq", a, b, 0, end))
        if a < end:
            gemms += [("dv", a, end, a, sq), ("dk", a, end, a, sq)]
    return gemms


def _whole(name: str, lo: int, hi: int, k0: int, k1: int, sq: int, sk: int) -> bool:
    """True when a product covers its gradient's every row and inner index: only then do several
    groups' operands stay one packed B and uniformly strided A rows (one launch for the chunk)."""
    return (hi - lo, k1 - k0) == ((sq, sk) if name == "dq" else (sk, sq))


def chunk_gemms(n: int, sq: int, sk: int, edges) -> list[tuple[str, int | None, int, int, int, int]]:
    """A causal chunk's GEMM launches (G = 1, Sq rows a group) in order, as (gradient, group or
    None for all n groups at once, out_lo, out_hi, inner_lo, inner_hi): the three full products
    (edges None), else the products causal_gemms lists, each n launches of one group unless whole;
    a group's launches follow each other (its operands stay in L2). Launches per chunk besides
    the scores kernel: 3 for the full products; blocked, n x (blocks + 2 x blocks starting below
    Sk), whole products once instead of n times, plus two zero fills when Sk > Sq."""
    if edges is None:
        return [("dv", None, 0, sk, 0, sq), ("dk", None, 0, sk, 0, sq), ("dq", None, 0, sq, 0, sk)]
    gemms = causal_gemms(sq, sk, edges)
    whole = [(name, None, *r) for name, *r in gemms if _whole(name, *r, sq, sk)]
    return whole + [(name, g, *r) for g in range(n) for name, *r in gemms if not _whole(name, *r, sq, sk)]


def _gemm_us(rows: int, inner: int, groups: int, sms: int) -> float:
    """Wave model of one grouped-GEMM launch of ``groups`` groups of rows x 512 outputs over
    ``inner``: output-stationary tiles (no split-K) run in waves of one a SM, each wave one
    tile's K loop however few tiles it holds."""
    cfg = _config(groups * rows, sms)
    tiles = groups * -(-rows // cfg.block_m) * (HEAD_DIM // cfg.block_n)
    return -(-tiles // sms) * 2 * cfg.block_m * cfg.block_n * inner / (SM_TFLOPS * 1e6)


def chunk_us(n: int, sq: int, sk: int, edges, sms: int) -> float:
    """Wave-model time of a causal chunk's GEMMs: their GPU time, or the host's when its launches
    take longer."""
    if edges is None:
        return max(_gemm_us(sq, sk, n, sms) + 2 * _gemm_us(sk, sq, n, sms), 3 * LAUNCH_US)
    gpu, launches = 0.0, 2 if sk > sq else 0
    for name, *r in causal_gemms(sq, sk, edges):
        lo, hi, k0, k1 = r
        times = 1 if _whole(name, *r, sq, sk) else n
        gpu += times * _gemm_us(hi - lo, k1 - k0, n // times, sms)
        launches += times
    return max(gpu, launches * LAUNCH_US)


@functools.lru_cache(maxsize=256)
def causal_edges(n: int, sq: int, sk: int, sms: int, blocks: int | None = None) -> tuple[int, ...] | None:
    """Block edges for a causal chunk of n groups (G = 1, Sq rows each, no row split), or None for
    the full products: ``blocks`` blocks when given (1: none), else the count of at most
    CAUSAL_BLOCKS, CAUSAL_MIN_ROWS rows a block, that the wave model finds fastest (fewest blocks
    on a tie)."""
    if blocks is not None:
        return tuple(block_edges(sq, blocks)) if blocks > 1 else None
    most = min(CAUSAL_BLOCKS, sq // CAUSAL_MIN_ROWS, sk // ROW_MULTIPLE)
    candidates = [None] + [tuple(block_edges(sq, b)) for b in range(2, most + 1)]
    return min(candidates, key=lambda edges: chunk_us(n, sq, sk, edges, sms))


def _causal_gemms(pb: bwd512.Problem, g0: int, n: int, pt, dst, ds, edges) -> None:
    """dQ, dK and dV of a causal chunk (G = 1, all Sq rows) as chunk_gemms lists them, from the
    chunk's P^T, dS^T [n, Sk, Sq] and dS [n, Sq, Sk]; the blocks skipped hold exact zeros (the
    scores kernel's), so the sums are the full products'."""
    sq, sk, g1 = pb.sq, pb.sk, g0 + n
    operands = {"dq": (ds, pb.ks, pb.dqs), "dv": (pt, pb.dos, pb.dvs), "dk": (dst, pb.qs, pb.dks)}
    for name, g, lo, hi, k0, k1 in chunk_gemms(n, sq, sk, edges):
        a, b, target = operands[name]
        if g is None:
            _gemm(a.view(n * a.shape[1], a.shape[2]), b[g0:g1], n, target[g0:g1].view(n * a.shape[1], HEAD_DIM))
        else:   # one group: its A rows have the workspace's row stride, its B any offset (b_view, G = 1)
            _gemm(a[g, lo:hi, k0:k1], b[g0 + g, k0:k1].unsqueeze(0), 1, target[g0 + g, lo:hi])
    if sk > sq:
        pb.dvs[g0:g1, sq:].zero_()
        pb.dks[g0:g1, sq:].zero_()


def backward512g(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                 lse: torch.Tensor, causal: bool, scale: float | None, *,
                 grads: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                 workspace_bytes: int = bwd512.WORKSPACE_BYTES,
                 causal_blocks: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """kernels_bwd512.backward512's contract for problems ``unserved`` accepts (ValueError otherwise).
    ``causal_blocks``: the causal block count where blocks apply (G = 1, no row split; 1: the full
    products), instead of causal_edges's choice."""
    reason = unserved(q, k, workspace_bytes)
    if reason is not None:
        raise ValueError(f"bwd512g does not serve this backward: {reason}")
    pb = bwd512.prepare(grad_out, q, k, v, out, lse, scale, grads)
    groups, group_rows, sk, d = pb.groups, pb.group_rows, pb.sk, HEAD_DIM
    n_groups, n_rows = chunks(groups, group_rows, sk, workspace_bytes)
    ws = torch.empty(3, n_groups * max(sk * _padded(n_rows), n_rows * _padded(sk)), dtype=q.dtype,
                     device=q.device)
    split = n_rows < group_rows
    acc = [torch.empty(sk, d, dtype=torch.float32, device=q.device) for _ in range(2)] if split else None
    part = torch.empty(sk, d, dtype=torch.float32, device=q.device) if split else None
    # GQA: a key block's rows would be G separate ranges; split rows: the blocks would cross chunks;
    # block edges are multiples of 64 (row-major B sub-views).
    blocked = causal and pb.group == 1 and not split and pb.sq % ROW_MULTIPLE == 0 and sk % ROW_MULTIPLE == 0

    with bwd512.device_of(q):
        for g0 in range(0, groups, n_groups):
            g1 = min(groups, g0 + n_groups)
            n = g1 - g0
            edges = causal_edges(n, pb.sq, sk, _device.sm_count(q), causal_blocks) if blocked else None
            k_blk = pb.ks[g0:g1]
            k_operand = _b_operand(k_blk)     # dQ's B, the same for every row block
            for r0 in range(0, group_rows, n_rows):
                r1 = min(group_rows, r0 + n_rows)
                rows = r1 - r0
                pt, dst, ds = _workspace(ws, n, rows, sk)
                q_blk, do_blk = pb.qs[g0:g1, r0:r1], pb.dos[g0:g1, r0:r1]
                _launch_scores(pb, g0, r0, q_blk, do_blk, k_blk, pb.vs[g0:g1], pt, dst, ds, causal)
                if edges is not None:
                    _causal_gemms(pb, g0, n, pt, dst, ds, edges)
                    continue
                _gemm(ds.view(n * rows, sk), k_operand, n, pb.dqs[g0:g1, r0:r1].view(n * rows, d))
                for i, (a, b, target) in enumerate(((pt, do_blk, pb.dvs), (dst, q_blk, pb.dks))):
                    a, b = a.view(n * sk, rows), _b_operand(b)
                    if not split:
                        _gemm(a, b, n, target[g0:g1].view(n * sk, d))
                    elif r0 == 0:
                        _gemm(a, b, 1, acc[i])
                    else:
                        _gemm(a, b, 1, part)
                        acc[i] += part
            if split:
                pb.dvs[g0].copy_(acc[0])
                pb.dks[g0].copy_(acc[1])
    return pb.finish()


def compile_specs():
    """The scores kernel's specs, and the grouped GEMM binaries this path launches (both configs,
    BF16 and FP16, row-major B and the K-major copies of inner sizes off BLOCK_K)."""
    from tilefly.compile_check import KernelSpec
    from tilefly.ops.grouped_gemm.configs import kernel_of, kernel_signature

    specs = scores.compile_specs()
    for cfg in (GEMM_WIDE, GEMM_NARROW):
        for dtype in scores.DTYPES:
            for kmajor in (False, True):
                sig, constexprs = kernel_signature(cfg, dtype, kmajor)
                name = f"attention.bwd512g_gemm.{cfg.name}[{dtype},B{'col' if kmajor else 'row'}]"
                specs.append(KernelSpec(name=name, kernel=lambda cfg=cfg: kernel_of(cfg), signature=sig,
                                        constexprs=constexprs, num_warps=cfg.num_warps, gluon=True,
                                        sass_must_contain=("HGMMA",)))
    return specs

"""Flash-attention forward for head dim 512 on Hopper in Gluon, the output accumulator split
across two warpgroups by head-dim halves. Same contract as kernels_fwd.py (FP16/BF16 in and out,
FP32 scores, softmax and accumulation, top-left causal, GQA, tails masked, natural-log lse), whose
helpers it reuses.

Layout plan (BLOCK_M = 64 query rows, BLOCK_N = 64 keys per step, D = 512, 8 warps; config d512n64p):

    why split       a 64 x 512 FP32 O accumulator is 128 KB: 256 registers a thread for one
                    warpgroup (255 is the limit, before S, P and addresses). Two warpgroups hold
                    128 a thread each. 128 query rows would take the whole register file, so
                    BLOCK_M is 64 and the grid has one program per 64 rows.
    grid            (cdiv(Sq, 64), B * Hq); causal programs take their row tiles last to first.
                    q head h reads kv head h // GROUP.
    warps           every wgmma accumulator is laid out with warps_per_cta [4, 2]: a warpgroup's
                    four warps own 16-row slabs, the two warpgroups own column halves. So
                    warpgroup w holds O[:, 256w : 256w + 256] (128 FP32 a thread) and
                    S[:, w*BLOCK_N/2 : (w+1)*BLOCK_N/2]; each reduces its S half over all 512
                    head-dim columns (m64n32k16 wgmmas), and P V is one m64n256 wgmma per k-step
                    per warpgroup.
    softmax         row max and row sum span both warpgroups' S halves: the compiler reduces
                    them through a few hundred bytes of shared scratch. P (FP16/BF16) moves from
                    the S layout into the register A operand of P V through 4 KB of shared
                    scratch: each warpgroup gets the whole P and multiplies it by its V half.
    shared memory   Q [64, 512] resident (64 KB; reused to stage O for its TMA store); K and V
                    one slot each [64, 512] (64 + 64 + 64 KB); ~200 KB with scratch, one CTA per SM.
                    NVMMA 128-byte swizzle: TMA moves a 512-wide box as eight 64-column
                    messages (one per warp) that land back to back, chunk c at byte c * rows *
                    128. Q K^T streams the head dim through a runtime loop over those eight
                    chunks (``_chunks`` views of the same bytes), so only one chunk's wgmma
                    descriptors are live: fully unrolled, the loop-invariant descriptors of Q
                    and a one-slot K ring (64 x 64 bits) were hoisted and spilled.
    barriers        q_bar; k_ready[s], v_ready[s] per slot, expect-tx on one tile. A key slot is
                    refilled as soon as the S wgmmas reading it retired (the copy overlaps the
                    softmax and P V), a value slot once P V retired (it overlaps the next
                    Q K^T). The CTA barrier Triton puts before each refill makes both
                    warpgroups' reads retire first.
    schedule        P_{j-1} V_{j-1} runs on the tensor cores while the warps run the softmax of
                    S_j and move P_j into its operand registers (+12 registers a thread for the
                    second P); O is rescaled by alpha_j once that wgmma retired. One loop over
                    the key tiles, masking (Sk tail, causal diagonal) a uniform runtime branch
                    from tile n_full on. Value slot j-1 is refilled after the rescale (the copy
                    overlaps the next Q K^T), key slot j after Q K_j^T. H200, B4 H8 S2048 BF16
                    (scripts/attn512_sweep.py, 2026-11-30): 560 us against 644 us for the serial
                    order (Q K^T, softmax, P V per tile) and 950 us for 32-key tiles; a variant
                    in which each warpgroup computed all of S (no cross-warpgroup softmax) took
                    707 us.
    epilogue        O / l cast into Q's shared tile, one TMA store clipped at Sq;
                    lse = (m + log2 l) * ln 2 with a row-masked store.

NaN in a query row makes that row's output and lse NaN, like PyTorch's math path.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma,
                                                               warpgroup_mma_wait)

from tilefly.gluon.layouts import wgmma_layout
from tilefly.gluon.tma_ring import alloc_barriers
from tilefly.gluon.wgmma import as_a_operand
from tilefly.ops.attention.kernels_fwd import (_load, _rescale, _softmax, _tile, key_tiles, prefetch_kv,
                                              query_tile, store_outputs)

HEAD_DIM = 512
_INTS = ["Sq", "Sk", "Hq", "GROUP"]


@gluon.constexpr_function
def chunk_layout(element_bits):
    """The 128-byte-swizzled layout of one [1, 1, rows, CHUNK] head-dim chunk. A TMA box of
    [1, 1, rows, 512] lands as CHUNKS such chunks back to back (one 64-column message per warp,
    message c at byte c * rows * 128), and that is the layout wgmma reads a 512-wide tile in:
    chunk c of a tile is plain sub-buffer c."""
    return gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=element_bits, rank=4)


@gluon.jit
def _chunks(bufs, rows: gl.constexpr, slots: gl.constexpr, CHUNK: gl.constexpr, CHUNKS: gl.constexpr):
    """bufs ([slots, 1, 1, rows, CHUNK * CHUNKS]) as [slots * CHUNKS, 1, 1, rows, CHUNK]."""
    return bufs._reinterpret(bufs.dtype, [slots * CHUNKS, 1, 1, rows, CHUNK],
                             chunk_layout(bufs.dtype.primitive_bitwidth))


@gluon.jit
def _qk(q_chunks, k_chunks, k_ready, j, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CHUNK: gl.constexpr,
        CHUNKS: gl.constexpr, STAGES: gl.constexpr, s_layout: gl.constexpr):
    """S_j = Q K_j^T summed over the head-dim chunks, every wgmma retired (a runtime loop: see
    the header, shared memory)."""
    slot = j % STAGES
    mbarrier.wait(k_ready.index(slot), (j // STAGES) & 1)
    s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    for c in range(CHUNKS):
        q = q_chunks.index(c).reshape([BLOCK_M, CHUNK])
        k = k_chunks.index(slot * CHUNKS + c).reshape([BLOCK_N, CHUNK]).permute((1, 0))
        s = warpgroup_mma(q, k, s, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s,))
    return warpgroup_mma_wait(num_outstanding=0, deps=(s,))


@gluon.jit
def _attend512(q_chunks, k_desc, v_desc, k_bufs, k_chunks, v_bufs, k_ready, v_ready, o, m_i, l_i,
               n_full, n_tiles, b, hk, off_m, Sk, qk_scale,
               BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
               CHUNKS: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, num_warps: gl.constexpr):
    """All key tiles, P_{j-1} V_{j-1} in flight on the tensor cores while the warps run the
    softmax of S_j (and move P_j into its operand registers); O is rescaled by alpha_j once that
    wgmma retired. The loop carries P_{j-1} instead of an in-flight accumulator: every wgmma has
    retired at the back edge (ptxas serializes all wgmmas otherwise). Masking is a uniform
    runtime branch from tile n_full on."""
    o_layout: gl.constexpr = o.type.layout
    s_layout: gl.constexpr = m_i.type.layout.parent
    CHUNK: gl.constexpr = HEAD_DIM // CHUNKS
    s = _qk(q_chunks, k_chunks, k_ready, 0, BLOCK_M, BLOCK_N, CHUNK, CHUNKS, STAGES, s_layout)
    _load(k_desc, k_bufs, k_ready, STAGES, n_tiles, b, hk, BLOCK_N, STAGES)
    p, alpha, m_i, l_i = _softmax(s, m_i, l_i, 0 >= n_full, 0, off_m, Sk, qk_scale, BLOCK_M, BLOCK_N, CAUSAL)
    p = as_a_operand(p, o_layout, k_desc.dtype)      # o is still zero: alpha_0 has nothing to rescale
    for j in range(1, n_tiles):
        s = _qk(q_chunks, k_chunks, k_ready, j, BLOCK_M, BLOCK_N, CHUNK, CHUNKS, STAGES, s_layout)
        _load(k_desc, k_bufs, k_ready, j + STAGES, n_tiles, b, hk, BLOCK_N, STAGES)
        v_tile = _tile(v_bufs, v_ready, j - 1, BLOCK_N, HEAD_DIM, STAGES)
        o = warpgroup_mma(p, v_tile, o, is_async=True)
        p_next, alpha, m_i, l_i = _softmax(s, m_i, l_i, j >= n_full, j, off_m, Sk, qk_scale, BLOCK_M, BLOCK_N,
                                           CAUSAL)
        p_next = as_a_operand(p_next, o_layout, k_desc.dtype)    # through shared scratch here (header)
        o, p = warpgroup_mma_wait(num_outstanding=0, deps=(o, p))
        o = _rescale(o, alpha)
        # Value tile j-1 is read: its slot takes tile j-1+STAGES during the next Q K^T.
        _load(v_desc, v_bufs, v_ready, j - 1 + STAGES, n_tiles, b, hk, BLOCK_N, STAGES)
        p = p_next
    v_tile = _tile(v_bufs, v_ready, n_tiles - 1, BLOCK_N, HEAD_DIM, STAGES)
    o = warpgroup_mma(p, v_tile, o, is_async=True)
    o, p = warpgroup_mma_wait(num_outstanding=0, deps=(o, p))
    return o, m_i, l_i


@gluon.jit(do_not_specialize=_INTS)
def attention_fwd512_kernel(q_desc, k_desc, v_desc, o_desc, lse_ptr, qk_scale, Sq, Sk, Hq, GROUP,
                            BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                            STAGES: gl.constexpr, CAUSAL: gl.constexpr, STORE_LSE: gl.constexpr,
                            num_warps: gl.constexpr):
    gl.static_assert(BLOCK_M == 64 and num_warps == 8, "64 rows, two warpgroups splitting the head dim")
    gl.static_assert(HEAD_DIM == q_desc.block_type.shape[3] and HEAD_DIM == k_desc.block_type.shape[3],
                     "boxes span the whole head dim")
    CHUNK: gl.constexpr = 1024 // q_desc.dtype.primitive_bitwidth     # 128 bytes of a row
    CHUNKS: gl.constexpr = HEAD_DIM // CHUNK
    gl.static_assert(q_desc.layout.swizzle_byte_width == 128 and k_desc.layout.swizzle_byte_width == 128,
                     "chunk views assume the 128-byte swizzle")
    o_layout: gl.constexpr = wgmma_layout(BLOCK_M, HEAD_DIM, num_warps)
    s_layout: gl.constexpr = wgmma_layout(BLOCK_M, BLOCK_N, num_warps)

    bh, b, h, hk, off_m = query_tile(Hq, GROUP, BLOCK_M, CAUSAL)

    q_smem = gl.allocate_shared_memory(q_desc.dtype, q_desc.block_type.shape, q_desc.layout)
    k_bufs = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_bufs = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_chunks = _chunks(q_smem, BLOCK_M, 1, CHUNK, CHUNKS)
    k_chunks = _chunks(k_bufs, BLOCK_N, STAGES, CHUNK, CHUNKS)
    q_bar = alloc_barriers(1)
    k_ready = alloc_barriers(STAGES)
    v_ready = alloc_barriers(STAGES)

    n_full, n_tiles = key_tiles(Sk, off_m, BLOCK_M, BLOCK_N, CAUSAL)
    mbarrier.expect(q_bar.index(0), q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [b, h, off_m, 0], q_bar.index(0), q_smem)
    prefetch_kv(k_desc, v_desc, k_bufs, v_bufs, k_ready, v_ready, n_tiles, b, hk, BLOCK_N, STAGES)

    o = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
    m_i = gl.full([BLOCK_M], -float("inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, s_layout))
    mbarrier.wait(q_bar.index(0), 0)
    o, m_i, l_i = _attend512(q_chunks, k_desc, v_desc, k_bufs, k_chunks, v_bufs, k_ready, v_ready, o, m_i, l_i,
                             n_full, n_tiles, b, hk, off_m, Sk, qk_scale, BLOCK_M, BLOCK_N, HEAD_DIM, CHUNKS, STAGES,
                             CAUSAL, num_warps)

    store_outputs(o, m_i, l_i, q_smem, o_desc, lse_ptr, bh, b, h, off_m, Sq, BLOCK_M, HEAD_DIM, STORE_LSE)


# ---- configs, compile specs and the launcher -------------------------------------------------

BLOCK_M = 64
NUM_WARPS = 8
DTYPES = ("bf16", "fp16")


@dataclass(frozen=True)
class Fwd512Config:
    block_n: int
    stages: int      # K and V ring slots; Q (64 KB) plus both rings fill 192 KB of the 227 KB

    @property
    def name(self) -> str:
        return f"d512n{self.block_n}p"     # "p": the pipelined schedule (header)


FWD512_CONFIGS: dict[str, Fwd512Config] = {c.name: c for c in (Fwd512Config(64, 1),)}
CONFIGS = tuple(FWD512_CONFIGS)
DEFAULT_CONFIG = "d512n64p"


def kernel_signature(cfg: Fwd512Config, dtype: str, causal: bool) -> tuple[dict, dict]:
    """Triton signature strings and constexprs of the kernel as forward512 launches it."""
    element = {"bf16": gl.bfloat16, "fp16": gl.float16}[dtype]

    def desc(rows: int) -> str:
        block = [1, 1, rows, HEAD_DIM]
        layout = gl.NVMMASharedLayout.get_default_for(block, element)
        return f"tensordesc<{dtype}[{', '.join(map(str, block))}],{layout!r}>"

    sig = {"q_desc": desc(BLOCK_M), "k_desc": desc(cfg.block_n), "v_desc": desc(cfg.block_n),
           "o_desc": desc(BLOCK_M), "lse_ptr": "*fp32", "qk_scale": "fp32",
           "Sq": "i32", "Sk": "i32", "Hq": "i32", "GROUP": "i32"}
    constexprs = dict(BLOCK_M=BLOCK_M, BLOCK_N=cfg.block_n, HEAD_DIM=HEAD_DIM, STAGES=cfg.stages, CAUSAL=causal,
                      STORE_LSE=True, num_warps=NUM_WARPS)
    sig.update({name: "constexpr" for name in constexprs})
    return sig, constexprs


def _kernel():
    return attention_fwd512_kernel


def spec(cfg: Fwd512Config, dtype: str, causal: bool):
    from tilefly.compile_check import KernelSpec

    sig, constexprs = kernel_signature(cfg, dtype, causal)
    return KernelSpec(name=f"attention.fwd512.{cfg.name}[{dtype},{'causal' if causal else 'full'}]",
                      kernel=_kernel, signature=sig, constexprs=constexprs, num_warps=NUM_WARPS, gluon=True,
                      sass_must_contain=("HGMMA",))


def compile_specs():
    """Every head-dim-512 config x dtype x causal."""
    return [spec(cfg, dtype, causal) for cfg in FWD512_CONFIGS.values() for dtype in DTYPES
            for causal in (False, True)]


def forward512(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None,
               need_lse: bool, config: str | None = None, *, out: torch.Tensor | None = None,
               lse: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """kernels.forward for head dim 512: (out B x Hq x Sq x 512 like q, lse B x Hq x Sq float32 or
    None). The caller checked kernels.unsupported() (with head dim 512 admitted)."""
    from tilefly.ops.attention.kernels import LOG2E, _descriptor, _no_lse, forward_outputs, replay

    b, hq, sq, d = q.shape
    hk, sk = k.shape[1], k.shape[2]
    if d != HEAD_DIM:
        raise ValueError(f"forward512 serves head dim {HEAD_DIM}, not {d}")
    if config is not None and config not in FWD512_CONFIGS:
        raise ValueError(f"attention config {config} does not serve head dim {HEAD_DIM}")
    cfg = FWD512_CONFIGS[config or DEFAULT_CONFIG]
    out, lse = forward_outputs(q, need_lse, out, lse)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    descs = (_descriptor(q, BLOCK_M, d), _descriptor(k, cfg.block_n, d), _descriptor(v, cfg.block_n, d),
             _descriptor(out, BLOCK_M, d))
    grid = (-(-sq // BLOCK_M), b * hq)
    with torch.cuda.device(q.device):
        replay(attention_fwd512_kernel, grid,
               [*descs, lse if need_lse else _no_lse(out), scale * LOG2E, sq, sk, hq, hq // hk],
               dict(BLOCK_M=BLOCK_M, BLOCK_N=cfg.block_n, HEAD_DIM=HEAD_DIM, STAGES=cfg.stages,
                    CAUSAL=bool(causal), STORE_LSE=bool(need_lse), num_warps=NUM_WARPS), q)
    return out, lse

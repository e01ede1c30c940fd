"""tilefly's flash-attention kernel configs: names, what each serves, and their compile specs.

Forward configs:

A config is a tile shape and a schedule, ``m<BLOCK_M>n<BLOCK_N>[p|w]``: BLOCK_M query rows per
program with one warp per 16 rows (m128: two warpgroups, m64: one), BLOCK_N keys per step;
a trailing ``p`` runs the overlapped schedule (kernels_fwd.py's header), a trailing ``w`` the
warp-specialized kernel whose two consumer warpgroups take turns on the tensor cores
(kernels_fwd_ws.py). The
ring depth follows from the head dim: the deepest (at most MAX_STAGES) whose Q tile and K/V rings fit
the H200's 227 KB of shared memory per block. A config serves the head dims whose registers
fit (``max_head_dim``: S, P and the O accumulator per thread; larger would spill, which the
compile check refuses).

Backward configs (kernels_bwd.py), ``bwd<ROWS>x<STEP>``: ROWS accumulator rows per program, one
warp per 16 (the dK/dV program's key rows, the dQ program's query rows), STEP rows of the
streamed operand per step (query rows for dK/dV, keys for dQ); the ring depth follows from the
same shared-memory budget, which is also what limits a config's head dims (bwd128x64 stops at
128; bwd64x64 serves 256 with two stages). Registers: dK/dV programs sum at most 128 columns
(``dkdv_chunk``: two programs per key tile at head dim 256).
"""
from __future__ import annotations

from dataclasses import dataclass

HEAD_DIMS = (32, 64, 96, 128, 192, 256)      # served head dims
SMEM_LIMIT = 232448      # bytes of shared memory one block may use on sm_90
SMEM_RESERVE = 1024      # barriers and compiler scratch
ELEMENT_BYTES = 2
MAX_STAGES = 3
DTYPES = ("bf16", "fp16")


def kernel_head_dim(d: int) -> int:
    """The power-of-two head dim of the kernel that serves ``d`` (96 -> 128, 192 -> 256): Gluon
    tiles are powers of two; TMA zero-fills the padding columns and clips them on store."""
    return 1 << (d - 1).bit_length()


def deepest_ring(smem_bytes) -> int:
    """The most ring stages (MAX_STAGES down to 2) whose ``smem_bytes(stages)`` fits a block, or 0."""
    return next((stages for stages in range(MAX_STAGES, 1, -1) if smem_bytes(stages) <= SMEM_LIMIT), 0)


@dataclass(frozen=True)
class FwdConfig:
    block_m: int
    block_n: int
    max_head_dim: int
    overlap: bool = False     # softmax of one key tile overlaps the next tile's Q K^T (name ends in "p")
    pingpong: bool = False    # warp-specialized, two consumer warpgroups in ping-pong (kernels_fwd_ws,
                              # name ends in "w"; block_m 128)

    @property
    def name(self) -> str:
        return f"m{self.block_m}n{self.block_n}{'p' if self.overlap else ''}{'w' if self.pingpong else ''}"

    @property
    def num_warps(self) -> int:
        """Warps of the launch: ping-pong kernels launch consumer warpgroup 0's four (the loader
        warp and warpgroup 1 are warp_specialize workers)."""
        return 4 if self.pingpong else self.block_m // 16

    @property
    def box_rows(self) -> int:
        """Query rows of the Q and O descriptors' boxes: one consumer warpgroup's in ping-pong."""
        return self.block_m // 2 if self.pingpong else self.block_m

    def smem_bytes(self, head_dim: int, stages: int) -> int:
        return (self.block_m + 2 * stages * self.block_n) * head_dim * ELEMENT_BYTES + SMEM_RESERVE

    def stages(self, head_dim: int) -> int:
        return deepest_ring(lambda stages: self.smem_bytes(head_dim, stages))

    def serves(self, head_dim: int) -> bool:
        kd = kernel_head_dim(head_dim)
        return kd <= self.max_head_dim and self.stages(kd) >= 2


FWD_CONFIGS: dict[str, FwdConfig] = {c.name: c for c in (
    FwdConfig(128, 64, 256),
    FwdConfig(128, 128, 128),
    FwdConfig(64, 64, 256),
    FwdConfig(128, 64, 256, overlap=True),
    FwdConfig(128, 128, 128, overlap=True),
    FwdConfig(128, 64, 256, pingpong=True),
    FwdConfig(128, 128, 128, pingpong=True),
)}


@dataclass(frozen=True)
class BwdConfig:
    rows: int          # dK/dV: BLOCK_N keys; dQ: BLOCK_M queries (accumulator rows, 16 per warp)
    step: int          # dK/dV: BLOCK_M queries per step; dQ: BLOCK_N keys per step

    @property
    def name(self) -> str:
        return f"bwd{self.rows}x{self.step}"

    @property
    def num_warps(self) -> int:
        return self.rows // 16

    def smem_bytes(self, head_dim: int, stages: int) -> int:
        # Both kernels: two resident [rows, D] tiles (K, V or Q, dO) and a ring of two [step, D] tiles.
        return (2 * self.rows + 2 * stages * self.step) * head_dim * ELEMENT_BYTES + SMEM_RESERVE

    def stages(self, head_dim: int) -> int:
        return deepest_ring(lambda stages: self.smem_bytes(head_dim, stages))

    def serves(self, head_dim: int) -> bool:
        return self.stages(kernel_head_dim(head_dim)) >= 2


BWD_CONFIGS: dict[str, BwdConfig] = {c.name: c for c in (
    BwdConfig(64, 64),
    BwdConfig(128, 64),
)}
FWD512_CONFIG_NAMES = ("d512n64p",)     # head dim 512: kernels_fwd512.FWD512_CONFIGS
# Head dim 512 backward: kernels_bwd512 (cuBLAS GEMMs around a Triton kernel) and kernels_bwd512g
# (all Gluon: a scores kernel and tilefly's grouped GEMM; problems it does not serve run bwd512).
BWD512_CONFIG_NAMES = ("bwd512", "bwd512g")
CONFIGS = tuple(FWD_CONFIGS) + FWD512_CONFIG_NAMES + tuple(BWD_CONFIGS) + BWD512_CONFIG_NAMES


def default_config(head_dim: int, sq: int) -> FwdConfig:
    """The config used when the caller (or the database) names none: one warpgroup for short
    query runs (fewer idle rows), two otherwise, in ping-pong from head dim 96 on (where the H200
    sweep of BENCHMARKS.md, session 15, has them fastest); wide key steps while the O
    accumulator leaves room."""
    if sq <= 64:
        return FWD_CONFIGS["m64n64"]
    if head_dim <= 64:
        return FWD_CONFIGS["m128n128"]
    return FWD_CONFIGS["m128n128w"] if head_dim <= 128 else FWD_CONFIGS["m128n64w"]


def default_bwd_config(head_dim: int, sk: int) -> BwdConfig:
    """Backward without a named config: one warpgroup for short key runs (the dK/dV grid is
    cdiv(Sk, rows) programs per kv head), two otherwise."""
    short = sk <= 128 or not BWD_CONFIGS["bwd128x64"].serves(head_dim)
    return BWD_CONFIGS["bwd64x64"] if short else BWD_CONFIGS["bwd128x64"]


# ---- compile specs: every shipped config, compiled for sm_90a in CI ---------------------------

def kernel_signature(cfg: FwdConfig, dtype: str, head_dim: int, causal: bool) -> tuple[dict, dict]:
    """Triton signature strings and constexprs of the forward kernel as the launcher runs it."""
    from triton.experimental.gluon import language as gl

    element = {"bf16": gl.bfloat16, "fp16": gl.float16}[dtype]

    def desc(rows: int) -> str:
        block = [1, 1, rows, head_dim]
        layout = gl.NVMMASharedLayout.get_default_for(block, element)
        return f"tensordesc<{dtype}[{', '.join(map(str, block))}],{layout!r}>"

    sig = {"q_desc": desc(cfg.box_rows), "k_desc": desc(cfg.block_n), "v_desc": desc(cfg.block_n),
           "o_desc": desc(cfg.box_rows), "lse_ptr": "*fp32", "qk_scale": "fp32",
           "Sq": "i32", "Sk": "i32", "Hq": "i32", "GROUP": "i32"}
    constexprs = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HEAD_DIM=head_dim, STAGES=cfg.stages(head_dim),
                      CAUSAL=causal, STORE_LSE=True, **({} if cfg.pingpong else {"OVERLAP": cfg.overlap}),
                      num_warps=cfg.num_warps)
    sig.update({name: "constexpr" for name in constexprs})
    return sig, constexprs


def _kernel():
    from tilefly.ops.attention import kernels_fwd

    return kernels_fwd.attention_fwd_kernel


def _ws_kernel():
    from tilefly.ops.attention import kernels_fwd_ws

    return kernels_fwd_ws.attention_fwd_ws_kernel


def spec(cfg: FwdConfig, dtype: str, head_dim: int, causal: bool):
    from tilefly.compile_check import KernelSpec

    sig, constexprs = kernel_signature(cfg, dtype, head_dim, causal)
    # ping-pong: the SASS must carry the partitions' register split (setmaxnreg)
    must = ("HGMMA", "USETMAXREG") if cfg.pingpong else ("HGMMA",)
    return KernelSpec(name=f"attention.fwd.{cfg.name}[{dtype},d={head_dim},{'causal' if causal else 'full'}]",
                      kernel=_ws_kernel if cfg.pingpong else _kernel, signature=sig, constexprs=constexprs,
                      num_warps=cfg.num_warps, gluon=True, sass_must_contain=must)


def compile_specs():
    """Every config x dtype x kernel head dim it serves x causal (96 and 192 run the 128 and 256
    kernels, the very same binaries), and the masked split-KV decode's two kernels (decode.py)."""
    from tilefly.ops.attention import (decode, kernels_bwd512, kernels_bwd512_kmajor, kernels_bwd512g,
                                       kernels_fwd512)

    kernel_dims = sorted({kernel_head_dim(d) for d in HEAD_DIMS})
    fwd = [spec(cfg, dtype, d, causal) for cfg in FWD_CONFIGS.values()
           for dtype in DTYPES for d in kernel_dims if cfg.serves(d) for causal in (False, True)]
    return (fwd + kernels_fwd512.compile_specs() + bwd_compile_specs() + kernels_bwd512.compile_specs()
            + kernels_bwd512g.compile_specs() + kernels_bwd512_kmajor.compile_specs() + decode.compile_specs())


# ---- backward compile specs -------------------------------------------------------------------

MAX_DKDV_COLUMNS = 128    # dK + dV columns one dK/dV program sums (2 x 64 x 128 FP32 fill a warpgroup)
DELTA_ELEMENTS = 2048     # elements of dO (and O) one delta program reduces (no spills unvectorized either)
BWD_INTS = {"lse_ptr": "*fp32", "delta_ptr": "*fp32", "qk_scale": "fp32", "scale": "fp32",
            "Sq": "i32", "Sk": "i32", "Hq": "i32", "GROUP": "i32"}


def _desc_type(dtype: str, rows: int, head_dim: int) -> str:
    from triton.experimental.gluon import language as gl

    block = [1, 1, rows, head_dim]
    layout = gl.NVMMASharedLayout.get_default_for(block, {"bf16": gl.bfloat16, "fp16": gl.float16}[dtype])
    return f"tensordesc<{dtype}[{', '.join(map(str, block))}],{layout!r}>"


def bwd_kernel_signature(kernel: str, cfg: BwdConfig, dtype: str, head_dim: int,
                         causal: bool) -> tuple[dict, dict]:
    """Signature strings and constexprs of the "dkdv" or "dq" backward kernel as the launcher runs it."""
    width = dkdv_chunk(head_dim) if kernel == "dkdv" else head_dim   # the descriptors' box columns
    resident, streamed = _desc_type(dtype, cfg.rows, width), _desc_type(dtype, cfg.step, width)
    common = dict(HEAD_DIM=head_dim, STAGES=cfg.stages(head_dim), CAUSAL=causal, num_warps=cfg.num_warps)
    if kernel == "dkdv":
        sig = {"q_desc": streamed, "k_desc": resident, "v_desc": resident, "do_desc": streamed,
               "dk_desc": resident, "dv_desc": resident}
        constexprs = dict(BLOCK_N=cfg.rows, BLOCK_M=cfg.step, **common)
    else:
        sig = {"q_desc": resident, "k_desc": streamed, "v_desc": streamed, "do_desc": resident,
               "dq_desc": resident}
        constexprs = dict(BLOCK_M=cfg.rows, BLOCK_N=cfg.step, **common)
    sig.update(BWD_INTS)
    sig.update({name: "constexpr" for name in constexprs})
    return sig, constexprs


def dkdv_chunk(head_dim: int) -> int:
    """Column chunk of the dK/dV kernel's descriptors (and of the dK, dV one program sums): the
    whole kernel head dim up to 128; at 256, two programs per key tile take 128 columns each."""
    return min(kernel_head_dim(head_dim), MAX_DKDV_COLUMNS)


def delta_blocks(head_dim: int) -> tuple[int, int]:
    """(BLOCK_S rows, BLOCK_D columns) of a delta program for head dim ``head_dim``."""
    block_d = kernel_head_dim(head_dim)
    return DELTA_ELEMENTS // block_d, block_d


def _bwd_kernel(kernel: str):
    def load():
        from tilefly.ops.attention import kernels_bwd

        return {"dkdv": kernels_bwd.attention_bwd_dkdv_kernel, "dq": kernels_bwd.attention_bwd_dq_kernel,
                "delta": kernels_bwd.attention_bwd_delta_kernel}[kernel]
    return load


def bwd_spec(kernel: str, cfg: BwdConfig, dtype: str, head_dim: int, causal: bool):
    from tilefly.compile_check import KernelSpec

    sig, constexprs = bwd_kernel_signature(kernel, cfg, dtype, head_dim, causal)
    return KernelSpec(name=f"attention.bwd_{kernel}.{cfg.name}[{dtype},d={head_dim},{'causal' if causal else 'full'}]",
                      kernel=_bwd_kernel(kernel), signature=sig, constexprs=constexprs, num_warps=cfg.num_warps,
                      gluon=True, sass_must_contain=("HGMMA",))


def delta_spec(dtype: str, head_dim: int):
    from tilefly.compile_check import KernelSpec

    block_s, block_d = delta_blocks(head_dim)
    element = f"*{dtype}"
    sig = {"o_ptr": element, "do_ptr": element, "delta_ptr": "*fp32", "Sq": "i32", "H": "i32", "HEAD_DIM": "i32",
           **{f"{t}_s{a}": "i32" for t in ("o", "do") for a in "bhs"}, "BLOCK_S": "constexpr", "BLOCK_D": "constexpr"}
    # As usually launched: pointers, head dim and strides divisible by 16 (Triton specializes them).
    aligned = {(list(sig).index(n),): [["tt.divisibility", 16]] for n in sig
               if n not in ("Sq", "H") and sig[n] != "constexpr"}
    return KernelSpec(name=f"attention.bwd_delta[{dtype},d={block_d}]", kernel=_bwd_kernel("delta"), signature=sig,
                      constexprs=dict(BLOCK_S=block_s, BLOCK_D=block_d), attrs=aligned, num_warps=4)


def bwd_compile_specs():
    """Every backward config x dtype x kernel head dim it serves x causal, both Gluon kernels, and
    the delta kernel per dtype and column block."""
    kernel_dims = sorted({kernel_head_dim(d) for d in HEAD_DIMS})
    specs = [bwd_spec(kernel, cfg, dtype, d, causal) for cfg in BWD_CONFIGS.values() for dtype in DTYPES
             for d in kernel_dims if cfg.serves(d) for causal in (False, True) for kernel in ("dkdv", "dq")]
    return specs + [delta_spec(dtype, d) for dtype in DTYPES for d in kernel_dims]


def interpreter_checks():
    """The plain-Triton kernels under TRITON_INTERPRET=1 on CPU tensors: the delta kernel (odd
    lengths and head dims, a B x S x H x D output and an expanded (stride-0 but unit-stride rows)
    grad_out), the whole head-dim-512 backward (kernels_bwd512.interpreter_checks), bwd512g's
    K-major copy (kernels_bwd512_kmajor) and the masked split-KV decode (decode.py)."""
    from tilefly.ops.attention import decode, kernels_bwd512, kernels_bwd512_kmajor

    def check(b, h, s, d, dtype):
        import torch

        from tilefly.ops.attention.kernels_bwd import attention_bwd_delta_kernel

        torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
        out = torch.randn(b, s, h, d).to(torch_dtype).transpose(1, 2)
        grad_out = torch.randn(1, 1, 1, d).to(torch_dtype).expand(b, h, s, d)  # stride 0 but unit-stride rows
        delta = torch.full((b, h, s), float("nan"))
        block_s, block_d = delta_blocks(d)
        attention_bwd_delta_kernel[(-(-s // block_s), b * h)](
            out, grad_out, delta, s, h, d, *out.stride()[:3], *grad_out.stride()[:3], BLOCK_S=block_s,
            BLOCK_D=block_d)
        want = (out.double() * grad_out.double()).sum(-1)
        if not torch.allclose(delta.double(), want, atol=1e-3, rtol=1e-4):
            raise AssertionError(f"delta off by {(delta.double() - want).abs().max().item()}")

    return [(f"bwd_delta[{dtype},B={b},H={h},S={s},D={d}]", lambda a=(b, h, s, d, dtype): check(*a))
            for b, h, s, d, dtype in ((2, 3, 77, 96, "bf16"), (1, 2, 300, 64, "fp16"), (3, 1, 1, 32, "bf16"))
            ] + kernels_bwd512.interpreter_checks() + kernels_bwd512_kmajor.interpreter_checks() + \
        decode.interpreter_checks()

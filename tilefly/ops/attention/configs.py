"""tilefly's flash-attention kernel configs: names, what each serves, and their compile specs.

A config is a tile shape and a schedule, ``m<BLOCK_M>n<BLOCK_N>[p]``: BLOCK_M query rows per
program with one warp per 16 rows (m128: two warpgroups, m64: one), BLOCK_N keys per step;
a trailing ``p`` runs the overlapped schedule (kernels_fwd.py's header). The ring depth
follows from the head dim: the deepest (at most MAX_STAGES) whose Q tile and K/V rings fit
the H200's 227 KB of shared memory per block. A config serves the head dims whose registers
fit (``max_head_dim``: S, P and the O accumulator per thread; larger would spill, which the
compile check refuses).
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


@dataclass(frozen=True)
class FwdConfig:
    block_m: int
    block_n: int
    max_head_dim: int
    overlap: bool = False     # softmax of one key tile overlaps the next tile's Q K^T (name ends in "p")

    @property
    def name(self) -> str:
        return f"m{self.block_m}n{self.block_n}{'p' if self.overlap else ''}"

    @property
    def num_warps(self) -> int:
        return self.block_m // 16

    def smem_bytes(self, head_dim: int, stages: int) -> int:
        return (self.block_m + 2 * stages * self.block_n) * head_dim * ELEMENT_BYTES + SMEM_RESERVE

    def stages(self, head_dim: int) -> int:
        for stages in range(MAX_STAGES, 1, -1):
            if self.smem_bytes(head_dim, stages) <= SMEM_LIMIT:
                return stages
        return 0

    def serves(self, head_dim: int) -> bool:
        kd = kernel_head_dim(head_dim)
        return kd <= self.max_head_dim and self.stages(kd) >= 2


FWD_CONFIGS: dict[str, FwdConfig] = {c.name: c for c in (
    FwdConfig(128, 64, 256),
    FwdConfig(128, 128, 128),
    FwdConfig(64, 64, 256),
    FwdConfig(128, 64, 256, overlap=True),
    FwdConfig(128, 128, 128, overlap=True),
)}
CONFIGS = tuple(FWD_CONFIGS)


def default_config(head_dim: int, sq: int) -> FwdConfig:
    """The config used when the caller names none: one warpgroup for short query runs (fewer
    idle rows), two otherwise; wide key steps while the O accumulator leaves room."""
    if sq <= 64:
        return FWD_CONFIGS["m64n64"]
    return FWD_CONFIGS["m128n128"] if head_dim <= 128 else FWD_CONFIGS["m128n64"]


# ---- compile specs: every shipped config, compiled for sm_90a in CI ---------------------------

def kernel_signature(cfg: FwdConfig, dtype: str, head_dim: int, causal: bool) -> tuple[dict, dict]:
    """Triton signature strings and constexprs of the forward kernel as the launcher runs it."""
    from triton.experimental.gluon import language as gl

    element = {"bf16": gl.bfloat16, "fp16": gl.float16}[dtype]

    def desc(rows: int) -> str:
        block = [1, 1, rows, head_dim]
        layout = gl.NVMMASharedLayout.get_default_for(block, element)
        return f"tensordesc<{dtype}[{', '.join(map(str, block))}],{layout!r}>"

    sig = {"q_desc": desc(cfg.block_m), "k_desc": desc(cfg.block_n), "v_desc": desc(cfg.block_n),
           "o_desc": desc(cfg.block_m), "lse_ptr": "*fp32", "qk_scale": "fp32",
           "Sq": "i32", "Sk": "i32", "Hq": "i32", "GROUP": "i32"}
    constexprs = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, HEAD_DIM=head_dim, STAGES=cfg.stages(head_dim),
                      CAUSAL=causal, STORE_LSE=True, OVERLAP=cfg.overlap, num_warps=cfg.num_warps)
    sig.update({name: "constexpr" for name in constexprs})
    return sig, constexprs


def _kernel():
    from tilefly.ops.attention import kernels_fwd

    return kernels_fwd.attention_fwd_kernel


def spec(cfg: FwdConfig, dtype: str, head_dim: int, causal: bool):
    from tilefly.compile_check import KernelSpec

    sig, constexprs = kernel_signature(cfg, dtype, head_dim, causal)
    return KernelSpec(name=f"attention.fwd.{cfg.name}[{dtype},d={head_dim},{'causal' if causal else 'full'}]",
                      kernel=_kernel, signature=sig, constexprs=constexprs, num_warps=cfg.num_warps,
                      gluon=True, sass_must_contain=("HGMMA",))


def compile_specs():
    """Every config x dtype x kernel head dim it serves x causal (96 and 192 run the 128 and 256
    kernels, the very same binaries)."""
    kernel_dims = sorted({kernel_head_dim(d) for d in HEAD_DIMS})
    return [spec(cfg, dtype, d, causal) for cfg in FWD_CONFIGS.values() for dtype in DTYPES
            for d in kernel_dims if cfg.serves(d) for causal in (False, True)]

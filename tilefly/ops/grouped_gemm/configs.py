"""Grouped GEMM kernel configs: what exists, what fits, what each problem is offered.

A ``GroupedConfig`` is one build of ``grouped_gemm_kernel``: tile, K-step,
pipeline depth, warps and the L2 group height inside an expert. ``DEFAULT`` is
the curated list Inductor races against ATen (CUTLASS) and Triton's grouped
template; ``exhaustive()`` is every config of a modest grid that passes
``static_reason`` (tilefly.config.gemm_autotune = "exhaustive"), both filtered
per problem by ``offered``.

Written for the H200 (132 SMs, 227 KB shared memory per block); to be refit
from the grouped_gemm suite:
- 128x256 over 8 warps for experts with many rows (>= 256 per group on average);
- 128x128 over 4 warps when 128x256 tiles would leave SMs idle (few groups,
  N small);
- 64-row tiles for many experts with few rows each (128 experts x 32 rows):
  a 128-row tile there computes 75% padding rows.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

SMEM_LIMIT = 232448          # bytes of shared memory one block may use on sm_90 (227 KB)
ACC_REGS_LIMIT = 128         # FP32 accumulator registers per thread we allow
SMEM_RESERVE = 2048          # barriers, the group table's reduction scratch
ELEMENT_BYTES = 2            # FP16/BF16 operands
MAX_GROUPS = 1024            # the group table lives in registers: at most 4 entries a thread
VERSION = "v1"               # part of every Inductor choice name: bump when kernels change


@dataclass(frozen=True)
class GroupedConfig:
    block_m: int
    block_n: int
    block_k: int
    stages: int
    num_warps: int
    group_m: int = 8

    @property
    def name(self) -> str:
        return (f"grouped{self.block_m}x{self.block_n}x{self.block_k}_s{self.stages}_w{self.num_warps}"
                f"_g{self.group_m}")

    def smem_bytes(self, out_bytes: int = ELEMENT_BYTES) -> int:
        """Ring plus the scratch of the output tile's layout conversion (16-bit outputs only)."""
        ring = self.stages * (self.block_m + self.block_n) * self.block_k * ELEMENT_BYTES
        convert = self.block_m * self.block_n * out_bytes if out_bytes == ELEMENT_BYTES else 0
        return ring + convert + SMEM_RESERVE


def _pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


def static_reason(cfg: GroupedConfig) -> str | None:
    """None when the config can be built at all (independent of the problem), else why not."""
    if not all(_pow2(v) for v in (cfg.block_m, cfg.block_n, cfg.block_k)):
        return "tile sizes must be powers of two (TMA boxes, aranges)"
    if cfg.block_m not in (64, 128):
        return "block_m must be 64 or 128 (one wgmma row slab per warpgroup)"
    if not 16 <= cfg.block_n <= 256:
        return "block_n must be 16..256 (wgmma N; 8 contiguous columns per thread in the store)"
    if cfg.block_k not in (32, 64, 128):
        return "block_k must be 32, 64 or 128"
    if cfg.num_warps not in (4, 8):
        return "num_warps must be 4 or 8 (one or two warpgroups)"
    if cfg.stages < 2:
        return "at least 2 pipeline stages"
    if cfg.group_m < 1:
        return "group_m must be at least 1"
    regs = cfg.block_m * cfg.block_n // (32 * cfg.num_warps)
    if regs > ACC_REGS_LIMIT:
        return f"accumulator needs {regs} registers per thread"
    if cfg.smem_bytes() > SMEM_LIMIT:
        return f"needs {cfg.smem_bytes()} bytes of shared memory (> {SMEM_LIMIT})"
    return None


DEFAULT: tuple[GroupedConfig, ...] = (
    # many rows per expert
    GroupedConfig(128, 256, 64, 3, 8),
    GroupedConfig(128, 128, 64, 4, 4),
    GroupedConfig(128, 128, 64, 5, 8),
    # few rows per expert: 64-row tiles waste less on padding rows
    GroupedConfig(64, 256, 64, 4, 4),
    GroupedConfig(64, 128, 64, 6, 4),
)
SMALL_GROUP_ROWS = 96        # mean rows per group below which only 64-row tiles are offered


def exhaustive() -> tuple[GroupedConfig, ...]:
    out = list(DEFAULT)
    for bm, bn, bk, stages, warps, group in itertools.product(
            (64, 128), (64, 128, 256), (64, 128), (2, 3, 4, 5, 6), (4, 8), (1, 8)):
        out.append(GroupedConfig(bm, bn, bk, stages, warps, group))
    return tuple(dict.fromkeys(cfg for cfg in out if static_reason(cfg) is None))  # first occurrence, in order


def configs(search: str = "default") -> tuple[GroupedConfig, ...]:
    return exhaustive() if search == "exhaustive" else DEFAULT


def problem_reason(cfg: GroupedConfig, k: int, b_kmajor: bool, out_bytes: int = ELEMENT_BYTES) -> str | None:
    """None when ``cfg`` computes this problem correctly and fits, else why not."""
    if not b_kmajor and k % cfg.block_k:
        return (f"row-major B with K={k} not a multiple of BLOCK_K={cfg.block_k}: the last K-step would read "
                "the next group's weights")
    if cfg.smem_bytes(out_bytes) > SMEM_LIMIT:
        return "does not fit shared memory with this output dtype"
    return None


def offered(total_rows: int, groups: int, n: int, k: int, b_kmajor: bool, search: str = "default",
            out_bytes: int = ELEMENT_BYTES) -> list[GroupedConfig]:
    """The configs worth benchmarking. ``total_rows`` is A's row count (the group sizes are
    on the device; their mean is what the host knows)."""
    mean_rows = total_rows / max(1, groups)
    picked = []
    for cfg in configs(search):
        if problem_reason(cfg, k, b_kmajor, out_bytes) is not None:
            continue
        if search != "exhaustive" and mean_rows < SMALL_GROUP_ROWS and cfg.block_m != 64:
            continue
        picked.append(cfg)
    return picked


def groups_pad(groups: int, num_warps: int) -> int:
    """Entries of the in-register group table: a power of two, at least one per thread."""
    return max(32 * num_warps, 1 << max(0, groups - 1).bit_length())


# ---- compile specs: every shipped config, compiled for sm_90a in CI ---------------------------

def kernel_signature(cfg: GroupedConfig, dtype: str, b_kmajor: bool, out: str | None = None,
                     groups: int = 8) -> tuple[dict[str, str], dict[str, object]]:
    """Triton signature strings and constexprs of one launch variant (``dtype`` "bf16"/"fp16",
    ``out`` the output dtype string, default the input's), as the launcher specializes it."""
    from triton.experimental.gluon import language as gl

    element = {"bf16": gl.bfloat16, "fp16": gl.float16}[dtype]

    def desc(rows: int, cols: int) -> str:
        layout = gl.NVMMASharedLayout.get_default_for([rows, cols], element)
        return f"tensordesc<{dtype}[{rows}, {cols}],{layout!r}>"

    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    out = out or dtype
    sig = {"a_desc": desc(bm, bk), "b_desc": desc(bn, bk) if b_kmajor else desc(bk, bn), "c_ptr": f"*{out}",
           "offs_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "num_groups": "i32", "stride_cm": "i32"}
    constexprs: dict[str, object] = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, B_KMAJOR=b_kmajor, STAGES=cfg.stages,
                                         GROUP_M=cfg.group_m, GROUPS_PAD=groups_pad(groups, cfg.num_warps),
                                         OUT_CONVERT=out != "fp32", num_warps=cfg.num_warps)
    sig.update({name: "constexpr" for name in constexprs})
    return sig, constexprs


def kernel_of(cfg: GroupedConfig):
    from tilefly.ops.grouped_gemm import kernels

    return kernels.grouped_gemm_kernel


def compile_specs():
    """Every default config as the grouped_gemm suite runs it (BF16, column-major B, 8 groups),
    plus row-major B, FP16, FP32 output and the largest group table on two configs."""
    from tilefly.compile_check import KernelSpec

    variants = [(cfg, "bf16", True, None, 8) for cfg in DEFAULT]
    for cfg in (DEFAULT[0], DEFAULT[3]):
        variants += [(cfg, "fp16", False, None, 8), (cfg, "bf16", True, "fp32", 8),
                     (cfg, "bf16", True, None, MAX_GROUPS)]
    specs = []
    for cfg, dtype, b_kmajor, out, groups in variants:
        sig, constexprs = kernel_signature(cfg, dtype, b_kmajor, out, groups)
        if out == "fp32" and cfg.smem_bytes(4) > SMEM_LIMIT:
            continue
        specs.append(KernelSpec(
            name=f"grouped_gemm.{cfg.name}[{dtype},B{'col' if b_kmajor else 'row'},out={out or dtype},"
                 f"G<={constexprs['GROUPS_PAD']}]",
            kernel=lambda cfg=cfg: kernel_of(cfg), signature=sig, constexprs=constexprs,
            num_warps=cfg.num_warps, gluon=True, sass_must_contain=("HGMMA",)))
    return specs

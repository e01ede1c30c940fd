"""Dense GEMM kernel configs: what exists, what fits, what each shape is offered.

A ``GemmConfig`` names one kernel (``tile``: persistent large-tile, ``tilews``:
the same with a producer warp, ``splitk``: skinny split-K) and its tile,
pipeline depth and warps. ``DEFAULT`` is the curated list Inductor races
against ATen and Triton; ``exhaustive()`` is every config that passes
``static_reason`` (tilefly.config.gemm_autotune = "exhaustive").
``offered(M, N, K)`` picks, per shape, the configs worth benchmarking.

Tuned for the H200 (132 SMs, 227 KB shared memory per block, 4.3 TB/s):
- decode shapes (M <= 256, N >= 4096) are weight-streaming: splitk tiles put
  128 weight rows in the wgmma M slot and the tokens (8..256, the next power
  of two) in its N slot, with 4-6 stages of 32 KB weight tiles in flight per SM;
- large shapes use 128x256 tiles over 8 warps (cuBLAS-class) or 128x128 over
  4 warps where 128x256 would leave SMs idle (M or N around 512-1024).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

SMEM_LIMIT = 232448          # bytes of shared memory one block may use on sm_90 (227 KB)
ACC_REGS_LIMIT = 128         # FP32 accumulator registers per thread we allow
SMEM_RESERVE = 1024          # barriers and small epilogue scratch
ELEMENT_BYTES = 2            # FP16/BF16 operands and outputs
KINDS = ("tile", "tilews", "splitk")
VERSION = "v1"               # part of every Inductor choice name: bump when kernels change


@dataclass(frozen=True)
class GemmConfig:
    kind: str
    block_m: int
    block_n: int
    block_k: int
    stages: int
    num_warps: int
    group_m: int = 8          # tile kinds: rows of tiles per L2 group
    max_splits: int = 1       # splitk: most K-splits the launcher may use

    @property
    def name(self) -> str:
        base = f"{self.kind}{self.block_m}x{self.block_n}x{self.block_k}_s{self.stages}_w{self.num_warps}"
        return f"{base}_k{self.max_splits}" if self.kind == "splitk" else f"{base}_g{self.group_m}"

    @property
    def persistent(self) -> bool:
        return self.kind in ("tile", "tilews")

    def smem_bytes(self) -> int:
        ring = self.stages * (self.block_m + self.block_n) * self.block_k * ELEMENT_BYTES
        c_tile = self.block_m * self.block_n * ELEMENT_BYTES if self.persistent else 0
        return ring + c_tile + SMEM_RESERVE


def _pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


def static_reason(cfg: GemmConfig) -> str | None:
    """None when the config can be built at all (independent of the shape), else why not."""
    if cfg.kind not in KINDS:
        return f"unknown kernel kind {cfg.kind!r}"
    if not all(_pow2(v) for v in (cfg.block_m, cfg.block_n, cfg.block_k)):
        return "tile sizes must be powers of two (TMA boxes, aranges)"
    if cfg.block_m not in (64, 128, 256):
        return "block_m must be 64, 128 or 256 (wgmma M is 64 per warpgroup)"
    if not 8 <= cfg.block_n <= 256:
        return "block_n must be 8..256 (wgmma N)"
    if cfg.block_k not in (32, 64, 128):
        return "block_k must be 32, 64 or 128"
    if cfg.num_warps not in (4, 8):
        return "num_warps must be 4 or 8 (one or two warpgroups)"
    if cfg.num_warps == 8 and cfg.block_m == 64 and cfg.block_n < 16:
        return "two warpgroups on 64 rows split N: block_n must be at least 16"
    if cfg.stages < 2:
        return "at least 2 pipeline stages"
    if cfg.block_m * cfg.block_n // (32 * cfg.num_warps) > ACC_REGS_LIMIT:
        return f"accumulator needs {cfg.block_m * cfg.block_n // (32 * cfg.num_warps)} registers per thread"
    if cfg.smem_bytes() > SMEM_LIMIT:
        return f"needs {cfg.smem_bytes()} bytes of shared memory (> {SMEM_LIMIT})"
    if cfg.kind == "splitk" and not 1 <= cfg.max_splits <= 32:
        return "max_splits must be 1..32"
    if cfg.kind != "splitk" and cfg.max_splits != 1:
        return "only splitk splits K"
    return None


# wgmma reads an MN-major (transposed) operand tile in 8 x 8 core matrices along MN; a tile whose MN
# extent is only 16 bytes (block_n = 8) gave wrong results and illegal addresses on the H200 (B read
# MN-major by splitk128x8x128, 2026-11-30), so such tiles are refused: the 16-wide configs serve them.
MIN_MN_MAJOR_BYTES = 32


def layout_reason(cfg: GemmConfig, a_kmajor: bool, b_kmajor: bool) -> str | None:
    """None when ``cfg`` can read operands in these orientations (after any swap), else why not."""
    if not a_kmajor and cfg.block_m * ELEMENT_BYTES < MIN_MN_MAJOR_BYTES:
        return f"an MN-major A tile needs block_m >= {MIN_MN_MAJOR_BYTES // ELEMENT_BYTES}"
    if not b_kmajor and cfg.block_n * ELEMENT_BYTES < MIN_MN_MAJOR_BYTES:
        return f"an MN-major B tile needs block_n >= {MIN_MN_MAJOR_BYTES // ELEMENT_BYTES}"
    return None


def _tile(bm, bn, bk, stages, warps, group=8, kind="tile"):
    return GemmConfig(kind, bm, bn, bk, stages, warps, group_m=group)


def _splitk(bm, bn, bk, stages, warps, max_splits=16):
    return GemmConfig("splitk", bm, bn, bk, stages, warps, max_splits=max_splits)


DEFAULT: tuple[GemmConfig, ...] = (
    # large shapes
    _tile(128, 256, 64, 3, 8),
    _tile(128, 256, 64, 3, 8, kind="tilews"),
    _tile(128, 128, 64, 4, 4),
    _tile(256, 128, 64, 3, 8),
    _tile(64, 256, 64, 4, 4),
    # skinny shapes: the small dimension (tokens) rides in block_n
    _splitk(128, 8, 128, 6, 4),
    _splitk(128, 16, 128, 6, 4),
    _splitk(64, 16, 128, 8, 4),
    _splitk(128, 32, 128, 5, 4),
    _splitk(64, 32, 128, 8, 4),
    _splitk(128, 64, 128, 4, 4),
    _splitk(128, 128, 64, 6, 8),
    _splitk(128, 256, 64, 4, 8),
    _splitk(64, 256, 64, 4, 4),
)


def exhaustive() -> tuple[GemmConfig, ...]:
    """Every buildable config of a modest grid (a few hundred)."""
    out = list(DEFAULT)
    for kind, bm, bn, bk, stages, warps in itertools.product(
            ("tile", "tilews"), (64, 128, 256), (64, 128, 256), (64, 128), (2, 3, 4, 5, 6), (4, 8)):
        out.append(GemmConfig(kind, bm, bn, bk, stages, warps))
    for bm, bn, bk, stages, warps in itertools.product(
            (64, 128), (8, 16, 32, 64, 128, 256), (64, 128), (3, 4, 5, 6, 8), (4, 8)):
        out.append(GemmConfig("splitk", bm, bn, bk, stages, warps, max_splits=16))
    return tuple(dict.fromkeys(cfg for cfg in out if static_reason(cfg) is None))  # first occurrence, in order


def configs(search: str = "default") -> tuple[GemmConfig, ...]:
    return exhaustive() if search == "exhaustive" else DEFAULT


def small_slot(small: int) -> int:
    """The wgmma N a splitk kernel wants for a small dimension: next power of two, 8..256."""
    return min(256, max(8, 1 << max(0, small - 1).bit_length()))


# Narrower token slots also offered to 33..256 tokens (the slot tiles N several times): the dense
# config sweep at ad87ca3 (BENCHMARKS.md) found them fastest there: 64 x 4096 x 4096 on a 32-wide
# slot (17.6 us, 1.02x cuBLAS), 128 x 4096 x 4096 on 32 (21.1 us), 256 x 4096 x 4096 and
# 4096 x 256 x 4096 on 64; offered only their own slot, the suite at 15f271b read 0.63-0.71x there.
NARROW_SLOTS = {64: (32,), 128: (32,), 256: (64,)}


def offered(m: int, n: int, k: int, search: str = "default") -> list[GemmConfig]:
    """The configs worth benchmarking for an m x n x k GEMM.

    splitk configs go to shapes whose small side fits their token slot exactly
    (1..8 tokens also get the 16-wide slot; 33..256 tokens also the narrower
    slots of ``NARROW_SLOTS``; above 256, up to two 256-wide slots); tile configs
    go to shapes whose small side is at least 128. Exhaustive search offers every
    config whose token slot is not wider than needed."""
    small = min(m, n)
    picked = []
    for cfg in configs(search):
        if cfg.kind == "splitk":
            slot = small_slot(small)
            # a 16-wide slot costs a 1..8-token GEMM nothing: it streams the same weights
            fits = (cfg.block_n == slot or (slot == 8 and cfg.block_n == 16)
                    or cfg.block_n in NARROW_SLOTS.get(slot, ())) and small <= 512
            if search == "exhaustive":
                fits = cfg.block_n <= small_slot(small) and small <= 1024
        else:
            fits = small >= 128 or search == "exhaustive"
        if fits:
            picked.append(cfg)
    return picked


# Fixed cost of one split-K program in K-steps: pipeline fill, partial store, ticket and
# the last program's reduction. A guess to be refit from an H200 sweep (sweep.py).
SPLIT_OVERHEAD_STEPS = 2
SMEM_PER_SM = 233472         # bytes all resident blocks of an SM share (228 KB)
REGS_PER_SM = 65536
MAX_RESIDENT = 3             # split-K programs an SM is assumed to run at once, at most
REGS_PER_THREAD = 168        # a guess at ptxas's count, only used to bound residency


def programs_per_sm(smem_bytes: int, num_warps: int, regs_per_thread: int) -> int:
    """Programs one SM runs at once, as shared memory and registers allow (at least 1, at most
    MAX_RESIDENT): the slot count split-K choices plan with (this module's and the MX GEMM's)."""
    by_regs = REGS_PER_SM // (32 * num_warps * regs_per_thread)
    return max(1, min(MAX_RESIDENT, SMEM_PER_SM // smem_bytes, by_regs))


def resident(cfg: GemmConfig) -> int:
    """splitk programs of ``cfg`` one SM runs at once: 1 for every shipped config (each fills
    most of the shared memory with its ring), more for the exhaustive list's shallow rings."""
    return programs_per_sm(cfg.smem_bytes(), cfg.num_warps, REGS_PER_THREAD)


def choose_splits(cfg: GemmConfig, tiles: int, k_iters: int, num_sms: int, split_cost: float = 0.0) -> int:
    """K-splits for a splitk launch. ``num_sms`` counts program slots (SMs x ``resident``),
    so a launch takes about waves x (K-steps per split + overhead), plus ``split_cost`` K-steps
    per split (the partials' reduction, where a caller measured it); pick the split count that
    minimizes it (fewest splits on ties), never leaving a split empty."""
    best, best_time = 1, None
    for splits in range(1, min(cfg.max_splits, k_iters) + 1):
        per_split = -(-k_iters // splits)
        if -(-k_iters // per_split) != splits:
            continue  # the same per-split length as a smaller count: that one already counted
        waves = -(-(tiles * splits) // num_sms)
        time = waves * (per_split + SPLIT_OVERHEAD_STEPS) + splits * split_cost
        if best_time is None or time < best_time:
            best, best_time = splits, time
    return best


# ---- compile specs: every shipped config, compiled for sm_90a in CI ---------------------------

def kernel_signature(cfg: GemmConfig, dtype: str, a_kmajor: bool, b_kmajor: bool, bias: int,
                     rows_contiguous: bool = True) -> tuple[dict[str, str], dict[str, object]]:
    """Triton signature strings and constexprs of ``cfg``'s kernel for one variant
    (``dtype`` "bf16"/"fp16"), exactly as the launcher specializes it."""
    from triton.experimental.gluon import language as gl

    element = {"bf16": gl.bfloat16, "fp16": gl.float16}[dtype]

    def desc(rows: int, cols: int) -> str:
        layout = gl.NVMMASharedLayout.get_default_for([rows, cols], element)
        return f"tensordesc<{dtype}[{rows}, {cols}],{layout!r}>"

    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    sig = {"a_desc": desc(bm, bk) if a_kmajor else desc(bk, bm),
           "b_desc": desc(bn, bk) if b_kmajor else desc(bk, bn)}
    constexprs: dict[str, object] = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, A_KMAJOR=a_kmajor, B_KMAJOR=b_kmajor,
                                         BIAS=bias)
    if cfg.persistent:
        sig.update({"c_desc": desc(bm, bn), "bias_ptr": f"*{dtype}", "M": "i32", "N": "i32", "K": "i32",
                    "stride_bias": "i32"})
        constexprs.update(STAGES=cfg.stages, GROUP_M=cfg.group_m)
    else:
        sig.update({"c_ptr": f"*{dtype}", "bias_ptr": f"*{dtype}", "ws_ptr": "*fp32", "ticket_ptr": "*i32",
                    "M": "i32", "N": "i32", "K": "i32", "stride_cm": "i32", "stride_cn": "i32",
                    "stride_bias": "i32", "iters_per_split": "i32"})
        constexprs.update(C_ROWS_CONTIGUOUS=rows_contiguous, STAGES=cfg.stages)
    constexprs["num_warps"] = cfg.num_warps
    sig.update({name: "constexpr" for name in constexprs})
    return sig, constexprs


def kernel_of(cfg: GemmConfig):
    from tilefly.ops.gemm import kernels

    return {"tile": kernels.gemm_persistent_kernel, "tilews": kernels.gemm_persistent_ws_kernel,
            "splitk": kernels.gemm_splitk_kernel}[cfg.kind]


def compile_specs():
    """Every default config as the dense_gemm suite runs it (BF16, NT, bias), plus the
    other layouts, FP16 and no-bias variants on one config of each kernel."""
    from tilefly.compile_check import KernelSpec

    variants = [(cfg, "bf16", True, True, 2 if cfg.kind == "splitk" else 1, True) for cfg in DEFAULT]
    for cfg in (DEFAULT[0], DEFAULT[1], _splitk(128, 16, 128, 6, 4), _splitk(128, 128, 64, 6, 8)):
        for a_kmajor, b_kmajor in ((True, False), (False, True), (False, False)):
            variants.append((cfg, "fp16", a_kmajor, b_kmajor, 0, False))
    specs = []
    for cfg, dtype, a_kmajor, b_kmajor, bias, rows in variants:
        sig, constexprs = kernel_signature(cfg, dtype, a_kmajor, b_kmajor, bias, rows)
        layout = ("T" if not a_kmajor else "N") + ("N" if not b_kmajor else "T")
        specs.append(KernelSpec(
            name=f"gemm.{cfg.name}[{dtype},{layout},bias={bias}{',rowsC' if rows and cfg.kind == 'splitk' else ''}]",
            kernel=lambda cfg=cfg: kernel_of(cfg), signature=sig, constexprs=constexprs,
            num_warps=cfg.num_warps, gluon=True, sass_must_contain=("HGMMA",)))
    return specs

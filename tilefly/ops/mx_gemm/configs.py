"""MX GEMM kernel configs: tile, ring depth and warps per shape, and the compile specs CI builds.

An ``MXConfig`` is one build of ``kernels.mx_gemm_kernel``: ``block_m`` rows of the big side
(the wgmma M slot), ``block_n`` of the small side (wgmma N, 8..64), ``stages`` K-blocks of 32
in flight, ``num_warps``, and the most K-splits the launcher may use (it splits K until every
SM runs ``resident`` programs). ``pick(rows, cols, k, fmt)`` chooses one per problem (rows >= cols
after the launcher's swap); ``offered`` lists the configs the benchmark races.

First version, not yet tuned on the H200: the ring holds ~48 KB of operands per program and
an SM runs up to three programs, well over the ~32 KB in flight an SM needs to stream at HBM
speed; the accumulator and the per-K-block partial both live in registers, so
block_m * block_n is kept to 32 values a thread (more spilled).
"""
from __future__ import annotations

from dataclasses import dataclass

SMEM_LIMIT = 232448          # bytes one block may use on sm_90
SMEM_PER_SM = 233472         # bytes all resident blocks of an SM share (228 KB)
SMEM_RESERVE = 1024          # barriers
# Operand bytes in flight per program. Each K-block is MMA, then scaling, in one program; a
# ring of ~48 KB leaves room for 3-4 programs an SM, whose MMA and scaling interleave.
RING_TARGET = 48 * 1024
MAX_RESIDENT = 3             # programs an SM is assumed to run at once
REGS_PER_SM = 65536
# Registers a thread, about what ptxas gives the kernel (sm_90a, triton 3.6: 54-232 over the
# shipped configs, ~170 for the 4-warp skinny ones); only used to guess residency.
REGS_PER_THREAD = 168
# FP32 accumulator values a thread; the partial takes as many again, and the per-K-block scaling
# needs its integer temporaries: at 64 (128x64 over 4 warps, 128x128 over 8) ptxas spilled.
ACC_REGS_LIMIT = 32
SCALE_BLOCK = 32
FORMATS = ("mxfp8", "mxfp4")


@dataclass(frozen=True)
class MXConfig:
    block_m: int
    block_n: int
    stages: int
    num_warps: int
    max_splits: int = 16

    @property
    def name(self) -> str:
        return f"mx{self.block_m}x{self.block_n}_s{self.stages}_w{self.num_warps}_k{self.max_splits}"

    def item_bytes(self, fmt: str) -> int:
        per_row = SCALE_BLOCK if fmt == "mxfp8" else SCALE_BLOCK // 2
        return (self.block_m + self.block_n) * per_row

    def smem_bytes(self, fmt: str) -> int:
        unpacked = (self.block_m + self.block_n) * SCALE_BLOCK if fmt == "mxfp4" else 0
        return self.stages * self.item_bytes(fmt) + unpacked + SMEM_RESERVE


def static_reason(cfg: MXConfig, fmt: str) -> str | None:
    if cfg.block_m not in (64, 128):
        return "block_m must be 64 or 128 (wgmma M is 64 per warpgroup)"
    if cfg.block_n not in (8, 16, 32, 64):
        return "block_n must be a power of two in 8..64"
    if cfg.num_warps not in (4, 8):
        return "num_warps must be 4 or 8"
    if cfg.num_warps == 8 and cfg.block_m == 64 and cfg.block_n < 16:
        return "two warpgroups on 64 rows split N: block_n must be at least 16"
    if cfg.block_m * cfg.block_n // (32 * cfg.num_warps) > ACC_REGS_LIMIT:
        return "accumulator and partial would not fit in registers"
    if cfg.stages < 2:
        return "at least 2 stages"
    if cfg.smem_bytes(fmt) > SMEM_LIMIT:
        return f"needs {cfg.smem_bytes(fmt)} bytes of shared memory"
    if not 1 <= cfg.max_splits <= 32:
        return "max_splits must be 1..32"
    return None


def resident(cfg: MXConfig, fmt: str) -> int:
    """Programs of ``cfg`` one SM runs at once, as shared memory and registers allow."""
    by_regs = REGS_PER_SM // (32 * cfg.num_warps * REGS_PER_THREAD)
    return max(1, min(MAX_RESIDENT, SMEM_PER_SM // cfg.smem_bytes(fmt), by_regs))


def small_slot(small: int) -> int:
    """wgmma N for the small side: the next power of two, 8..64 (wider sides take several tiles)."""
    return min(64, max(8, 1 << max(0, small - 1).bit_length()))


def _stages(block_m: int, block_n: int, fmt: str) -> int:
    per_row = SCALE_BLOCK if fmt == "mxfp8" else SCALE_BLOCK // 2
    return max(2, min(32, RING_TARGET // ((block_m + block_n) * per_row)))


def pick(rows: int, cols: int, k: int, fmt: str) -> MXConfig:
    """The config for a rows x cols x k problem (rows >= cols)."""
    block_n = small_slot(cols)
    num_warps = 8 if block_n >= 64 else 4
    return MXConfig(128, block_n, _stages(128, block_n, fmt), num_warps)


def offered(rows: int, cols: int, k: int, fmt: str) -> list[MXConfig]:
    """Configs the benchmark races on this shape: the pick, and a 64-row variant (twice the
    programs, for shapes with few row tiles)."""
    best = pick(rows, cols, k, fmt)
    alt = MXConfig(64, best.block_n, _stages(64, best.block_n, fmt), 4)
    return [c for c in (best, alt) if static_reason(c, fmt) is None]


# ---- compile specs: every shipped config, compiled for sm_90a in CI ---------------------------

def kernel_signature(cfg: MXConfig, fmt: str, x_swizzled: bool, y_swizzled: bool, bias: int, out: str = "bf16",
                     rows_contiguous: bool = True) -> tuple[dict[str, str], dict[str, object]]:
    """Triton signature strings and constexprs for one variant, as the launcher specializes it."""
    from triton.experimental.gluon import language as gl

    if fmt == "mxfp8":
        elem, ty, width = gl.float8e4nv, "fp8e4nv", SCALE_BLOCK
    else:
        elem, ty, width = gl.uint8, "u8", SCALE_BLOCK // 2

    def desc(rows: int) -> str:
        layout = gl.NVMMASharedLayout.get_default_for([rows, width], elem)
        return f"tensordesc<{ty}[{rows}, {width}],{layout!r}>"

    sig = {"x_desc": desc(cfg.block_m), "y_desc": desc(cfg.block_n), "sx_ptr": "*u8", "sy_ptr": "*u8",
           "c_ptr": f"*{out}", "bias_ptr": f"*{out}", "ws_ptr": "*fp32", "ticket_ptr": "*i32",
           "M": "i32", "N": "i32", "K": "i32", "stride_sxr": "i32", "stride_sxc": "i32", "stride_syr": "i32",
           "stride_syc": "i32", "stride_cm": "i32", "stride_cn": "i32", "stride_bias": "i32",
           "iters_per_split": "i32"}
    constexprs = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, FP4=fmt == "mxfp4", X_SWIZZLED=x_swizzled,
                      Y_SWIZZLED=y_swizzled, BIAS=bias, C_ROWS_CONTIGUOUS=rows_contiguous, STAGES=cfg.stages,
                      num_warps=cfg.num_warps)
    sig.update({name: "constexpr" for name in constexprs})
    return sig, constexprs


def kernel():
    from tilefly.ops.mx_gemm import kernels

    return kernels.mx_gemm_kernel


# The mxfp_gemm suite's quick shapes (skinny and square) per format, plus a 64-row variant.
SHIPPED_SHAPES = ((4096, 32, 4096), (4096, 4096, 4096), (14336, 1, 4096))


def shipped() -> list[tuple[str, MXConfig]]:
    out = []
    for fmt in FORMATS:
        for rows, cols, k in SHIPPED_SHAPES:
            for cfg in offered(rows, cols, k, fmt):
                if (fmt, cfg) not in out:
                    out.append((fmt, cfg))
    return out


def compile_specs():
    """Every shipped (format, config) with the benchmark's variant (unswizzled scales, no bias,
    BF16 out, the skinny swap's column-contiguous output), plus swizzled scales, bias and FP16
    on one config per format."""
    from tilefly.compile_check import KernelSpec

    variants = [(fmt, cfg, False, False, 0, "bf16", True) for fmt, cfg in shipped()]
    for fmt in FORMATS:
        cfg = pick(4096, 16, 4096, fmt)
        variants.append((fmt, cfg, True, True, 1, "fp16", False))
        variants.append((fmt, cfg, True, False, 2, "bf16", True))
    specs = []
    for fmt, cfg, xs, ys, bias, out, rows in variants:
        sig, constexprs = kernel_signature(cfg, fmt, xs, ys, bias, out, rows)
        specs.append(KernelSpec(
            name=f"mx_gemm.{cfg.name}[{fmt},swz={int(xs)}{int(ys)},bias={bias},{out},rowsC={int(rows)}]",
            kernel=kernel, signature=sig, constexprs=constexprs, num_warps=cfg.num_warps, gluon=True,
            sass_must_contain=("QGMMA",)))
    return specs

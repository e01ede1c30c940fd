"""MX GEMM kernel configs: tile, ring depth and warps per shape, and the compile specs CI builds.

An ``MXConfig`` is one build of an MX kernel: ``kernel`` 1 (``kernels.mx_gemm_kernel``, a ring
slot is one K-block of 32), 2 (``kernels_v2.mx_gemm_v2_kernel``, a slot is BLOCK_K = 128 K
elements, async wgmma with the block-scale promotion overlapped; ``scale_slots`` > 0 stages the
program's scale words in shared memory first), 3 (``kernels_v3``, the same slots upcast to BF16 in
the CTA) or 4 (``kernels_v4``, MXFP4 only: the scales folded into the unpacked FP8 operands;
``x_regs`` builds feed X to the wgmma from registers), ``block_m`` rows of the big side (the wgmma M
slot), ``block_n`` of the small side (wgmma N, 8..64), ``stages`` ring slots, ``num_warps``, and the
most K-splits the launcher may use (it splits K until every SM runs ``resident`` programs).
``pick(rows, cols, k, fmt)`` chooses the build the eager path runs (rows >= cols after the launcher's
swap): the staged v2 build at <= 64 columns (v4 with X from registers for MXFP4 above 8), v2 above;
``offered`` lists the configs the benchmark races (v1, v2, staged v2 at <= 64 columns, v3 at 33-64,
v4 with and without X from registers at <= 64).

Sizes: rings of ~48 KB (v1) to ~96 KB (v2) of operands per program; the accumulator and the
per-K-block partials live in registers, so block_m * block_n is kept to 32 values a thread for v1
and v2 (more spilled) and 64 for v3. Calls of at least 128 tokens take the BF16 route (upcast.py),
not these kernels.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from tilefly.ops.gemm.configs import SMEM_PER_SM, programs_per_sm  # noqa: F401 - SMEM_PER_SM: shared budget

SMEM_LIMIT = 232448          # bytes one block may use on sm_90
SMEM_RESERVE = 1024          # barriers
# Operand bytes in flight per program. Each K-block is MMA, then scaling, in one program; a
# ring of ~48 KB leaves room for 3-4 programs an SM, whose MMA and scaling interleave.
RING_TARGET = 48 * 1024
# Registers a thread, about what ptxas gives the kernel (sm_90a, triton 3.6: 54-232 over the
# shipped configs, ~170 for the 4-warp skinny ones); only used to guess residency.
REGS_PER_THREAD = 168
# FP32 accumulator values a thread; the partial takes as many again, and the per-K-block scaling
# needs its integer temporaries: at 64 (128x64 over 4 warps, 128x128 over 8) ptxas spilled.
ACC_REGS_LIMIT = 32
SCALE_BLOCK = 32
FORMATS = ("mxfp8", "mxfp4")

# v2: a slot holds V2_BLOCK_K K elements (4 scale blocks). The accumulator and two partials
# live in registers (3 x 32 values a thread at most): ptxas gives such a build 241-255
# registers without spills (sm_90a, triton 3.6), so 2 programs of 4 warps (1 of 8) share an SM;
# 59-137 for the 8- and 16-wide skinny ones. Rings: ~96 KB (FP8), ~64 KB plus the two unpacked
# FP8 buffers (FP4).
V2_BLOCK_K = 128
V2_RING_TARGET = {"mxfp8": 96 * 1024, "mxfp4": 64 * 1024}
V2_MAX_STAGES = 8
V2_REGS_PER_THREAD = 248
V2_REGS_SKINNY = 136        # block_m * block_n / (32 * num_warps) <= 8
# v2 with staged scales (kernels_v2, "staged scales"): a program's K-range holds at most scale_slots ring
# slots, whose scale words it loads once before the ring; the launcher splits K so. Offered at <= 64
# columns (decode), where a launch is one or two waves of short programs.
STAGED_SLOTS = (8, 16, 32)
# K-steps each extra split costs (its partial tile written, then reduced): without it the planner
# split decode shapes with few row tiles down to 2 steps a program. MXFP8 decode probe at d1dbf60
# (BENCHMARKS.md session 29), picked tile, 32 x 1024 x 4096: 4 / 8 / 16 splits 11.8 / 11.3 / 12.8 us
# (16 planned); 32 x 4096 x 4096: 2 / 4 / 8 splits 14.8 / 13.7 / 15.6 (4 planned, kept).
SPLIT_COST_STEPS = 0.5
V2_STAGED_SLOTS = 16
V2_STAGED_STAGES = 4
# Registers the split planner counts for a staged build above 8 accumulator values a thread (V2_REGS_SKINNY at
# 8 and fewer). ptxas (sm_90a, triton 3.6) gives the 16-value picks 110-128 (64x32 and 128x16 with X from registers:
# 128) and the 32-value ones 168-219, so the 16-value builds could run 3 programs an SM, not the 2 planned.
# Planning with 3 (52ee3b7, BENCHMARKS.md session 35) split K further with mixed results in the Llama-3.1-8B
# MXFP4 e2e: 32 x 6144 x 4096 2 -> 4 splits 18.3 -> 15.5 us, but 32 x 4096 x 4096 4 -> 6 12.9 -> 13.7,
# 16 x 28672 x 4096 2 -> 3 33.2 -> 34.9 and 16 x 4096 x 14336 8 -> 12 20.9 -> 22.9; so the planner keeps 2.
# test_mx_v2 checks against ptxas that it never counts more programs than fit.
V2_STAGED_REGS = 176
# v3 (kernels_v3.py): operands upcast to BF16 in the CTA; one or two sets of four [rows, 32] BF16 K-block
# buffers beside the ring; only the accumulator lives across the loop (at most 64 values a thread).
V3_BF16_BYTES = 4 * 32 * 2         # shared bytes per tile row and buffer set (X and Y rows alike)
V3_ACC_REGS_LIMIT = 64
V3_REGS_PER_THREAD = 128           # sm_90a compile: 128-147 for the shipped 64x64 build


@dataclass(frozen=True)
class MXConfig:
    block_m: int
    block_n: int
    stages: int
    num_warps: int
    max_splits: int = 16
    kernel: int = 1
    bf16_sets: int = 2        # v3: sets of BF16 K-block buffers (2: the next slot upcasts while one multiplies)
    scale_slots: int = 0      # v2: slots of scale words staged in shared memory up front (0: loaded per slot)
    x_regs: int = 0           # v2 / v4, MXFP4: 1 feeds X to the wgmma from registers (v4: in folded slots; X_REGS)
    pdl: bool = False         # v2 / v4: programmatic dependent launch (config.mx_pdl; kernels_v2, PDL)
    prefetch_x: bool = False  # v2 with pdl: X (constant weight rows) streamed in before the wait (PREFETCH_X)
    fold_y: int = 0           # v2, MXFP4, staged: 1 folds Y's block scales into its unpacked values (FOLD_Y)
    expanded_y: int = 0       # v2 fold_y with x_regs: 1 reads Y already expanded to FP8 (Y_EXPANDED; launch.py)

    @property
    def name(self) -> str:
        prefix = "mx" if self.kernel == 1 else f"mx{self.kernel}_"
        sets = f"_b{self.bf16_sets}" if self.kernel == 3 and self.bf16_sets != 2 else ""
        staged = f"_ss{self.scale_slots}" if self.scale_slots else ""
        regs = "_xr" if self.x_regs else ""
        pdl = ("_pdlpf" if self.prefetch_x else "_pdl") if self.pdl else ""
        fold = ("_ey" if self.expanded_y else "_fy") if self.fold_y else ""
        return (f"{prefix}{self.block_m}x{self.block_n}_s{self.stages}_w{self.num_warps}_k{self.max_splits}"
                f"{sets}{staged}{regs}{fold}{pdl}")

    @property
    def block_k(self) -> int:
        """K elements one ring slot holds."""
        return SCALE_BLOCK if self.kernel == 1 else V2_BLOCK_K

    def row_bytes(self, fmt: str) -> int:
        """Bytes one X row brings per slot (the TMA box width)."""
        return self.block_k if fmt == "mxfp8" else self.block_k // 2

    def y_row_bytes(self, fmt: str) -> int:
        """Bytes one Y row brings per slot: X's, or an FP8 byte a K element when Y comes expanded."""
        return self.block_k if self.expanded_y else self.row_bytes(fmt)

    def item_bytes(self, fmt: str) -> int:
        return self.block_m * self.row_bytes(fmt) + self.block_n * self.y_row_bytes(fmt)

    def smem_bytes(self, fmt: str) -> int:
        if self.kernel == 3:    # bf16_sets sets of four BF16 K-block buffers (kernels_v3.py)
            return (self.stages * self.item_bytes(fmt) + V3_BF16_BYTES * self.bf16_sets * (self.block_m + self.block_n)
                    + SMEM_RESERVE)
        buffers = 2 if self.kernel == 2 else 1     # v2 unpacks the next slot while one multiplies
        x_rows = 0 if self.kernel == 2 and self.x_regs else self.block_m    # v2 X_REGS: X never unpacked to smem
        y_rows = 0 if self.expanded_y else self.block_n                   # expanded Y: read from the ring
        unpacked = buffers * (x_rows + y_rows) * self.block_k if fmt == "mxfp4" else 0
        staged = self.scale_slots * (self.block_m + self.block_n) * 4     # int32 scale words
        return self.stages * self.item_bytes(fmt) + unpacked + staged + SMEM_RESERVE

    def min_splits(self, k: int) -> int:
        """The fewest K-splits this build runs K in: staged builds hold at most scale_slots slots of
        scales a program (kernels_v2, "staged scales")."""
        if not self.scale_slots:
            return 1
        return -(-(-(-k // self.block_k)) // self.scale_slots)

    def acc_values(self) -> int:
        """FP32 accumulator values a thread holds."""
        return self.block_m * self.block_n // (32 * self.num_warps)


# Tile widths each kernel builds (None: every kernel not listed). v3 also takes 128 columns, over two
# warpgroups (``v3_wide_configs``); the others keep 8-64, their partial or unpacked Y beside the accumulator.
BLOCK_NS = {None: (8, 16, 32, 64), 3: (8, 16, 32, 64, 128)}


def static_reason(cfg: MXConfig, fmt: str) -> str | None:
    if cfg.kernel not in (1, 2, 3, 4):
        return "kernel must be 1, 2, 3 or 4"
    if cfg.fold_y not in (0, 1):
        return "fold_y must be 0 or 1 (1: Y's scales folded into its unpack)"
    if cfg.fold_y and (cfg.kernel != 2 or fmt != "mxfp4" or not cfg.scale_slots
                       or cfg.block_n < 8 * cfg.num_warps):
        return ("fold_y is an MXFP4 build of kernel 2 with staged scales and at least 8 Y rows a warp "
                "(one K-block of one row a thread in Y's unpack)")
    if cfg.expanded_y not in (0, 1):
        return "expanded_y must be 0 or 1 (1: Y read already expanded to FP8)"
    if cfg.expanded_y and not can_read_expanded(cfg):
        return "expanded_y is a fold_y build with x_regs (Y expanded, X unpacked in registers)"
    if cfg.kernel == 4 and (fmt != "mxfp4" or cfg.num_warps != 4 or not cfg.scale_slots):
        return "kernel 4 folds scales into unpacked FP4: MXFP4, 4 warps and staged scales only"
    if cfg.x_regs and (cfg.kernel not in (2, 4) or fmt != "mxfp4" or cfg.num_warps != 4 or not cfg.scale_slots):
        return "x_regs is an MXFP4 build of kernel 2 or 4 with one warpgroup and staged scales"
    if cfg.pdl and cfg.kernel not in (2, 4):
        return "pdl is a kernel 2 or 4 build (programmatic dependent launch)"
    if cfg.prefetch_x and (cfg.kernel != 2 or not cfg.pdl):
        return "prefetch_x is a kernel 2 build with pdl (X streamed in before the wait for the kernel ahead)"
    if cfg.x_regs not in (0, 1):
        return "x_regs must be 0 or 1 (1: X from registers)"
    if cfg.block_m not in (64, 128):
        return "block_m must be 64 or 128 (wgmma M is 64 per warpgroup)"
    if cfg.block_n not in BLOCK_NS.get(cfg.kernel, BLOCK_NS[None]):
        return "block_n must be a power of two in 8..64 (v3: 8..128)"
    if cfg.num_warps not in (4, 8):
        return "num_warps must be 4 or 8"
    if cfg.num_warps == 8 and cfg.block_m == 64 and cfg.block_n < 16:
        return "two warpgroups on 64 rows split N: block_n must be at least 16"
    if cfg.acc_values() > (V3_ACC_REGS_LIMIT if cfg.kernel == 3 else ACC_REGS_LIMIT):
        return "accumulator and partial would not fit in registers"
    if cfg.stages < 2:
        return "at least 2 stages"
    if cfg.kernel == 3 and cfg.bf16_sets not in (1, 2):
        return "bf16_sets must be 1 or 2"
    if cfg.scale_slots and (cfg.kernel not in (2, 4) or cfg.scale_slots not in STAGED_SLOTS):
        return f"scale_slots must be 0, or one of {STAGED_SLOTS} with kernel 2 or 4"
    if cfg.smem_bytes(fmt) > SMEM_LIMIT:
        return f"needs {cfg.smem_bytes(fmt)} bytes of shared memory"
    if not 1 <= cfg.max_splits <= 32:
        return "max_splits must be 1..32"
    return None


def resident(cfg: MXConfig, fmt: str) -> int:
    """Programs of ``cfg`` one SM runs at once, as shared memory and registers allow."""
    regs = REGS_PER_THREAD
    if cfg.kernel in (2, 4):
        regs = V2_REGS_SKINNY if cfg.acc_values() <= 8 else V2_STAGED_REGS if cfg.scale_slots else V2_REGS_PER_THREAD
    elif cfg.kernel == 3:
        regs = V3_REGS_PER_THREAD
    return programs_per_sm(cfg.smem_bytes(fmt), cfg.num_warps, regs)


def small_slot(small: int) -> int:
    """wgmma N for the small side: the next power of two, 8..64 (wider sides take several tiles)."""
    return min(64, max(8, 1 << max(0, small - 1).bit_length()))


def _stages(block_m: int, block_n: int, fmt: str) -> int:
    per_row = SCALE_BLOCK if fmt == "mxfp8" else SCALE_BLOCK // 2
    return max(2, min(32, RING_TARGET // ((block_m + block_n) * per_row)))


def _v2_stages(block_m: int, block_n: int, fmt: str) -> int:
    item = MXConfig(block_m, block_n, 2, 4, kernel=2).item_bytes(fmt)
    return max(2, min(V2_MAX_STAGES, V2_RING_TARGET[fmt] // item))


def v2_configs(rows: int, cols: int, k: int, fmt: str) -> list[MXConfig]:
    """v2 builds for a rows x cols problem: 128 rows (two warpgroups when block_n is 64, which
    keeps 3 x 32 FP32 values a thread) and 64 rows over one warpgroup (twice the programs)."""
    block_n = small_slot(cols)
    out = []
    for block_m, num_warps in ((128, 8 if block_n >= 64 else 4), (64, 4)):
        out.append(MXConfig(block_m, block_n, _v2_stages(block_m, block_n, fmt), num_warps, kernel=2))
    return out


def v2_staged_configs(rows: int, cols: int, k: int, fmt: str) -> list[MXConfig]:
    """``v2_configs`` with staged scales and at most V2_STAGED_STAGES ring slots, at <= 64 columns. The
    probe at 51e6b28 (BENCHMARKS.md session 23) timed 4 slots within noise of the best depth on every
    decode shape, and the deeper default rings of the 64-row builds up to 1.2x slower (MXFP8 32 x 4096 x
    14336: 33.3 us at 8 slots, 28.5 at 4)."""
    if cols > 64:
        return []
    out = [replace(c, scale_slots=V2_STAGED_SLOTS, stages=min(c.stages, V2_STAGED_STAGES))
           for c in v2_configs(rows, cols, k, fmt)]
    return [c for c in out if static_reason(c, fmt) is None]


def v2_regs_configs(rows: int, cols: int, k: int, fmt: str) -> list[MXConfig]:
    """``v2_staged_configs`` for MXFP4 with X fed to the wgmma from registers (kernels_v2, X_REGS): no
    unpacked X tile in shared memory, one warpgroup. ``pick`` runs them up to V4_MIN_COLS tokens."""
    if fmt != "mxfp4":
        return []
    out = [replace(c, x_regs=1) for c in v2_staged_configs(rows, cols, k, fmt)]
    return [c for c in out if static_reason(c, fmt) is None]


def v2_fold_configs(rows: int, cols: int, k: int, fmt: str) -> list[MXConfig]:
    """``v2_regs_configs`` that also fold Y's block scales into its unpacked values (kernels_v2, FOLD_Y):
    tiles of at least 32 tokens over one warpgroup. ``pick`` runs them at 32 tokens."""
    out = [replace(c, fold_y=1) for c in v2_regs_configs(rows, cols, k, fmt)]
    return [c for c in out if static_reason(c, fmt) is None]


def v2_expanded_configs(rows: int, cols: int, k: int, fmt: str) -> list[MXConfig]:
    """``v2_fold_configs`` that read Y already expanded (kernels_v2, Y_EXPANDED): what the launcher runs in
    place of a folded pick when the activation's quantization offers its expanded copy (tilefly.mx.expanded)."""
    out = [replace(c, expanded_y=1) for c in v2_fold_configs(rows, cols, k, fmt)]
    return [c for c in out if static_reason(c, fmt) is None]


def v4_configs(rows: int, cols: int, k: int, fmt: str) -> list[MXConfig]:
    """v4 builds (kernels_v4: MXFP4 scales folded into the unpacked operands) at <= 64 columns: the
    staged v2 builds' tiles with one unpacked buffer. Offered at any decode width; ``pick`` runs them
    (with X from registers) above V4_MIN_COLS tokens (decode probe at fc505eb, BENCHMARKS.md session 33)."""
    if fmt != "mxfp4" or cols > 64:
        return []
    out = [replace(c, kernel=4) for c in v2_staged_configs(rows, cols, k, fmt)]
    return [c for c in out if static_reason(c, fmt) is None]


def v4_regs_configs(rows: int, cols: int, k: int, fmt: str) -> list[MXConfig]:
    """``v4_configs`` with X fed to the wgmma from registers in folded slots (kernels_v4, X_REGS), what
    ``pick`` runs above V4_MIN_COLS tokens. Decode probe at d3f67b9 (BENCHMARKS.md session 28), us, v4 /
    v4 X from registers at other rings of the pick's tile: 32 x 14336 x 4096 (128 x 32) 34.3 / 32.3,
    34.2 / 32.5, 34.4 / 33.2 at 2, 3, 6 slots, 32 x 4096 x 14336 34.7 / 32.7, 34.1 / 33.1, 34.0 / 32.6;
    32 x 4096 x 4096 (64 x 32) 16.7 / 17.6, 17.5 / 17.1, 22.3 / 17.1; 64 x 4096 x 4096 (64 x 64)
    22.9 / 22.7 at 2, 22.8 / 21.6 at 3, 22.3 / 22.8 at 6. The build that also
    unpacked the next slot during the wgmma (X_REGS 2, a second Y buffer) took 1.2-1.9x as long on every
    shape there and was removed."""
    out = [replace(c, x_regs=1) for c in v4_configs(rows, cols, k, fmt)]
    return [c for c in out if static_reason(c, fmt) is None]


def v3_configs(rows: int, cols: int, k: int, fmt: str) -> list[MXConfig]:
    """The v3 build (kernels_v3: operands upcast to BF16 in the CTA) for 33-64 columns: 64 rows over
    one warpgroup, a two-slot ring. H200 decode probe (BENCHMARKS.md, session 21): at 64 tokens it took
    23.8 / 25.1 us (MXFP8 / MXFP4, 4096 x 4096) against v2's best 28.6 / 32.9. At 32 tokens it was
    1.9 us faster to 3.1 us slower than v2 depending on the shape, at 16 tokens (x 4096 x 14336) 6-7 us
    slower and at 8 tokens 2.3-2.7 us slower, so it is not built there."""
    if not 32 < cols <= 64:
        return []
    cfg = MXConfig(64, small_slot(cols), 2, 4, kernel=3)
    return [cfg] if static_reason(cfg, fmt) is None else []


# v3 tiles wider than a decode slot, for both sides of the product past 64 (the BF16 route's shapes):
# (block_m, block_n, stages, warps, BF16 buffer sets). 128 x 128 over two warpgroups holds 64 accumulator
# values a thread (128-155 registers, sm_90a); the two-stage one-set builds fit two programs an SM.
# Not offered: scripts/mx_wide_probe.py times them (BENCHMARKS.md, session 47). On the suite's shapes with
# both sides past 64 the fastest ran at 0.36-0.61x of BF16 ``mm``'s speed (at most 303 TFLOP/s), level with
# the BF16 route at 128 tokens and slower from 256 up.
V3_WIDE = ((128, 128, 2, 8, 2), (128, 128, 3, 8, 1), (128, 128, 4, 8, 1), (128, 64, 3, 4, 2), (128, 64, 2, 4, 1),
           (64, 128, 3, 4, 2), (64, 128, 2, 4, 1))


def v3_wide_configs(rows: int, cols: int, k: int, fmt: str) -> list[MXConfig]:
    """v3 builds on tiles of up to 128 x 128 for more than 64 columns."""
    if cols <= 64:
        return []
    out = [MXConfig(bm, bn, st, w, kernel=3, bf16_sets=sets) for bm, bn, st, w, sets in V3_WIDE]
    return [c for c in out if static_reason(c, fmt) is None]


def v1_pick(rows: int, cols: int, k: int, fmt: str) -> MXConfig:
    """The first version's config for a rows x cols x k problem (rows >= cols): 128 rows."""
    block_n = small_slot(cols)
    num_warps = 8 if block_n >= 64 else 4
    return MXConfig(128, block_n, _stages(128, block_n, fmt), num_warps)


def staged_rows(rows: int, cols: int, k: int, fmt: str) -> int:
    """Tile rows of the staged v2 build the eager path runs at <= 32 tokens: 64 (twice the programs,
    each on half the rows) below 8192 weight rows, except for MXFP4 at K > 4096 or <= 8 tokens, 128
    otherwise. Decode probe at 51e6b28 (BENCHMARKS.md session 23), us over ring depths, 64 / 128 rows:
    MXFP8 32 x 4096 x 4096 14.5-15.1 / 17.9-18.9, 32 x 4096 x 14336 27.3-33.3 / 29.1-29.9, 32 x 14336 x
    4096 25.9-31.5 / 24.6-25.7, 8 x 4096 x 4096 11.4-12.7 / 11.8-13.1; MXFP4 32 x 4096 x 4096 17.6-18.6 /
    19.9-20.8, 32 x 4096 x 14336 41.2-47.2 / 37.0-38.0, 8 x 4096 x 4096 15.7-16.2 / 14.4-16.4. The folded MXFP4
    builds (17-32 tokens) at K <= 4096 take 64 rows beyond 16384 rows too: decode probe at 19a30c2
    (BENCHMARKS.md session 41), 64 / 128 rows, 32 x 28672 x 4096 45.1 / 46.4-46.8 us, but 32 x 14336 x 4096
    29.0 / 26.4."""
    if fmt == "mxfp4" and 16 < cols <= 32 and k <= 4096 and rows > 16384:
        return 64
    if rows >= 8192 or (fmt == "mxfp4" and (k > 4096 or cols <= 8)):
        return 128
    return 64


# MXFP4 decode runs v4 above this many tokens and v2 with X from registers up to it. Decode probe at
# fc505eb (BENCHMARKS.md session 33), us, the pick's tile at the launcher's split, staged v2 / v2 X from
# registers / v4 X from registers: 8 x 6144 x 4096 14.8 / 14.1 / 18.4, 8 x 28672 x 4096 39.3 / 32.6 / 51.0,
# 8 x 4096 x 4096 13.6 / 13.1 / 15.9, 8 x 4096 x 14336 21.7 / 20.7 / 31.6, 32 x 6144 x 4096 22.2 / 21.5 /
# 23.8, 32 x 4096 x 14336 31.4 / 30.6 / 32.4. Above 32 tokens only v4 was timed against staged v2 (probe
# at 93fa9af, session 24: 64 x 4096 x 4096 23.5 / 22.3).
V4_MIN_COLS = 32


def pick(rows: int, cols: int, k: int, fmt: str) -> MXConfig:
    """The config the eager path runs (rows >= cols): v2 with staged scales at <= 64 tokens
    (``staged_rows`` up to 32, 64 rows above), v2's 64-row build beyond. Staging and its plain decode
    (decode probes at 93538b4 and 51e6b28, mxfp_gemm suite at 66b0808; BENCHMARKS.md session 23) took
    MXFP8 32 x 14336 x 4096 from 40.3 to 24.6 us and MXFP4 from 50.7 to 36.7; at 64 tokens the suite's
    race (66b0808 and b76a2b2) chose the staged 64-row build over v3 for both formats.
    v3 (whose BF16 upcast shares the BF16 route's exactness limit) stays offered to the race only, so
    every pick is exact. v1 took 1.2-6x v2's time on every decode shape (session 18). MXFP4 feeds X from
    registers on the same tile: v2's build up to V4_MIN_COLS tokens, v4's above (exact too: slots that
    do not fold take v2's path). Decode probe at d3f67b9 (BENCHMARKS.md session 28), us, v4 / v4 X from
    registers on the pick's tile and ring: 64 x 4096 x 4096 22.0 / 21.6. MXFP4 tiles of 32 tokens also fold
    Y's block scales into its unpack (``v2_fold_configs``, exact): decode probe at f19bbd3 against 45bcc37
    (BENCHMARKS.md session 40), us, 32 x 28672 x 4096 52.2 -> 47.0, 32 x 4096 x 14336 30.1 -> 27.1,
    32 x 6144 x 4096 18.3 -> 16.9, 32 x 4096 x 4096 16.2 -> 14.9."""
    staged = v2_staged_configs(rows, cols, k, fmt)
    if len(staged) == 2:
        wide, narrow = staged
        chosen = wide if cols <= 32 and staged_rows(rows, cols, k, fmt) == 128 else narrow
        if fmt == "mxfp4":
            faster = replace(chosen, kernel=4) if cols > V4_MIN_COLS else chosen
            faster = replace(faster, x_regs=1)
            if static_reason(replace(faster, fold_y=1), fmt) is None:
                faster = replace(faster, fold_y=1)
            if static_reason(faster, fmt) is None:
                return faster
        return chosen
    v2_wide, v2_narrow = v2_configs(rows, cols, k, fmt)
    chosen = v2_narrow if cols > 64 else v2_wide
    return chosen if static_reason(chosen, fmt) is None else v1_pick(rows, cols, k, fmt)


def can_read_expanded(cfg: MXConfig) -> bool:
    """Whether ``cfg`` has an expanded-Y build (Y_EXPANDED): the folded build taking X from registers."""
    return bool(cfg.fold_y and cfg.x_regs)


def reads_expanded(tokens: int, weight_rows: int, k: int) -> bool:
    """Whether an MXFP4 call of ``tokens`` activation rows on ``weight_rows`` weight rows runs a build that reads
    the activation expanded when offered (launch.py: the pick can, activations in the Y slot). The post-grad pass
    asks it before making the fused quantization write the copy."""
    return 0 < tokens < weight_rows and can_read_expanded(pick(weight_rows, tokens, k, "mxfp4"))


def offered(rows: int, cols: int, k: int, fmt: str) -> list[MXConfig]:
    """Configs the benchmark races on this shape: v1's 128-row config and a 64-row variant (twice
    the programs, for shapes with few row tiles), then the v2 builds (``v2_configs``) and, at 33-64
    columns, v3 (``v3_configs``); MXFP4 at <= 64 columns, v2 with X from registers (``v2_regs_configs``) and v4
    (``v4_configs``, ``v4_regs_configs``)."""
    first = v1_pick(rows, cols, k, fmt)
    alt = MXConfig(64, first.block_n, _stages(64, first.block_n, fmt), 4)
    return [c for c in (first, alt, *v2_configs(rows, cols, k, fmt), *v2_staged_configs(rows, cols, k, fmt),
                        *v2_regs_configs(rows, cols, k, fmt), *v2_fold_configs(rows, cols, k, fmt),
                        *v3_configs(rows, cols, k, fmt),
                        *v4_configs(rows, cols, k, fmt),
                        *v4_regs_configs(rows, cols, k, fmt))
            if static_reason(c, fmt) is None]


# ---- compile specs: every shipped config, compiled for sm_90a in CI ---------------------------

def kernel_signature(cfg: MXConfig, fmt: str, x_swizzled: bool, y_swizzled: bool, bias: int, out: str = "bf16",
                     rows_contiguous: bool = True, words: bool = True) -> tuple[dict[str, str], dict[str, object]]:
    """Triton signature strings and constexprs for one variant, as the launcher specializes it
    (``words``: v2 reads both operands' scales as 32-bit words, see kernels_v2)."""
    from triton.experimental.gluon import language as gl

    elem, ty = (gl.float8e4nv, "fp8e4nv") if fmt == "mxfp8" else (gl.uint8, "u8")
    width = cfg.row_bytes(fmt)

    def desc(rows: int, width: int = width, elem=elem, ty: str = ty) -> str:
        layout = gl.NVMMASharedLayout.get_default_for([rows, width], elem)
        return f"tensordesc<{ty}[{rows}, {width}],{layout!r}>"

    y_desc = desc(cfg.block_n, cfg.y_row_bytes(fmt), gl.float8e4nv, "fp8e4nv") if cfg.expanded_y else desc(cfg.block_n)
    sig = {"x_desc": desc(cfg.block_m), "y_desc": y_desc, "sx_ptr": "*u8", "sy_ptr": "*u8",
           "c_ptr": f"*{out}", "bias_ptr": f"*{out}", "ws_ptr": "*fp32", "ticket_ptr": "*i32",
           "M": "i32", "N": "i32", "K": "i32", "stride_sxr": "i32", "stride_sxc": "i32", "stride_syr": "i32",
           "stride_syc": "i32", "stride_cm": "i32", "stride_cn": "i32", "stride_bias": "i32",
           "iters_per_split" if cfg.kernel == 1 else "slots_per_split": "i32"}
    constexprs = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, FP4=fmt == "mxfp4", X_SWIZZLED=x_swizzled,
                      Y_SWIZZLED=y_swizzled)
    if cfg.kernel in (2, 3, 4):
        constexprs.update(X_WORDS=words, Y_WORDS=words)
    if cfg.kernel == 3:
        constexprs.update(SETS=cfg.bf16_sets)
    constexprs.update(BIAS=bias, C_ROWS_CONTIGUOUS=rows_contiguous, STAGES=cfg.stages)
    constexprs.update(build_constexprs(cfg))
    sig.update({name: "constexpr" for name in constexprs})
    return sig, constexprs


def build_constexprs(cfg: MXConfig) -> dict:
    """The build flags of ``cfg``'s kernel and its warps: the last constexprs of every launch and compile
    spec (launch.py and ``compile_spec`` both end their lists with these)."""
    flags = {}
    if cfg.kernel in (2, 4):
        flags.update(SCALE_SLOTS=cfg.scale_slots, X_REGS=cfg.x_regs, PDL=cfg.pdl)
    if cfg.kernel == 2:
        flags.update(PREFETCH_X=cfg.prefetch_x, FOLD_Y=cfg.fold_y, Y_EXPANDED=cfg.expanded_y)
    flags.update(num_warps=cfg.num_warps)
    return flags


def kernel_of(cfg: MXConfig):
    """The Gluon kernel that runs ``cfg`` (imports the kernel module)."""
    if cfg.kernel == 2:
        from tilefly.ops.mx_gemm import kernels_v2

        return kernels_v2.mx_gemm_v2_kernel
    if cfg.kernel == 3:
        from tilefly.ops.mx_gemm import kernels_v3

        return kernels_v3.mx_gemm_v3_kernel
    if cfg.kernel == 4:
        from tilefly.ops.mx_gemm import kernels_v4

        return kernels_v4.mx_gemm_v4_kernel
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


def _spec_name(cfg, fmt, xs, ys, bias, out, rows, words) -> str:
    tail = "" if cfg.kernel == 1 else f",words={int(words)}"
    return f"mx_gemm.{cfg.name}[{fmt},swz={int(xs)}{int(ys)},bias={bias},{out},rowsC={int(rows)}{tail}]"


def compile_specs():
    """Every shipped (format, config) with the benchmark's variant (unswizzled scales, no bias,
    BF16 out, the skinny swap's column-contiguous output), plus swizzled scales, bias and FP16
    on one config per format and kernel, v2's byte-wise scale loads, every v4 build ``pick`` runs, and
    each format's 32-token decode pick with programmatic dependent launch (``pdl``), also streaming its
    weight rows in before the wait (``prefetch_x``)."""
    variants = [(fmt, cfg, False, False, 0, "bf16", True, True) for fmt, cfg in shipped()]
    for fmt in FORMATS:
        cfg = v1_pick(4096, 16, 4096, fmt)
        variants.append((fmt, cfg, True, True, 1, "fp16", False, True))
        variants.append((fmt, cfg, True, False, 2, "bf16", True, True))
        cfg2 = v2_configs(4096, 16, 4096, fmt)[0]
        variants.append((fmt, cfg2, True, True, 1, "fp16", False, True))
        variants.append((fmt, cfg2, False, True, 2, "bf16", True, False))
        cfg2s = v2_staged_configs(4096, 16, 4096, fmt)[0]
        variants.append((fmt, cfg2s, True, True, 1, "fp16", False, True))
        variants.append((fmt, cfg2s, False, True, 2, "bf16", True, False))
        for cfg4 in v4_configs(4096, 32, 4096, fmt) + v4_regs_configs(4096, 32, 4096, fmt):
            variants.append((fmt, cfg4, True, True, 1, "fp16", False, False))   # shipped() has the plain build
        for shape in ((4096, 8, 4096), (4096, 16, 4096), (4096, 32, 4096), (4096, 64, 4096)):
            for cfg2r in v2_regs_configs(*shape, fmt) + v2_fold_configs(*shape, fmt) + v2_expanded_configs(*shape, fmt):
                for variant in ((fmt, cfg2r, False, False, 0, "bf16", True, True),
                                (fmt, cfg2r, True, True, 1, "fp16", False, False)):
                    if variant not in variants:
                        variants.append(variant)
        for shape in ((4096, 16, 4096), (4096, 16, 14336), (4096, 64, 4096)):   # v4 picks beyond SHIPPED_SHAPES
            cfg4 = pick(*shape, fmt)
            if cfg4.kernel == 4:
                variants.append((fmt, cfg4, False, False, 0, "bf16", True, True))
        variants.append((fmt, replace(pick(4096, 32, 4096, fmt), pdl=True), False, False, 0, "bf16", True, True))
        decode = pick(14336, 32, 4096, fmt)
        if decode.kernel == 2:
            variants.append((fmt, replace(decode, pdl=True, prefetch_x=True), False, False, 0, "bf16", True, True))
            if decode.fold_y:   # what a compiled MXFP4 decode step runs (tilefly.mx.expanded)
                variants.append((fmt, replace(decode, pdl=True, prefetch_x=True, expanded_y=1), False, False, 0,
                                 "bf16", True, True))
        for cfg3 in v3_configs(4096, 64, 4096, fmt):   # 33-64 tokens, not among SHIPPED_SHAPES
            variants.append((fmt, cfg3, False, False, 0, "bf16", True, True))
            variants.append((fmt, cfg3, True, True, 1, "fp16", False, False))
    return ([compile_spec(*variant) for variant in variants] + requant_specs() + upcast_specs() + quantize_specs()
            + norm_quantize_specs() + silu_quantize_specs())


def compile_spec(fmt: str, cfg: MXConfig, xs: bool = False, ys: bool = False, bias: int = 0, out: str = "bf16",
                 rows: bool = True, words: bool = True):
    """The KernelSpec of ``cfg``'s build for one variant (defaults: the benchmark's, as ``compile_specs``)."""
    from tilefly.compile_check import KernelSpec

    sig, constexprs = kernel_signature(cfg, fmt, xs, ys, bias, out, rows, words)
    return KernelSpec(name=_spec_name(cfg, fmt, xs, ys, bias, out, rows, words),
                      kernel=functools.partial(kernel_of, cfg), signature=sig, constexprs=constexprs,
                      num_warps=cfg.num_warps, gluon=True, sass_must_contain=sass_markers(cfg))


def requant_specs():
    """The requantization kernel (kernels_requant.py) for both formats at K = 4096 and 16384; stores
    must be 16-byte vectors (requant.CHUNK elements over 4 warps)."""
    from tilefly.compile_check import KernelSpec
    from tilefly.ops.mx_gemm import requant

    sig = {"q_ptr": "*u8", "s_ptr": "*u8", "out_ptr": "*u8", "row_scale_ptr": "*fp32", "K": "i32",
           "stride_q": "i32", "stride_s": "i32", "stride_out": "i32", "FP4": "constexpr", "BLOCK_KB": "constexpr",
           "CHUNK": "constexpr"}
    aligned = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 4, 5, 6, 7)}  # pointers, K and strides
    specs = []
    for fmt in FORMATS:
        for k in (4096, 16384):
            constexprs = dict(FP4=fmt == "mxfp4", BLOCK_KB=k // SCALE_BLOCK, CHUNK=requant.CHUNK)
            specs.append(KernelSpec(f"mx_gemm.requant[{fmt},K={k}]", _requant_kernel, sig, constexprs,
                                    attrs=aligned, num_warps=4, sass_must_contain=("F2FP.SATFINITE.E4M3", "STG.E.128")))
    return specs


def quantize_specs():
    """tilefly.mx's quantization kernel (tilefly/mx/kernels_quant.py): both formats from each input
    dtype, loads in 16-byte vectors and the data bytes stored 16 (E4M3) or 8 (E2M1 pairs) at a time;
    BF16 input with programmatic dependent launch (config.mx_pdl), waiting for the kernel ahead."""
    from tilefly.compile_check import KernelSpec
    from tilefly.mx import formats, quant

    specs = []
    for fmt in FORMATS:
        for dtype, pdl in (("bf16", False), ("fp16", False), ("fp32", False), ("bf16", True)):
            sig = {"x_ptr": f"*{dtype}", "data_ptr": "*u8", "scale_ptr": "*u8", "n_blocks": "i32",
                   "EMAX": "constexpr", "FP4": "constexpr", "BLOCKS": "constexpr", "PDL": "constexpr"}
            constexprs = dict(EMAX=formats.ELEMENTS[fmt].emax, FP4=fmt == "mxfp4", BLOCKS=quant.KERNEL_BLOCKS,
                              PDL=pdl)
            stores = ("LDG.E.128", "STG.E.64" if fmt == "mxfp4" else "STG.E.128")
            specs.append(KernelSpec(f"mx.quantize[{fmt},{dtype}{',pdl' if pdl else ''}]", _quantize_kernel, sig,
                                    constexprs, attrs={(i,): [["tt.divisibility", 16]] for i in (0, 1, 2)},
                                    num_warps=4, sass_must_contain=(*stores, "ACQBULK") if pdl else stores))
    return specs


def norm_quantize_specs():
    """tilefly.mx's fused add + RMSNorm + quantization kernel (tilefly/mx/kernels_norm_quant.py) for both
    formats at the row lengths of Llama-3.1-8B (4096), Qwen3-32B (5120) and the largest served (16384),
    with the launcher's warps, and MXFP4's build that writes the expanded copy too (tilefly.mx.expanded);
    the operands load in 16-byte vectors."""
    from tilefly.compile_check import KernelSpec
    from tilefly.mx import formats, norm_quant

    sig = {"a_ptr": "*i16", "b_ptr": "*i16", "w_ptr": "*i16", "h_ptr": "*i16", "data_ptr": "*u8",
           "scale_ptr": "*u8", "expanded_ptr": "*u8", "expanded_scale_ptr": "*u8", "K": "i32", "EPS": "constexpr",
           "EMAX": "constexpr", "FP4": "constexpr", "BLOCK_K": "constexpr", "TRIGGER": "constexpr",
           "EXPAND": "constexpr"}
    specs = []
    for fmt in FORMATS:
        expanded = [(k, True, True) for k in (4096, 5120, norm_quant.MAX_K)] if fmt == "mxfp4" else []
        for k, trigger, expand in [(4096, False, False), (5120, False, False), (norm_quant.MAX_K, False, False),
                                   (4096, True, False)] + expanded:
            block_k = norm_quant.block_k_of(k)
            constexprs = dict(EPS=1e-5, EMAX=formats.ELEMENTS[fmt].emax, FP4=fmt == "mxfp4", BLOCK_K=block_k,
                              TRIGGER=trigger, EXPAND=expand)
            name = f"mx.add_rms_norm_quantize[{fmt},K={k}{',trigger' if trigger else ''}{',expand' if expand else ''}]"
            specs.append(KernelSpec(name, _norm_quantize_kernel, sig, constexprs,
                                    attrs={(i,): [["tt.divisibility", 16]] for i in range(9)},
                                    num_warps=norm_quant.num_warps(block_k), sass_must_contain=("LDG.E.128",)))
    return specs


def silu_quantize_specs():
    """tilefly.mx's fused SiLU product + quantization kernel (tilefly/mx/kernels_silu_quant.py) for both
    formats, on rows strided as column slices of a packed gate/up output, and MXFP4's build that writes the
    expanded copy too (tilefly.mx.expanded); 16-byte loads."""
    from tilefly.compile_check import KernelSpec
    from tilefly.mx import formats, silu_quant

    sig = {"g_ptr": "*i16", "u_ptr": "*i16", "data_ptr": "*u8", "scale_ptr": "*u8", "expanded_ptr": "*u8",
           "expanded_scale_ptr": "*u8", "N": "i32", "stride_g": "i32", "stride_u": "i32", "EMAX": "constexpr",
           "FP4": "constexpr", "BLOCKS": "constexpr", "TRIGGER": "constexpr", "EXPAND": "constexpr"}
    builds = [(fmt, trigger, False) for fmt in FORMATS for trigger in (False, True)] + [("mxfp4", True, True)]
    return [KernelSpec(f"mx.silu_mul_quantize[{fmt}{',trigger' if trigger else ''}{',expand' if expand else ''}]",
                       _silu_quantize_kernel, sig,
                       dict(EMAX=formats.ELEMENTS[fmt].emax, FP4=fmt == "mxfp4", BLOCKS=silu_quant.CHUNK_BLOCKS,
                            TRIGGER=trigger, EXPAND=expand),
                       attrs={(i,): [["tt.divisibility", 16]] for i in range(9)}, num_warps=silu_quant.NUM_WARPS,
                       sass_must_contain=("LDG.E.128",)) for fmt, trigger, expand in builds]


def upcast_specs():
    """The BF16 route's kernels (kernels_upcast.py): the upcast of both operands for both formats and
    scale layouts at K = 4096 (one row a program) and K = 256 (16 rows a program); the rescale for
    each output dtype, in place (BF16) and from the FP32 product with a bias."""
    from tilefly.compile_check import KernelSpec
    from tilefly.ops.mx_gemm import upcast

    sig = {"qa_ptr": "*u8", "sa_ptr": "*u8", "qb_ptr": "*u8", "sb_ptr": "*u8", "out_ptr": "*bf16",
           "row_scale_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32", "stride_qa": "i32", "stride_sar": "i32",
           "stride_sac": "i32", "stride_qb": "i32", "stride_sbr": "i32", "stride_sbc": "i32", "stride_out": "i32",
           "FP4": "constexpr", "A_SWIZZLED": "constexpr", "B_SWIZZLED": "constexpr", "ROWS": "constexpr",
           "BLOCKS": "constexpr"}
    aligned = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 4, 5, 8, 9, 12, 15)}
    specs = []
    for fmt in FORMATS:
        for swizzled in (False, True):
            for k in (4096, 256):
                blocks = min(k // SCALE_BLOCK, upcast.CHUNK // SCALE_BLOCK)
                constexprs = dict(FP4=fmt == "mxfp4", A_SWIZZLED=swizzled, B_SWIZZLED=swizzled,
                                  ROWS=upcast.CHUNK // SCALE_BLOCK // blocks, BLOCKS=blocks)
                specs.append(KernelSpec(f"mx_gemm.upcast[{fmt},swz={int(swizzled)},K={k}]", _upcast_kernel, sig,
                                        constexprs, attrs=aligned, num_warps=4))
    block_m, block_n = upcast.RESCALE_TILE
    for c, out, bias, always in (("bf16", "bf16", 0, 0), ("fp32", "bf16", 1, 1), ("fp32", "fp16", 0, 1),
                                 ("fp32", "fp32", 1, 1)):
        sig = {"c_ptr": f"*{c}", "out_ptr": f"*{out}", "scale_a_ptr": "*fp32", "scale_b_ptr": "*fp32",
               "bias_ptr": f"*{out}", "M": "i32", "N": "i32", "stride_c": "i32", "stride_out": "i32",
               "stride_bias": "i32", "BIAS": "constexpr", "ALWAYS": "constexpr", "BLOCK_M": "constexpr",
               "BLOCK_N": "constexpr"}
        constexprs = dict(BIAS=bool(bias), ALWAYS=always, BLOCK_M=block_m, BLOCK_N=block_n)
        specs.append(KernelSpec(f"mx_gemm.rescale[{c}->{out},bias={bias},always={always}]", _rescale_kernel, sig,
                                constexprs, attrs={(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 7, 8)},
                                num_warps=8))
    return specs


def _silu_quantize_kernel():
    from tilefly.mx import kernels_silu_quant

    return kernels_silu_quant.silu_mul_mx_quantize_kernel


def _norm_quantize_kernel():
    from tilefly.mx import kernels_norm_quant

    return kernels_norm_quant.add_rms_norm_mx_quantize_kernel


def _quantize_kernel():
    from tilefly.mx import kernels_quant

    return kernels_quant.mx_quantize_kernel


def _upcast_kernel():
    from tilefly.ops.mx_gemm import kernels_upcast

    return kernels_upcast.mx_upcast_rows_kernel


def _rescale_kernel():
    from tilefly.ops.mx_gemm import kernels_upcast

    return kernels_upcast.mx_rescale_kernel


def _requant_kernel():
    from tilefly.ops.mx_gemm import kernels_requant

    return kernels_requant.mx_requant_rows_kernel


def interpreter_checks():
    from tilefly.ops.mx_gemm import checks

    return checks.interpreter_checks()


# v2's overlap exists only if ptxas kept the wgmmas async: a wait that leaves one group in
# flight. When ptxas serializes them (C7514: an in-flight accumulator read or copied) every
# wait becomes ``gsb0, 0x0`` and the kernel still computes the right result, only slowly.
V2_ASYNC_WAIT = "WARPGROUP.DEPBAR.LE gsb0, 0x1"


def sass_markers(cfg: MXConfig) -> tuple[str, ...]:
    if cfg.pdl:   # griddepcontrol.wait
        return (*sass_markers(replace(cfg, pdl=False)), "ACQBULK")
    if cfg.kernel == 4:   # FP8 wgmma; its block-by-block fallback keeps v2's overlap
        return ("QGMMA", V2_ASYNC_WAIT)
    if cfg.kernel == 3:   # BF16 wgmma fed by the exact E4M3 -> F16 conversion
        return ("HGMMA.64x", "F2FP.F16.E4M3.UNPACK_B")
    return ("QGMMA",) if cfg.kernel == 1 else ("QGMMA", V2_ASYNC_WAIT)

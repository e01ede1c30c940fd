"""Launch configurations of the RMSNorm kernels: the row layout and config picked per call,
the candidates ``sweep.py`` tries on the GPU, what CI compiles (``compile_specs``) and what it
runs in Triton's interpreter (``interpreter_checks``).

Tuned on an H200 (torch 2.11, triton 3.6): ``TUNED`` holds the full sweep's winners for every
row length of the rmsnorm suite; the rules in ``heuristic`` cover the rest and follow the same
sweeps (see the constants' comments).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from tilefly._interpreter import numpy_compat

ALIGNED, SPLIT, GENERIC = "aligned", "split", "generic"  # row layouts, see kernels.py

# -- heuristic constants, for rows TUNED does not list (H200 sweeps, see TUNED) ----------------
ONE_PASS_MAX_BLOCK = 16384   # longest row body kept in registers by rule; TUNED adds FP32 rows of 32768
                             # (1.25x / 1.55x over chunked) and 16-bit aligned rows of 65536 (one 16-warp
                             # tile in two pieces, 1.15x); 16-bit rows of 32768 unmeasured (the SPLIT tile
                             # spills there: scalar w loads need an address per element)
ROW_TILE_ELEMS = 4096        # short rows are packed until a program holds this many elements
MAX_ROWS = 128               # rows per program, cap
ELEMS_PER_THREAD = 16        # values per thread in a rows tile: 2 (16-bit) or 4 (FP32) 16-byte vectors
CHUNK_BYTES = 32768          # long rows: bytes of x per chunk; 32 KB at 16 warps won every aligned
CHUNK_WARPS = 16             #   long-row sweep (FP16 65536/114688, FP32 65536/114688)
CHUNK_STAGES = 3             # cp.async depth: 3 won 3 of those 4 (FP16 65536 took 1)
CHUNK_PROGRAMS_PER_SM = 2    # 2 won every chunked case, even rows of 448 KB
SPLIT_MIN_N = 64             # below this an unaligned row is a few scalars anyway: GENERIC
MAX_SEGMENTS = 16            # segments kernel: CTAs per row, at most (forward progress, kernels.py)
HINTS = ("cg", "evict_first", "cs")  # rows kernel: cache hints on x and y (Config.hint)


@dataclass(frozen=True)
class Config:
    kernel: str                # "rows" (row in registers), "chunked" (two passes) or "segments"
                               # (a row over several CTAs, each piece in registers; kernels.py)
    block: int                 # rows: BLOCK_N, power of two >= the row body; chunked: CHUNK; segments: SEG
    rows: int = 1              # rows kernel: rows per program (power of two)
    num_warps: int = 8
    stages: int = 1            # chunked, persistent rows: software-pipeline depth of their loops (1 = none)
    programs_per_sm: int = 1   # chunked, persistent rows: programs per SM
    split: bool = True         # allow the SPLIT layout for unaligned contiguous rows
    w_shift: bool = False      # SPLIT rows: read w from V shifted, aligned copies written per
                               # launch (16-byte w loads; kernels.py, W_SHIFT)
    row_edges: bool = False    # rows kernel, SPLIT rows: head/tail a row at a time (ROW_EDGES)
    w_realign: bool = False    # rows kernel, SPLIT rows: w from two aligned loads shifted in
                               # registers (W_REALIGN; needs a 16-byte-aligned w, else plain loads)
    pdl: bool = False          # rows kernel with w_shift: launched as a programmatic dependent of
                               # the copies' kernel, waiting for them only before reading w (W_PDL)
    reload: bool = False       # segments kernel: load the piece again after the row sync (RELOAD)
    x16: bool = False          # segments and rows kernels, 16-bit x: keep x as loaded across the
                               # row sync or reduction (X16, kernels.py)
    persistent: bool = False   # rows kernel: programs_per_sm programs an SM loop over the row
                               # tiles, the next tiles' loads pipelined `stages` deep through
                               # shared memory (PERSISTENT, kernels.py)
    same_phase: bool = False   # rows kernel, SPLIT rows, rows > 1: a program's rows are V apart,
                               # so they share their 16-byte phase and one w tile (SAME_PHASE)
    hint: str = ""             # rows kernel: cache hint on x's loads and y's stores ("cg",
                               # "evict_first", "cs"; HINT, kernels.py)
    pieces: int = 1            # rows kernel: the tile normalized and stored in 1, 2, 4 or 8 column
                               # pieces, each loading its w just before (PIECES, kernels.py)
    w_ahead: bool = False      # rows kernel: each piece's w loaded one piece early, the first with x
                               # (W_AHEAD, kernels.py)
    w_branch: bool = False     # rows kernel, w_realign, one row a tile or same_phase: a code path for
                               # each 16-byte phase, so w's shift is fixed (W_BRANCH, kernels.py)

    def __str__(self) -> str:
        if self.kernel == "rows":
            text = f"rows[BLOCK_N={self.block},ROWS={self.rows},w={self.num_warps}]"
        elif self.kernel == "segments":
            text = f"segments[SEG={self.block},w={self.num_warps}]"
        else:
            text = (f"chunked[CHUNK={self.block},w={self.num_warps},stages={self.stages},"
                    f"per_sm={self.programs_per_sm}]")
        if self.w_shift:
            text += "[w-shift]"
        if self.row_edges:
            text += "[row-edges]"
        if self.w_realign:
            text += "[w-realign]"
        if self.pdl:
            text += "[pdl]"
        if self.reload:
            text += "[reload]"
        if self.x16:
            text += "[x16]"
        if self.same_phase:
            text += "[same-phase]"
        if self.hint:
            text += f"[{self.hint}]"
        if self.pieces > 1:
            text += f"[pieces={self.pieces}]"
        if self.w_ahead:
            text += "[w-ahead]"
        if self.w_branch:
            text += "[w-branch]"
        if self.persistent:
            text += f"[persistent,stages={self.stages},per_sm={self.programs_per_sm}]"
        return text if self.split else text + "[no-split]"


def vec(element_size: int) -> int:
    """Elements in one 16-byte access."""
    return 16 // element_size


def row_layout(N: int, stride: int, x_aligned: bool, element_size: int, split: bool = True) -> str:
    """ALIGNED, SPLIT or GENERIC for rows of N elements ``stride`` apart (see kernels.py)."""
    v = vec(element_size)
    if x_aligned and N % v == 0 and stride % v == 0:
        return ALIGNED
    if split and x_aligned and stride == N and N >= SPLIT_MIN_N:
        return SPLIT
    return GENERIC


def max_body(N: int, element_size: int, layout: str) -> int:
    """Longest stretch of a row one vectorized tile must hold (SPLIT: the aligned body)."""
    return N // vec(element_size) * vec(element_size) if layout == SPLIT else N


def segments(config: Config, N: int, element_size: int, layout: str) -> int:
    """CTAs per row of the segments kernel: pieces of SEG elements covering the row body."""
    return -(-max(max_body(N, element_size, layout), 1) // config.block)


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def row_block(N: int, element_size: int, layout: str) -> int:
    """The power-of-two row body: TUNED's key beside element size and layout."""
    return _pow2(max(max_body(N, element_size, layout), 1))


# Sweep winners on the H200 (sweep.py, full candidate sweeps of the rmsnorm suite, L2 flushed),
# (element size, layout, power-of-two row body) -> Config. The comment is the case it won and
# its time; "=" marks a tie with the heuristic within the sweep's +-2% noise. FP16 and BF16 share
# entries; where their sweeps disagreed (only (2, aligned, 4096): 37.9 vs 37.8 us, noise) the
# pick keeps 16 values per thread, the per-thread load the LLM-shape sweep validated. Entries in
# pieces (and FP16 rows of 65536 as one rows tile) won `sweep.py --new` over every rows pick of the
# suite at 0ccd669 (pieces_candidates; gains under ~1 % left out), those with w_ahead at c320772, those with
# w_branch at 5ef87a2.
TUNED: dict[tuple[int, str, int], Config] = {
    (2, ALIGNED, 4096): Config("rows", 4096, 2, 16),                 # bf16 8192x4096    37.8 us
    (2, ALIGNED, 8192): Config("rows", 8192, 2, 16, x16=True, pieces=2),  # fp16 4096x8192 34.6 (36.1 before
                                                                     # pieces: rows[8192,2,w=8])
    (2, ALIGNED, 16384): Config("rows", 16384, 1, 8, pieces=4),      # fp16 2048x16384 35.2, bf16 34.4 (36.4 /
                                                                     # 35.6 in one piece)
    (2, ALIGNED, 65536): Config("rows", 65536, 1, 16, x16=True, hint="cs", pieces=2),  # fp16 2048x65536
                                                                     # 140.0 (chunked 161.1)
    (2, ALIGNED, 131072): Config("segments", 16384, 1, 4, x16=True), # fp16 2048x114688 267.0 (chunked 300.6)
    (2, SPLIT, 4096): Config("rows", 4096, 1, 4, row_edges=True, w_realign=True, x16=True, pieces=2,
                             w_branch=True),                         # fp16 8192x4097 34.6, bf16 34.8 (w
                                                                     # unaligned 36.3 / 36.5)
    (2, SPLIT, 8192): Config("rows", 8192, 1, 4, row_edges=True, w_realign=True, w_branch=True),  # fp16
                                                                     # 4096x8193 36.4 (copies, pdl 37.2)
    (2, SPLIT, 16384): Config("rows", 16384, 1, 16, row_edges=True, w_realign=True, pieces=4, w_branch=True),
                                                                     # fp16 2048x16385 37.1, bf16 37.2 (8
                                                                     # warps, 8 pieces, w ahead 38.0 / 37.8)
    (4, ALIGNED, 4096): Config("rows", 4096, 2, 4),                  # fp32 8192x4096    70.3 =
    (4, ALIGNED, 8192): Config("rows", 8192, 2, 32),                 # fp32 4096x8192    71.0 =
    (4, ALIGNED, 16384): Config("rows", 16384, 2, 16),               # fp32 2048x16384   72.6 =
    (4, ALIGNED, 32768): Config("rows", 32768, 1, 32, hint="cs"),    # fp32 2048x32768  133.1 (no hint 137.9)
    (4, ALIGNED, 65536): Config("segments", 8192, 1, 4),             # fp32 2048x65536  298.3 (chunked 349.8)
    (4, ALIGNED, 131072): Config("segments", 8192, 1, 4),            # fp32 2048x114688 523.7 (chunked 649.2)
    (4, SPLIT, 4096): Config("rows", 4096, 1, 4, row_edges=True),    # fp32 8192x4097    67.0 =
    (4, SPLIT, 8192): Config("rows", 8192, 1, 8, row_edges=True, w_realign=True, w_branch=True),  # fp32
                                                                     # 4096x8193 68.2 (w unaligned 69.1)
    (4, SPLIT, 16384): Config("rows", 16384, 2, 32, row_edges=True, w_realign=True, same_phase=True, pieces=4),
                                                                     # fp32 2048x16385 73.6 (16 warps, one
                                                                     # piece 78.9; one row a tile 81.0)
    (4, SPLIT, 32768): Config("rows", 32768, 1, 32, row_edges=True, w_realign=True, pieces=4, w_ahead=True,
                              w_branch=True),                        # fp32 2048x32769 136.4 (plain 141.8)
}


# TUNED's entries as they were before a change replaced them, by change: the tiles older candidate
# lists were built from and measured against ("pieces": the tried, persistent, hint and pieces
# lists; "w_ahead": the w_ahead list; "w_branch": the w_branch list).
EARLIER_PICKS: dict[str, dict[tuple[int, str, int], Config]] = {
    "pieces": {
        (2, ALIGNED, 8192): Config("rows", 8192, 2, 8),
        (2, ALIGNED, 16384): Config("rows", 16384, 1, 8),
        (2, ALIGNED, 65536): Config("chunked", 16384, 1, 16, 1, 2),
        (2, SPLIT, 4096): Config("rows", 4096, 1, 4, row_edges=True),
        (2, SPLIT, 16384): Config("rows", 16384, 1, 8, w_shift=True, row_edges=True, pdl=True),
        (4, SPLIT, 16384): Config("rows", 16384, 2, 16, row_edges=True, w_realign=True, same_phase=True),
        (4, SPLIT, 32768): Config("rows", 32768, 1, 16),
    },
    "w_ahead": {
        (2, SPLIT, 16384): Config("rows", 16384, 1, 8, row_edges=True, w_realign=True, pieces=4),
        (4, SPLIT, 32768): Config("rows", 32768, 1, 32, pieces=4),
    },
    "w_branch": {
        (2, SPLIT, 4096): Config("rows", 4096, 1, 4, row_edges=True, x16=True, pieces=2),
        (2, SPLIT, 8192): Config("rows", 8192, 1, 4, w_shift=True, row_edges=True, pdl=True),
        (2, SPLIT, 16384): Config("rows", 16384, 1, 8, row_edges=True, w_realign=True, pieces=8, w_ahead=True),
        (4, SPLIT, 8192): Config("rows", 8192, 1, 8, row_edges=True),
        (4, SPLIT, 32768): Config("rows", 32768, 1, 32, pieces=4, w_ahead=True),
    },
}


def measured_pick(N: int, element_size: int, layout: str, before: str = "pieces") -> Config:
    """The heuristic's pick as it was before ``before`` changed it: the entry of the first change
    from ``before`` on that replaced it (``EARLIER_PICKS`` is in order), else today's."""
    key = (element_size, layout, row_block(N, element_size, layout))
    changes = list(EARLIER_PICKS)
    for change in changes[changes.index(before):]:
        if key in EARLIER_PICKS[change]:
            return EARLIER_PICKS[change][key]
    return heuristic(N, element_size, layout)


@functools.lru_cache(maxsize=1024)
def heuristic(N: int, element_size: int, layout: str) -> Config:
    block = row_block(N, element_size, layout)
    tuned = TUNED.get((element_size, layout, block))
    return tuned if tuned is not None else rule(N, element_size, layout)


def rule(N: int, element_size: int, layout: str) -> Config:
    """The heuristic where TUNED is silent."""
    block = row_block(N, element_size, layout)
    if block <= ONE_PASS_MAX_BLOCK:
        rows = min(MAX_ROWS, max(1, ROW_TILE_ELEMS // block))
        warps = min(32, max(1, rows * block // (32 * ELEMS_PER_THREAD)))
        return Config("rows", block, rows, warps)
    return Config("chunked", CHUNK_BYTES // element_size, 1, CHUNK_WARPS, CHUNK_STAGES, CHUNK_PROGRAMS_PER_SM)


def validate(config: Config, N: int, element_size: int, layout: str) -> None:
    """Raise ValueError for a config that cannot serve rows of N (used for sweep overrides)."""
    pow2 = lambda n: n > 0 and n & (n - 1) == 0  # noqa: E731
    if config.kernel not in ("rows", "chunked", "segments"):
        raise ValueError(f"unknown kernel {config.kernel!r}")
    if config.w_realign and (config.kernel != "rows" or config.w_shift):
        raise ValueError(f"{config}: w_realign is a rows-kernel alternative to w_shift")
    if config.pdl and (config.kernel != "rows" or not config.w_shift):
        raise ValueError(f"{config}: pdl overlaps the rows kernel with w_shift's copies")
    if config.persistent and (config.kernel != "rows" or config.pdl or config.stages < 1):
        raise ValueError(f"{config}: persistent is a rows-kernel grid (not with pdl), stages >= 1")
    if config.same_phase and (config.kernel != "rows" or config.persistent):
        raise ValueError(f"{config}: same_phase is a rows-kernel tile order (not persistent)")
    if config.hint and (config.kernel != "rows" or config.hint not in HINTS):
        raise ValueError(f"{config}: hint is one of {HINTS} for the rows kernel")
    if not (pow2(config.block) and pow2(config.rows) and pow2(config.num_warps)):
        raise ValueError(f"{config}: block, rows and num_warps must be powers of two")
    if config.kernel == "rows" and config.block < max_body(N, element_size, layout):
        raise ValueError(f"{config}: BLOCK_N < the {layout} row body of N={N}")
    if config.kernel != "rows" and config.block < 2 * vec(element_size):
        raise ValueError(f"{config}: CHUNK/SEG below two 16-byte vectors")
    if config.kernel == "segments" and not 2 <= segments(config, N, element_size, layout) <= MAX_SEGMENTS:
        raise ValueError(f"{config}: rows of N={N} would take {segments(config, N, element_size, layout)} "
                         f"segments, outside 2..{MAX_SEGMENTS}")
    if config.x16 and (element_size != 2 or config.kernel == "chunked" or config.reload):
        raise ValueError(f"{config}: x16 is for 16-bit x in the rows and segments kernels (without reload)")
    if config.pieces not in (1, 2, 4, 8) or (config.pieces > 1 and config.kernel != "rows"):
        raise ValueError(f"{config}: pieces is 1, 2, 4 or 8, and more than 1 only for the rows kernel")
    if config.w_ahead and config.kernel != "rows":
        raise ValueError(f"{config}: w_ahead is a rows-kernel schedule")
    if config.w_branch and (not config.w_realign or config.persistent or (config.rows > 1 and not config.same_phase)):
        raise ValueError(f"{config}: w_branch fixes w_realign's shift for tiles of one phase (one row or "
                         f"same_phase; not persistent)")
    if config.pieces > 1 and not _fits(config, element_size):
        # a piece must give every thread a whole 16-byte run: with less, Triton's layout holds
        # fewer values a thread, and W_REALIGN's shift (V values an instance) mixes two runs
        raise ValueError(f"{config}: pieces of {config.block // config.pieces} columns leave threads without "
                         f"a 16-byte run")


def _fits(config: Config, element_size: int) -> bool:
    """Each piece of the tile gives every thread at least one 16-byte run (validate)."""
    return config.rows * config.block // config.pieces >= 32 * config.num_warps * vec(element_size)


def candidates(N: int, element_size: int, layout: str) -> list[Config]:
    """The configs sweep.py times for rows of N (the heuristic's pick first)."""
    out = [heuristic(N, element_size, layout)]
    block = row_block(N, element_size, layout)
    if block <= 2 * ONE_PASS_MAX_BLOCK:
        for rows in (1, 2, 4, 8, 16, 32, 64):
            for warps in (4, 8, 16, 32):
                if 4 <= rows * block // (32 * warps) <= 64 and rows * block <= 32768:
                    out.append(Config("rows", block, rows, warps))
    if block >= ONE_PASS_MAX_BLOCK // 2:
        for chunk_bytes in (8192, 16384, 32768):
            chunk = chunk_bytes // element_size
            for warps in (4, 8, 16):
                if 8 <= chunk // (32 * warps) <= 32:
                    out += [Config("chunked", chunk, 1, warps, stages, per_sm)
                            for stages in (1, 3) for per_sm in (1, 2)]
        for seg in (4096, 8192, 16384, 32768):
            for warps in (4, 8, 16, 32):
                cfg = Config("segments", seg, 1, warps)
                if 16 <= seg // (32 * warps) <= 64 and \
                        2 <= segments(cfg, N, element_size, layout) <= MAX_SEGMENTS:
                    out.append(cfg)
    if layout == SPLIT:  # plain masked loads instead, to check that SPLIT pays for itself
        out.append(replace(heuristic(N, element_size, GENERIC), split=False))
    out += tried_candidates(N, element_size, layout)
    return list(dict.fromkeys(out + persistent_candidates(N, element_size, layout)
                              + same_phase_candidates(N, element_size, layout)
                              + hint_candidates(N, element_size, layout)
                              + pieces_candidates(N, element_size, layout)
                              + w_ahead_candidates(N, element_size, layout)
                              + split_16385_candidates(N, element_size, layout)
                              + w_branch_candidates(N, element_size, layout)
                              + new_candidates(N, element_size, layout)))


SMEM_PER_BLOCK = 232448      # bytes of shared memory one block may use on sm_90 (227 KB)


def persistent_smem(config: Config, element_size: int, layout: str) -> int:
    """Shared memory of a persistent rows config, about: Triton's pipeliner gives every load in
    the loop ``stages - 1`` buffers of its tile, w's too (two with w_realign); on sm_90a (CPU
    compile) FP32 rows[16384,1,w=16][row-edges][w-realign] at 2 stages took 196768 bytes."""
    tile = config.block * element_size
    w_tiles = 2 if (config.w_realign and layout == SPLIT) else (config.rows if layout == SPLIT else 1)
    return (config.stages - 1) * tile * (config.rows + w_tiles)


def pieces_candidates(N: int, element_size: int, layout: str) -> list[Config]:
    """Rows tiles that normalize and store their row in 2 or 4 column pieces (pieces), each
    piece's w loaded only after the previous piece's stores, with and without 16-bit x kept as
    loaded across the row reduction (x16); on the pick and its siblings over more warps, for
    16-bit SPLIT rows also with w realigned in registers instead of the shifted copies, and for
    16-bit aligned rows of 65536 (a chunked pick) one rows tile of 16 or 32 warps. Why: Nsight Compute found the rows tiles
    latency-bound at one or two CTAs an SM (session 48), and w's tile is half of what a thread
    holds: in pieces, its registers are a piece's (sm_90a, CPU compile: FP16 rows[16384,1,w=16]
    realigned takes 88 registers, 63 in four pieces with x16, so two CTAs fit an SM). First run
    (c478c07, pieces of 2): FP16 2048x65536 139.4 us in one 16-warp tile against 159.5 chunked,
    FP16 2048x16384 34.8 against 36.2, FP32 2048x16385 73.9 against 76.6; 16-bit 2048x16385 did
    not move (39.2-39.8 against 39.5). Second run, every rmsnorm case (0ccd669, pieces of 2 and 4;
    BENCHMARKS.md session 50): TUNED took the winners that gained beyond the sweep's noise, among
    them FP16 2048x16385 with w realigned in four pieces (38.5 us against 39.2 for the copies) and
    FP32 2048x16385 as two same-phase rows over 32 warps in four pieces (73.6 against 78.9). Third
    run (141d72a, ``_realign_pieces_candidates``, 16-bit 2048x16385): none beat the realigned tile
    in four pieces (FP16 38.6 us; in eight pieces 40.5, with cache hints 40.4-41.1, same-phase rows
    45.2 at best, the copies in eight pieces 43.3)."""
    pick = measured_pick(N, element_size, layout)
    block = row_block(N, element_size, layout)
    if layout == GENERIC:
        return []
    if pick.kernel == "rows":
        bases = [replace(pick, num_warps=warps) for warps in sorted({pick.num_warps, 8, 16, 32})
                 if warps >= pick.num_warps and pick.rows * block // (32 * warps) >= 16]
        if layout == SPLIT and element_size == 2 and pick.w_shift:
            bases += [replace(base, w_shift=False, pdl=False, w_realign=True) for base in bases
                      if base.num_warps <= 16]
    elif element_size == 2 and layout == ALIGNED and block == 65536:
        bases = [Config("rows", block, 1, warps, hint="cs") for warps in (16, 32)]
    else:
        return []
    out = [replace(base, pieces=pieces, x16=x16) for base in bases for pieces in (1, 2, 4)
           for x16 in ((False, True) if element_size == 2 else (False,))]
    out += _realign_pieces_candidates(N, element_size, layout)
    return [cfg for cfg in dict.fromkeys(out) if cfg != pick and _fits(cfg, element_size)]


def new_candidates(N: int, element_size: int, layout: str) -> list[Config]:
    """Configs ``sweep.py --new`` times against the heuristic's pick and ATen: none pending (the
    last round is ``w_branch_candidates``)."""
    return []


def w_branch_candidates(N: int, element_size: int, layout: str) -> list[Config]:
    """w_branch (a code path for each 16-byte phase, so w's realigning shift is fixed at compile
    time: no selects; moves ptxas folds away, or four byte permutes a run for odd 16-bit phases) on
    every SPLIT rows pick (as it was at 5ef87a2) with w realigned, and on the other one-row SPLIT
    picks realigned; for 16-bit rows of 16385 on the realigned tile in 4 or 8 pieces, w ahead or
    not, over 8 or 16 warps. Why: the realigning shift is ~19 instructions a 16-byte run (sm_90a,
    FP16 rows[16384,1,w=8] in eight pieces: 792 a thread, ~510 a path with w_branch), and these
    tiles wait on their instructions between loads. Measured at 5ef87a2 (BENCHMARKS.md session
    51): won every 16-bit SPLIT case (FP16 8192x4097 34.6 us against 36.3, 4096x8193 36.4 against
    37.2, 2048x16385 37.1 over 16 warps in four pieces against 38.0; BF16 alike), FP32 4096x8193
    (68.2 against 69.1) and 2048x32769 (136.4 against 141.8), so TUNED has it there; lost FP32
    8192x4097 (68.3 against 67.8) and 2048x16385 (71.7 against 70.9)."""
    pick = measured_pick(N, element_size, layout, before="w_branch")
    if layout != SPLIT or pick.kernel != "rows" or pick.persistent or (pick.rows > 1 and not pick.same_phase):
        return []
    out = [replace(pick, w_shift=False, pdl=False, w_realign=True, row_edges=True, w_branch=True)]
    if element_size == 2 and row_block(N, element_size, layout) == 16384:
        realigned = Config("rows", 16384, 1, 8, row_edges=True, w_realign=True, w_branch=True)
        out += [replace(realigned, pieces=pieces, w_ahead=ahead) for pieces in (4, 8) for ahead in (False, True)]
        out += [replace(realigned, num_warps=16, pieces=4, w_ahead=ahead) for ahead in (False, True)]
    return [cfg for cfg in dict.fromkeys(out) if cfg != pick and _fits(cfg, element_size)]


def split_16385_candidates(N: int, element_size: int, layout: str) -> list[Config]:
    """For 16-bit SPLIT rows of 16385 (the suite's last cases under 3.5 TB/s at 737ec73): the
    realigned tile in eight pieces with w ahead under each cache hint and without w ahead; in
    four pieces with and without w ahead over 8 and 16 warps; the shifted copies in eight pieces
    with w ahead. Measured at 737ec73 (BENCHMARKS.md session 50): FP16 kept the shipped tile (37.7
    us; the rest 38.4-40.3); BF16 read 38.3 in four pieces without w ahead against 38.6 for it
    (the rest 39.4-40.5). Again at 23d5bc3 (the edges' loads early, session 51): both kept it
    (FP16 37.6 us, BF16 37.3; the rest 38.4-43.0)."""
    if element_size != 2 or layout != SPLIT or row_block(N, element_size, layout) != 16384:
        return []
    pick = heuristic(N, element_size, layout)
    realigned = Config("rows", 16384, 1, 8, row_edges=True, w_realign=True)
    out = [replace(realigned, pieces=8, w_ahead=True, hint=hint) for hint in HINTS]
    out += [replace(realigned, pieces=8), replace(realigned, pieces=4)]
    out += [replace(realigned, num_warps=16, pieces=4, w_ahead=ahead, x16=x16) for ahead in (False, True)
            for x16 in (False, True)]
    out.append(Config("rows", 16384, 1, 8, w_shift=True, row_edges=True, pdl=True, pieces=8, w_ahead=True))
    return [cfg for cfg in dict.fromkeys(out) if cfg != pick and _fits(cfg, element_size)]


def w_ahead_candidates(N: int, element_size: int, layout: str) -> list[Config]:
    """Every rows pick (as it was at c320772) with
    w_ahead (each piece's w loaded one piece early, the first piece's with x), and for 16-bit SPLIT
    rows of 16385 (the last suite cases under 3.5 TB/s) the realigned tile in 2, 4 or 8 pieces with
    w_ahead, with and without x16. Why: in pieces, the w loads of each piece wait for the previous
    piece's stores, so a tile of four pieces makes four L2 round trips one after another once its
    row is reduced. Measured at c320772 (BENCHMARKS.md session 50): FP16 2048x16385 37.7 us in eight
    pieces with w ahead against 38.6 (BF16 38.9 against 38.6), FP32 2048x32769 140.6 against 142.9,
    so TUNED has it there (16-bit rows of 16385 left it for w_branch, session 51); elsewhere it tied
    or lost (FP16 2048x65536 150.8 against 140.0)."""
    pick = measured_pick(N, element_size, layout, before="w_ahead")
    if pick.kernel != "rows" or layout == GENERIC:
        return []
    out = [replace(pick, w_ahead=True)]
    if element_size == 2 and layout == SPLIT and row_block(N, element_size, layout) == 16384:
        out += [Config("rows", 16384, 1, 8, row_edges=True, w_realign=True, pieces=pieces, x16=x16, w_ahead=True)
                for pieces in (2, 4, 8) for x16 in (False, True)]
    return [cfg for cfg in dict.fromkeys(out) if cfg != pick and _fits(cfg, element_size)]


def _realign_pieces_candidates(N: int, element_size: int, layout: str) -> list[Config]:
    """The second round of pieces_candidates (141d72a): 16-bit SPLIT rows of 16385 with w
    realigned in 4 or 8 pieces, with and without x16, under each cache hint; two same-phase rows
    over 16 warps, realigned, in 4 or 8 pieces; the shifted copies in 8 pieces."""
    if element_size != 2 or layout != SPLIT or row_block(N, element_size, layout) != 16384:
        return []
    realigned = Config("rows", 16384, 1, 8, row_edges=True, w_realign=True)
    out = [replace(realigned, pieces=pieces, x16=x16, hint=hint) for pieces in (4, 8) for x16 in (False, True)
           for hint in ("",) + HINTS]
    out += [Config("rows", 16384, 2, 16, row_edges=True, w_realign=True, same_phase=True, pieces=pieces, x16=x16)
            for pieces in (4, 8) for x16 in (False, True)]
    out += [Config("rows", 16384, 1, 8, w_shift=True, row_edges=True, pdl=True, pieces=8, x16=x16)
            for x16 in (False, True)]
    return out


def hint_candidates(N: int, element_size: int, layout: str) -> list[Config]:
    """The rows pick with each cache hint on x and y (``HINTS``). Why: x and y pass through once,
    but their lines go through L1 like w's, which every row of a phase reads again (shifted copies,
    realigned loads); a hint keeps them from pushing w out. Measured at d6c68b7 (BENCHMARKS.md
    session 49): only FP32 aligned rows of 32768 gained ("cs", 133.1 us against 137.9; TUNED has
    it); the unaligned rows did not move."""
    pick = measured_pick(N, element_size, layout)
    if pick.kernel != "rows" or layout == GENERIC:
        return []
    return [replace(pick, hint=hint) for hint in HINTS]


def same_phase_candidates(N: int, element_size: int, layout: str) -> list[Config]:
    """SPLIT rows tiles of 2 or 4 rows V apart (same_phase), so that the rows share one w tile
    (shifted copies, with or without pdl, or realigned), 16-64 values a thread. Why: FP32 rows of 16385 reach 3.3 TB/s
    against 3.9 for rows of 16384, whose winning tile holds two rows (64 values a thread, 120
    registers); a SPLIT tile of two consecutive rows needs two w tiles (their phases differ) and
    spills, so the one-row tile ran there with one 64 KB row in flight an SM. Measured at 8cc053c
    (BENCHMARKS.md session 24): two same-phase FP32 rows of 16385 with w realigned took 76.6 / 76.1 us
    against 81.0 / 80.3 (TUNED has it; 16 bytes of spills); every 16-bit case and FP32 rows of 4097
    and 8193 lost (FP16 2048x16385 46.2 us at best against 39.1)."""
    if layout != SPLIT or row_block(N, element_size, layout) < 4096:
        return []
    block = row_block(N, element_size, layout)
    out = []
    for rows in (2, 4):
        for warps in (8, 16, 32):
            if rows * block // (32 * warps) in (16, 32, 64) and rows * block <= 32768:
                base = Config("rows", block, rows, warps, row_edges=True, same_phase=True)
                out += [replace(base, w_shift=True, pdl=True), replace(base, w_shift=True),
                        replace(base, w_realign=True)]
    return out


def _one_row(config: Config) -> Config:
    """A same-phase tile as the one-row tile it replaced: the variants below were built from and
    measured against that one."""
    return replace(config, rows=1, same_phase=False) if config.same_phase else config


def persistent_candidates(N: int, element_size: int, layout: str) -> list[Config]:
    """The heuristic's rows tile (pdl dropped) as a persistent grid whose next tile's loads are in
    flight while this one reduces and stores, 1 or 2 programs an SM where shared memory allows.
    Measured at d80dcdd (BENCHMARKS.md session 18): slower than the shipped tile on every case
    tried (FP16 2048x16385 47.9 us at 2 an SM against 39.5, FP32 2048x16385 100.8 against 81.1),
    so TUNED has none of them."""
    base = _one_row(measured_pick(N, element_size, layout))
    if base.kernel != "rows" or layout == GENERIC or row_block(N, element_size, layout) < 4096:
        return []
    variants = [replace(base, pdl=False)]
    if base.w_realign:
        variants.append(replace(base, w_realign=False))
    out = []
    for cfg in variants:
        for per_sm in (1, 2):
            cand = replace(cfg, persistent=True, stages=2, programs_per_sm=per_sm)
            if persistent_smem(cand, element_size, layout) * per_sm <= SMEM_PER_BLOCK:
                out.append(cand)
    return out


def _x16_segments(N: int, element_size: int, layout: str) -> list[Config]:
    """Long 16-bit rows: segments keeping their piece as loaded across the row sync, 64 or 128
    values a thread."""
    if element_size != 2 or layout == GENERIC or max_body(N, element_size, layout) <= 2 * ONE_PASS_MAX_BLOCK:
        return []
    return [cfg for cfg in (Config("segments", 16384, 1, 4, x16=True), Config("segments", 16384, 1, 8, x16=True),
                            Config("segments", 32768, 1, 8, x16=True), Config("segments", 32768, 1, 16, x16=True))
            if 2 <= segments(cfg, N, element_size, layout) <= MAX_SEGMENTS]


def tried_candidates(N: int, element_size: int, layout: str) -> list[Config]:
    """Variants measured on the H200 (kept in the full sweep):
    - SPLIT rows with the head/tail a row at a time (row_edges, rows kernel) and with it or alone
      the shifted weight copies (w_shift): rows tiles of 16-64 values per thread with 1-4 rows per
      program; w_shift segments of 2-16 pieces. Rows tiles with row_edges (and w_shift from rows
      of 8193 on) won every SPLIT case of the suite and were in TUNED (16-bit 8192x4097: 3.6 TB/s,
      4096x8193: 3.5, 2048x16385: 3.3);
    - SPLIT rows-kernel tiles with w realigned in registers (w_realign): won FP32 2048x16385 (80.5 us
      against 82.1 with row edges alone), lost or tied on 16-bit rows (FP16 2048x16385: 56.7 us at
      8 warps, 145 registers, against 40.8 with w_shift). Holding 16-bit x as loaded across the row
      reduction (as x16 does for segments) brought that tile to 113 registers but no 16-bit case
      moved beyond 2 %, so the rows kernel does not have it;
    - SPLIT rows tiles with w_shift whose kernel is a programmatic dependent of the copies' kernel
      (pdl): won 16-bit 4096x8193 (37.2 us against 39.0) and 2048x16385 (39.3 against 41.3), lost
      FP32 (70.4 against 68.8 without copies at 8193), so TUNED had it for 16-bit rows of 8193 on (until
      w_branch replaced it, session 51);
    - long ALIGNED 16-bit rows: segments with 128 values (256 bytes) per thread held as FP32
      (SASS: 219-233 registers), and segments that reload their piece after the row sync
      (reload), 64 or 128 values a thread (FP16 2048x65536: 3.20 TB/s at best);
    - long 16-bit rows, segments with x16 (``_x16_segments``): SEG=16384 over 4 warps won FP16
      2048x114688 (267.0 us, 3.52 TB/s, against chunked's 300.6) and tied 2048x65536 (156.6 against
      157.3), so TUNED takes it for the former only.
    - one-row SPLIT tiles taken phase by phase (rows 0, V, 2V, ..., then 1, V+1, ...), so that the
      CTAs resident together read one w copy (c1ea665, reverted): 5-12 % slower than row order on
      every SPLIT case of the suite, with w by copies, realigned or scalar (FP16 2048x16385 43.8 us
      against 39.1, FP32 8192x4097 72.1 against 67.3), likely because x's concurrent reads spread
      V times wider;
    - ALIGNED FP16 rows of 65536 as one rows tile with x kept 16-bit across the row reduction
      (e73eb9b, reverted): FP32 rows of the same 128 KB reach 3.9 TB/s as one 32-warp rows tile, so
      the 16-bit tile held 64 values a thread in 32 registers (sm_90a: 56 bytes of spills at 32 warps,
      8 at 16). 156.8 us (3.42 TB/s) at 16 warps against 157.8 for the shipped chunked tile, 169.5
      at 32 warps: no gain, so neither the rows kernel nor the sweep keeps it;
    - rows tiles with their registers capped (Triton's maxnreg) so that 3-4 CTAs fit an SM
      (session 48, after Nsight Compute found these tiles latency-bound at two CTAs an SM): ptxas
      spilled 56-352 bytes a thread and every capped tile lost (FP16 2048x16385 43.3 us at 80
      registers against 39.4, FP16 2048x16384 42.4 against 36.0, FP32 2048x16385 149.6 against
      76.1), so Config has no cap;
    - segments launched as thread-block clusters (a row's CTAs one cluster of 2-8, started
      together: no ticket atomic, no zeroed workspace, the partials exchanged through global memory
      across one cluster barrier; commits 5ea5261 / ea1b7d5, 296 GPU tests passed): slower on every
      case timed (FP16 2048x65536 164.7 us at best against chunked's 157.0, FP16 2048x114688 306.2
      against 265.2, FP32 2048x65536 301.7 against the polling segments' 295.4, FP16 2048x16385 45.4
      against 39.1), so removed (not profiled; a cluster starts only once all its CTAs have slots);
    - one-row SPLIT tiles in phase-major order (tile t took row (t % Q) * V + t // Q, Q = cdiv(M, V),
      so that the CTAs resident at once shared one 16-byte phase and read one shifted copy of w;
      commit 96998bf, 286 GPU tests passed): slower on every case, shifted copies with or without
      pdl or w realigned (FP16 2048x16385 44.0 us at best against 39.3, FP16 4096x8193 42.6 against
      37.0, FP32 2048x16385 91.6 against 78.5 for the same-phase pick; first of two rounds), so removed;
    A "flat" kernel (contiguous rows as one array of 16-byte-aligned tiles, rows crossing tiles
    reduced across CTAs) was tried in the same H200 run (commit 5cd0b78) and removed: at most 2.1 TB/s
    on the 16-bit unaligned rows against 3.1-3.4 for the rows kernel, and wrong results with
    tiles of 32768 elements."""
    out = _x16_segments(N, element_size, layout)
    block = row_block(N, element_size, layout)
    if layout == SPLIT:
        pick = _one_row(measured_pick(N, element_size, layout))
        rows_kernel = pick.kernel == "rows"
        out.append(replace(pick, w_shift=True, w_realign=False, row_edges=rows_kernel))
        if rows_kernel:
            out.append(replace(pick, w_shift=False, w_realign=False, row_edges=True, pdl=False))
        if block <= 2 * ONE_PASS_MAX_BLOCK:
            for rows in (1, 2, 4):
                for warps in (4, 8, 16, 32):
                    # rows x warps <= 32: beyond it ptxas spilled (8-360 bytes) in every SPLIT tile tried
                    per_thread = rows * block // (32 * warps)
                    if per_thread in (16, 32, 64) and rows * block <= 32768 and rows * warps <= 32:
                        shifted = Config("rows", block, rows, warps, w_shift=True, row_edges=True)
                        out += [shifted, replace(shifted, pdl=True), replace(shifted, w_shift=False)]
                        out.append(Config("rows", block, rows, warps, row_edges=True, w_realign=True))
        if block >= ONE_PASS_MAX_BLOCK:
            for seg in (4096, 8192, 16384):
                for warps in (4, 8, 16):
                    cfg = Config("segments", seg, 1, warps, w_shift=True)
                    if seg // (32 * warps) in (32, 64) and \
                            2 <= segments(cfg, N, element_size, layout) <= MAX_SEGMENTS:
                        out.append(cfg)
    if layout == ALIGNED and element_size == 2 and block >= 4 * ONE_PASS_MAX_BLOCK:
        for seg, warps in ((8192, 2), (16384, 4), (32768, 8)):
            for cfg in (Config("segments", seg, 1, warps), Config("segments", seg, 1, warps, reload=True),
                        Config("segments", seg, 1, 2 * warps, reload=True)):
                if 2 <= segments(cfg, N, element_size, layout) <= MAX_SEGMENTS:
                    out.append(cfg)
    return list(dict.fromkeys(out))


# -- CI: compile every shipped kernel config, run small cases in the interpreter ---------------

_TRITON_DTYPE = {"fp16": "*fp16", "bf16": "*bf16", "fp32": "*fp32"}
_ELEMENT_SIZE = {"fp16": 2, "bf16": 2, "fp32": 4}
_KERNEL_NAME = {"rows": "rms_norm_rows_kernel", "chunked": "rms_norm_chunked_kernel",
                "segments": "rms_norm_segments_kernel"}


def _kernel(name: str):
    from tilefly.ops.rms_norm import kernels

    return getattr(kernels, name)


def kernel_constexprs(config: Config, N: int, element_size: int, layout: str, has_w: bool) -> dict:
    """The constexpr arguments of ``config``'s kernel, in signature order (the launcher passes
    them positionally to Triton's C launcher)."""
    if config.kernel == "rows":
        head = {"BLOCK_N": config.block, "ROWS": config.rows}
    elif config.kernel == "chunked":
        head = {"CHUNK": config.block, "STAGES": config.stages}
    else:
        head = {"SEG": config.block, "SEGMENTS": segments(config, N, element_size, layout)}
    return {**head, "V": vec(element_size), "ALIGNED": layout == ALIGNED, "SPLIT": layout == SPLIT,
            "HAS_W": has_w, "W_SHIFT": uses_w_shift(config, layout, has_w),
            **({"ROW_EDGES": config.row_edges and layout == SPLIT,
                "W_REALIGN": config.w_realign and layout == SPLIT and has_w,
                "W_PDL": config.pdl and uses_w_shift(config, layout, has_w),
                "PERSISTENT": config.persistent, "STAGES": config.stages,
                "SAME_PHASE": config.same_phase and layout == SPLIT,
                "HINT": config.hint, "PIECES": config.pieces,
                "X16": config.x16 and element_size == 2,
                "W_AHEAD": config.w_ahead and has_w,
                "W_BRANCH": config.w_branch and config.w_realign and layout == SPLIT and has_w}
               if config.kernel == "rows" else {}),
            **({"RELOAD": config.reload, "X16": config.x16} if config.kernel == "segments" else {})}


def uses_w_shift(config: Config, layout: str, has_w: bool) -> bool:
    """The shifted weight copies serve only SPLIT rows (elsewhere w is aligned or plain)."""
    return config.w_shift and layout == SPLIT and has_w


# The 16-byte accesses of x and y under each cache hint: .cg loads are strong GPU-scope loads (no
# L1), evict_first and .cs stores carry EF.
_HINT_SASS = {"cg": ("LDG.E.128.STRONG.GPU", "STG.E.128"), "cs": ("LDG.E.128.STRONG.GPU", "STG.E.EF.128"),
              "evict_first": ("LDG.E.EF.128", "STG.E.EF.128")}


def _spec(dtype: str, layout: str, config: Config, N: int, has_w: bool = True):
    from tilefly.compile_check import KernelSpec

    ptr = _TRITON_DTYPE[dtype]
    signature = {"X": ptr, "W": ptr, "Y": ptr, "RSTD": "*fp32", "M": "i32", "N": "i32",
                 "stride_row": "i32", "eps": "fp32"}
    pointers = [0, 1, 2, 3]
    if config.kernel == "segments":
        signature.update({"SYNC": "*i32", "PARTIAL": "*fp32"})
        pointers += [8, 9]
    constexprs = kernel_constexprs(config, N, _ELEMENT_SIZE[dtype], layout, has_w)
    signature.update({k: "constexpr" for k in constexprs})
    # Pointers 16-byte aligned as at run time (fresh outputs; ALIGNED/SPLIT need x aligned):
    # without it Triton compiles scalar accesses and the check would not see the real kernel.
    extra = {"attrs": {(i,): [["tt.divisibility", 16]] for i in pointers}}
    must = ()
    if layout != GENERIC:  # 16-byte global accesses: the point of ALIGNED and SPLIT
        if config.kernel == "rows" and config.persistent and config.stages > 1:
            must = ("LDGSTS.E.BYPASS.128", "STG.E.128")   # x through cp.async into shared memory
        elif config.kernel != "chunked":
            must = _HINT_SASS.get(config.hint, ("LDG.E.128", "STG.E.128"))
        elif config.stages > 1:  # pipelined: cp.async into shared memory, evict_first stores
            must = ("LDGSTS.E.BYPASS.128", "STG.E.EF.128")
        else:
            must = ("STG.E.EF.128",)
    if config.kernel == "segments":  # the row sync: release/acquire atomics at GPU scope
        must += ("ATOMG.E.ADD.STRONG.GPU", "MEMBAR.ALL.GPU")
    if must:
        extra["sass_must_contain"] = must
    extra["max_local_bytes"] = _SPILLS_ALLOWED.get((dtype, layout, config), 0)
    pieces = f",x{constexprs['SEGMENTS']}" if config.kernel == "segments" else ""
    return KernelSpec(f"rms_norm.{config.kernel}[{dtype},{layout},{config}{pieces}{'' if has_w else ',no-w'}]",
                      functools.partial(_kernel, _KERNEL_NAME[config.kernel]), signature, constexprs,
                      num_warps=config.num_warps, num_stages=max(config.stages, 1), **extra)


# The FP16 ALIGNED 65536 winner (one 16-warp tile, x16, two pieces: 140 us against 161 for chunked)
# holds 128 values a thread and spills 32 bytes of stack; still the fastest measured, so allowed.
_SPILLS_ALLOWED = {("fp16", ALIGNED, TUNED[(2, ALIGNED, 65536)]): 32}

# Row lengths behind TUNED's keys (the suite's) and the rules' representatives.
_SUITE_N = {ALIGNED: (4096, 8192, 16384, 32768, 65536, 114688), SPLIT: (4097, 8193, 16385, 32769)}


def compile_specs():
    """Every TUNED config (FP16 for 2-byte keys, FP32 for 4-byte ones), the heuristic's rules
    where TUNED is silent (packed short rows, chunked 16-bit rows of 32768 and rows of 262144),
    BF16 and GENERIC and no-weight variants, and the segments kernel."""
    specs, seen = [], set()

    def add(dtype, layout, config, N, has_w=True):
        spec = _spec(dtype, layout, config, N, has_w)
        if spec.name not in seen:
            seen.add(spec.name)
            specs.append(spec)

    for (size, layout, block), cfg in TUNED.items():
        N = next(n for n in _SUITE_N[layout] if row_block(n, size, layout) == block)
        add("fp16" if size == 2 else "fp32", layout, cfg, N)
    add("bf16", ALIGNED, heuristic(4096, 2, ALIGNED), 4096)
    add("bf16", ALIGNED, heuristic(2048, 2, ALIGNED), 2048)
    add("bf16", ALIGNED, heuristic(32768, 2, ALIGNED), 32768)
    add("bf16", ALIGNED, heuristic(262144, 2, ALIGNED), 262144)
    add("fp32", SPLIT, heuristic(262145, 4, SPLIT), 262145)
    add("bf16", GENERIC, heuristic(127, 2, GENERIC), 127, has_w=False)
    # the shortest rows of each layout: a value or one 16-byte run a thread (BF16's pair conversion)
    add("bf16", GENERIC, heuristic(1, 2, GENERIC), 1)
    add("bf16", ALIGNED, heuristic(8, 2, ALIGNED), 8)
    add("bf16", SPLIT, heuristic(SPLIT_MIN_N + 1, 2, SPLIT), SPLIT_MIN_N + 1)
    add("fp16", SPLIT, heuristic(4097, 2, SPLIT), 4097, has_w=False)
    add("fp32", ALIGNED, Config("segments", 16384, 1, 16), 114688)
    add("fp16", SPLIT, Config("segments", 16384, 1, 16), 114689)
    add("bf16", GENERIC, Config("segments", 8192, 1, 8), 40000, has_w=False)
    # sweep.py --new candidates (not in TUNED yet): shifted weight copies, row edges, 16-bit
    # segments of 128 values a thread, segments that reload; and the kernel writing the copies.
    add("fp16", SPLIT, Config("rows", 4096, 1, 4, w_shift=True, row_edges=True), 4097)
    add("fp16", SPLIT, Config("rows", 4096, 1, 4, w_shift=True), 4097)
    add("bf16", SPLIT, Config("rows", 8192, 2, 8, row_edges=True), 8193)
    add("fp32", SPLIT, Config("rows", 4096, 1, 4, w_shift=True, row_edges=True), 4097)
    add("bf16", SPLIT, Config("rows", 16384, 1, 8, w_shift=True, row_edges=True), 16385)
    add("fp16", SPLIT, Config("segments", 8192, 1, 4, w_shift=True), 16385)
    add("fp16", ALIGNED, Config("segments", 16384, 1, 4), 65536)
    add("bf16", ALIGNED, Config("segments", 16384, 1, 4, reload=True), 114688)
    add("fp16", SPLIT, Config("segments", 8192, 1, 4, w_shift=True, reload=True), 65537, has_w=False)
    # w realigned in registers (TUNED for FP32 16385, tried elsewhere): each element size, packed
    # rows, 16 and 64 values a thread
    add("fp16", SPLIT, Config("rows", 4096, 1, 4, row_edges=True, w_realign=True), 4097)
    add("bf16", SPLIT, Config("rows", 8192, 2, 16, row_edges=True, w_realign=True), 8193)
    add("fp16", SPLIT, Config("rows", 16384, 1, 8, row_edges=True, w_realign=True), 16385)
    add("fp32", SPLIT, Config("rows", 4096, 1, 4, row_edges=True, w_realign=True), 4097)
    add("fp32", SPLIT, Config("rows", 16384, 1, 16, row_edges=True, w_realign=True), 16385)
    # 16-bit segments that keep x as loaded (x16): TUNED's long rows, a wider variant
    add("fp16", ALIGNED, Config("segments", 16384, 1, 4, x16=True), 65536)
    add("bf16", ALIGNED, Config("segments", 32768, 1, 16, x16=True), 262144)
    # the rows kernel waiting for the copies through PDL (sweep.py --new)
    add("fp16", SPLIT, Config("rows", 16384, 1, 8, w_shift=True, row_edges=True, pdl=True), 16385)
    add("fp32", SPLIT, Config("rows", 4096, 2, 4, w_shift=True, row_edges=True, pdl=True), 4097)
    # persistent rows tiles (tried) at the suite's rows of 16384 and 16385 (programs a SM is a grid
    # size, not compiled in: one binary serves 1 and 2)
    for dtype, layout, N in (("fp32", SPLIT, 16385), ("fp32", ALIGNED, 16384), ("fp16", SPLIT, 16385),
                             ("bf16", ALIGNED, 16384)):
        for cfg in persistent_candidates(N, _ELEMENT_SIZE[dtype], layout):
            if cfg.programs_per_sm == 1:
                add(dtype, layout, cfg, N)
    # w's shift fixed by a code path per phase (TUNED's 16-bit SPLIT tiles have it): BF16's, and
    # the pick before it
    add("bf16", SPLIT, TUNED[(2, SPLIT, 16384)], 16385)
    add("fp16", SPLIT, EARLIER_PICKS["w_branch"][(2, SPLIT, 16384)], 16385)
    # cache hints on x and y (sweep.py --new)
    for hint in HINTS:
        add("fp16", SPLIT, replace(TUNED[(2, SPLIT, 16384)], hint=hint), 16385)
    # rows V apart sharing one w tile (TUNED has FP32's realigned tile), the others
    add("fp32", SPLIT, Config("rows", 16384, 2, 16, w_shift=True, row_edges=True, pdl=True, same_phase=True), 16385)
    add("fp16", SPLIT, Config("rows", 16384, 2, 16, w_shift=True, row_edges=True, pdl=True, same_phase=True), 16385)
    add("bf16", SPLIT, Config("rows", 16384, 2, 16, row_edges=True, w_realign=True, same_phase=True), 16385)
    for dtype in ("fp16", "fp32"):
        for pdl in (False, True):
            specs.append(_shift_weight_spec(dtype, pdl))
    return specs


# Elements of w per program of the shifted-copies kernel (each writes them to all V copies).
# 256 (65 programs for rows of 16385, one load each) measured the same as 1024 with V load-store
# round trips (BENCHMARKS.md session 25): the copies' cost is not their latency.
SHIFT_BLOCK = 256


def _shift_weight_spec(dtype: str, pdl: bool = False):
    from tilefly.compile_check import KernelSpec

    ptr = _TRITON_DTYPE[dtype]
    consts = {"BLOCK": SHIFT_BLOCK, "V": vec(_ELEMENT_SIZE[dtype]), "PDL": pdl}
    return KernelSpec(f"rms_norm.shift_weight[{dtype}{',pdl' if pdl else ''}]",
                      functools.partial(_kernel, "rms_norm_shift_weight_kernel"),
                      {"W": ptr, "WS": ptr, "N": "i32", "BLOCK": "constexpr", "V": "constexpr", "PDL": "constexpr"},
                      consts, attrs={(i,): [["tt.divisibility", 16]] for i in (0, 1)}, num_warps=4, num_stages=1)


def _interpreter_case(dtype_name: str, M: int, N: int, has_w: bool, config: Config | None,
                      stride: int | None = None, eps: float | None = 1e-6, specials: bool = False) -> None:
    """Run the launcher (TRITON_INTERPRET=1, CPU tensors) and compare with a float64 reference.
    ``specials`` plants NaN, +inf and -inf in rows 0, 1 and 2 (M >= 3)."""
    import torch

    from tilefly.ops.rms_norm import launcher

    numpy_compat()
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
    gen = torch.Generator().manual_seed(M * 100003 + N)
    width = stride or N
    buf = torch.randn(M, width, generator=gen).to(dtype)
    if specials:
        buf[0, N // 3], buf[1, N // 2], buf[2, N - 1] = float("nan"), float("inf"), -float("inf")
    x = buf[:, :N]
    w = (torch.rand(N, generator=gen) + 0.5).to(dtype) if has_w else None
    y = torch.full((M, N), float("nan"), dtype=dtype)
    rstd = torch.full((M, 1), float("nan"))
    launcher.launch(x, w, y, rstd, eps, config=config)
    ref_rstd = torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + (1.1920928955078125e-07 if eps is None else eps))
    ref = x.double() * ref_rstd * (w.double() if has_w else 1.0)
    tol = {"fp16": 2e-3, "bf16": 1.6e-2, "fp32": 1e-5}[dtype_name]
    torch.testing.assert_close(rstd.double(), ref_rstd, rtol=1e-5, atol=0, equal_nan=specials)
    torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol, equal_nan=specials)
    if specials:  # rows with +-inf: rsqrt(inf) = 0, so y is 0 except NaN where x is infinite
        assert rstd[1:3].eq(0).all() and y[1:3].isnan().sum() == 2, (rstd[:3], y[1:3].isnan().sum())


def _interpreter_op_case(shape: tuple, n: int, dtype_name: str, has_w: bool, eps: float | None,
                         sliced: bool = False) -> None:
    """The op wrapper end to end: (y, rstd) shapes, dtypes and strides as ATen's meta kernel
    gives them, values against float64."""
    import torch

    from tilefly.ops.rms_norm import eager

    numpy_compat()
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
    gen = torch.Generator().manual_seed(sum(shape) + n)
    x = torch.randn(*shape[:-1], shape[-1] + 3 * sliced, generator=gen).to(dtype)[..., :shape[-1]]
    norm = list(shape[len(shape) - n:])
    w = (torch.rand(norm, generator=gen) + 0.5).to(dtype) if has_w else None
    y, rstd = eager.rms_norm_forward(x, norm, w, eps)
    y_meta, rstd_meta = torch.ops.aten._fused_rms_norm(x.to("meta"), norm, None if w is None else w.to("meta"), eps)
    for got, want in ((y, y_meta), (rstd, rstd_meta)):
        assert (got.shape, got.dtype, got.stride()) == (want.shape, want.dtype, want.stride()), (got, want)
    dims = tuple(range(x.dim() - n, x.dim()))
    ref_rstd = torch.rsqrt(x.double().pow(2).mean(dims, keepdim=True) + (1.1920928955078125e-07 if eps is None else eps))
    ref = x.double() * ref_rstd * (w.double() if has_w else 1.0)
    tol = {"fp16": 2e-3, "bf16": 1.6e-2, "fp32": 1e-5}[dtype_name]
    torch.testing.assert_close(rstd.double(), ref_rstd, rtol=1e-5, atol=0)
    torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol)


def interpreter_checks():
    """Small cases through all three kernels and all three row layouts, each dtype, with and
    without weight: N in {1, 7, 127, 4097} plus aligned rows and strided rows; NaN/+-inf rows;
    the segments kernel runs one thread per program (concurrent_interpreter)."""
    chunked = lambda chunk: Config("chunked", chunk, 1, 4, 2, 1)  # noqa: E731 - several chunks per row
    cases = []
    for dtype in ("fp16", "bf16", "fp32"):
        for N in (1, 7, 127, 4097):
            cases.append((f"rows[{dtype},N={N}]", (dtype, 5, N, True, None)))
        cases.append((f"rows[{dtype},N=4097,no-w,eps=None]", (dtype, 3, 4097, False, None, None, None)))
        cases.append((f"rows-aligned[{dtype},N=256]", (dtype, 9, 256, True, None)))
        cases.append((f"rows-strided[{dtype},N=100,stride=131]", (dtype, 4, 100, True, None, 131)))
        cases.append((f"chunked-split[{dtype},N=4097]", (dtype, 3, 4097, True, chunked(512))))
        cases.append((f"chunked-aligned[{dtype},N=1024]", (dtype, 3, 1024, False, chunked(256))))
        cases.append((f"segments-split[{dtype},N=1001]", (dtype, 3, 1001, True, Config("segments", 256, 1, 4))))
        cases.append((f"segments-aligned[{dtype},N=1024,no-w]", (dtype, 2, 1024, False, Config("segments", 128, 1, 4))))
    cases.append(("chunked-strided[fp32,N=300,stride=301]", ("fp32", 3, 300, True, chunked(64), 301)))
    cases.append(("segments-strided[fp32,N=300,stride=301]", ("fp32", 3, 300, True, Config("segments", 64, 1, 4), 301)))
    cases.append(("rows-no-split[fp16,N=127]", ("fp16", 4, 127, True, Config("rows", 128, 2, 4, split=False))))
    # w_shift, row_edges, reload: rows of odd N (the body starts at every column c0 < V in turn),
    # several rows per program (M not a multiple of ROWS), each kernel; no-w and GENERIC ignore w_shift.
    for dtype, M, N, cfg in (("fp16", 9, 1001, Config("rows", 1024, 2, 4, w_shift=True, row_edges=True)),
                             ("bf16", 5, 4097, Config("rows", 4096, 1, 4, w_shift=True, row_edges=True)),
                             ("fp32", 6, 203, Config("rows", 256, 4, 4, w_shift=True, row_edges=True)),
                             ("fp16", 7, 1001, Config("rows", 1024, 4, 4, row_edges=True)),
                             ("bf16", 5, 1001, Config("rows", 1024, 1, 4, w_shift=True)),
                             ("bf16", 3, 1001, replace(chunked(256), w_shift=True)),
                             ("fp16", 3, 1003, Config("segments", 256, 1, 4, w_shift=True)),
                             ("fp32", 3, 1001, Config("segments", 256, 1, 4, w_shift=True)),
                             ("fp16", 3, 1001, Config("segments", 256, 1, 4, w_shift=True, reload=True)),
                             ("bf16", 2, 1024, Config("segments", 256, 1, 4, reload=True))):
        flags = "-w-shift" * cfg.w_shift + "-row-edges" * cfg.row_edges + "-reload" * cfg.reload
        cases.append((f"{cfg.kernel}{flags}[{dtype},N={N},ROWS={cfg.rows}]", (dtype, M, N, True, cfg)))
    # 16-bit segments keeping x as loaded (x16)
    for dtype, M, N, cfg in (("fp16", 3, 1024, Config("segments", 256, 1, 4, x16=True)),
                             ("bf16", 3, 1001, Config("segments", 256, 1, 4, x16=True))):
        cases.append((f"{cfg.kernel}-x16[{dtype},M={M},N={N},SEG={cfg.block}]", (dtype, M, N, True, cfg)))
    for dtype, M, N, cfg in (("fp16", 9, 1001, Config("rows", 1024, 2, 4, row_edges=True, w_realign=True)),
                             ("fp32", 6, 203, Config("rows", 256, 4, 4, row_edges=True, w_realign=True))):
        cases.append((f"rows-w-realign[{dtype},N={N},ROWS={cfg.rows}]", (dtype, M, N, True, cfg)))
    # same_phase: rows V apart share a program (M not a multiple of V * ROWS, so the last group
    # has masked rows), w by each of its three ways
    for dtype, M, N, cfg in (("fp32", 13, 1001, Config("rows", 1024, 2, 4, row_edges=True, w_realign=True, same_phase=True)),
                             ("fp16", 21, 1001, Config("rows", 1024, 2, 4, w_shift=True, row_edges=True, same_phase=True)),
                             ("bf16", 19, 203, Config("rows", 256, 4, 4, row_edges=True, same_phase=True)),
                             ("fp32", 9, 203, Config("rows", 256, 2, 4, w_shift=True, row_edges=True, pdl=True, same_phase=True))):
        cases.append((f"rows-same-phase[{dtype},M={M},N={N},ROWS={cfg.rows}]", (dtype, M, N, True, cfg)))
    for dtype, hint in (("fp16", "cg"), ("bf16", "evict_first"), ("fp32", "cs")):
        cases.append((f"rows-hint-{hint}[{dtype},N=1001]",
                      (dtype, 5, 1001, True, Config("rows", 1024, 2, 4, w_shift=True, row_edges=True, hint=hint))))
    # the tile normalized in pieces (each w kind; a second piece partly or wholly past the body),
    # and 16-bit x kept as loaded (x16); one warp, so that small pieces still give every thread a
    # 16-byte run (validate)
    for dtype, M, N, cfg in (("fp16", 9, 1001, Config("rows", 1024, 2, 1, w_shift=True, row_edges=True, pdl=True,
                                                      pieces=2, x16=True)),
                             ("fp32", 13, 1001, Config("rows", 1024, 2, 1, row_edges=True, w_realign=True,
                                                       same_phase=True, pieces=2)),
                             ("bf16", 7, 1001, Config("rows", 1024, 1, 1, row_edges=True, w_realign=True, pieces=2)),
                             ("fp16", 5, 203, Config("rows", 512, 2, 1, row_edges=True, pieces=2)),
                             ("bf16", 6, 256, Config("rows", 256, 2, 1, pieces=2, x16=True, hint="cs")),
                             ("fp32", 5, 200, Config("rows", 512, 1, 1, pieces=2)),
                             ("fp16", 7, 1001, Config("rows", 1024, 1, 1, row_edges=True, w_realign=True, pieces=4,
                                                      x16=True)),
                             ("fp32", 11, 1001, Config("rows", 1024, 2, 1, row_edges=True, w_realign=True,
                                                       same_phase=True, pieces=4)),
                             ("bf16", 5, 1001, Config("rows", 1024, 1, 1, w_shift=True, pieces=4)),
                             # w_ahead: each w kind, one piece or several, the last piece past the body
                             ("fp16", 7, 1001, Config("rows", 1024, 1, 1, row_edges=True, w_realign=True, pieces=4,
                                                      w_ahead=True)),
                             ("fp32", 11, 1001, Config("rows", 1024, 2, 1, row_edges=True, w_realign=True,
                                                       same_phase=True, pieces=2, w_ahead=True)),
                             ("bf16", 9, 1001, Config("rows", 1024, 2, 1, w_shift=True, row_edges=True, pdl=True,
                                                      pieces=4, w_ahead=True)),
                             ("fp16", 5, 200, Config("rows", 512, 1, 1, pieces=2, w_ahead=True)),
                             ("fp32", 6, 256, Config("rows", 256, 2, 1, w_ahead=True)),
                             # w_branch: every phase (odd N, 8+ rows), one row a tile or same-phase rows
                             ("bf16", 17, 1001, Config("rows", 1024, 1, 1, row_edges=True, w_realign=True, pieces=4,
                                                       w_ahead=True, w_branch=True)),
                             ("fp32", 13, 1001, Config("rows", 1024, 2, 1, row_edges=True, w_realign=True,
                                                       same_phase=True, pieces=2, w_branch=True))):
        cases.append((f"rows-pieces{'-x16' * cfg.x16}{'-w-ahead' * cfg.w_ahead}{'-w-branch' * cfg.w_branch}"
                      f"[{dtype},M={M},N={N},BLOCK_N={cfg.block},{cfg.pieces}]",
                      (dtype, M, N, True, cfg)))
    cases.append(("rows-x16[bf16,N=1001,no-w]", ("bf16", 4, 1001, False, Config("rows", 1024, 1, 4, x16=True))))
    cases.append(("rows-w-ahead[fp16,N=1001,no-w]",
                  ("fp16", 4, 1001, False, Config("rows", 1024, 1, 1, row_edges=True, pieces=4, w_ahead=True))))
    cases.append(("rows-w-shift-pdl[bf16,N=1001,ROWS=2]",
                  ("bf16", 5, 1001, True, Config("rows", 1024, 2, 4, w_shift=True, row_edges=True, pdl=True))))
    cases.append(("w-shift-no-w[fp16,N=1001]",
                  ("fp16", 3, 1001, False, Config("rows", 1024, 1, 4, w_shift=True, row_edges=True))))
    cases.append(("w-shift-strided[fp16,N=100,stride=131]",
                  ("fp16", 4, 100, True, Config("rows", 128, 1, 4, w_shift=True, row_edges=True), 131)))
    # persistent rows tiles: more tiles than the 4 programs the CPU launch gets, so each loops; the
    # last tile short (M not a multiple of ROWS)
    persistent = lambda cfg: replace(cfg, persistent=True, stages=2)  # noqa: E731
    for dtype, M, N, cfg in (("fp32", 11, 1001, persistent(Config("rows", 1024, 1, 4, row_edges=True, w_realign=True))),
                             ("fp16", 9, 1001, persistent(Config("rows", 1024, 2, 4, w_shift=True, row_edges=True))),
                             ("bf16", 13, 256, persistent(Config("rows", 256, 1, 4))),
                             ("fp32", 10, 203, persistent(Config("rows", 256, 1, 4)))):
        cases.append((f"rows-persistent[{dtype},M={M},N={N},ROWS={cfg.rows}]", (dtype, M, N, True, cfg)))
    for kernel, cfg in (("rows", None), ("chunked", chunked(256)), ("segments", Config("segments", 256, 1, 4)),
                        ("rows-w-shift", Config("rows", 1024, 2, 4, w_shift=True, row_edges=True)),
                        ("rows-persistent", persistent(Config("rows", 1024, 1, 4, row_edges=True))),
                        ("rows-pieces-x16", Config("rows", 1024, 2, 4, w_shift=True, row_edges=True, pieces=2,
                                                   x16=True))):
        cases.append((f"nan-inf-{kernel}[bf16,N=1001,eps=0]", ("bf16", 4, 1001, True, cfg, None, 0.0, True)))
    checks = [(name, functools.partial(_interpreter_case, *args)) for name, args in cases]
    op_cases = [
        ("op[1-D,fp32]", ((300,), 1, "fp32", True, 1e-5)),
        ("op[3-D,n=2,bf16,no-w,eps=None]", ((2, 3, 5, 24), 2, "bf16", False, None)),
        ("op[3-D,n=1,fp16,row-slice]", ((2, 3, 129), 1, "fp16", True, 0.0, True)),
        ("op[empty rows,fp16]", ((0, 64), 1, "fp16", True, 1e-6)),
    ]
    return checks + [(name, functools.partial(_interpreter_op_case, *args)) for name, args in op_cases]

"""RMSNorm forward kernels (plain Triton): y = x * rsqrt(mean(x^2) + eps) * w, FP32 math.

Bandwidth-bound: everything below serves one goal, 16-byte accesses with enough bytes in
flight, x read once from DRAM and y written once.

Triton rather than Gluon, measured: a Gluon kernel staging each row through shared memory by TMA
(one CTA a row, the row's boxes behind one mbarrier per chunk, TMA stores; commit f66e032,
BENCHMARKS.md session 19) was slower than these kernels on all 8 aligned suite shapes it served,
0.58x-0.98x of their speed.
A persistent Gluon kernel streaming 16-bit rows through a TMA ring (two or three programs an SM,
each keeping its next rows' copies in flight while it normalizes the current one from shared
memory; commits 3f71267-eb91fde, BENCHMARKS.md session 48) was slower too, on all six shapes
timed, 0.83x-0.95x of these kernels' speed at best.

Row layouts (the launcher picks one per call and passes it as constexprs; V = 16 bytes
divided by the element size, i.e. 8 for FP16/BF16 and 4 for FP32):
  ALIGNED  N and the row stride are multiples of V and x is 16-byte aligned. Each row is a run
           of whole 16-byte vectors; w's loads vectorize as well. ``N // V * V`` in the kernel
           is how Triton's alignment analysis learns this (``tl.multiple_of`` does not apply to
           scalars).
  SPLIT    contiguous rows with N not a multiple of V: row r starts r*N elements in, so its
           start drifts off 16-byte alignment and a naive load degrades to 2- or 4-byte
           accesses. Each row is cut into an aligned body [ceil(s/V)*V, floor((s+N)/V)*V),
           loaded and stored as 16-byte vectors, plus a head and a tail of fewer than V elements
           each, handled as scalars in a 2V-lane edge tile. w is read at the body's column
           offset, which is not aligned: scalar loads, but of a vector every row shares, so
           they hit L1/L2 and cost issue slots, not DRAM bandwidth.
           Not TMA: a TMA copy whose first element is not 16-byte aligned is an illegal instruction
           on the H200 (a 1-D descriptor of the flat x, rows of 4097-16385, commit f66e032), so
           TMA cannot land an unaligned row at offset 0 of shared memory.
  GENERIC  any other row-contiguous layout (rows with an odd stride, x not 16-byte aligned):
           plain masked loads, correct at any alignment, vectorized where Triton can prove it.

rms_norm_rows_kernel -- the row fits in registers (one pass, no loop).
  Tile [ROWS, BLOCK_N] per program, BLOCK_N the next power of two of the body and ROWS > 1 for
  short rows, so a program still moves several KB (configs.py sizes it to ~16 values per
  thread: two 16-byte vectors of FP16/BF16, four of FP32). Layout (Triton's blocked layout for
  a vectorized load): each thread holds 16-byte runs along the row, lanes then warps continue
  along the row, warps left over spread across rows. Shared memory: only the cross-warp step of
  tl.sum (a few floats per warp, one barrier). Without PERSISTENT no staging, no pipelining:
  occupancy (several programs per SM) keeps enough loads in flight.

  PERSISTENT (configs.Config.persistent; sweep.py --new, not in TUNED until measured): a grid
  of programs_per_sm programs an SM, each looping over the row tiles (tl.range, num_stages =
  STAGES). Triton's pipeliner then issues the next tile's loads (x, and w's tile: the loop does
  not hoist it) as cp.async into shared memory while this tile reduces and stores, STAGES - 1
  buffers per load: FP32 [16384] with w realigned takes 192 KB at 2 stages. Why: where the tile
  needs ~110 registers over 512 threads (FP32 rows of 16385) an SM holds one CTA, one row in
  flight, and nothing loads while that row reduces and stores.

  HINT (configs.Config.hint): x's loads and y's stores marked as used once: "cg" (x past L1),
  "cs" (that, and y stored streaming), "evict_first" (both first out of L1). Measured: "cs" made
  FP32 rows of 32768 3.5 % faster and nothing else; TUNED has it there alone.

  PIECES (configs.Config.pieces: 1, 2, 4 or 8): the tile's columns as that many [ROWS, BLOCK_N /
  PIECES] pieces, each thread holding its 16-byte runs of every piece (configs.validate keeps at
  least one run a thread in each: W_REALIGN's shift takes a whole run). All pieces' loads are
  issued first and reduced together; after the row reduction each piece loads its w, normalizes
  and stores before the next piece loads its w (ptxas keeps that order, SASS: w may alias y). So
  the first y stores leave after one piece's w round trip instead of the whole tile's, and w's
  registers are a piece's; total registers move either way (sm_90a: FP16 rows[16384,1,w=8] 107
  in one piece, 113 in four; FP32 two same-phase rows of 16385 over 16 warps 128 and 16 bytes
  of spills in one, 125 and none in two). With X16 (configs.Config.x16) 16-bit x stays as
  loaded until its piece is normalized (keep_16_bit). With W_AHEAD (configs.Config.w_ahead) each
  piece's w is loaded one piece early, the first piece's right after x's loads, so it is in flight
  through the row reduction and each later one while the previous piece is stored: in pieces
  without it, a tile makes its pieces' w round trips one after another. Without W_AHEAD, x * rstd
  is computed before w is loaded: the other order spills FP32 rows[32768,1,w=32] (16 bytes, 3 %
  slower on the H200). Measured (BENCHMARKS.md
  session 50): FP16 rows of 65536 as one 16-warp tile in two pieces with X16 ran at 3.8 TB/s where
  every earlier layout stopped at 3.4; 16-bit rows of 16385 gained with w realigned in pieces (its
  two w vectors a run are what made it lose in one piece), most in eight with W_AHEAD (FP16 37.7
  us against 39.2 for the shifted copies); FP32 rows of 16385 and 32769 gained in four pieces over
  32 warps.

rms_norm_chunked_kernel -- rows too long for registers (two passes, the second from L2).
  Persistent grid, a few programs per SM, each normalizing whole rows in turn. Tile [CHUNK],
  same per-thread 16-byte runs. Pass 1 streams the row chunk by chunk into a [CHUNK] FP32
  accumulator (one cross-warp reduction per row); tl.range pipelines the loads STAGES deep
  through shared memory with cp.async (STAGES - 1 chunk buffers, per loaded tensor), lines
  marked evict_last. Pass 2 walks the chunks newest-first, so the re-read starts with the lines
  most recently brought into L2, and writes y marked evict_first. Few programs per SM keep the
  rows in flight (programs x row bytes) small next to the 50 MB L2.

rms_norm_segments_kernel -- long rows read from DRAM exactly once (one pass, several CTAs a row).
  Why: the chunked kernel's second pass is meant to hit L2, but 264 programs x a 224-448 KB row
  is 60-120 MB in flight against a 50 MB L2, so much of the re-read comes from DRAM (measured
  2.9-3.4 TB/s on rows of 128-448 KB, the issue asks 3.5). Here a row of N is cut into SEGMENTS
  pieces of SEG elements (SEG * SEGMENTS >= the row body) and each piece goes to its own CTA,
  which keeps its piece in registers exactly like the rows kernel ([SEG] tile, 16-byte runs per
  thread): load, sum of squares, publish the partial, wait for the row's other pieces,
  normalize from registers, store.
  Work split: grid = M * SEGMENTS. A CTA takes a ticket from an atomic counter when it starts
  (not its program id) and serves piece ticket % SEGMENTS of row ticket // SEGMENTS.
  Cross-CTA reduction, through a zeroed int32 workspace SYNC[1 + M] and FP32 PARTIAL[M, SEGMENTS]:
    store PARTIAL[row, piece]; bar.sync; atom.add.acq_rel.gpu SYNC[1 + row] += 1, then poll it
    (an acquire atomic add of 0, which Triton emits as ld.acquire.gpu) until it reads SEGMENTS;
    bar.sync; every CTA of the row sums PARTIAL[row, 0..SEGMENTS) in the same order (.cg loads),
    so all pieces share one bitwise rstd. This is the CUDA cooperative-groups grid-sync pattern:
    the barrier before the release orders the partial store (whichever thread made it) before
    the counter update; the SASS check looks for ATOMG.E.ADD.STRONG.GPU and MEMBAR.ALL.GPU.
    SYNC is zeroed per launch (one memset, a few us against the >= 100 us these rows take).
  Forward progress without a cooperative launch: tickets go out in the order CTAs start, and a
  CTA waits only for the other pieces of its own row. Every row below the newest ticket's row
  has all its pieces started (resident or finished), so only the newest row can wait on CTAs
  that have not started, i.e. at most SEGMENTS - 1 resident CTAs are blocked on unstarted ones.
  Whenever the GPU holds at least SEGMENTS of these CTAs at once (configs cap SEGMENTS at 16;
  an H200 holds >= 132) some resident CTA can finish or a slot is free: no deadlock. A polling
  bound (MAX_POLLS, seconds of polling) turns a broken assumption (e.g. MPS with < SEGMENTS
  CTA slots) into NaN rows instead of a hung GPU.
  Bandwidth argument: DRAM traffic is the rows kernel's (x once, y once, w from L2), and per CTA
  the footprint is the rows kernel's at BLOCK_N = SEG, which measured 3.6-3.8 TB/s on FP32 rows
  of 16-32K. What is added is latency per CTA: the ticket atomic and the row sync, ~1-2 us of
  L2 round trips. With 2 CTAs per SM (SEG=16384 FP32 at 16 warps: 32 values per thread, 62
  registers) each SM holds 128 KB of loads in flight, ~4x what covers DRAM latency at 4 TB/s
  (30 KB/us per SM x ~1 us), so one CTA's wait overlaps the other's loads. Expected >= 3.5 TB/s
  on the 128-448 KB rows where chunked gets 2.9-3.4; sweep.py times it as a candidate, and
  TUNED takes it only once measured faster.
  Testing on CPU: Triton's interpreter runs programs one after another, which would deadlock
  the wait; interpreter checks run this kernel under ``concurrent_interpreter`` (one thread per
  program), which checks the protocol, not the GPU memory model.
  Launched as thread-block clusters instead (each row's pieces one cluster, synced by the cluster
  barrier: no ticket, no polling, no zeroed workspace), it measured slower on every case
  (BENCHMARKS.md session 49), so the tickets stay.

All kernels read rows at ``row * stride_row`` and write y contiguous (row * N), store one FP32
rstd per row, and take M unspecialized (the launcher caches each compiled kernel under
everything else Triton specializes on).

Shifted weight (W_SHIFT, SPLIT rows with a weight; configs.Config.w_shift; not served by
TUNED until the GPU sweep says so). SPLIT rows move x and y as 16-byte vectors, but their body's
w loads are scalar (the body starts at row column c0 = (-s) mod V, one of V values, and w at c0
is misaligned): 8 (16-bit) or 4 (FP32) load instructions per 16-byte x vector, each touching
four cache lines across a warp. Likely why 16-bit SPLIT rows stop at 2.4-3.1 TB/s where FP32's
reach 3.75 (SASS, FP16 rows[4096,1,w=4]: 4 LDG.128 + 42 LDG.U16, 584 instructions; ALIGNED: 8
LDG.128, 320). With W_SHIFT the launcher first runs rms_norm_shift_weight_kernel, which writes V
shifted copies of w, copy k = w[k:] at k * NP (NP = N rounded up to V, so each copy starts
16-byte aligned; V * NP elements, L2-resident), and the body reads copy c0 at ``c0 * NP +
column`` with 16-byte loads like x; head and tail read copy 0 (= w). Cost: one more launch and
V * NP elements written per call. Nothing is cached across calls, so a weight changed in place
(even through .data, which no version counter sees) is always read fresh.
Copies through PDL (W_PDL, the rows kernel with W_SHIFT; configs.Config.pdl): the second launch
is what W_SHIFT costs beyond its copies (FP16 2048x16385: 40.8 us against 35.2 for aligned rows of
16384). With W_PDL the rows kernel is launched as a programmatic dependent of the copies' kernel
(launch_pdl), which lets it start at once (griddepcontrol.launch_dependents); its CTAs load x and
reduce while the copies are written, and wait for them (griddepcontrol.wait: the copies' kernel
complete, its writes visible) just before the first read of w. Stream order is unchanged for
everything else: the copies' kernel itself starts after the work before it.
Realigned weight (W_REALIGN, the rows kernel; configs.Config.w_realign): the same 16-byte w loads
without copies or a second launch. Each run of V body columns loads the two aligned w vectors it
straddles (w[j:j+V], w[j+V:j+2V], j a multiple of V) and an inline PTX barrel shift picks
w[j+c0 : j+c0+V] from their registers (_REALIGN_16/_REALIGN_32). The asm takes V values per
instance (pack=V), which is one aligned run only if each thread's tile holds whole runs: the CPU
test checks the TTGIR layout (sizePerThread [1, V]). Needs a 16-byte-aligned w (the launcher
drops it otherwise). Cost: the second vector and the shift's registers (FP16 rows[16384,1,w=8]:
145 against 117 with W_SHIFT), so on the H200 it won only FP32 rows (BENCHMARKS.md, session 14);
in pieces it won 16-bit rows of 16385 (session 50), and with W_BRANCH every 16-bit SPLIT row.
Phase branches (W_BRANCH, with W_REALIGN, tiles of one row or SAME_PHASE rows; configs.Config.
w_branch): a tile's rows share one phase c0, uniform across the CTA, so the kernel branches once
on it into V copies of the tile, each compiled with c0 as a constant (PHASE): the barrel shift
becomes register moves ptxas folds away (even c0; c0 = 0 loads one vector, no shift) or, for
16-bit odd c0, four prmt a run (_phase_shift). The selects and their operands go: FP16
rows[16384,1,w=8] in eight pieces with W_AHEAD, 122 registers and 792 instructions a thread
without, 112 and about 510 a path with it (V paths, 4096 instructions in the binary). On the H200
(BENCHMARKS.md session 51) it made every 16-bit SPLIT case of the suite 2-5 % faster (FP16
8192x4097 34.6 us against 36.3; 2048x16385 37.1 over 16 warps in four pieces against 38.0) and
FP32 rows of 8193 and 32769 too; only the CTA-uniform branch makes this cheap: one row a tile
(or rows V apart) is what gives a tile a single c0.
Row edges (ROW_EDGES, the rows kernel; configs.Config.row_edges): the [ROWS, 2V] head/tail
tile takes the rows tile's layout (8 lanes a thread, replicated across the CTA): ~200
instructions a thread whatever the tile. ROW_EDGES instead handles each row's edges from its
scalar row index (a [2V] tile Triton spreads a lane a thread). SASS, FP16 rows[4096,1,w=4]: 8
LDG.128 + 3 LDG.U16, 416 instructions with both (544 with W_SHIFT alone); FP32: 384 against 488.
Either way the edges' x is loaded right after the body's and kept for the output: loaded after
the row reduction (as up to 72fc4ba), its round trip (lines no body load touched, so usually
DRAM) came after the reduction's on every tile's path. On one H200 (BENCHMARKS.md session 51,
23d5bc3 against 72fc4ba, w's edges then early on every tile) moving them took FP16 2048x16385
from 38.6 to 37.6 us and FP32 from 72.7 to 71.5.
Same-phase rows (SAME_PHASE, the rows kernel, SPLIT rows; configs.Config.same_phase): row r starts
r*N elements in, so rows V apart start at the same 16-byte phase c0 and read w from the same column
offset. With SAME_PHASE a tile's ROWS rows are V apart (tile t of group t // V takes rows t % V,
t % V + V, ...; the grid is V tiles per group of V * ROWS rows) and one [BLOCK_N] w tile, shifted
copy c0 or realigned once, serves them all. Why: consecutive rows differ in phase, so a two-row
SPLIT tile needs two w tiles and spills; FP32 rows of 16385 therefore ran one row a CTA (one 64 KB
row in flight an SM) where aligned rows of 16384 run two. On the H200 two same-phase FP32 rows of 16385
with w realigned (128 registers at 16 warps, 16 bytes of spills) took 76.6 us against 81.0 for one row a
tile, so TUNED has them there; on 16-bit rows and shorter FP32 rows they lost (BENCHMARKS.md session 24).
Segments RELOAD (configs.Config.reload): the segments kernel keeps its piece of x in registers
across the row sync, as FP32: 128 16-bit values a thread (256 bytes, the bytes a thread of FP32's
winning segments[SEG=8192,w=4]) take ~220 registers, so few CTAs fit an SM and the bytes in
flight stay below FP32's. With RELOAD the piece is loaded again after the sync (it was read
microseconds before: L2, often L1), so registers hold x only until its sum of squares: more
CTAs an SM, same DRAM traffic, twice the L2 reads.
Segments X16 (configs.Config.x16, 16-bit x): the other way to halve those registers. x stays in
registers across the row sync in its loaded 16-bit form (two values a 32-bit register) and is
converted to FP32 again after it. Written plainly, LLVM merges the second conversion into the
first and keeps the FP32 values alive; an identity PTX move (inline asm, a register of two
values) between them keeps them apart (keep_16_bit). Toy check, 128 FP16 values a thread, 4
warps: 152 registers as FP32, 96 with X16, +128 instructions. Triton's interpreter runs no
inline asm, so under TRITON_INTERPRET the move is left out (same values; only registers differ).
"""
import os

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

_INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


@triton.jit
def keep_16_bit(x, X16: tl.constexpr):
    """x itself; with X16, through an identity PTX move (see X16 in the header)."""
    if X16 and not _INTERPRETED:
        return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=x.dtype, is_pure=True, pack=2)
    else:
        return x


# BF16 to FP32 of a register holding two values: the low one shifted up, the high one masked.
# LLVM's conversion extracts the high value first (PRMT, then a shift): three instructions a pair
# where these take two, as HADD2.F32 does for FP16 (sm_90a, BF16 rows[16384,1,w=8] in eight
# pieces: 848 instructions a thread, 784 with this).
_BF16_PAIR_TO_FP32 = tl.constexpr("{ shl.b32 $0, $2, 16; and.b32 $1, $2, 0xFFFF0000; }")


@triton.jit
def to_fp32(x, PAIRS: tl.constexpr):
    """x as FP32; with PAIRS (every thread holds x in 16-byte runs: ALIGNED and SPLIT tiles), BF16
    through _BF16_PAIR_TO_FP32, which needs whole pairs a thread (a GENERIC tile of rows of one
    value has one a thread, and the asm would not compile)."""
    if x.dtype == tl.bfloat16 and PAIRS and not _INTERPRETED:
        return tl.inline_asm_elementwise(_BF16_PAIR_TO_FP32, "=r,=r,r", [x], dtype=tl.float32, is_pure=True, pack=2)
    else:
        return x.to(tl.float32)


@triton.jit
def _edge_lanes(s, body_start, body_len, N, V: tl.constexpr):
    """Offsets and mask of a SPLIT row's head [s, body_start) and tail [body_end, s+N), as one
    2V-lane tile (lanes < V: head, lanes >= V: tail). Works on scalars or [ROWS, 1] columns."""
    k = tl.arange(0, 2 * V)
    row_end = s + N
    head_end = tl.minimum(body_start, row_end)
    tail_start = tl.maximum(body_start + body_len, body_start)  # body_len < 0: the row has no body
    is_head = k < V
    pos = tl.where(is_head, s + k, tail_start + (k - V))
    mask = tl.where(is_head, pos < head_end, pos < row_end)
    return pos, mask


@triton.jit
def _row_edge_lanes(row, M, N, stride_row, V: tl.constexpr):
    """``_edge_lanes`` of one SPLIT row from its scalar index (masked off past M): a [2V] tile
    free of the rows tile's layout, so Triton spreads it a lane a thread (ROW_EDGES)."""
    s = tl.cast(row, tl.int64) * stride_row
    body_start = (s + V - 1) // V * V
    pos, mask = _edge_lanes(s, body_start, (s + N) // V * V - body_start, N, V)
    return pos, mask & (row < M)


@triton.jit
def _row_edge_w(W, e_pos, e_mask, tile, r, stride_row, ROWS: tl.constexpr, V: tl.constexpr,
                SAME_PHASE: tl.constexpr):
    """w at the edge lanes ``e_pos`` of the tile's r-th row (``_row_edge_lanes``)."""
    row = _tile_row(tile, r, ROWS, V, SAME_PHASE)
    return tl.load(W + (e_pos - tl.cast(row, tl.int64) * stride_row), mask=e_mask, other=0.0)


@triton.jit
def _body_w_offset(c0, N, V: tl.constexpr, W_SHIFT: tl.constexpr):
    """Where a SPLIT row's body (row column c0 on) finds its w: w itself at c0 (scalar loads), or
    the start of shifted copy c0 (16-byte aligned: ``(N + V - 1) // V * V`` tells Triton that NP
    is a multiple of V, which an argument could not)."""
    if W_SHIFT:
        return c0 * ((N + V - 1) // V * V)
    else:
        return c0


# W_REALIGN, in PTX: from two aligned vectors of w (lo = w[j : j+V], hi = w[j+V : j+2V]) one
# vector w[j+c0 : j+c0+V], c0 = the body's first row column (< V). A barrel shifter over the
# eight 32-bit words of lo, hi: by 2 words if c0 & 4, by 1 word if c0 & 2 (16-bit only), then
# for 16-bit by half a word if c0 & 1 (prmt 0x5432 takes the high half of one word and the low
# half of the next). Operands: $0-$3 out, $4-$7 lo, $8-$11 hi, $12 c0 (one per element; the
# first is read).
_REALIGN_16 = tl.constexpr("""{
.reg .pred p4, p2, p1;
.reg .b32 m, o, t0, t1, t2, t3, t4, t5, u0, u1, u2, u3, u4;
and.b32 m, $12, 4; setp.ne.b32 p4, m, 0;
and.b32 m, $12, 2; setp.ne.b32 p2, m, 0;
and.b32 m, $12, 1; setp.ne.b32 p1, m, 0;
selp.b32 t0, $6, $4, p4; selp.b32 t1, $7, $5, p4; selp.b32 t2, $8, $6, p4;
selp.b32 t3, $9, $7, p4; selp.b32 t4, $10, $8, p4; selp.b32 t5, $11, $9, p4;
selp.b32 u0, t1, t0, p2; selp.b32 u1, t2, t1, p2; selp.b32 u2, t3, t2, p2;
selp.b32 u3, t4, t3, p2; selp.b32 u4, t5, t4, p2;
prmt.b32 o, u0, u1, 0x5432; selp.b32 $0, o, u0, p1;
prmt.b32 o, u1, u2, 0x5432; selp.b32 $1, o, u1, p1;
prmt.b32 o, u2, u3, 0x5432; selp.b32 $2, o, u2, p1;
prmt.b32 o, u3, u4, 0x5432; selp.b32 $3, o, u3, p1;
}""")
_REALIGN_32 = tl.constexpr("""{
.reg .pred p2, p1;
.reg .b32 m, t0, t1, t2, t3, t4;
and.b32 m, $12, 2; setp.ne.b32 p2, m, 0;
and.b32 m, $12, 1; setp.ne.b32 p1, m, 0;
selp.b32 t0, $6, $4, p2; selp.b32 t1, $7, $5, p2; selp.b32 t2, $8, $6, p2;
selp.b32 t3, $9, $7, p2; selp.b32 t4, $10, $8, p2;
selp.b32 $0, t1, t0, p1; selp.b32 $1, t2, t1, p1; selp.b32 $2, t3, t2, p1; selp.b32 $3, t4, t3, p1;
}""")
_REALIGN_16_OPERANDS = tl.constexpr("=r,=r,=r,=r" + ",r" * 16)  # out; lo, hi (2 values a register); c0 x 8
_REALIGN_32_OPERANDS = tl.constexpr("=r,=r,=r,=r" + ",r" * 12)  # out; lo, hi; c0 x 4
_PHASE_SHIFT_OPERANDS = tl.constexpr("=r,=r,=r,=r" + ",r" * 8)  # out; lo, hi


@triton.constexpr_function
def _phase_shift(V, phase):
    """W_BRANCH's PTX for a known c0 = ``phase`` (> 0): the words of w[j+c0 : j+c0+V] taken from
    lo ($4-$7) and hi ($8-$11) as they are (moves, which ptxas folds away) or, for 16-bit and
    odd c0, as the high half of one word and the low half of the next (prmt 0x5432)."""
    words = []
    for i in range(4):
        if V == 8 and phase % 2:
            a = 4 + phase // 2 + i
            words.append(f"prmt.b32 ${i}, ${a}, ${a + 1}, 0x5432;")
        else:
            words.append(f"mov.b32 ${i}, ${4 + (phase // 2 if V == 8 else phase) + i};")
    return "{ " + " ".join(words) + " }"


@triton.jit
def _realigned_w(W, c0, cols, N, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, V: tl.constexpr,
                 PHASE: tl.constexpr):
    """[ROWS, BLOCK_N] tile of w[c0 + col] (c0: [ROWS] int32 in [0, V)), for SPLIT bodies whose
    columns come in aligned runs of V (W_REALIGN). Two 16-byte loads of w per run and a register
    shift instead of V scalar loads. w is read up to N rounded up to V: the rest of the 16-byte
    line holding w's last element (never a fault; the values land only in masked-off lanes).
    PHASE >= 0: every c0 is PHASE (W_BRANCH), so the shift is fixed: one load at PHASE 0."""
    NP = (N + V - 1) // V * V
    if _INTERPRETED:  # no inline PTX in the interpreter: the same values, gathered
        if PHASE >= 0:  # from the branch's phase, not the rows', so the branch is checked too
            c0 = tl.zeros_like(c0) + PHASE
        return tl.load(W + c0[:, None] + cols[None, :], mask=c0[:, None] + cols[None, :] < N, other=0.0)
    else:
        lo = tl.load(W + cols, mask=cols < NP, other=0.0)
        if PHASE == 0:  # the body starts 16-byte aligned: w[j : j+V] is lo itself
            w = tl.broadcast_to(lo[None, :], (ROWS, BLOCK_N))
        else:
            hi = tl.load(W + V + cols, mask=cols + V < NP, other=0.0)
            shift = tl.broadcast_to(c0[:, None], (ROWS, BLOCK_N))
            if V == 8:
                lo16 = tl.broadcast_to(lo.to(tl.int16, bitcast=True)[None, :], (ROWS, BLOCK_N))
                hi16 = tl.broadcast_to(hi.to(tl.int16, bitcast=True)[None, :], (ROWS, BLOCK_N))
                if PHASE > 0:
                    w = tl.inline_asm_elementwise(_phase_shift(V, PHASE), _PHASE_SHIFT_OPERANDS, [lo16, hi16],
                                                  dtype=tl.int16, is_pure=True, pack=8)
                else:
                    w = tl.inline_asm_elementwise(_REALIGN_16, _REALIGN_16_OPERANDS, [lo16, hi16, shift],
                                                  dtype=tl.int16, is_pure=True, pack=8)
            else:
                lo32 = tl.broadcast_to(lo.to(tl.int32, bitcast=True)[None, :], (ROWS, BLOCK_N))
                hi32 = tl.broadcast_to(hi.to(tl.int32, bitcast=True)[None, :], (ROWS, BLOCK_N))
                if PHASE > 0:
                    w = tl.inline_asm_elementwise(_phase_shift(V, PHASE), _PHASE_SHIFT_OPERANDS, [lo32, hi32],
                                                  dtype=tl.int32, is_pure=True, pack=4)
                else:
                    w = tl.inline_asm_elementwise(_REALIGN_32, _REALIGN_32_OPERANDS, [lo32, hi32, shift],
                                                  dtype=tl.int32, is_pure=True, pack=4)
            w = w.to(W.dtype.element_ty, bitcast=True)
        return w


@triton.jit
def rms_norm_shift_weight_kernel(W, WS, N, BLOCK: tl.constexpr, V: tl.constexpr, PDL: tl.constexpr):
    """WS[k * NP + j] = w[k + j] (0 past the row) for k < V, NP = N rounded up to V: the shifted
    copies W_SHIFT reads. Grid: cdiv(NP, BLOCK) programs, each writing column block j of every
    copy from one [V, BLOCK] load (scalar for odd k; the lines are shared, so L1 serves most).
    One 2-D load rather than copy by copy, where each load waits behind the previous copy's store
    (WS may alias W for all Triton knows): one round trip instead of V. On the H200 both measured
    the same (BENCHMARKS.md session 25), so the copies' cost is not this kernel's latency. PDL: the
    dependent kernel is let go once the load is issued."""
    NP = (N + V - 1) // V * V
    j = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    k = tl.arange(0, V)
    src = k[:, None] + j[None, :]
    w = tl.load(W + src, mask=src < N, other=0.0)
    if PDL and not _INTERPRETED:
        gdc_launch_dependents()
    tl.store(WS + k[:, None] * NP + j[None, :], w, mask=(j < NP)[None, :])


@triton.jit(do_not_specialize=["M"])
def rms_norm_rows_kernel(X, W, Y, RSTD, M, N, stride_row, eps,
                         BLOCK_N: tl.constexpr, ROWS: tl.constexpr, V: tl.constexpr,
                         ALIGNED: tl.constexpr, SPLIT: tl.constexpr, HAS_W: tl.constexpr,
                         W_SHIFT: tl.constexpr, ROW_EDGES: tl.constexpr, W_REALIGN: tl.constexpr,
                         W_PDL: tl.constexpr, PERSISTENT: tl.constexpr, STAGES: tl.constexpr,
                         SAME_PHASE: tl.constexpr, HINT: tl.constexpr, PIECES: tl.constexpr, X16: tl.constexpr,
                         W_AHEAD: tl.constexpr, W_BRANCH: tl.constexpr):
    if PERSISTENT:
        for tile in tl.range(tl.program_id(0), tl.cdiv(M, ROWS), tl.num_programs(0), num_stages=STAGES):
            _rows_tile(X, W, Y, RSTD, M, N, stride_row, eps, tile, BLOCK_N, ROWS, V, ALIGNED, SPLIT, HAS_W,
                       W_SHIFT, ROW_EDGES, W_REALIGN, W_PDL, False, HINT, PIECES, X16, W_AHEAD, -1)
    elif W_BRANCH:  # the tile's rows share one 16-byte phase: a code path for each
        tile = tl.program_id(0)
        phase = _phase(_tile_start(tile, stride_row, ROWS, V, SAME_PHASE), V)
        for k in tl.static_range(V):
            if phase == k:
                _rows_tile(X, W, Y, RSTD, M, N, stride_row, eps, tile, BLOCK_N, ROWS, V, ALIGNED, SPLIT, HAS_W,
                           W_SHIFT, ROW_EDGES, W_REALIGN, W_PDL, SAME_PHASE, HINT, PIECES, X16, W_AHEAD, k)
    else:
        _rows_tile(X, W, Y, RSTD, M, N, stride_row, eps, tl.program_id(0), BLOCK_N, ROWS, V, ALIGNED, SPLIT,
                   HAS_W, W_SHIFT, ROW_EDGES, W_REALIGN, W_PDL, SAME_PHASE, HINT, PIECES, X16, W_AHEAD, -1)


@triton.jit
def _tile_row(tile, r, ROWS: tl.constexpr, V: tl.constexpr, SAME_PHASE: tl.constexpr):
    """Row index of the tile's r-th row (r a scalar or an arange): consecutive rows, or with
    SAME_PHASE rows V apart, tile t of group t // V taking rows t % V, t % V + V, ..."""
    if SAME_PHASE:
        return (tile // V) * (V * ROWS) + tile % V + r * V
    else:
        return tile * ROWS + r


@triton.jit
def _tile_start(tile, stride_row, ROWS: tl.constexpr, V: tl.constexpr, SAME_PHASE: tl.constexpr):
    """Where the tile's first row starts (int64 elements into x)."""
    return tl.cast(_tile_row(tile, 0, ROWS, V, SAME_PHASE), tl.int64) * stride_row


@triton.jit
def _phase(s, V: tl.constexpr):
    """The 16-byte phase of a row starting at s: the row column its aligned body starts at (int32),
    which every row of a one-row or SAME_PHASE tile shares."""
    return ((s + V - 1) // V * V - s).to(tl.int32)


@triton.jit
def _body_mask(row_ok, cols, body_len):
    """[ROWS, len(cols)] mask: the row exists and the column lies in its body."""
    return row_ok[:, None] & (cols[None, :] < body_len[:, None])


@triton.jit
def _piece_w(W, mask, cols, tile, s, body_start, n_cols, N, stride_row, PIECE_N: tl.constexpr, ROWS: tl.constexpr,
             V: tl.constexpr, SPLIT: tl.constexpr, W_SHIFT: tl.constexpr, W_REALIGN: tl.constexpr,
             W_PDL: tl.constexpr, SAME_PHASE: tl.constexpr, PHASE: tl.constexpr):
    """w for columns ``cols`` of the tile's row bodies, as loaded ([ROWS or 1, PIECE_N]); PHASE: the
    rows' known 16-byte phase (W_BRANCH) or -1."""
    if SPLIT and SAME_PHASE:  # one w tile for every row: the first row's phase is theirs
        s0 = _tile_start(tile, stride_row, ROWS, V, SAME_PHASE)
        c0 = _phase(s0, V)
        w_cols = cols < (s0 + N) // V * V - (s0 + c0)
        if W_REALIGN:
            w = _realigned_w(W, tl.full([1], 0, tl.int32) + c0, cols, N, 1, PIECE_N, V, PHASE)
        else:
            if W_PDL and not _INTERPRETED:
                gdc_wait()
            w = tl.load(W + _body_w_offset(c0, N, V, W_SHIFT) + cols, mask=w_cols, other=0.0)[None, :]
    elif SPLIT and W_REALIGN:
        w = _realigned_w(W, (body_start - s).to(tl.int32), cols, N, ROWS, PIECE_N, V, PHASE)
    elif SPLIT:
        if W_PDL and not _INTERPRETED:  # the copies' kernel ran alongside x's loads: wait for it now
            gdc_wait()
        w = tl.load(W + _body_w_offset(body_start - s, N, V, W_SHIFT)[:, None] + cols[None, :],
                    mask=mask, other=0.0)
    else:
        w = tl.load(W + cols, mask=cols < n_cols, other=0.0)[None, :]
    return w


@triton.jit
def _rows_tile(X, W, Y, RSTD, M, N, stride_row, eps, tile,
               BLOCK_N: tl.constexpr, ROWS: tl.constexpr, V: tl.constexpr,
               ALIGNED: tl.constexpr, SPLIT: tl.constexpr, HAS_W: tl.constexpr,
               W_SHIFT: tl.constexpr, ROW_EDGES: tl.constexpr, W_REALIGN: tl.constexpr,
               W_PDL: tl.constexpr, SAME_PHASE: tl.constexpr, HINT: tl.constexpr, PIECES: tl.constexpr,
               X16: tl.constexpr, W_AHEAD: tl.constexpr, PHASE: tl.constexpr):
    """The rows of tile ``tile`` (``_tile_row``) in the rows kernel. HINT marks x's loads and y's
    stores, read and written once: "" none, "cg" x not cached in L1, "cs" that and y stored as
    streaming, "evict_first" both first out of L1. PIECES (1, 2, 4 or 8): the body tile as that many
    column pieces, all loaded first, then normalized and stored piece by piece (PIECES in the
    header). X16: 16-bit x kept as loaded across the row reduction (keep_16_bit). W_AHEAD: each
    piece's w loaded one piece early, the first piece's with x (PIECES in the header)."""
    X_CACHE: tl.constexpr = ".cg" if HINT == "cg" or HINT == "cs" else ""
    Y_CACHE: tl.constexpr = ".cs" if HINT == "cs" else ""
    EVICT: tl.constexpr = "evict_first" if HINT == "evict_first" else ""
    PIECE_N: tl.constexpr = BLOCK_N // PIECES
    PAIRS: tl.constexpr = ALIGNED or SPLIT  # x and w in 16-byte runs a thread (to_fp32)
    rows = _tile_row(tile, tl.arange(0, ROWS), ROWS, V, SAME_PHASE)
    row_ok = rows < M
    r64 = rows.to(tl.int64)
    cols = tl.arange(0, PIECE_N)
    if ALIGNED:
        n_cols = N // V * V
        s = r64 * (stride_row // V * V)
        body_start = s
        body_len = s * 0 + n_cols
        y_start = r64 * n_cols
    elif SPLIT:
        n_cols = N
        s = r64 * stride_row
        body_start = (s + V - 1) // V * V
        body_len = (s + N) // V * V - body_start
        y_start = body_start  # contiguous x: y rows sit at the same offsets
    else:
        n_cols = N
        s = r64 * stride_row
        body_start = s
        body_len = s * 0 + N
        y_start = r64 * N

    xs = ()  # the pieces as loaded, all in flight together
    for p in tl.static_range(PIECES):
        x = tl.load(X + body_start[:, None] + (cols + p * PIECE_N)[None, :],
                    mask=_body_mask(row_ok, cols + p * PIECE_N, body_len), other=0.0,
                    cache_modifier=X_CACHE, eviction_policy=EVICT)
        xs = xs + (x,)
        xf = to_fp32(x, PAIRS)
        if p == 0:
            sq = xf * xf
        else:
            sq += xf * xf
    # SPLIT rows: the edges' x goes out with the body's (issued after the row reduction, its round
    # trip, to lines no body load brought in, would follow it on every tile's path), their w too
    # with W_AHEAD (without it, w's edges load at the end: FP16 rows[8192,1,w=4] with the copies
    # takes 126 registers with them early, 96 without).
    W_EDGES_EARLY: tl.constexpr = HAS_W and W_AHEAD
    if SPLIT and ROW_EDGES:
        x_edges = ()
        w_edges = ()
        for r in tl.static_range(ROWS):
            e_pos, e_mask = _row_edge_lanes(_tile_row(tile, r, ROWS, V, SAME_PHASE), M, N, stride_row, V)
            x_edges = x_edges + (tl.load(X + e_pos, mask=e_mask, other=0.0),)
            if W_EDGES_EARLY:
                w_edges = w_edges + (_row_edge_w(W, e_pos, e_mask, tile, r, stride_row, ROWS, V, SAME_PHASE),)
    elif SPLIT:
        e_pos, e_mask = _edge_lanes(s[:, None], body_start[:, None], body_len[:, None], N, V)
        e_mask = e_mask & row_ok[:, None]
        xe = tl.load(X + e_pos, mask=e_mask, other=0.0).to(tl.float32)
        if W_EDGES_EARLY:
            we = tl.load(W + (e_pos - s[:, None]), mask=e_mask, other=0.0)
    if W_AHEAD and HAS_W:  # the first piece's w in flight with x, through the row reduction
        w_next = _piece_w(W, _body_mask(row_ok, cols, body_len), cols, tile, s, body_start, n_cols, N, stride_row,
                          PIECE_N, ROWS, V, SPLIT, W_SHIFT, W_REALIGN, W_PDL, SAME_PHASE, PHASE)
    sumsq = tl.sum(sq, axis=1)
    if SPLIT and ROW_EDGES:
        for r in tl.static_range(ROWS):
            xe = x_edges[r].to(tl.float32)
            sumsq += tl.where(tl.arange(0, ROWS) == r, tl.sum(xe * xe, axis=0), 0.0)
    elif SPLIT:
        sumsq += tl.sum(xe * xe, axis=1)
    rstd = tl.math.rsqrt(sumsq / N + eps)
    tl.store(RSTD + rows, rstd, mask=row_ok)

    # Each piece's w is loaded after the previous piece's stores; with W_AHEAD one piece earlier,
    # so the next piece's w is in flight while this one is normalized and stored.
    for p in tl.static_range(PIECES):
        piece_cols = cols + p * PIECE_N
        piece_mask = _body_mask(row_ok, piece_cols, body_len)
        if HAS_W and W_AHEAD:  # this piece's w arrived a piece ago; the next one's goes out first
            w = w_next
            if p + 1 < PIECES:
                w_next = _piece_w(W, _body_mask(row_ok, piece_cols + PIECE_N, body_len), piece_cols + PIECE_N,
                                  tile, s, body_start, n_cols, N, stride_row, PIECE_N, ROWS, V, SPLIT, W_SHIFT,
                                  W_REALIGN, W_PDL, SAME_PHASE, PHASE)
            y = to_fp32(keep_16_bit(xs[p], X16), PAIRS) * rstd[:, None] * to_fp32(w, PAIRS)
        else:
            # x * rstd before w's load: the other order spills FP32 rows[32768,1,w=32] (16 bytes)
            y = to_fp32(keep_16_bit(xs[p], X16), PAIRS) * rstd[:, None]
            if HAS_W:
                w = _piece_w(W, piece_mask, piece_cols, tile, s, body_start, n_cols, N, stride_row, PIECE_N, ROWS,
                             V, SPLIT, W_SHIFT, W_REALIGN, W_PDL, SAME_PHASE, PHASE)
                y = y * to_fp32(w, PAIRS)
        tl.store(Y + y_start[:, None] + piece_cols[None, :], y.to(Y.dtype.element_ty), mask=piece_mask,
                 cache_modifier=Y_CACHE, eviction_policy=EVICT)
    if SPLIT and ROW_EDGES:
        for r in tl.static_range(ROWS):
            e_pos, e_mask = _row_edge_lanes(_tile_row(tile, r, ROWS, V, SAME_PHASE), M, N, stride_row, V)
            ye = x_edges[r].to(tl.float32) * tl.sum(tl.where(tl.arange(0, ROWS) == r, rstd, 0.0), axis=0)
            if W_EDGES_EARLY:
                ye = ye * w_edges[r].to(tl.float32)
            elif HAS_W:
                ye = ye * _row_edge_w(W, e_pos, e_mask, tile, r, stride_row, ROWS, V, SAME_PHASE).to(tl.float32)
            tl.store(Y + e_pos, ye.to(Y.dtype.element_ty), mask=e_mask)
    elif SPLIT:
        ye = xe * rstd[:, None]
        if W_EDGES_EARLY:
            ye = ye * we.to(tl.float32)
        elif HAS_W:
            ye = ye * tl.load(W + (e_pos - s[:, None]), mask=e_mask, other=0.0).to(tl.float32)
        tl.store(Y + e_pos, ye.to(Y.dtype.element_ty), mask=e_mask)


@triton.jit
def _row_geometry(r64, N, stride_row, V: tl.constexpr, ALIGNED: tl.constexpr, SPLIT: tl.constexpr):
    """Where one row (int64 index ``r64``) starts (s), where its vector-aligned body starts and how
    long it is, and where its output row starts, for the three row layouts (see the header)."""
    if ALIGNED:
        s = r64 * (stride_row // V * V)
        body_start = s
        body_len = N // V * V
        y_start = r64 * (N // V * V)
    elif SPLIT:
        s = r64 * stride_row
        body_start = (s + V - 1) // V * V
        body_len = (s + N) // V * V - body_start
        y_start = body_start
    else:
        s = r64 * stride_row
        body_start = s
        body_len = N
        y_start = r64 * N
    return s, body_start, body_len, y_start


@triton.jit(do_not_specialize=["M"])
def rms_norm_chunked_kernel(X, W, Y, RSTD, M, N, stride_row, eps,
                            CHUNK: tl.constexpr, STAGES: tl.constexpr, V: tl.constexpr,
                            ALIGNED: tl.constexpr, SPLIT: tl.constexpr, HAS_W: tl.constexpr,
                            W_SHIFT: tl.constexpr):
    cols = tl.arange(0, CHUNK)
    # A while loop and N-only loop bounds below keep this runnable by triton 3.6's interpreter,
    # which turns range() bounds into ints through int(1-element array), refused by NumPy 2.4.
    row = tl.program_id(0)
    while row < M:
        r64 = row.to(tl.int64)
        s, body_start, body_len, y_start = _row_geometry(r64, N, stride_row, V, ALIGNED, SPLIT)

        # Bounds from N, not body_len (<= N): masks trim the at most one extra, empty chunk.
        acc = tl.zeros([CHUNK], dtype=tl.float32)
        for c in tl.range(0, N, CHUNK, num_stages=STAGES):
            m = c + cols < body_len
            x = tl.load(X + body_start + c + cols, mask=m, other=0.0, eviction_policy="evict_last")
            x = x.to(tl.float32)
            acc += x * x
        sumsq = tl.sum(acc, axis=0)
        if SPLIT:
            e_pos, e_mask = _edge_lanes(s, body_start, body_len, N, V)
            xe = tl.load(X + e_pos, mask=e_mask, other=0.0).to(tl.float32)
            sumsq += tl.sum(xe * xe, axis=0)
        rstd = tl.math.rsqrt(sumsq / N + eps)
        tl.store(RSTD + row, rstd)

        # Newest chunk first: the lines pass 1 touched last are the likeliest to be in L2.
        n_chunks = tl.cdiv(N, CHUNK)
        for i in tl.range(0, n_chunks, num_stages=STAGES):
            c = (n_chunks - 1 - i) * CHUNK
            m = c + cols < body_len
            x = tl.load(X + body_start + c + cols, mask=m, other=0.0, eviction_policy="evict_first")
            y = x.to(tl.float32) * rstd
            if HAS_W:
                if SPLIT:
                    w = tl.load(W + _body_w_offset(body_start - s, N, V, W_SHIFT) + c + cols, mask=m, other=0.0)
                else:
                    w = tl.load(W + c + cols, mask=m, other=0.0)
                y = y * w.to(tl.float32)
            tl.store(Y + y_start + c + cols, y.to(Y.dtype.element_ty), mask=m, eviction_policy="evict_first")
        if SPLIT:
            ye = xe * rstd
            if HAS_W:
                ye = ye * tl.load(W + (e_pos - s), mask=e_mask, other=0.0).to(tl.float32)
            tl.store(Y + e_pos, ye.to(Y.dtype.element_ty), mask=e_mask)
        row += tl.num_programs(0)


# Polls of a row's arrival counter before a segments CTA gives up (~1 us each on an H200: a few
# seconds, far beyond any legitimate wait) and writes NaN rather than hanging the GPU.
MAX_POLLS = tl.constexpr(1 << 22)


@triton.jit(do_not_specialize=["M"])
def rms_norm_segments_kernel(X, W, Y, RSTD, M, N, stride_row, eps, SYNC, PARTIAL,
                             SEG: tl.constexpr, SEGMENTS: tl.constexpr, V: tl.constexpr,
                             ALIGNED: tl.constexpr, SPLIT: tl.constexpr, HAS_W: tl.constexpr,
                             W_SHIFT: tl.constexpr, RELOAD: tl.constexpr, X16: tl.constexpr):
    ticket = tl.atomic_add(SYNC, 1, sem="relaxed")
    row = ticket // SEGMENTS
    piece = ticket % SEGMENTS
    r64 = row.to(tl.int64)
    s, body_start, body_len, y_start = _row_geometry(r64, N, stride_row, V, ALIGNED, SPLIT)

    cols = piece * SEG + tl.arange(0, SEG)
    mask = cols < body_len
    x_raw = tl.load(X + body_start + cols, mask=mask, other=0.0)
    x = x_raw.to(tl.float32)
    partial = tl.sum(x * x, axis=0)
    if SPLIT:  # piece 0 owns the head and tail
        e_pos, e_mask = _edge_lanes(s, body_start, body_len, N, V)
        e_mask = e_mask & (piece == 0)
        xe = tl.load(X + e_pos, mask=e_mask, other=0.0).to(tl.float32)
        partial += tl.sum(xe * xe, axis=0)
    tl.store(PARTIAL + r64 * SEGMENTS + piece, partial)

    tl.debug_barrier()
    arrived = tl.atomic_add(SYNC + 1 + row, 1, sem="acq_rel", scope="gpu") + 1
    polls = 0
    while (arrived < SEGMENTS) & (polls < MAX_POLLS):
        arrived = tl.atomic_add(SYNC + 1 + row, 0, sem="acquire", scope="gpu")
        polls += 1
    tl.debug_barrier()
    sumsq = tl.load(PARTIAL + r64 * SEGMENTS, cache_modifier=".cg")
    for k in tl.static_range(1, SEGMENTS):
        sumsq += tl.load(PARTIAL + r64 * SEGMENTS + k, cache_modifier=".cg")
    rstd = tl.math.rsqrt(sumsq / N + eps)
    rstd = tl.where(arrived >= SEGMENTS, rstd, float("nan"))
    tl.store(RSTD + row, rstd, mask=piece == 0)

    if RELOAD:  # the piece again, from L2 (or L1): x needs no registers across the wait
        x = tl.load(X + body_start + cols, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    elif X16:  # x kept as loaded across the wait, converted again now
        x = keep_16_bit(x_raw, X16).to(tl.float32)
    y = x * rstd
    if HAS_W:
        if SPLIT:
            w = tl.load(W + _body_w_offset(body_start - s, N, V, W_SHIFT) + cols, mask=mask, other=0.0)
        else:
            w = tl.load(W + cols, mask=mask, other=0.0)
        y = y * w.to(tl.float32)
    tl.store(Y + y_start + cols, y.to(Y.dtype.element_ty), mask=mask)
    if SPLIT:
        ye = xe * rstd
        if HAS_W:
            ye = ye * tl.load(W + (e_pos - s), mask=e_mask, other=0.0).to(tl.float32)
        tl.store(Y + e_pos, ye.to(Y.dtype.element_ty), mask=e_mask)

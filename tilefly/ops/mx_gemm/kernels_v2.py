"""MX GEMM kernel v2 for Hopper in Gluon: deep K slots, async FP8 wgmma, promotion overlapped.

Same problem and contract as v1 (kernels.py; its header explains the math and the exact
scaling): C = X @ Y^T, X [ROWS, K] and Y [COLS, K] K-major MXFP8 bytes or MXFP4 nibble pairs,
one E8M0 scale per row per 32 K. What changes is how the K loop is fed and overlapped.

Layout plan (one program per (output tile, K-split); num_warps 4, or 8 = two warpgroups
stacked along M for BLOCK_M = 128):

    ring            STAGES slots of BLOCK_K = 128 K elements = 4 scale blocks: X tile
                    [BLOCK_M, 128] and Y tile [BLOCK_N, 128] FP8 bytes with 128-byte NVMMA
                    swizzle (MXFP4: [*, 64] packed bytes, 64-byte swizzle), one TMA box per
                    operand per slot and one ``ready`` mbarrier per slot (tilefly.gluon.tma_ring).
                    All STAGES slots are issued up front; slot s is refilled with slot
                    s + STAGES once the last wgmma (MXFP4: the unpack) reading it is done.
    FP4 unpack      MXFP4 only, once per slot for both operands: a thread reads 16 packed bytes
                    (4 threads a 64-byte row, 8 rows a warp), turns each E2M1 nibble into the
                    E4M3 byte of its value times 2^-6 by moving its bits into place (seven integer
                    ops for 8 values, ``_UNPACK_SHIFTED_ASM``) and stores 32 FP8 bytes into an
                    unpacked [rows, 128] buffer (128-byte swizzle), each K-block's even K first,
                    then its odd K (no byte shuffles; both operands permuted alike inside each
                    block, so every block's dot product is the same sum, its terms in another order
                    inside the wgmma). Every product of the wgmma is then 2^-12 of the true one,
                    exactly, and ``add_block`` scales it back (``SHIFTED_PRODUCT_EXP``). Two unpacked
                    buffers alternate by slot parity: slot s+1 is unpacked while the wgmmas of slot s
                    still read the other one.
    MMA             one async FP8 wgmma per scale block (K = 32, one instruction) on a 32-byte
                    K slice of the slot, into a fresh FP32 partial (use_acc=False). Block j+1 is
                    issued before block j's partial is waited for (``warpgroup_mma_wait(1)``), so
                    the tensor cores run block j+1 while the FP32 units scale partial j into the
                    accumulator. Two partials (even and odd blocks) alternate; each wgmma writes
                    into the registers of the partial it replaces, so no in-flight accumulator is
                    ever copied. Each slot drains (block 3 is scaled after ``wait(0)``, MXFP4:
                    after the next slot's unpack): a wgmma still in flight at the loop's back
                    edge makes ptxas serialize them all (C7514); configs.compile_specs checks the
                    SASS keeps a ``gsb0, 0x1`` wait. Registers a thread: accumulator + 2
                    partials, each BLOCK_M * BLOCK_N / (32 * num_warps) FP32 values (<= 32).
    scales          per slot, one 32-bit word per accumulator row and column of the thread: the
                    4 E8M0 bytes of the slot's 4 K-blocks. SWIZZLE_32_4_4 stores them as 4
                    consecutive aligned bytes; NO_SWIZZLE does when its column stride is 1, rows
                    are 4-byte aligned and K is a multiple of 128 (``WORDS``, decided by the
                    launcher): then the words are loaded one slot ahead. Otherwise 4 byte loads
                    are packed into the word at the slot's start (the next slot's byte addresses
                    would cost registers the partials need). Block j's byte is
                    ``(word >> 8j) & 255``; K-blocks past K (a K tail inside the last slot) and
                    rows past ROWS/COLS read as 127 (2^0) against zero-filled operand bytes.
    staged scales   SCALE_SLOTS > 0 (the decode builds, ``mx2_*_ss16``): before the ring is issued,
                    every scale word of the program's K-range (k_slots <= SCALE_SLOTS, the launcher
                    splits K so) is loaded in one [rows, SCALE_SLOTS] pass (``load_scale_words``: 4
                    slots of a row a thread, K-tail bytes already set to 127) and stored to shared
                    memory as int32 [SCALE_SLOTS, rows] per operand (a rank-1 view, so that a slot's
                    words are one loadable row); ``words_range`` reduces the same registers to the
                    ``moderate`` test and the ``plain`` one below. The loop then reads each slot's
                    words from shared memory and issues no global load at all. Why: every program of
                    a decode launch issues its whole ring at once, so a scale load issued after it
                    queues behind megabytes of operand bytes; v2's per-slot word loads (and the scan
                    before them) put several such round trips on each program's critical path
                    (Nsight Compute, session 21: 39 % long-scoreboard stalls, the top one on the
                    first use of a loaded scale word). Shared memory: SCALE_SLOTS x (BLOCK_M +
                    BLOCK_N) x 4 bytes more.
    scaling         v1's ``add_scaled_fast`` (two FP32 ops an element) when the program's X scales
                    are all within 2^+-100 or NaN (``scales_moderate``), else v1's exact
                    ``add_scaled``; NaN scale byte 255 makes its row or column NaN. Staged programs
                    whose X and Y scales are all within 2^+-100 and none NaN (``plain``, the normal
                    case) keep the two FP32 ops but decode each scale by moving its byte into the
                    FP32 exponent field (``exponent_scale``, two integer ops, no K-tail check): the
                    general decode (zero and NaN selects, the K-tail select) was about half of the
                    loop's instructions (Nsight Compute, session 23: ISETP + SEL + FSEL + P2R 38 %,
                    FMUL + FFMA 28 %), and plain programs run MXFP8 32 x 14336 x 4096 in 24.6 us
                    against 33.0 (decode probe, BENCHMARKS.md session 23).
    epilogue        tilefly.gluon.epilogue.finish_splitk (split-K partials summed in split order
                    by the last-ticket program, bias, masked store with any output strides).
    X_REGS          (MXFP4, one warpgroup, staged scales; ``configs.v2_regs_configs``, what ``pick`` runs up
                    to 32 tokens) X is never unpacked to shared memory: each slot, a thread loads from the ring
                    slot the packed 4-byte word of each K-block that its wgmma A fragment needs
                    (``x_regs_packed_layout``: lane 4g + q, bytes 4q..4q+3 of rows g and g + 8 of each
                    64-row slab), unpacks it as above into the fragment's two 4-byte chunks (K 4q and
                    16 + 4q of the block, the same order as Y's tile) and the four blocks' wgmmas take A
                    from registers (``slot_blocks_0_to_2``). Only Y's tiles stay double-buffered in
                    shared memory; a CTA barrier before each refill keeps the ring slot until every warp
                    has loaded it.
    FOLD_Y          (MXFP4, staged scales; ``configs.v2_fold_configs``, what ``pick`` runs at 17-32 tokens) a
                    program whose scales are ``plain`` and whose every Y row spans at most 2^FOLD_SPAN over its
                    K-range unpacks Y through per-(row, K-block) tables that fold the block's scale in, relative
                    to the row's largest (fp4_unpack.unpack_fp4_slot_below: exact E4M3 normals), so a block's
                    partial needs the row factor alone, one FMA an element instead of an FMUL and an FMA (at 32
                    tokens the per-block scaling was 39 % of the loop's instructions, BENCHMARKS.md session 39);
                    the epilogue multiplies each column by 2^(top - 127) once. Both rescalings are powers of two
                    on normal FP32 values, so the output bits are the unfolded build's; only outputs in FP32's
                    subnormal range can differ (the folded accumulator rounds once, not per block). Other
                    programs take the unfolded path.
    Y_EXPANDED      (FOLD_Y with X_REGS; ``configs.MXConfig.expanded_y``, what the launcher runs when the activation's
                    quantization also wrote it expanded, tilefly.mx.expanded) Y arrives as E4M3 bytes already in the
                    unpack's order with its block scales folded in (or, in a fold group whose scales span too far,
                    the exact E2M1 values), and its scales as one byte per block that says so: the group's top where
                    it folds, the block's own otherwise. The ring then holds [BLOCK_N, 128] FP8 Y tiles (128-byte swizzle)
                    that the wgmma reads in place: no Y unpack, no unpacked buffers, no fence, and one wait per slot
                    at its start. X still comes shifted (2^-6) from registers, so every product is 2^-6 of the true
                    one (``add_block``'s PRODUCT_EXP = FOLDED_PRODUCT_EXP) and a program folds when its Y scales are
                    constant along its K-range. Why: the unpack of a 32-token Y slot and the CTA barrier after it cost
                    a 32 x 28672 x 4096 GEMM about 16 % of its time (BENCHMARKS.md session 41, the no-Y-unpack
                    timing experiment); reading Y expanded it took 36.6 us against 45.6 (session 42).
    PDL             with ``PDL`` (configs.MXConfig.pdl, launched with Triton's ``launch_pdl``) the program
                    starts with ``wait_prior_grid``: its launch overlaps the kernel ahead, its loads wait.
                    With ``PREFETCH_X`` as well (MXConfig.prefetch_x: X holds constant weight rows,
                    launch.py says when) the TMA copies of X's first STAGES slots go out before the
                    wait (``issue_load_a`` arms each slot's barrier for both operands), so a decode
                    GEMM streams weights while the kernel ahead (the activation's quantization,
                    which lets dependents launch at its start) runs; Y's copies and the scale loads
                    follow the wait.
    barriers        ``ready`` per ring slot only; shared-memory hazards between warps (refill
                    after the wgmma wait, unpack store before the wgmma) get CTA barriers from
                    Triton's membar analysis, fence_async_shared orders the unpack stores before
                    the async proxy reads them.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from tilefly.gluon.epilogue import finish_splitk
from tilefly.gluon.grid_dependency import wait_prior_grid
from tilefly.gluon.layouts import wgmma_layout
from tilefly.gluon.scheduler import splitk_tile
from tilefly.gluon.tma_ring import alloc_ring, issue_load_a, issue_load_b, wait_ready
from tilefly.ops.mx_gemm.fp4_unpack import (_UNPACK_SHIFTED_ASM, BLOCK_K, FOLD_SPAN, FOLDED_PRODUCT_EXP,
                                            SHIFTED_PRODUCT_EXP, block_layout3, program_tops, unpack_fp4_slot,
                                            unpack_fp4_slot_below)
from tilefly.ops.mx_gemm.scales import (BLOCKS_PER_SLOT, SCALE_BLOCK, add_scaled_any, exponent_scale,
                                        load_program_scales, program_scale_paths, scales_moderate, slot_scale_words,
                                        stage_words, word_byte)

_INTS = ["K", "stride_sxr", "stride_sxc", "stride_syr", "stride_syc", "stride_bias", "slots_per_split"]


@gluon.jit
def x_block(x_tiles, j: gl.constexpr):
    """The wgmma A operand of scale block j of a slot: a 32-byte K slice of the FP8 X tile."""
    return x_tiles.slice(j * SCALE_BLOCK, SCALE_BLOCK, dim=1)


@gluon.jit
def y_block(y_tiles, j: gl.constexpr):
    """The wgmma B operand of scale block j of a slot: a 32-byte K slice of the FP8 Y tile."""
    return y_tiles.slice(j * SCALE_BLOCK, SCALE_BLOCK, dim=1).permute((1, 0))


@gluon.jit
def block_operands(x_tiles, y_tiles, j: gl.constexpr):
    """The wgmma operands of scale block j of a slot."""
    return x_block(x_tiles, j), y_block(y_tiles, j)


@gluon.jit
def add_block(acc, partial, wx, wy, j: gl.constexpr, kb, k_blocks, moderate, plain, folded,
              PRODUCT_EXP: gl.constexpr):
    """acc + partial * 2^PRODUCT_EXP scaled by block j's row and column scales (PRODUCT_EXP: 0, or
    SHIFTED_PRODUCT_EXP when both operands were unpacked by ``unpack_fp4_slot``; the factor is a power
    of two, so the scaled partial is what the unshifted operands give, exactly). ``plain``
    (staged scales, every byte of both operands within 2^+-MODERATE_EXP, none NaN):
    ``add_scaled_fast``'s two FP32 ops with the scales decoded in two integer ops each and no K-tail
    check (staging already set those bytes to 127), about half the instructions of the general path;
    PRODUCT_EXP then goes into the row scale's exponent field (at most 227 + 12 there). ``folded`` (FOLD_Y
    programs that fold, a subset of ``plain``): Y's block scales are in its unpacked values, so the row
    factor alone, one FMA an element; X shifted and Y from the tables make the partial 2^-6 of the true
    one, whatever PRODUCT_EXP says."""
    if folded:
        fx = exponent_scale(wx, j)
        fx = (fx.to(gl.int32, bitcast=True) + (FOLDED_PRODUCT_EXP << 23)).to(gl.float32, bitcast=True)
        acc = gl.fma(partial, fx[:, None], acc)
    elif plain:
        fx = exponent_scale(wx, j)
        if PRODUCT_EXP != 0:
            fx = (fx.to(gl.int32, bitcast=True) + (PRODUCT_EXP << 23)).to(gl.float32, bitcast=True)
        acc = gl.fma(partial * fx[:, None], exponent_scale(wy, j)[None, :], acc)
    else:
        if PRODUCT_EXP != 0:
            partial = partial * (1 << PRODUCT_EXP)     # a power of two: exact
        acc = add_scaled_any(acc, partial, word_byte(wx, j, kb, k_blocks), word_byte(wy, j, kb, k_blocks), moderate)
    return acc


@gluon.jit
def unpack_y_slot(packed, unpacked, words, top, folded, ROWS: gl.constexpr, num_warps: gl.constexpr):
    """FOLD_Y: a packed Y slot unpacked with its block scales folded in (``folded``) or shifted as v2's."""
    if folded:
        unpack_fp4_slot_below(packed, unpacked, words, top, ROWS, num_warps)
    else:
        unpack_fp4_slot(packed, unpacked, ROWS, num_warps)


@gluon.jit
def issue_slot(x_desc, y_desc, x_bufs, y_bufs, bars, item, off_m, off_n, slot_k, STAGES: gl.constexpr, pred):
    """The TMA copies of ring slot ``item`` (K slot ``slot_k``): X and Y boxes of their own widths (Y_EXPANDED
    brings 128 FP8 bytes a row where X brings 64 packed ones)."""
    issue_load_a(x_desc, y_desc, x_bufs, bars, item, off_m, slot_k * x_desc.block_type.shape[1], True, STAGES, pred)
    issue_load_b(y_desc, y_bufs, bars, item, off_n, slot_k * y_desc.block_type.shape[1], True, STAGES, pred)


@gluon.jit
def x_blocks(x_tiles):
    """The wgmma A operands of a slot's four scale blocks: 32-byte K slices of the unpacked X tile."""
    return x_block(x_tiles, 0), x_block(x_tiles, 1), x_block(x_tiles, 2), x_block(x_tiles, 3)


@gluon.jit
def slot_blocks_0_to_2(x0, x1, x2, x3, y_tiles, acc, even, odd, wx, wy, kb0, k_blocks, moderate, plain, folded,
                       PRODUCT_EXP: gl.constexpr):
    """A slot's first three K-blocks: one async FP8 wgmma each into a fresh partial (even, odd,
    even), block j + 1 issued before block j is scaled into ``acc``. Block 3's wgmma is left in
    flight: ``slot_block_3`` retires and scales it (MXFP4 unpacks the next slot in between).
    ``x0``..``x3``: block j's A operand, in shared memory (``x_blocks``) or in registers (X_REGS;
    ptxas keeps a wgmma's A registers until the wait that retires it, and Gluon's ``deps`` take no
    FP8 tensors)."""
    y_op = y_block(y_tiles, 0)
    even = warpgroup_mma(x0, y_op, even, use_acc=False, is_async=True)
    y_op = y_block(y_tiles, 1)
    odd = warpgroup_mma(x1, y_op, odd, use_acc=False, is_async=True)
    even = warpgroup_mma_wait(num_outstanding=1, deps=(even,))
    acc = add_block(acc, even, wx, wy, 0, kb0, k_blocks, moderate, plain, folded, PRODUCT_EXP)
    y_op = y_block(y_tiles, 2)
    even = warpgroup_mma(x2, y_op, even, use_acc=False, is_async=True)
    odd = warpgroup_mma_wait(num_outstanding=1, deps=(odd,))
    acc = add_block(acc, odd, wx, wy, 1, kb0 + 1, k_blocks, moderate, plain, folded, PRODUCT_EXP)
    y_op = y_block(y_tiles, 3)
    odd = warpgroup_mma(x3, y_op, odd, use_acc=False, is_async=True)
    even = warpgroup_mma_wait(num_outstanding=1, deps=(even,))
    acc = add_block(acc, even, wx, wy, 2, kb0 + 2, k_blocks, moderate, plain, folded, PRODUCT_EXP)
    return acc, even, odd


@gluon.jit
def slot_block_3(acc, odd, wx, wy, kb0, k_blocks, moderate, plain, folded, PRODUCT_EXP: gl.constexpr):
    """Retire the slot's last wgmma (the slot drains: see the loop) and scale block 3 into ``acc``."""
    odd = warpgroup_mma_wait(num_outstanding=0, deps=(odd,))
    acc = add_block(acc, odd, wx, wy, 3, kb0 + 3, k_blocks, moderate, plain, folded, PRODUCT_EXP)
    return acc, odd


@gluon.constexpr_function
def x_regs_packed_layout(block_m):
    """X_REGS: a packed X slot [block_m, 64] bytes spread as the wgmma A fragments of its four K-blocks
    want it. Lane 4g + q holds packed bytes 4q..4q+3 of every 16-byte K-block of rows g and g + 8 of
    each 64-row slab; warp w takes rows 16w.. (one warpgroup)."""
    reg = [[0, 1], [0, 2], [0, 16], [0, 32], [8, 0]]
    slab = 64
    while slab < block_m:
        reg.append([slab, 0])
        slab *= 2
    return gl.DistributedLinearLayout(reg_bases=reg, lane_bases=[[0, 4], [0, 8], [1, 0], [2, 0], [4, 0]],
                                      warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[block_m, 64])


@gluon.jit
def x_register_operands(packed, BLOCK_M: gl.constexpr, acc_layout: gl.constexpr):
    """X_REGS: a packed X slot in shared memory -> the four K-blocks' wgmma A operands in registers, FP8
    of the values times 2^-6 in ``unpack_fp4_slot``'s order (position 16h + p of block j: nibble h of
    packed byte 16j + p), so that they pair with its Y tile. Lane 4g + q's word of a block unpacks to the
    two 4-byte chunks its fragment holds at 4q and 16 + 4q: no shuffles."""
    bytes_ = packed.load(x_regs_packed_layout(BLOCK_M))
    lo, hi = gl.inline_asm_elementwise(_UNPACK_SHIFTED_ASM, "=r,=r,r", [bytes_], dtype=(gl.uint8, gl.uint8),
                                       is_pure=True, pack=4)
    blocks = gl.reshape(gl.join(lo, hi), [BLOCK_M, BLOCKS_PER_SLOT, SCALE_BLOCK // 2, 2])   # [row, j, p, h]
    blocks = gl.reshape(gl.permute(blocks, (0, 3, 2, 1)), [BLOCK_M, SCALE_BLOCK, 2, 2])    # [row, 16h + p, j1, j0]
    even_j, odd_j = gl.split(blocks)
    x0, x2 = gl.split(even_j)
    x1, x3 = gl.split(odd_j)
    operand: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=4)
    x0 = gl.convert_layout(x0.to(gl.float8e4nv, bitcast=True), operand, assert_trivial=True)
    x1 = gl.convert_layout(x1.to(gl.float8e4nv, bitcast=True), operand, assert_trivial=True)
    x2 = gl.convert_layout(x2.to(gl.float8e4nv, bitcast=True), operand, assert_trivial=True)
    x3 = gl.convert_layout(x3.to(gl.float8e4nv, bitcast=True), operand, assert_trivial=True)
    return x0, x1, x2, x3


@gluon.jit(do_not_specialize=_INTS, do_not_specialize_on_alignment=["bias_ptr"])
def mx_gemm_v2_kernel(x_desc, y_desc, sx_ptr, sy_ptr, c_ptr, bias_ptr, ws_ptr, ticket_ptr,
                      M, N, K, stride_sxr, stride_sxc, stride_syr, stride_syc, stride_cm, stride_cn, stride_bias,
                      slots_per_split,
                      BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, FP4: gl.constexpr,
                      X_SWIZZLED: gl.constexpr, Y_SWIZZLED: gl.constexpr, X_WORDS: gl.constexpr,
                      Y_WORDS: gl.constexpr, BIAS: gl.constexpr, C_ROWS_CONTIGUOUS: gl.constexpr,
                      STAGES: gl.constexpr, SCALE_SLOTS: gl.constexpr, X_REGS: gl.constexpr, PDL: gl.constexpr,
                      PREFETCH_X: gl.constexpr, FOLD_Y: gl.constexpr, Y_EXPANDED: gl.constexpr,
                      num_warps: gl.constexpr):
    gl.static_assert(PDL or not PREFETCH_X, "PREFETCH_X streams X in before the PDL wait: PDL builds only")
    if PDL and not PREFETCH_X:   # launched early (PDL): nothing read may predate the kernel ahead
        wait_prior_grid()
    acc_layout: gl.constexpr = wgmma_layout(BLOCK_M, BLOCK_N, num_warps, 8)
    STAGED: gl.constexpr = SCALE_SLOTS > 0
    # X shifted by the unpack (2^-6) and Y as unpacked (2^-6) or expanded (its folded values or the exact ones)
    PRODUCT_EXP: gl.constexpr = (FOLDED_PRODUCT_EXP if Y_EXPANDED else SHIFTED_PRODUCT_EXP) if FP4 else 0
    Y_UNPACKED: gl.constexpr = FP4 and not Y_EXPANDED
    PREFETCH_SCALES: gl.constexpr = X_WORDS and Y_WORDS and not STAGED
    tile, off_m, off_n, split, num_splits = splitk_tile(N, BLOCK_M, BLOCK_N)
    k_blocks = K // SCALE_BLOCK
    slot_first = split * slots_per_split
    k_slots = gl.minimum(slots_per_split, gl.cdiv(K, BLOCK_K) - slot_first)
    kb_first = slot_first * BLOCKS_PER_SLOT
    if PREFETCH_X:
        # X's rows are weights no kernel ahead writes: their first STAGES slots stream in while the kernel
        # ahead finishes; Y (this step's activations) and every scale wait for it.
        x_bufs, y_bufs, bars = alloc_ring(x_desc, y_desc, STAGES)
        for i in gl.static_range(STAGES):
            issue_load_a(x_desc, y_desc, x_bufs, bars, i, off_m, (slot_first + i) * x_desc.block_type.shape[1],
                         True, STAGES, pred=i < k_slots)
        wait_prior_grid()
    if STAGED:
        # Issued before the ring, so these loads are not queued behind its operand bytes.
        staged_x, staged_y = load_program_scales(sx_ptr, sy_ptr, off_m, off_n, M, N, kb_first, k_slots, k_blocks,
                                                 stride_sxr, stride_sxc, stride_syr, stride_syc, X_SWIZZLED,
                                                 Y_SWIZZLED, X_WORDS, Y_WORDS, BLOCK_M, BLOCK_N, SCALE_SLOTS,
                                                 num_warps)

    if not PREFETCH_X:
        x_bufs, y_bufs, bars = alloc_ring(x_desc, y_desc, STAGES)
    gl.static_assert(not X_REGS or (FP4 and num_warps == 4), "X from registers: MXFP4, one warpgroup")
    gl.static_assert(not FOLD_Y or (FP4 and STAGED), "Y's scales fold into its unpack: MXFP4, staged scales")
    gl.static_assert(not Y_EXPANDED or (FOLD_Y == 1 and X_REGS == 1), "expanded Y: a FOLD_Y build, X from registers")
    if FP4 and not X_REGS:
        x_fp8 = gl.allocate_shared_memory(gl.float8e4nv, [2, BLOCK_M, BLOCK_K],
                                          gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_K], gl.float8e4nv))
    if Y_UNPACKED:
        y_fp8 = gl.allocate_shared_memory(gl.float8e4nv, [2, BLOCK_N, BLOCK_K],
                                          gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_K], gl.float8e4nv))
    for i in gl.static_range(STAGES):
        if PREFETCH_X:
            issue_load_b(y_desc, y_bufs, bars, i, off_n, (slot_first + i) * y_desc.block_type.shape[1], True, STAGES,
                         pred=i < k_slots)
        else:
            issue_slot(x_desc, y_desc, x_bufs, y_bufs, bars, i, off_m, off_n, slot_first + i, STAGES, i < k_slots)

    rows = off_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, acc_layout))
    cols = off_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, acc_layout))
    folded = False
    if STAGED:
        moderate, plain = program_scale_paths(staged_x, staged_y)
        if FOLD_Y:
            # Per program: every Y row (token) within 2^FOLD_SPAN of its largest scale over the K-range.
            # Expanded: every Y row's (effective) scale constant over the K-range, its values already folded.
            y_top, y_span = program_tops(staged_y, k_slots, SCALE_SLOTS)
            folded = plain & (gl.max(y_span, axis=0) <= (0 if Y_EXPANDED else FOLD_SPAN))
            if not Y_EXPANDED:
                y_top_unpack = gl.convert_layout(y_top,
                                                 gl.SliceLayout(1, gl.SliceLayout(2, block_layout3(num_warps))))
        words_x = stage_words(staged_x, BLOCK_M, SCALE_SLOTS)
        words_y = stage_words(staged_y, BLOCK_N, SCALE_SLOTS)
        gl.thread_barrier()
    else:
        plain = False
        moderate = scales_moderate(sx_ptr, off_m, M, kb_first,
                                   gl.minimum(k_slots * BLOCKS_PER_SLOT, k_blocks - kb_first), k_blocks,
                                   stride_sxr, stride_sxc, X_SWIZZLED, BLOCK_M, num_warps)
        wx = slot_scale_words(sx_ptr, rows, M, kb_first, k_blocks, stride_sxr, stride_sxc, X_SWIZZLED, X_WORDS)
        wy = slot_scale_words(sy_ptr, cols, N, kb_first, k_blocks, stride_syr, stride_syc, Y_SWIZZLED, Y_WORDS)
    acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
    # Two partials, even and odd blocks: each wgmma writes into the registers of the partial it
    # replaces (retired and scaled before), so no in-flight accumulator is ever copied.
    even = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
    odd = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, acc_layout)
    if Y_UNPACKED:
        wait_ready(bars, 0, STAGES)
        if not X_REGS:
            unpack_fp4_slot(x_bufs.index(0), x_fp8.index(0), BLOCK_M, num_warps)
        if FOLD_Y:
            unpack_y_slot(y_bufs.index(0), y_fp8.index(0), words_y.index(0), y_top_unpack, folded, BLOCK_N,
                          num_warps)
        else:
            unpack_fp4_slot(y_bufs.index(0), y_fp8.index(0), BLOCK_N, num_warps)
        fence_async_shared()

    for s in range(k_slots):
        slot = s % STAGES
        kb0 = (slot_first + s) * BLOCKS_PER_SLOT
        if Y_UNPACKED:
            if not X_REGS:
                x_tiles = x_fp8.index(s % 2)
            y_tiles = y_fp8.index(s % 2)
        elif Y_EXPANDED:
            wait_ready(bars, s, STAGES)
            y_tiles = y_bufs.index(slot)
        else:
            wait_ready(bars, s, STAGES)
            x_tiles = x_bufs.index(slot)
            y_tiles = y_bufs.index(slot)
        if STAGED:
            wx = words_x.index(s).load(gl.SliceLayout(1, acc_layout))
            wy = words_y.index(s).load(gl.SliceLayout(0, acc_layout))
        elif PREFETCH_SCALES:
            # Issued now, used next slot: their latency hides behind this slot's MMAs.
            kb_next = gl.minimum(kb0 + BLOCKS_PER_SLOT, (slot_first + k_slots - 1) * BLOCKS_PER_SLOT)
            wx_next = slot_scale_words(sx_ptr, rows, M, kb_next, k_blocks, stride_sxr, stride_sxc, X_SWIZZLED,
                                       X_WORDS)
            wy_next = slot_scale_words(sy_ptr, cols, N, kb_next, k_blocks, stride_syr, stride_syc, Y_SWIZZLED,
                                       Y_WORDS)
        else:
            # Byte-wise scales: the next slot's byte addresses would not fit in registers.
            wx = slot_scale_words(sx_ptr, rows, M, kb0, k_blocks, stride_sxr, stride_sxc, X_SWIZZLED, X_WORDS)
            wy = slot_scale_words(sy_ptr, cols, N, kb0, k_blocks, stride_syr, stride_syc, Y_SWIZZLED, Y_WORDS)

        # ptxas serializes every wgmma (C7514) if one is still in flight at the loop's back edge
        # while its registers are read later, so each slot drains: blocks 0-2 are scaled while
        # the next block runs, block 3 while (MXFP4) the next slot is unpacked.
        if X_REGS:
            # The ring slot was waited for when its Y was unpacked (the previous slot, or before the loop), or
            # (Y_EXPANDED) just above.
            x0, x1, x2, x3 = x_register_operands(x_bufs.index(slot), BLOCK_M, acc_layout)
        else:
            x0, x1, x2, x3 = x_blocks(x_tiles)
        acc, even, odd = slot_blocks_0_to_2(x0, x1, x2, x3, y_tiles, acc, even, odd, wx, wy, kb0, k_blocks,
                                            moderate, plain, folded, PRODUCT_EXP)
        if Y_UNPACKED:
            if s + 1 < k_slots:
                # The other unpacked buffer's readers (slot s-1's wgmmas) have all retired.
                wait_ready(bars, s + 1, STAGES)
                if not X_REGS:
                    unpack_fp4_slot(x_bufs.index((s + 1) % STAGES), x_fp8.index((s + 1) % 2), BLOCK_M, num_warps)
                if FOLD_Y:
                    unpack_y_slot(y_bufs.index((s + 1) % STAGES), y_fp8.index((s + 1) % 2), words_y.index(s + 1),
                                  y_top_unpack, folded, BLOCK_N, num_warps)
                else:
                    unpack_fp4_slot(y_bufs.index((s + 1) % STAGES), y_fp8.index((s + 1) % 2), BLOCK_N, num_warps)
                fence_async_shared()
        acc, odd = slot_block_3(acc, odd, wx, wy, kb0, k_blocks, moderate, plain, folded, PRODUCT_EXP)
        if X_REGS:
            gl.thread_barrier()     # every warp's X loads from this ring slot are done before the refill
        # Every wgmma of this slot has retired (MXFP4: so has the unpack that read it): refill.
        ahead = s + STAGES
        issue_slot(x_desc, y_desc, x_bufs, y_bufs, bars, ahead, off_m, off_n, slot_first + ahead, STAGES,
                   ahead < k_slots)
        if PREFETCH_SCALES:
            wx = wx_next
            wy = wy_next

    if FOLD_Y:
        if folded:   # the Y scales' common part, left out of the unpacked values: exact (a power of two)
            y_top_cols = gl.convert_layout(y_top, gl.SliceLayout(0, acc_layout))
            acc = acc * (y_top_cols << 23).to(gl.float32, bitcast=True)[None, :]
    finish_splitk(acc, ws_ptr, ticket_ptr, tile, split, num_splits, bias_ptr, stride_bias, c_ptr, stride_cm,
                  stride_cn, off_m, off_n, M, N, BLOCK_M, BLOCK_N, BIAS, C_ROWS_CONTIGUOUS, num_warps)

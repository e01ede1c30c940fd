"""RMSNorm forward for contiguous 16-bit rows as a persistent stream through shared memory (Gluon;
experimental, not routed: ``scripts/rms_stream_probe.py`` times it against the shipped kernels).

Why: Nsight Compute (BENCHMARKS.md, session 48) found the shipped rows kernel on FP16 rows of 16385
latency-bound: two CTAs of 8 warps an SM, each loading its row, then reducing, then storing, so an
SM's loads stop while its rows reduce (issue slots 29 % busy, DRAM 64 % of peak). Here each CTA
stays resident and keeps the next rows' copies in flight (TMA) while it normalizes the current one.

Layout plan (one program serves rows pid, pid + G, pid + 2G, ...; G programs in all):
    row window  row r occupies flat elements [r*N, (r+1)*N); its window starts at s0, the multiple of
                V = 8 at or below r*N, so every copy and every 16-byte store is aligned; the row
                begins ph = r*N - s0 elements in. G is a multiple of V (or covers M), so ph is the
                same for every row of a program: (pid + i*G)*N = pid*N (mod V).
    ring        STAGES slots of BOXES_PAD x 256 elements (unswizzled); a row's window is BOXES 1-D TMA
                boxes of 256 (the last one reaches into the next row or past the tensor, zero-filled
                there), behind one mbarrier a slot (expect-tx of BOXES boxes).
    w           read as 16-byte runs from the shifted copies of w (kernels.py, W_SHIFT), the one
                copy whose runs line up with this program's phase, so from L1 after the first row.
    registers   a chunk of CHUNK boxes at a time, BlockedLayout [1, 8] per thread, 32 lanes along
                a box, warps across boxes: 8 values a thread a chunk.
    per row     wait its slot; pass 1 over the chunks: FP32 sum of squares of the positions inside
                the row; pass 2 reads the chunks again, y = x * rstd * w, stores the 16-byte runs
                wholly inside the row (a mask constant across each run, so the stores stay
                vectorized) and, separately, the at most 2 * (V - 1) elements of the two runs that
                straddle the row's ends; then a CTA barrier, and the slot takes the row STAGES
                ahead (the other slots' rows are in flight meanwhile).
    shared      STAGES x BOXES_PAD x 512 bytes: rows of 16385 at two stages and chunks of 8 boxes
                72 KB, three programs an SM.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

BOX = 256  # elements a TMA copy moves: the largest box dimension


@gluon.constexpr_function
def chunk_layout(num_warps):
    return gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])


@gluon.jit
def _issue_row(x_desc, xv_desc, view_rows, ring, ready, row, slot, N, BOXES: gl.constexpr, CHUNK: gl.constexpr,
               CHUNKS: gl.constexpr):
    """The TMA copies of row ``row``'s window into ring slot ``slot``, box b at row b of the slot: a
    whole chunk in one copy through the overlapping 2-D view ``xv_desc`` (rows of 2 * BOX elements
    BOX apart) where the view reaches, single boxes otherwise (the chunk past the last whole one,
    and chunks near the tensor's end)."""
    BOX_: gl.constexpr = x_desc.block_type.shape[0]
    FULL: gl.constexpr = BOXES // CHUNK
    s0 = row * N // 8 * 8
    bar = ready.index(slot)
    mbarrier.expect(bar, BOXES * x_desc.block_type.nbytes)
    for c in range(FULL):
        f = s0 + c * CHUNK * BOX_
        if f // BOX_ + CHUNK <= view_rows:
            tma.async_copy_global_to_shared(xv_desc, [f // BOX_, f % BOX_], bar, ring.index(slot * CHUNKS + c))
        else:
            chunk = ring.index(slot * CHUNKS + c)._reinterpret(x_desc.dtype, [CHUNK, BOX_], x_desc.layout)
            for b in range(CHUNK):
                tma.async_copy_global_to_shared(x_desc, [f + b * BOX_], bar, chunk.index(b))
    if FULL < CHUNKS:
        chunk = ring.index(slot * CHUNKS + FULL)._reinterpret(x_desc.dtype, [CHUNK, BOX_], x_desc.layout)
        for b in range(BOXES - FULL * CHUNK):
            tma.async_copy_global_to_shared(x_desc, [s0 + (FULL * CHUNK + b) * BOX_], bar, chunk.index(b))


@gluon.jit
def rms_norm_stream_kernel(x_desc, xv_desc, view_rows, x_ptr, w_ptr, ws_ptr, y_ptr, rstd_ptr, M, N, eps,
                           BOXES: gl.constexpr, CHUNK: gl.constexpr, STAGES: gl.constexpr, HAS_W: gl.constexpr):
    BOX_: gl.constexpr = x_desc.block_type.shape[0]
    DTYPE: gl.constexpr = x_desc.dtype
    V: gl.constexpr = 8
    BOXES_PAD: gl.constexpr = (BOXES + CHUNK - 1) // CHUNK * CHUNK
    CHUNKS: gl.constexpr = BOXES_PAD // CHUNK
    layout: gl.constexpr = chunk_layout(gl.num_warps())
    slab: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)

    pid = gl.program_id(0)
    G = gl.num_programs(0)
    n_rows = (M - pid + G - 1) // G
    # chunk c of slot s at ring.index(s * CHUNKS + c); shapes past the first must be powers of two
    ring = gl.allocate_shared_memory(DTYPE, [STAGES * CHUNKS, CHUNK, BOX_], slab)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
    fence_async_shared()
    for j in gl.static_range(STAGES):
        if j < n_rows:
            _issue_row(x_desc, xv_desc, view_rows, ring, ready, pid + j * G, j, N, BOXES, CHUNK, CHUNKS)

    box_ids = gl.arange(0, CHUNK, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, BOX_, layout=gl.SliceLayout(0, layout))
    pos = box_ids[:, None] * BOX_ + cols[None, :]          # window position within a chunk
    run = pos // V                                         # its 16-byte run
    ph = pid * N - pid * N // V * V                        # every row of this program starts ph in
    # w at window position p is w[p - ph]: in the shifted copies (ws[k * NP + j] = w[k + j], kernels.py's
    # rms_norm_shift_weight_kernel) that is copy (V - ph) % V at p - V (p at 0 for ph = 0), so a run of
    # the row's body reads 16 aligned bytes
    NP = (N + V - 1) // V * V
    w_base = (V - ph) % V * NP - gl.where(ph > 0, V, 0)
    lo = (ph + V - 1) // V                                 # first run wholly inside the row
    hi = (ph + N) // V                                     # one past the last
    edge_layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    e = gl.arange(0, 2 * V, layout=edge_layout)
    e_pos = gl.where(e < V, e, hi * V + e - V)
    e_inside = (e_pos >= ph) & (e_pos < ph + N) & ((e >= V) | (e_pos < lo * V))
    for i in range(n_rows):
        slot = i % STAGES
        mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
        row = pid + i * G
        s0 = row * N // V * V
        # the two runs straddling the row's ends go out element by element, from x in L2: loaded now
        # so that their latency hides behind the passes
        xe = gl.load(x_ptr + s0 + e_pos, mask=e_inside, other=0.0).to(gl.float32)
        acc = gl.zeros([CHUNK, BOX_], gl.float32, layout)
        for c in range(CHUNKS):
            p = c * CHUNK * BOX_ + pos
            xs = ring.index(slot * CHUNKS + c).load(layout).to(gl.float32)
            acc += gl.where((p >= ph) & (p < ph + N), xs * xs, 0.0)
        rstd = gl.rsqrt(gl.sum(gl.sum(acc, axis=1), axis=0) / N + eps)
        for c in range(CHUNKS):
            q = c * CHUNK * BOX_ // V + run
            xs = ring.index(slot * CHUNKS + c).load(layout).to(gl.float32)
            body = (q >= lo) & (q < hi)
            if HAS_W:
                ws = gl.load(ws_ptr + w_base + c * CHUNK * BOX_ + pos, mask=body, other=0.0).to(gl.float32)
                ys = (xs * rstd * ws).to(DTYPE)
            else:
                ys = (xs * rstd).to(DTYPE)
            gl.store(y_ptr + s0 + c * CHUNK * BOX_ + pos, ys, mask=body)
        if HAS_W:
            we = gl.load(w_ptr + (e_pos - ph), mask=e_inside, other=0.0).to(gl.float32)
            ye = xe * rstd * we
        else:
            ye = xe * rstd
        gl.store(y_ptr + s0 + e_pos, ye.to(DTYPE), mask=e_inside)
        gl.store(rstd_ptr + row, rstd)
        gl.thread_barrier()  # every warp has read this slot: it may take the row STAGES ahead
        if i + STAGES < n_rows:
            _issue_row(x_desc, xv_desc, view_rows, ring, ready, pid + (i + STAGES) * G, slot, N, BOXES, CHUNK, CHUNKS)

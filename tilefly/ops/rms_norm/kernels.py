"""RMSNorm forward kernels (plain Triton): y = x * rsqrt(mean(x^2) + eps) * w, FP32 math.

Bandwidth-bound: everything below serves one goal, 16-byte accesses with enough bytes in
flight, x read once from DRAM and y written once.

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
  GENERIC  any other row-contiguous layout (rows with an odd stride, x not 16-byte aligned):
           plain masked loads, correct at any alignment, vectorized where Triton can prove it.

rms_norm_rows_kernel -- the row fits in registers (one pass, no loop).
  Tile [ROWS, BLOCK_N] per program, BLOCK_N the next power of two of the body and ROWS > 1 for
  short rows, so a program still moves several KB (configs.py sizes it to ~16 values per
  thread: two 16-byte vectors of FP16/BF16, four of FP32). Layout (Triton's blocked layout for
  a vectorized load): each thread holds 16-byte runs along the row, lanes then warps continue
  along the row, warps left over spread across rows. Shared memory: only the cross-warp step of
  tl.sum (a few floats per warp, one barrier). No staging, no pipelining: occupancy (several
  programs per SM) keeps enough loads in flight.

rms_norm_chunked_kernel -- rows too long for registers (two passes, the second from L2).
  Persistent grid, a few programs per SM, each normalizing whole rows in turn. Tile [CHUNK],
  same per-thread 16-byte runs. Pass 1 streams the row chunk by chunk into a [CHUNK] FP32
  accumulator (one cross-warp reduction per row); tl.range pipelines the loads STAGES deep
  through shared memory with cp.async (STAGES - 1 chunk buffers, per loaded tensor), lines
  marked evict_last. Pass 2 walks the chunks newest-first, so the re-read starts with the lines
  most recently brought into L2, and writes y marked evict_first. Few programs per SM keep the
  rows in flight (programs x row bytes) small next to the 50 MB L2.

Both kernels read rows at ``row * stride_row`` and write y contiguous (row * N), store one FP32
rstd per row, and take M unspecialized (the launcher caches each compiled kernel under
everything else Triton specializes on).
"""
import triton
import triton.language as tl


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


@triton.jit(do_not_specialize=["M"])
def rms_norm_rows_kernel(X, W, Y, RSTD, M, N, stride_row, eps,
                         BLOCK_N: tl.constexpr, ROWS: tl.constexpr, V: tl.constexpr,
                         ALIGNED: tl.constexpr, SPLIT: tl.constexpr, HAS_W: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < M
    r64 = rows.to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
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

    mask = row_ok[:, None] & (cols[None, :] < body_len[:, None])
    x = tl.load(X + body_start[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    sumsq = tl.sum(x * x, axis=1)
    if SPLIT:
        e_pos, e_mask = _edge_lanes(s[:, None], body_start[:, None], body_len[:, None], N, V)
        e_mask = e_mask & row_ok[:, None]
        xe = tl.load(X + e_pos, mask=e_mask, other=0.0).to(tl.float32)
        sumsq += tl.sum(xe * xe, axis=1)
    rstd = tl.math.rsqrt(sumsq / N + eps)
    tl.store(RSTD + rows, rstd, mask=row_ok)

    y = x * rstd[:, None]
    if HAS_W:
        if SPLIT:
            w = tl.load(W + (body_start - s)[:, None] + cols[None, :], mask=mask, other=0.0)
        else:
            w = tl.load(W + cols, mask=cols < n_cols, other=0.0)[None, :]
        y = y * w.to(tl.float32)
    tl.store(Y + y_start[:, None] + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    if SPLIT:
        ye = xe * rstd[:, None]
        if HAS_W:
            ye = ye * tl.load(W + (e_pos - s[:, None]), mask=e_mask, other=0.0).to(tl.float32)
        tl.store(Y + e_pos, ye.to(Y.dtype.element_ty), mask=e_mask)


@triton.jit(do_not_specialize=["M"])
def rms_norm_chunked_kernel(X, W, Y, RSTD, M, N, stride_row, eps,
                            CHUNK: tl.constexpr, STAGES: tl.constexpr, V: tl.constexpr,
                            ALIGNED: tl.constexpr, SPLIT: tl.constexpr, HAS_W: tl.constexpr):
    cols = tl.arange(0, CHUNK)
    # A while loop and N-only loop bounds below keep this runnable by triton 3.6's interpreter,
    # which turns range() bounds into ints through int(1-element array), refused by NumPy 2.4.
    row = tl.program_id(0)
    while row < M:
        r64 = row.to(tl.int64)
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
                    w = tl.load(W + (body_start - s) + c + cols, mask=m, other=0.0)
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

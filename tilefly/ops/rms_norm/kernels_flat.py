"""RMSNorm forward over x as one flat array (plain Triton): contiguous rows whatever their length.

Why: a contiguous row of N 16-bit elements starts r*N*2 bytes in, so for N off a multiple of 8
rows drift off 16-byte alignment and the SPLIT row layout (kernels.py) pays per row for a
scalar head, a scalar tail and scalar w loads: 16-bit SPLIT rows stopped at 2.4-3.2 TB/s where
ALIGNED ones reach 3.5. Seen as one flat array of M*N elements, x has no edges: any tile that
starts at a multiple of 8 elements is 16 bytes aligned, so every load and store of x and y is a
16-byte vector, whatever N is. What moves into the kernel is which row each element belongs to.

Layout plan, rms_norm_flat_kernel:
  Tile: TILE consecutive elements of the flat array per CTA (a power of two, 8-32K), tile t
  covers [t*TILE, (t+1)*TILE), viewed as [TILE/V, V]: vectors by lanes, V = 16 bytes / element
  size. Triton's blocked layout for that load: a thread holds whole 16-byte vectors (its lanes
  in registers), threads then warps continue along the vectors; TILE / (32 * num_warps) values a
  thread. Per-vector quantities (row, rstd, weight offset) are [TILE/V, 1] tensors: computed
  once a vector, not once a value. Shared memory: tl.sum's cross-warp step only (a barrier a
  reduction), plus the scalar atomics' broadcast. No pipelining: occupancy keeps loads in flight.
  Rows inside a tile: at most SPAN = (TILE-1)//N + 2 rows touch a tile; row k (row r_first + k)
  holds tile offsets [lo0 + k*N, lo0 + (k+1)*N). A vector lies in one row (k_vec: SPAN - 1
  compares a vector) or straddles the start of row k >= 1 (at most one vector a row start,
  N >= 2V). Whole vectors: per-vector sums of squares in registers, then all rows' sums in one
  [TILE/V, SPAN_P2] -> [SPAN_P2] reduction (SPAN_P2: SPAN rounded up to a power of two); they
  are normalized with their row's rstd and stored as 16-byte vectors. Straddling vectors are
  loaded again (L1 hits) into a small [SPAN_P2, V] tile, row k the vector around row k's start,
  lanes split between rows k-1 and k, and stored from there. Nothing per value beyond the
  ALIGNED rows kernel's work but the 16-bit x kept across the wait (X16) and the periodic w.
  Row index of the tile's first element: f0 // N with f0 64-bit; a 64-bit division is a SASS
  subroutine call (and a stack frame), so _row_of divides through an FP64 reciprocal instead.
  Rows across tiles: only the tile's first row and its last row can reach outside it; a row
  crosses at most SLOTS = (N-1)//TILE + 2 tiles. Those rows are reduced across CTAs exactly as
  the segments kernel does it (kernels.py): each CTA stores its partial in PARTIAL[row, slot]
  (slot = tile - the row's first tile), bar.sync, atom.add.acq_rel.gpu on the row's counter
  SYNC[2 + row], polls it (acquire) until every tile of the row arrived, bar.sync, and every CTA
  of the row sums PARTIAL[row, 0..tiles) in the same order (.cg loads): one bitwise rstd per
  row. A CTA publishes and arrives for both of its end rows before it polls either, so no CTA
  waits on a CTA that waits on it. Forward progress: tickets (SYNC[0], taken at CTA start) are
  tile indices in start order and a CTA waits only on tiles of its own two end rows, at most
  SLOTS - 1 tickets after its own, so as in the segments kernel at most SLOTS - 1 resident CTAs
  can be blocked on CTAs not yet started; configs cap SLOTS (an H200 holds >= 132 such CTAs).
  MAX_POLLS bounds the wait: a broken assumption gives NaN rows, not a hung GPU.
  The end of x: M*N need not be a multiple of V. The vector part of a tile stops at a multiple
  of V; the last tile also handles the last < V elements of x as a [V] scalar tile (row M-1),
  loaded again after the wait rather than kept.
  rstd: row r's first tile stores RSTD[r] (for rows inside one tile: that tile).
  Weight: element f of the flat array needs w[f mod N]. Two ways (configs.Config.w_period):
  - scalar (W_PERIOD off): the column from the element's row, w loaded a value at a time (it
    is read by every tile, so from L1/L2, but one load instruction per value);
  - periodic copy (W_PERIOD): w repeated over PERIOD = G*N elements, G = V / gcd(N, V) rows,
    the first multiple of N that is a multiple of V, plus one tile: WREP[i] = w[i mod N] for
    i < PERIOD + TILE. f mod PERIOD is then a multiple of V wherever f is, so tile t reads
    WREP[(t*TILE) mod PERIOD + offset] with 16-byte loads like x. The first CTAs by ticket
    (min(cdiv(PERIOD + TILE, BUILD), tiles)) write WREP inside the launch, BUILD values at a
    time, before their own tile, and count themselves on SYNC[1] (bar.sync, then a release
    atomic); every CTA waits for that count (in the same polling loop as its rows, after its x
    loads are in flight) before loading WREP with .cg. One launch, nothing cached: a weight
    changed in place between calls is read fresh.
  Cost, SASS of FP16 tiles without the copy-writing branch: ~800 instructions a thread a tile
  (ticket, row geometry, reductions, the sync and its scalar atomics, each broadcast through
  shared memory) plus ~9 a value: configs offer 32-128 values a thread. Not measured yet.
X16 (configs.Config.x16): x kept across the row sync in its loaded 16-bit form (kernels.py,
keep_16_bit).
"""
import triton
import triton.language as tl

from tilefly.ops.rms_norm.kernels import MAX_POLLS, keep_16_bit

BUILD = tl.constexpr(1024)  # elements of the periodic copy of w written per step


@triton.jit(do_not_specialize=["M"])
def rms_norm_flat_kernel(X, W, Y, RSTD, M, N, stride_row, eps, SYNC, PARTIAL, WREP, PERIOD,
                         TILE: tl.constexpr, SPAN: tl.constexpr, SPAN_P2: tl.constexpr, SLOTS: tl.constexpr,
                         V: tl.constexpr,
                         HAS_W: tl.constexpr, W_PERIOD: tl.constexpr, X16: tl.constexpr):
    ticket = tl.atomic_add(SYNC, 1, sem="relaxed")
    total = M.to(tl.int64) * N
    f0 = ticket.to(tl.int64) * TILE
    vec_start = tl.arange(0, TILE // V)[:, None] * V    # [TILE/V, 1]: a thread's 16-byte vectors
    lane = tl.arange(0, V)[None, :]                     # [1, V]: their elements, in the thread
    off = vec_start + lane
    rest = tl.minimum(total - f0, TILE).to(tl.int32)    # elements of x in this tile
    n_vec = rest // V * V                               # ... in whole 16-byte vectors
    vmask = vec_start < n_vec                           # [TILE/V, 1]

    if HAS_W and W_PERIOD:
        period = PERIOD // V * V
        rep_len = period + TILE
        n_build = tl.minimum(tl.cdiv(rep_len, BUILD), tl.cdiv(total, TILE).to(tl.int32))
        if ticket < n_build:  # one of the first CTAs: pieces of the periodic copy of w first
            # BUILD values at a time (few registers). A while loop, not range(): the interpreter's
            # range() reads tensor bounds through a patch that other program threads re-apply.
            c = ticket * BUILD
            while c < rep_len:
                i = c + tl.arange(0, BUILD)
                tl.store(WREP + i, tl.load(W + i % N, mask=i < rep_len), mask=i < rep_len)
                c += n_build * BUILD
            tl.debug_barrier()
            tl.atomic_add(SYNC + 1, 1, sem="acq_rel", scope="gpu")

    x_raw = tl.load(X + f0 + off, mask=vmask, other=0.0)
    xf = x_raw.to(tl.float32)
    vec_sumsq = tl.sum(xf * xf, axis=1, keep_dims=True)  # [TILE/V, 1]
    # The last < V elements of x (row M-1): the last tile takes them as scalars.
    tail = total // V * V + tl.arange(0, V)
    last_tile = f0 + TILE >= total
    tail_sumsq = 0.0
    if last_tile:
        xt = tl.load(X + tail, mask=tail < total, other=0.0).to(tl.float32)
        tail_sumsq = tl.sum(xt * xt, axis=0)

    # Row k of the tile (row r_first + k) holds offsets [lo0 + k*N, lo0 + (k+1)*N); the tail
    # belongs to the last row, k_last. Vector j lies in row k_vec[j] ("whole"), or it straddles
    # rows k and k+1: at most one vector per row start b_k = lo0 + k*N, k >= 1 (N >= 2V). Whole
    # vectors go the tile's way, a value a lane; straddling ones are loaded again (L1) into a
    # small [SPAN, V] tile, row k of it holding the vector around b_k.
    r_first = _row_of(f0, N)
    lo0 = (r_first * N - f0).to(tl.int32)               # in (-N, 0]
    k_last = (rest - 1 - lo0) // N                      # 32-bit division from here on
    r_last = r_first + k_last
    k_vec = tl.zeros_like(vec_start)
    for k in tl.static_range(1, SPAN):
        k_vec += (vec_start >= lo0 + k * N).to(tl.int32)
    whole = lo0 + (k_vec + 1) * N - vec_start >= V      # [TILE/V, 1]
    # Whole vectors' sums, all rows in one reduction: [TILE/V, SPAN_P2] -> [SPAN_P2].
    row_sums = tl.sum(tl.where(whole & (k_vec == tl.arange(0, SPAN_P2)[None, :]), vec_sumsq, 0.0), axis=0)
    # Straddling vectors: row k of the small tile, lanes before b_k in row k-1, the rest in row k.
    b = lo0 + tl.arange(0, SPAN_P2)[:, None] * N         # [SPAN_P2, 1]
    b_vec = b // V * V
    s_pos = b_vec + tl.arange(0, V)[None, :]
    s_mask = (tl.arange(0, SPAN_P2)[:, None] > 0) & (tl.arange(0, SPAN_P2)[:, None] < SPAN) & (b % V != 0) & \
        (b_vec < n_vec)
    xs = tl.load(X + f0 + s_pos, mask=s_mask, other=0.0).to(tl.float32)
    s_head = s_pos < b
    head_sums = tl.sum(tl.where(s_head, xs * xs, 0.0), axis=1)     # [SPAN_P2]: row k-1's
    tail_sums = tl.sum(tl.where(s_head, 0.0, xs * xs), axis=1)     # [SPAN_P2]: row k's
    sums = ()
    sum_last = 0.0
    for k in tl.static_range(SPAN):
        s = _element(row_sums, k, SPAN_P2) + _element(tail_sums, k, SPAN_P2)
        if k + 1 < SPAN:
            s += _element(head_sums, k + 1, SPAN_P2)
        s += tl.where(k == k_last, tail_sumsq, 0.0)
        sums = sums + (s,)
        sum_last += tl.where(k == k_last, s, 0.0)
    sum_first = sums[0]

    # The first and the last row may reach into other tiles: publish, arrive for both, then
    # wait for both (header).
    start_a = r_first * N
    tile_a = start_a // TILE
    tiles_a = ((start_a + N - 1) // TILE - tile_a + 1).to(tl.int32)
    start_b = r_last * N
    tile_b = start_b // TILE
    tiles_b = ((start_b + N - 1) // TILE - tile_b + 1).to(tl.int32)
    shared_a = tiles_a > 1
    shared_b = (tiles_b > 1) & (k_last > 0)
    tl.store(PARTIAL + r_first * SLOTS + (ticket - tile_a), sum_first, mask=shared_a)
    tl.store(PARTIAL + r_last * SLOTS + (ticket - tile_b), sum_last, mask=shared_b)
    tl.debug_barrier()
    arrived_a = tl.atomic_add(SYNC + 2 + r_first, 1, mask=shared_a, sem="acq_rel", scope="gpu") + 1
    arrived_b = tl.atomic_add(SYNC + 2 + r_last, 1, mask=shared_b, sem="acq_rel", scope="gpu") + 1
    arrived_a = tl.where(shared_a, arrived_a, tiles_a)
    arrived_b = tl.where(shared_b, arrived_b, tiles_b)
    if HAS_W and W_PERIOD:
        ready = tl.atomic_add(SYNC + 1, 0, sem="acquire", scope="gpu")
        need = n_build
    else:
        ready = tiles_a * 0
        need = 0
    polls = 0
    while ((arrived_a < tiles_a) | (arrived_b < tiles_b) | (ready < need)) & (polls < MAX_POLLS):
        wait_a = arrived_a < tiles_a
        wait_b = arrived_b < tiles_b
        arrived_a = tl.where(wait_a, tl.atomic_add(SYNC + 2 + r_first, 0, mask=wait_a, sem="acquire", scope="gpu"),
                             arrived_a)
        arrived_b = tl.where(wait_b, tl.atomic_add(SYNC + 2 + r_last, 0, mask=wait_b, sem="acquire", scope="gpu"),
                             arrived_b)
        if HAS_W and W_PERIOD:
            ready = tl.atomic_add(SYNC + 1, 0, sem="acquire", scope="gpu")
        polls += 1
    tl.debug_barrier()
    total_a = 0.0
    total_b = 0.0
    for j in tl.static_range(SLOTS):  # the same order in every CTA of the row: one bitwise rstd
        total_a += tl.load(PARTIAL + r_first * SLOTS + j, mask=shared_a & (j < tiles_a), other=0.0,
                           cache_modifier=".cg")
        total_b += tl.load(PARTIAL + r_last * SLOTS + j, mask=shared_b & (j < tiles_b), other=0.0,
                           cache_modifier=".cg")
    synced = (arrived_a >= tiles_a) & (arrived_b >= tiles_b) & (ready >= need)
    rstd_a = tl.math.rsqrt(tl.where(shared_a, total_a, sum_first) / N + eps)
    rstd_b = tl.math.rsqrt(tl.where(shared_b, total_b, sum_last) / N + eps)
    rstd_a = tl.where(synced, rstd_a, float("nan"))
    rstd_b = tl.where(synced, rstd_b, float("nan"))

    # Each row's rstd (stored by the row's first tile), then each whole vector's, and each
    # straddling vector's pair (row k-1's for its head lanes, row k's for the rest).
    rstd_vec = tl.zeros_like(vec_sumsq) + rstd_a
    s_rstd_head = tl.zeros_like(b).to(tl.float32)
    s_rstd_tail = s_rstd_head + rstd_a
    for k in tl.static_range(SPAN):
        lo = lo0 + k * N
        if k == 0:
            rstd = rstd_a
        else:
            rstd = tl.where(k == k_last, rstd_b, tl.math.rsqrt(sums[k] / N + eps))
            rstd_vec = tl.where(k_vec == k, rstd, rstd_vec)
            s_rstd_tail = tl.where(tl.arange(0, SPAN_P2)[:, None] == k, rstd, s_rstd_tail)
        if k + 1 < SPAN:
            s_rstd_head = tl.where(tl.arange(0, SPAN_P2)[:, None] == k + 1, rstd, s_rstd_head)
        tl.store(RSTD + r_first + k, rstd, mask=(lo >= 0) & (lo < rest))

    y = keep_16_bit(x_raw, X16).to(tl.float32) * rstd_vec
    ys = xs * tl.where(s_head, s_rstd_head, s_rstd_tail)
    if HAS_W:
        if W_PERIOD:
            # f0 mod PERIOD, PERIOD = G*N: (r_first mod G) rows plus -lo0 elements of x
            m0 = ((r_first.to(tl.int32) % (period // N)) * N - lo0) // V * V
            w = tl.load(WREP + m0 + off, mask=vmask & whole, other=0.0, cache_modifier=".cg")
            ws = tl.load(WREP + m0 + s_pos, mask=s_mask, other=0.0, cache_modifier=".cg")
        else:  # columns: from the vector's row start (for a straddling one, row k-1's or row k's)
            w = tl.load(W + (vec_start - lo0 - k_vec * N + lane), mask=vmask & whole, other=0.0)
            ws = tl.load(W + tl.where(s_head, s_pos - b + N, s_pos - b), mask=s_mask, other=0.0)
        y = y * w.to(tl.float32)
        ys = ys * ws.to(tl.float32)
    tl.store(Y + f0 + off, y.to(Y.dtype.element_ty), mask=vmask & whole)
    tl.store(Y + f0 + s_pos, ys.to(Y.dtype.element_ty), mask=s_mask)
    if last_tile:
        t_mask = tail < total
        yt = tl.load(X + tail, mask=t_mask, other=0.0).to(tl.float32) * tl.where(k_last == 0, rstd_a, rstd_b)
        if HAS_W:
            yt = yt * tl.load(W + (tail - r_last * N), mask=t_mask, other=0.0).to(tl.float32)
        tl.store(Y + tail, yt.to(Y.dtype.element_ty), mask=t_mask)


@triton.jit
def _row_of(f, N):
    """f // N for an int64 f < 2**53 without a 64-bit division (a subroutine call in SASS): FP32
    reciprocal, two Newton steps in FP64 (relative error ~2**-52), product, one correction
    each way."""
    n = N.to(tl.float64)
    inv = (1.0 / N.to(tl.float32)).to(tl.float64)
    inv = inv * (2.0 - n * inv)
    inv = inv * (2.0 - n * inv)
    q = (f.to(tl.float64) * inv).to(tl.int64)
    q = tl.where(q * N > f, q - 1, q)
    return tl.where((q + 1) * N <= f, q + 1, q)


@triton.jit
def _element(t, k: tl.constexpr, SIZE: tl.constexpr):
    """t[k] of a [SIZE] tensor, as a scalar."""
    return tl.sum(tl.where(tl.arange(0, SIZE) == k, t, 0.0), axis=0)

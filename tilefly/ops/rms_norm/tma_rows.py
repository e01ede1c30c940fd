"""RMSNorm forward, one row per CTA staged through shared memory by TMA (Gluon).

Why: a contiguous row of N elements starts N * row elements into x, so when N is not a multiple
of the 16-byte vector (V elements) the row's start drifts off alignment and the rows kernel of
kernels.py has to cut it into an aligned body, scalar edges and scalar (or shifted) w loads.
TMA has no such constraint: x and y are described as one flat tensor of M * N elements and a
copy may start at any element. The row lands in shared memory at offset 0, so the reads from
shared memory and the loads of w are 16-byte vectors whatever the row's alignment.

Layout plan
  Descriptors  x and y as 1-D tensors of M * N elements (TMA coordinates are int32: M * N < 2^31),
               box of BOX = 256 elements (the largest box dimension TMA takes), no swizzle.
  Shared       [CHUNKS * CHUNK, BOX] elements of x's dtype: box k of the row at row k (the boxes
               past the row's BOXES = ceil(N / BOX) are padding and never read unmasked). FP32 rows
               of 16385: 72 boxes, 72 KB, three CTAs an SM; 16-bit: 36 KB, six.
  Barriers     one mbarrier per CHUNK boxes, expect-tx of the chunk's bytes, so the first pass
               starts on chunk 0 while later boxes are in flight. Each barrier completes once
               (phase 0): a CTA serves one row.
  Registers    a chunk [CHUNK, BOX] at a time in a blocked layout: each thread holds 16-byte runs
               (V elements) along a box, lanes continue along it, warps across boxes. Pass 1 reads
               each chunk into an FP32 sum of squares (elements at or past N, which belong to the
               next row or were never loaded, count as 0); pass 2 reads it again, scales by rstd
               and w (16-byte loads: w's column j sits at shared column j) and writes y back over
               x in place (each thread rewrites exactly what it read, so no barrier between).
  Stores       after a fence and a CTA barrier one thread issues a TMA store for every box wholly
               inside the row; the last partial box (N % BOX elements: a store box would spill
               into the next row) goes out through masked plain stores. store_wait(0) before exit
               keeps shared memory alive until the TMA engine has read it.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

BOX = 256  # elements per TMA copy: the largest box dimension


@gluon.constexpr_function
def chunk_layout(chunk, box, vec, num_warps):
    """[chunk, box] over num_warps warps, 16-byte runs per thread along the box."""
    lanes_col = min(32, box // vec)
    return gl.BlockedLayout([1, vec], [32 // lanes_col, lanes_col], [num_warps, 1], [1, 0])


@gluon.constexpr_function
def boxes_in_chunk(c, chunk, boxes):
    return min(chunk, boxes - c * chunk)


@gluon.jit
def box(bufs, k, CHUNK: gl.constexpr, desc):
    """Box k of the row as the 1-D shared buffer a TMA copy of ``desc`` takes (unswizzled,
    so the [CHUNK, BOX] slab viewed with the descriptor's rank-1 layout is the same bytes)."""
    slab = bufs.index(k // CHUNK)._reinterpret(desc.dtype, [CHUNK, desc.block_type.shape[0]], desc.layout)
    return slab.index(k % CHUNK)


@gluon.jit
def rms_norm_tma_kernel(x_desc, y_desc, xv_desc, yv_desc, w_ptr, y_ptr, rstd_ptr, N, view_rows, eps,
                        BOXES: gl.constexpr, CHUNK: gl.constexpr, HAS_W: gl.constexpr, VIEW2D: gl.constexpr):
    BOX_: gl.constexpr = x_desc.block_type.shape[0]
    DTYPE: gl.constexpr = x_desc.dtype
    V: gl.constexpr = 128 // DTYPE.primitive_bitwidth
    CHUNKS: gl.constexpr = (BOXES + CHUNK - 1) // CHUNK
    # Chunks before FULL_CHUNKS lie wholly inside every row this kernel serves (N > (BOXES-1)*BOX),
    # so their w loads need no mask, which would break them into scalars (N % V != 0).
    FULL_CHUNKS: gl.constexpr = (BOXES - 1) // CHUNK
    layout: gl.constexpr = chunk_layout(CHUNK, BOX_, V, gl.num_warps())
    row = gl.program_id(0)
    start = row * N

    slab_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=DTYPE.primitive_bitwidth,
                                                     rank=2)
    bufs = gl.allocate_shared_memory(DTYPE, [CHUNKS, CHUNK, BOX_], slab_layout)
    bars = gl.allocate_shared_memory(gl.int64, [CHUNKS, 1], mbarrier.MBarrierLayout())
    for c in gl.static_range(CHUNKS):
        mbarrier.init(bars.index(c), count=1)
    fence_async_shared()
    for c in gl.static_range(CHUNKS):
        first = start + c * CHUNK * BOX_
        if VIEW2D and first // BOX_ + CHUNK <= view_rows:
            mbarrier.expect(bars.index(c), xv_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(xv_desc, [first // BOX_, first % BOX_], bars.index(c), bufs.index(c))
        else:
            mbarrier.expect(bars.index(c), boxes_in_chunk(c, CHUNK, BOXES) * x_desc.block_type.nbytes)
            for b in gl.static_range(boxes_in_chunk(c, CHUNK, BOXES)):
                tma.async_copy_global_to_shared(x_desc, [first + b * BOX_], bars.index(c),
                                                box(bufs, c * CHUNK + b, CHUNK, x_desc))

    box_ids = gl.arange(0, CHUNK, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, BOX_, layout=gl.SliceLayout(0, layout))
    offs = box_ids[:, None] * BOX_ + cols[None, :]
    acc = gl.zeros([CHUNK, BOX_], gl.float32, layout)
    for c in gl.static_range(CHUNKS):
        mbarrier.wait(bars.index(c), 0)
        xs = bufs.index(c).load(layout).to(gl.float32)
        if c >= FULL_CHUNKS:
            xs = gl.where(c * CHUNK * BOX_ + offs < N, xs, 0.0)
        acc += xs * xs
    rstd = gl.rsqrt(gl.sum(gl.sum(acc, axis=1), axis=0) / N + eps)

    for c in gl.static_range(CHUNKS):
        chunk = bufs.index(c)
        ys = chunk.load(layout).to(gl.float32) * rstd
        if HAS_W:
            if c < FULL_CHUNKS:
                ys = ys * gl.load(w_ptr + c * CHUNK * BOX_ + offs).to(gl.float32)
            else:
                ws = gl.load(w_ptr + c * CHUNK * BOX_ + offs, mask=c * CHUNK * BOX_ + offs < N, other=0.0)
                ys = ys * ws.to(gl.float32)
        chunk.store(ys.to(DTYPE))
    fence_async_shared()
    gl.thread_barrier()

    whole = N // BOX_
    for c in gl.static_range(CHUNKS):
        first = start + c * CHUNK * BOX_
        if VIEW2D and (c + 1) * CHUNK <= whole and first // BOX_ + CHUNK <= view_rows:
            tma.async_copy_shared_to_global(yv_desc, [first // BOX_, first % BOX_], bufs.index(c))
        else:
            for b in gl.static_range(boxes_in_chunk(c, CHUNK, BOXES)):
                if c * CHUNK + b < whole:
                    tma.async_copy_shared_to_global(y_desc, [first + b * BOX_], box(bufs, c * CHUNK + b, CHUNK, y_desc))
    if whole < BOXES:  # the row's last, partial box
        tail_layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
        t = gl.arange(0, BOX_, layout=tail_layout)
        tail = box(bufs, whole, CHUNK, y_desc).load(tail_layout)
        gl.store(y_ptr + start + whole * BOX_ + t, tail, mask=whole * BOX_ + t < N)
    gl.store(rstd_ptr + row, rstd)
    tma.store_wait(0)

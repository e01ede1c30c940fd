"""A STAGES-deep ring of TMA loads into NVMMA-swizzled shared memory.

Slot s holds one K-step of both operands: an LHS tile (the rows of the output)
and an RHS tile (its columns). ``ready[s]`` is an mbarrier that completes a
phase when both TMA copies of slot s have landed (expect-tx with their byte
count); ``empty[s]`` (warp-specialized kernels only) completes when the
consumer has finished reading slot s. Item number c of the stream always goes
to slot c % STAGES and its barriers are in phase (c // STAGES) & 1, so a
producer and a consumer that count the same items agree without talking.

Orientation: a K-major operand tile is stored [rows, BK] (K contiguous, loaded
from a row-major LHS or a column-major RHS); an MN-major tile is stored
[BK, rows] (loaded from the transposed view of the tensor). wgmma reads 16-bit
operands from shared memory in either orientation, so the four GEMM layouts
NN/NT/TN/TT differ only in descriptors and these views, never by a copy.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma


@gluon.jit
def alloc_ring(a_desc, b_desc, STAGES: gl.constexpr):
    """Operand buffers for STAGES slots and one initialized barrier per slot."""
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    bars = alloc_barriers(STAGES)
    return a_bufs, b_bufs, bars


@gluon.jit
def alloc_barriers(STAGES: gl.constexpr):
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    return bars


@gluon.jit
def issue_load(a_desc, b_desc, a_bufs, b_bufs, bars, item, off_m, off_n, off_k,
               A_KMAJOR: gl.constexpr, B_KMAJOR: gl.constexpr, STAGES: gl.constexpr, pred=True, b_k_base=0):
    """Start the TMA copies of stream item ``item`` (LHS rows off_m, RHS columns off_n,
    K offset off_k) into its slot. Out-of-bounds rows and columns arrive as zeros.
    ``b_k_base`` shifts only the RHS's K coordinate: a grouped GEMM reads group g's
    MN-major RHS from a [G*K, N] view, its K rows starting at g*K."""
    issue_load_a(a_desc, b_desc, a_bufs, bars, item, off_m, off_k, A_KMAJOR, STAGES, pred)
    issue_load_b(b_desc, b_bufs, bars, item, off_n, off_k, B_KMAJOR, STAGES, pred, b_k_base)


@gluon.jit
def issue_load_a(a_desc, b_desc, a_bufs, bars, item, off_m, off_k, A_KMAJOR: gl.constexpr, STAGES: gl.constexpr,
                 pred=True):
    """``issue_load``'s first half: the slot's barrier is told to expect both operands' bytes and the
    LHS copy starts. A kernel may issue it for operands no kernel ahead of it writes (weights) before
    it waits for that kernel (grid_dependency), and ``issue_load_b`` after."""
    slot = item % STAGES
    bar = bars.index(slot)
    mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=pred)
    if A_KMAJOR:
        tma.async_copy_global_to_shared(a_desc, [off_m, off_k], bar, a_bufs.index(slot), pred)
    else:
        tma.async_copy_global_to_shared(a_desc, [off_k, off_m], bar, a_bufs.index(slot), pred)


@gluon.jit
def issue_load_b(b_desc, b_bufs, bars, item, off_n, off_k, B_KMAJOR: gl.constexpr, STAGES: gl.constexpr, pred=True,
                 b_k_base=0):
    """``issue_load``'s second half: the RHS copy into the slot whose barrier ``issue_load_a`` armed."""
    slot = item % STAGES
    bar = bars.index(slot)
    if B_KMAJOR:
        tma.async_copy_global_to_shared(b_desc, [off_n, off_k], bar, b_bufs.index(slot), pred)
    else:
        tma.async_copy_global_to_shared(b_desc, [b_k_base + off_k, off_n], bar, b_bufs.index(slot), pred)


@gluon.jit
def wait_ready(bars, item, STAGES: gl.constexpr):
    mbarrier.wait(bars.index(item % STAGES), (item // STAGES) & 1)


@gluon.jit
def wait_empty(bars, item, STAGES: gl.constexpr):
    # The first pass over the ring finds every slot free: waiting on the phase
    # before the barrier's first completes at once.
    mbarrier.wait(bars.index(item % STAGES), ((item // STAGES) & 1) ^ 1)


@gluon.jit
def lhs_operand(a_bufs, slot, A_KMAJOR: gl.constexpr):
    """The [BM, BK] view wgmma takes as its A operand."""
    tile = a_bufs.index(slot)
    if not A_KMAJOR:
        tile = tile.permute((1, 0))
    return tile


@gluon.jit
def rhs_operand(b_bufs, slot, B_KMAJOR: gl.constexpr):
    """The [BK, BN] view wgmma takes as its B operand."""
    tile = b_bufs.index(slot)
    if B_KMAJOR:
        tile = tile.permute((1, 0))
    return tile

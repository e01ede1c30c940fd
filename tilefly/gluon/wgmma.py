"""The async-wgmma mainloop over a TMA ring (see tma_ring).

One K-step: wait for the slot's ``ready`` barrier, issue an async wgmma on the
slot's two tiles, then wait until at most one wgmma group is in flight. That
wait retires the previous step, so its slot may be refilled: in the
single-partition loop the same warps issue the TMA for the step STAGES-1
ahead into it; in the warp-specialized loop they arrive on its ``empty``
barrier for the producer warp. Triton's shared-memory barrier analysis puts a
CTA barrier between the wait and the refill or arrive, so every warpgroup has
retired its reads of the slot before it is overwritten.

Items are numbered across tiles (``first_item``), which keeps barrier phases
right when a persistent kernel runs many tiles through one ring.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

from tilefly.gluon.tma_ring import issue_load, lhs_operand, rhs_operand, wait_ready


@gluon.jit
def prefetch(a_desc, b_desc, a_bufs, b_bufs, bars, first_item, off_m, off_n, k_first, k_iters,
             A_KMAJOR: gl.constexpr, B_KMAJOR: gl.constexpr, STAGES: gl.constexpr, BLOCK_K: gl.constexpr,
             b_k_base=0):
    """Issue the first STAGES-1 K-steps of a tile (fewer when the tile has fewer).
    ``b_k_base``: see tma_ring.issue_load."""
    for i in gl.static_range(STAGES - 1):
        issue_load(a_desc, b_desc, a_bufs, b_bufs, bars, first_item + i, off_m, off_n, (k_first + i) * BLOCK_K,
                   A_KMAJOR, B_KMAJOR, STAGES, pred=i < k_iters, b_k_base=b_k_base)


@gluon.jit
def mma_step(a_bufs, b_bufs, slot, acc, A_KMAJOR: gl.constexpr, B_KMAJOR: gl.constexpr):
    """One async wgmma on ring slot ``slot``; waits until at most this one group is in flight,
    so the slot read by the previous group can be refilled."""
    acc = warpgroup_mma(lhs_operand(a_bufs, slot, A_KMAJOR), rhs_operand(b_bufs, slot, B_KMAJOR), acc,
                        is_async=True)
    return warpgroup_mma_wait(num_outstanding=1, deps=(acc,))


@gluon.jit
def mainloop(a_desc, b_desc, a_bufs, b_bufs, bars, first_item, off_m, off_n, k_first, k_iters, acc,
             A_KMAJOR: gl.constexpr, B_KMAJOR: gl.constexpr, STAGES: gl.constexpr, BLOCK_K: gl.constexpr,
             b_k_base=0):
    """Accumulate k_iters K-steps into acc; ``prefetch`` must have issued the first
    STAGES-1. Returns acc with every wgmma retired."""
    for k in range(k_iters):
        item = first_item + k
        wait_ready(bars, item, STAGES)
        acc = mma_step(a_bufs, b_bufs, item % STAGES, acc, A_KMAJOR, B_KMAJOR)
        ahead = k + STAGES - 1
        issue_load(a_desc, b_desc, a_bufs, b_bufs, bars, first_item + ahead, off_m, off_n,
                   (k_first + ahead) * BLOCK_K, A_KMAJOR, B_KMAJOR, STAGES, pred=ahead < k_iters, b_k_base=b_k_base)
    return warpgroup_mma_wait(num_outstanding=0, deps=(acc,))


@gluon.jit
def mainloop_consumer(a_bufs, b_bufs, ready, empty, first_item, k_iters, acc,
                      A_KMAJOR: gl.constexpr, B_KMAJOR: gl.constexpr, STAGES: gl.constexpr):
    """The consumer half of a warp-specialized mainloop: a producer partition fills
    the ring; this hands each slot back on ``empty`` once its wgmma retired."""
    for k in range(k_iters):
        item = first_item + k
        wait_ready(ready, item, STAGES)
        acc = mma_step(a_bufs, b_bufs, item % STAGES, acc, A_KMAJOR, B_KMAJOR)
        mbarrier.arrive(empty.index((item + STAGES - 1) % STAGES), count=1, pred=k > 0)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    mbarrier.arrive(empty.index((first_item + k_iters + STAGES - 1) % STAGES), count=1, pred=k_iters > 0)
    return acc


@gluon.jit
def as_a_operand(x, acc_layout: gl.constexpr, dtype: gl.constexpr):
    """An FP32 accumulator tile ``x`` (attention's P or dS) cast to ``dtype`` as the register A
    operand of a wgmma into an accumulator laid out as ``acc_layout``. Where both accumulators
    keep warps along M only, each thread already holds its rows and the move needs no shared
    memory; otherwise (head dim 512's column-split warpgroups) it goes through shared scratch.
    The layout, not the accumulator, is passed: an accumulator in flight has no layout yet."""
    return gl.convert_layout(x.to(dtype), gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2))

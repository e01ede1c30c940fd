"""Gluon building blocks shared by tilefly's Hopper matrix kernels.

Each module has one job and only ``@gluon.jit`` helpers or compile-time layout
functions, so the dense, grouped and MX GEMMs compose the same pieces:

    layouts     the wgmma accumulator layout for a tile and warp count
    tma_ring    a STAGES-deep ring of TMA loads guarded by mbarriers, operands in
                either K-major or MN-major orientation (all four GEMM layouts)
    wgmma       the async-wgmma mainloop that consumes the ring
    scheduler   tile order: grouped (L2-friendly) swizzle, persistent tile ranges,
                split-K grids
    epilogue    bias, split-K reduction with a ticket, TMA and masked stores
    grid_dependency  programmatic dependent launch: wait for the kernel ahead

Importing this package imports triton; tilefly imports it only from kernel modules,
which are themselves imported on first use.
"""

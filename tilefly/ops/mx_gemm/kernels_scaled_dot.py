"""MX GEMM through Triton's ``tl.dot_scaled`` (plain Triton): an experiment, not routed yet.

On sm_90 Triton lowers ``dot_scaled`` by upcasting each operand tile to BF16 in registers (value
times its block's E8M0 scale) and running BF16 wgmma with FP32 accumulation: the fused form of the
BF16 route (upcast.py), which reads the MX bytes once instead of writing and re-reading BF16
copies. scaled_dot.py runs it; scripts/mx_scaled_dot_probe.py times it against the route, the exact
kernels and BF16 ``mm``. Until those numbers and the GPU tests say otherwise, no call is served by it.

C = A @ B with A [M, K] and B given as [N, K] (both K-major: MXFP8 bytes, or MXFP4 nibble pairs along
K, low nibble first), scales (rows, K / 32) through strides or the SWIZZLE_32_4_4 offsets.

Layout plan: one program per [BLOCK_M, BLOCK_N] output tile, programs grouped GROUP_M tiles along M
so neighbours share B tiles in L2; num_warps 4 or 8, Triton's software pipeline over num_stages
K steps of BLOCK_K. Each step loads an A tile [BLOCK_M, BLOCK_K / PACK] and a B tile [BLOCK_K / PACK,
BLOCK_N] (K contiguous in both: 16-byte vector loads along K) and their scale tiles [rows,
BLOCK_K / 32]; Triton picks the register and shared layouts of the upcast and the wgmma. K tails
load zero bytes with scale 2^0 (127). Epilogue: bias along N, cast, masked store.
"""
import triton
import triton.language as tl

from tilefly.ops.mx_gemm.kernels_upcast import _scale_offsets

SCALE_BLOCK = tl.constexpr(32)


@triton.jit
def _group_tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    tile_m = first_m + (pid % per_group) % group_rows
    tile_n = (pid % per_group) // group_rows
    return tile_m, tile_n


@triton.jit
def mx_scaled_dot_kernel(a_ptr, sa_ptr, b_ptr, sb_ptr, c_ptr, bias_ptr, M, N, K, stride_am, stride_bn, stride_sar,
                         stride_sac, stride_sbr, stride_sbc, stride_cm, stride_cn, stride_bias,
                         FORMAT: tl.constexpr, A_SWIZZLED: tl.constexpr, B_SWIZZLED: tl.constexpr,
                         BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         GROUP_M: tl.constexpr):
    PACK: tl.constexpr = 2 if FORMAT == "e2m1" else 1
    tile_m, tile_n = _group_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    in_m, in_n = rm < M, rn < N
    k_blocks = K // SCALE_BLOCK
    a_rows = a_ptr + rm.to(tl.int64)[:, None] * stride_am
    b_cols = b_ptr + rn.to(tl.int64)[None, :] * stride_bn
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 // PACK + tl.arange(0, BLOCK_K // PACK)           # bytes along K
        in_k = kk < K // PACK
        a = tl.load(a_rows + kk[None, :], mask=in_m[:, None] & in_k[None, :], other=0.0)
        b = tl.load(b_cols + kk[:, None], mask=in_k[:, None] & in_n[None, :], other=0.0)
        kb = k0 // SCALE_BLOCK + tl.arange(0, BLOCK_K // SCALE_BLOCK)
        in_kb = kb < k_blocks
        sa = tl.load(sa_ptr + _scale_offsets(rm[:, None], kb[None, :], k_blocks, stride_sar, stride_sac, A_SWIZZLED),
                     mask=in_m[:, None] & in_kb[None, :], other=127)
        sb = tl.load(sb_ptr + _scale_offsets(rn[:, None], kb[None, :], k_blocks, stride_sbr, stride_sbc, B_SWIZZLED),
                     mask=in_n[:, None] & in_kb[None, :], other=127)
        acc = tl.dot_scaled(a, sa, FORMAT, b, sb, FORMAT, acc)
    if BIAS:
        acc += tl.load(bias_ptr + rn.to(tl.int64) * stride_bias, mask=in_n, other=0.0).to(tl.float32)[None, :]
    offs = rm.to(tl.int64)[:, None] * stride_cm + rn.to(tl.int64)[None, :] * stride_cn
    tl.store(c_ptr + offs, acc.to(c_ptr.dtype.element_ty), mask=in_m[:, None] & in_n[None, :])

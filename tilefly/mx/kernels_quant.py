"""MX quantization of contiguous rows in one pass (plain Triton): what ``quant.quantize_rows`` computes
with a dozen PyTorch ops, each reading or writing the whole tensor in FP32.

Why: an eager MXLinear (the e2e benchmark's prefill, any uncompiled model) quantizes its activation
every call. The op-by-op path moves ~39 bytes a BF16 element (upcast, abs, amax, scale, clamp, cast,
and for MXFP4 seven comparisons); this kernel reads the element once and writes its byte or nibble
and, per 32 elements, one scale byte.

The rules are quant.py's and the results are bit-identical to it, so the encoders below use integer
and exact FP32 operations only (Triton's interpreter truncates FP8 subnormals where the GPU rounds):

- the block's scale field is the largest FP32 exponent field among its elements (the field of amax;
  255 when an element is Inf or NaN), minus emax, at least 0;
- y = x * 2^(127 - field) is exact (a power of two that keeps y normal or zero);
- E4M3: normals round their FP32 mantissa to three bits by an integer add (ties to even, a carry
  moves into the exponent); below 2^-6, adding 2^14 leaves y rounded to a multiple of 2^-9 (FP32's
  spacing there), ties to even, which is the subnormal code; magnitudes saturate at 448 first;
  NaN becomes 0x7F with its sign, as torch's cast makes it;
- E2M1: the code counts the midpoints between E2M1 magnitudes that |y| passes (``>=`` where a tie
  rounds up to an even code, ``>`` elsewhere), plus the sign bit; NaN gives a signed zero code.

Layout plan: the tensor is a sequence of 32-element blocks (rows are contiguous and K is a multiple
of 32), so one program takes BLOCKS = 64 consecutive blocks as a [64, 32] tile over num_warps 4.
In the sm_90a build Triton gives each thread half a block, 16 consecutive elements (two 16-byte
loads of BF16), so a block's exponent maximum is one exchange between two lanes, and E4M3 bytes
leave in one 16-byte store a thread. E2M1 codes are joined in pairs along the tile's last dim (low
nibble first) through a layout change in 1 KB of shared memory, then stored 8 bytes a thread. One
scale byte a block. (mx_gemm's configs.quantize_specs checks those vector widths in the SASS.)
With PDL (``config.mx_pdl``) the kernel waits for the kernel ahead before its first load and lets the
next PDL kernel (the MX GEMM) launch at once.
"""
import triton
import triton.language as tl

E8M0_NAN = tl.constexpr(255)
SCALE_BLOCK = tl.constexpr(32)
E4M3_MAX_BITS = tl.constexpr(0x43E00000)      # 448.0 as FP32 bits
E4M3_MIN_NORMAL_BITS = tl.constexpr(0x3C800000)  # 2^-6
SUBNORMAL_SHIFTER = tl.constexpr(16384.0)     # 2^14: FP32 spacing 2^-9 at this magnitude
SUBNORMAL_SHIFTER_BITS = tl.constexpr(0x46800000)


@triton.jit
def e4m3_codes(y):
    """E4M3 bytes (int32 0..255) of FP32 values y, rounded to nearest even, saturated at +-448."""
    bits = y.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    mag_bits = tl.minimum(bits & 0x7FFFFFFF, E4M3_MAX_BITS)   # NaN bits exceed Inf's: handled below
    rounded = mag_bits + 0x7FFFF + ((mag_bits >> 20) & 1)
    normal = (rounded >> 20) - ((127 - 7) << 3)
    mag = mag_bits.to(tl.float32, bitcast=True)
    subnormal = (mag + SUBNORMAL_SHIFTER).to(tl.int32, bitcast=True) - SUBNORMAL_SHIFTER_BITS
    code = tl.where(mag_bits >= E4M3_MIN_NORMAL_BITS, normal, subnormal)
    code = tl.where((bits & 0x7FFFFFFF) > 0x7F800000, 0x7F, code)
    return code | sign


@triton.jit
def e2m1_codes(y):
    """E2M1 codes (int32 0..15) of FP32 values y: round to nearest even, saturate at +-6."""
    mag = tl.abs(y)
    code = (mag > 0.25).to(tl.int32) + (mag >= 0.75).to(tl.int32) + (mag > 1.25).to(tl.int32)
    code += (mag >= 1.75).to(tl.int32) + (mag > 2.5).to(tl.int32) + (mag >= 3.5).to(tl.int32)
    code += (mag > 5.0).to(tl.int32)
    return code | ((y.to(tl.int32, bitcast=True) >> 28) & 8)


@triton.jit
def bf16_to_f32(x):
    """FP32 values of BF16 (or int16-viewed BF16) x, by moving the bits up: exact, also for subnormals
    in Triton's interpreter, whose casts may flush them."""
    return ((x.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF) << 16).to(tl.float32, bitcast=True)


@triton.jit
def block_scales(x, EMAX: tl.constexpr):
    """(E8M0 scale codes [R], x scaled by 2^-scale [R, 32]) of FP32 blocks x [R, 32], by the rules above."""
    field = tl.max((x.to(tl.int32, bitcast=True) >> 23) & 0xFF, axis=1)
    scale = tl.where(field == 0xFF, E8M0_NAN, tl.maximum(field - EMAX, 0))
    inverse = (tl.where(scale == E8M0_NAN, 127, 254 - scale) << 23).to(tl.float32, bitcast=True)
    return scale, x * inverse[:, None]


@triton.jit
def e2m1_pairs(y, BLOCKS: tl.constexpr):
    """The packed E2M1 bytes [BLOCKS, 16] (low nibble first) of scaled blocks y [BLOCKS, 32]."""
    lo, hi = tl.split(tl.reshape(e2m1_codes(y), [BLOCKS, SCALE_BLOCK // 2, 2]))
    return lo | (hi << 4)


@triton.jit
def store_blocks(data_ptr, scale_ptr, index, scale, y, live, FP4: tl.constexpr, BLOCKS: tl.constexpr):
    """Store BLOCKS scale blocks, numbered ``index`` [BLOCKS] in the tensor's row-major block order (where
    ``live``): their E8M0 codes ``scale`` and their scaled values ``y`` [BLOCKS, 32] as E2M1 nibble pairs
    (16 bytes a block) or E4M3 bytes (32 a block)."""
    tl.store(scale_ptr + index, scale.to(tl.uint8), mask=live)
    if FP4:
        pair = tl.arange(0, SCALE_BLOCK // 2)
        tl.store(data_ptr + index[:, None] * (SCALE_BLOCK // 2) + pair[None, :], e2m1_pairs(y, BLOCKS).to(tl.uint8),
                 mask=live[:, None])
    else:
        element = tl.arange(0, SCALE_BLOCK)
        tl.store(data_ptr + index[:, None] * SCALE_BLOCK + element[None, :], e4m3_codes(y).to(tl.uint8),
                 mask=live[:, None])


EXPAND_SPAN = tl.constexpr(8)   # tilefly.mx.expanded.EXPAND_SPAN


@triton.jit
def e2m1_values(code):
    """FP32 values of E2M1 codes (int32 0..15): magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6, the sign in bit 3."""
    mag = code & 7
    bits = tl.where(mag >= 2, (((mag >> 1) + 126) << 23) | ((mag & 1) << 22), tl.where(mag == 1, 0x3F000000, 0))
    return (bits | ((code & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def _max_and_min(a_high, a_low, b_high, b_low):
    return tl.maximum(a_high, b_high), tl.minimum(a_low, b_low)


@triton.jit
def store_expanded(expanded_ptr, expanded_scale_ptr, row, K, first_block, scale, y, live, BLOCKS: tl.constexpr):
    """Store the expanded copy (tilefly.mx.expanded) of one fold group, BLOCKS MXFP4 blocks of a row from
    block ``first_block``: their E8M0 codes ``scale`` [BLOCKS] and scaled values ``y`` [BLOCKS, 32] (blocks
    past the row not ``live``). A folded group (every block holding a nonzero code within EXPAND_SPAN of the
    group's top scale, none NaN) stores E2M1 value x 2^(scale - top), exact in E4M3, and ``top`` as every
    block's scale; another group its E2M1 values and own scales. Values go in the MX GEMM's unpack order: a
    block's even K, then its odd K."""
    code = e2m1_codes(y)
    nonzero = (tl.max(code & 7, axis=1) > 0) & live
    # the group's top scale and its lowest nonzero block's, in one reduction across the program
    top, low = tl.reduce((tl.where(live, scale, 0), tl.where(nonzero, scale, E8M0_NAN)), 0, _max_and_min)
    folded = (top - low <= EXPAND_SPAN) & (top != E8M0_NAN)
    shift = tl.where(folded, scale - top, 0)          # >= -EXPAND_SPAN where it matters: 2^shift is a normal
    value = e2m1_values(code) * ((shift + 127) << 23).to(tl.float32, bitcast=True)[:, None]
    # A thread holds half a block, 16 consecutive K (module docstring): its 8 even ones land at 8 consecutive
    # bytes of the block's first half, its 8 odd ones at 8 of its second half. Split so, each half is one
    # 8-byte store a thread; stored by computed offsets, they were 16 byte stores each touching its own
    # sector (the e2e step's fused norm kernel took 7.6 us a call against 3.3, BENCHMARKS.md session 42).
    HALF: tl.constexpr = SCALE_BLOCK // 2
    even, odd = tl.split(tl.reshape(e4m3_codes(value).to(tl.uint8), [BLOCKS, 2, HALF // 2, 2]))
    blk = first_block + tl.arange(0, BLOCKS)
    at = (expanded_ptr + row * K + blk[:, None, None] * SCALE_BLOCK
          + (tl.arange(0, 2) * (HALF // 2))[None, :, None] + tl.arange(0, HALF // 2)[None, None, :])
    tl.store(at, even, mask=live[:, None, None])
    tl.store(at + HALF, odd, mask=live[:, None, None])
    tl.store(expanded_scale_ptr + row * (K // SCALE_BLOCK) + blk, tl.where(folded, top, scale).to(tl.uint8),
             mask=live)


@triton.jit
def mx_quantize_kernel(x_ptr, data_ptr, scale_ptr, n_blocks, EMAX: tl.constexpr, FP4: tl.constexpr,
                       BLOCKS: tl.constexpr, PDL: tl.constexpr):
    if PDL:   # programmatic dependent launch (config.mx_pdl)
        tl.extra.cuda.gdc_wait()                # the input may come from the kernel ahead
        tl.extra.cuda.gdc_launch_dependents()   # the GEMM after may start: it waits for this kernel inside
    blk = tl.program_id(0).to(tl.int64) * BLOCKS + tl.arange(0, BLOCKS)
    live = blk < n_blocks
    col = tl.arange(0, SCALE_BLOCK)
    x = tl.load(x_ptr + blk[:, None] * SCALE_BLOCK + col[None, :], mask=live[:, None], other=0.0)
    if x_ptr.dtype.element_ty == tl.bfloat16:
        x = bf16_to_f32(x)
    else:
        x = x.to(tl.float32)
    scale, y = block_scales(x, EMAX)
    store_blocks(data_ptr, scale_ptr, blk, scale, y, live, FP4, BLOCKS)

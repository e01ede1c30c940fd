"""Split-KV decode attention with an additive mask (plain Triton): at most 16 query rows a head
(one decode token, or the query heads of one KV group) against a long KV cache.

Serves SDPA's masked decode calls under ``config.attention_decode`` (eager.py: "on", or "auto" where the
decode tuning database has it winning).
Correctness is checked under Triton's interpreter (decode.interpreter_checks) and the kernels compile
for sm_90a (decode.compile_specs); BENCHMARKS.md (session 30) has the H200 measurements.

Why split the keys: a decode step has B x H programs' worth of query rows (32 requests x 8 KV heads =
256), each against up to thousands of keys; splitting each head's keys over ``splits`` programs puts
enough programs on 132 SMs to stream the cache at full bandwidth.

Layout plan (``decode_split_kernel``, one program per (batch x head, split), num_warps 4 by default):

    query       [BLOCK_M = 16, D] rows of one (batch, head), loaded once, padding rows zero; the dot
                needs M >= 16, so Sq <= 16.
    keys        BLOCK_N (decode.DecodeConfig, 64 by default) keys a step, over the program's contiguous
                range of ``keys_per_split`` (a multiple of BLOCK_N). With a bias, a backward scan first
                reads the range's bias SCAN = 256 keys at a time ([16, SCAN] blocks, stride-0 dims
                broadcast as an expanded mask has them), from the range's end down to its last key
                that some row does not mask, and the range ends there: a static cache's unwritten tail
                costs bias bytes only, and a range live to its end costs one probe before the K and V
                loads start. The main loop has no branch, so Triton pipelines its K and V loads over
                ``num_stages`` shared-memory buffers.
                Each step loads K and V [BLOCK_N, D] and the bias block, S = Q K^T on the tensor cores (FP32),
                logits in base 2 (``sm_scale * log2(e)``, the bias times log2(e)), an online softmax
                (running max m, sum l, FP32 accumulator [16, D]), P cast to the input dtype for P V.
                A key whose bias is at most MASK_FLOOR = -65504 is masked: its logit is -inf whatever
                Q K^T is (a NaN or Inf key it masks does not reach the output), and the backward scan
                skips it. -65504, not only -inf, because PyTorch's cuDNN path turns a boolean mask into
                that finite bias (attention.cpp, convert_boolean_attn_mask_cudnn), which is what a
                compiled model hands the cuDNN op. Next to any key above the floor such a key has FP32
                weight 0 anyway. Only a row with no key above it differs from ATen: it gets 0, and ATen
                would attend over the floor keys. NaN in an unmasked key, query or bias propagates.
    partials    FP32 [BH, splits, 16, D] accumulator and [BH, splits, 16] max and sum, unnormalized,
                in the dense GEMM's split-K workspace (gemm.launch.splitk_buffers). A program stores
                its partials, passes a CTA barrier, and takes an acq_rel ticket for its (batch, head);
                the one that draws the last ticket reads every split's partials (.cg, past L1),
                rescales them to a running max in one pass, writes the output and zeroes the ticket
                for the next launch. With one split (DIRECT) the program writes the output directly.
    output      any strides, the query's dtype; the natural-log log-sum-exp B x H x Sq FP32. A fully
                masked row (max -inf, sum 0) gets 0, as PyTorch's SDPA gives it, and log-sum-exp
                -inf; a row of NaN logits gets NaN (its sum is NaN).
    QUANT       (tilefly.mx.attention_quant: a compiled MX model's o_proj input) the output is not
                stored: the program rounds its rows to the query's dtype, as the store would, and
                MX-quantizes them with kernels_quant's helpers (bit-identical to quantizing the
                stored output). ``so_*`` then place the output in the quantized rows' element order:
                element offset / 32 is the scale block, so D and the strides are multiples of 32 and
                a program's [16, D] rows are 16 x D / 32 whole blocks. This saves the quantization
                kernel that read the output back, one launch a layer in a decode step.
    shared      Triton's pipeline buffers for K and V (num_stages x 2 x BLOCK_N x D x 2 bytes);
                registers: the accumulator (16 x D / (32 x num_warps) FP32 a thread).
"""
import triton
import triton.language as tl

from tilefly.mx.kernels_quant import SCALE_BLOCK, bf16_to_f32, block_scales, store_blocks

LOG2E = tl.constexpr(1.4426950408889634)
NEG_INF = tl.constexpr(float("-inf"))
MASK_FLOOR = tl.constexpr(-65504.0)     # a bias at or below this masks its key (header)


@triton.jit
def decode_split_kernel(q_ptr, k_ptr, v_ptr, bias_ptr, o_part_ptr, m_part_ptr, l_part_ptr, ticket_ptr, out_ptr, lse_ptr,
                        data_ptr, scale_ptr, scale_log2, Sq, Sk, H, GROUP, keys_per_split,
                        sq_b, sq_h, sq_m, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, sb_b, sb_h, sb_m, sb_n, so_b, so_h, so_m,
                        D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SCAN: tl.constexpr,
                        HAS_BIAS: tl.constexpr, DIRECT: tl.constexpr, UPCAST: tl.constexpr,
                        QUANT: tl.constexpr, FP4: tl.constexpr, EMAX: tl.constexpr):
    bh = tl.program_id(0)
    split = tl.program_id(1)
    splits = tl.num_programs(1)
    b = bh // H
    h = bh % H
    kv = h // GROUP
    rows = tl.arange(0, BLOCK_M)
    dims = tl.arange(0, D)
    row_live = rows < Sq
    q = tl.load(q_ptr + b.to(tl.int64) * sq_b + h * sq_h + rows[:, None] * sq_m + dims[None, :],
                mask=row_live[:, None], other=0.0)
    if UPCAST:   # Triton 3.6's interpreter multiplies BF16 operands wrongly; CPU checks run FP32 dots
        q = q.to(tl.float32)
    k_base = k_ptr + b.to(tl.int64) * sk_b + kv * sk_h
    v_base = v_ptr + b.to(tl.int64) * sv_b + kv * sv_h
    bias_base = bias_ptr + b.to(tl.int64) * sb_b + h * sb_h

    start = split * keys_per_split
    end = tl.minimum(start + keys_per_split, Sk)
    if HAS_BIAS:   # trim the range to its last key some row sees (header: the backward scan)
        hi = end
        searching = hi > start
        while searching:
            lo = tl.maximum(hi - SCAN, start)
            cols = lo + tl.arange(0, SCAN)
            bias = tl.load(bias_base + rows[:, None] * sb_m + cols[None, :] * sb_n,
                           mask=row_live[:, None] & (cols < hi)[None, :], other=NEG_INF)
            last = tl.max(tl.where(tl.max(bias, axis=0) > MASK_FLOOR, cols + 1, 0), axis=0)
            hi = tl.where(last > 0, last, lo)
            searching = (last == 0) & (lo > start)
        end = hi

    m_i = tl.full([BLOCK_M], NEG_INF, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for n0 in range(start, end, BLOCK_N):      # no branch in the body: the K and V loads pipeline
        cols = n0 + tl.arange(0, BLOCK_N)
        key_live = cols < end
        live = row_live[:, None] & key_live[None, :]
        if HAS_BIAS:
            bias = tl.load(bias_base + rows[:, None] * sb_m + cols[None, :] * sb_n, mask=live,
                           other=NEG_INF).to(tl.float32)
        else:
            bias = tl.where(live, 0.0, NEG_INF)
        k = tl.load(k_base + cols[:, None] * sk_n + dims[None, :], mask=key_live[:, None], other=0.0)
        v = tl.load(v_base + cols[:, None] * sv_n + dims[None, :], mask=key_live[:, None], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k)) * scale_log2 + bias * LOG2E
        s = tl.where(bias <= MASK_FLOOR, NEG_INF, s)
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # rows with every logit -inf so far keep m = -inf: shift by 0 there, not by -inf
        shift = tl.where(m_new == NEG_INF, 0.0, m_new)
        p = tl.math.exp2(s - shift[:, None])
        alpha = tl.math.exp2(m_i - shift)
        if UPCAST:   # P rounded to the input dtype as on the GPU, then multiplied in FP32
            acc = acc * alpha[:, None] + tl.dot(p.to(v_ptr.dtype.element_ty).to(tl.float32), v.to(tl.float32))
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new

    if DIRECT:     # one split: this program's sums are the row's
        _store_rows(out_ptr, lse_ptr, data_ptr, scale_ptr, acc, m_i, l_i, b, h, bh, rows, dims, row_live, Sq,
                    so_b, so_h, so_m, D, BLOCK_M, QUANT, FP4, EMAX)
    else:
        part = bh * splits + split
        tl.store(o_part_ptr + (part * BLOCK_M + rows[:, None]).to(tl.int64) * D + dims[None, :], acc)
        tl.store(m_part_ptr + part * BLOCK_M + rows, m_i)
        tl.store(l_part_ptr + part * BLOCK_M + rows, l_i)
        tl.debug_barrier()      # every thread's partials are issued before the ticket releases them
        ticket = tl.atomic_add(ticket_ptr + bh, 1, sem="acq_rel", scope="gpu")
        if ticket == splits - 1:                 # the last split to finish combines them all
            m_run = tl.full([BLOCK_M], NEG_INF, tl.float32)
            total = tl.zeros([BLOCK_M], tl.float32)
            acc = tl.zeros([BLOCK_M, D], tl.float32)
            for s in range(0, splits):
                at = (bh * splits + s) * BLOCK_M + rows
                m_s = tl.load(m_part_ptr + at, cache_modifier=".cg")
                l_s = tl.load(l_part_ptr + at, cache_modifier=".cg")
                o_s = tl.load(o_part_ptr + at[:, None].to(tl.int64) * D + dims[None, :], cache_modifier=".cg")
                m_new = tl.maximum(m_run, m_s)
                shift = tl.where(m_new == NEG_INF, 0.0, m_new)
                keep, take = tl.math.exp2(m_run - shift), tl.math.exp2(m_s - shift)
                acc = acc * keep[:, None] + o_s * take[:, None]
                total = total * keep + l_s * take
                m_run = m_new
            _store_rows(out_ptr, lse_ptr, data_ptr, scale_ptr, acc, m_run, total, b, h, bh, rows, dims, row_live, Sq,
                        so_b, so_h, so_m, D, BLOCK_M, QUANT, FP4, EMAX)
            tl.atomic_xchg(ticket_ptr + bh, 0, sem="relaxed", scope="gpu")    # zero for the next launch


@triton.jit
def _store_rows(out_ptr, lse_ptr, data_ptr, scale_ptr, acc, m, l, b, h, bh, rows, dims, row_live, Sq, so_b, so_h, so_m,
                D: tl.constexpr, BLOCK_M: tl.constexpr, QUANT: tl.constexpr, FP4: tl.constexpr, EMAX: tl.constexpr):
    """out = acc / l in the output's dtype and strides (QUANT: its MX bytes, header), lse = ln(sum exp)
    from the base-2 max m and sum l; a fully masked row (m = -inf, l = 0) gets 0 and -inf. A row whose
    logits are all NaN also keeps m = -inf (the GPU's max drops NaN), but its l is NaN: it gets NaN, as
    SDPA gives it."""
    masked = (m == NEG_INF) & (l == 0.0)
    out = tl.where(masked[:, None], 0.0, acc / l[:, None]).to(out_ptr.dtype.element_ty)
    row_at = b.to(tl.int64) * so_b + h * so_h + rows * so_m
    if QUANT:
        BLOCKS: tl.constexpr = BLOCK_M * D // SCALE_BLOCK
        if out_ptr.dtype.element_ty == tl.bfloat16:
            x = bf16_to_f32(out)
        else:
            x = out.to(tl.float32)
        block = row_at[:, None] // SCALE_BLOCK + tl.arange(0, D // SCALE_BLOCK)[None, :]
        live = tl.broadcast_to(row_live[:, None], [BLOCK_M, D // SCALE_BLOCK])
        scale, y = block_scales(tl.reshape(x, [BLOCKS, SCALE_BLOCK]), EMAX)
        store_blocks(data_ptr, scale_ptr, tl.reshape(block, [BLOCKS]), scale, y, tl.reshape(live, [BLOCKS]), FP4,
                     BLOCKS)
    else:
        tl.store(out_ptr + row_at[:, None] + dims[None, :], out, mask=row_live[:, None])
    lse = tl.where(masked, NEG_INF, (m + tl.math.log2(l)) / LOG2E)
    tl.store(lse_ptr + bh * Sq + rows, lse, mask=row_live)

"""Host side of kernels_decode: split-KV decode attention with an additive mask.

``decode_attention(q, k, v, bias=None, scale=None)`` computes SDPA's forward for q (B, H, Sq, D) with
Sq <= 16 against k, v (B, Hkv, Sk, D), H a multiple of Hkv (query head h reads KV head h // (H / Hkv)),
and an optional additive float bias broadcastable to (B, H, Sq, Sk) (a value of -65504 or below,
-inf included, masks a key). Returns (out (B, H, Sq, D) in q's dtype, lse (B, H, Sq) FP32). The
attention family routes SDPA's masked decode calls here under ``config.attention_decode`` (eager.py);
kernels_decode's header says what is checked.

Split plan: enough (batch x head, split) programs for ``programs_per_sm`` a SM, each at least
``block_n`` keys, at most ``MAX_SPLITS`` splits. ``DecodeConfig`` holds the tile and launch knobs;
scripts/decode_attention_probe.py sweeps them, and decode_tuning picks one per shape from the GPU's
tuning database (``DEFAULT`` without one).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tilefly import _device, _triton_launch
from tilefly.ops.attention import decode_tuning
from tilefly.ops.gemm.launch import splitk_buffers

BLOCK_M = 16              # query rows a program (the dot's smallest M)
MAX_SPLITS = 64
SCAN = 256                # bias keys a probe of the backward scan for a split's last live key
MASK_FLOOR = -65504.0     # a bias at or below this masks its key (kernels_decode's header says why)


@dataclass(frozen=True)
class DecodeConfig:
    block_n: int = 64             # keys a step (a power of two, >= 16)
    num_warps: int = 4
    num_stages: int = 3           # K and V pipeline buffers
    programs_per_sm: int = 4      # the split plan's target


DEFAULT = DecodeConfig()
HEAD_DIMS = (16, 32, 64, 128, 256)
DTYPES = (torch.bfloat16, torch.float16)

_launches: dict = {}


def unsupported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None) -> str | None:
    """Why ``decode_attention`` does not take these inputs, or None."""
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        return "q, k and v must be tensors"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return "q, k and v must be 4-D (batch, heads, sequence, head dim)"
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"q, k and v must share one dtype, bfloat16 or float16 (got {q.dtype}, {k.dtype}, {v.dtype})"
    b, h, sq, d = q.shape
    if k.shape != v.shape or k.shape[0] != b or k.shape[3] != d:
        return f"k and v must be (batch {b}, kv heads, keys, head dim {d}); got {tuple(k.shape)} and {tuple(v.shape)}"
    if not 1 <= sq <= BLOCK_M:
        return f"decode attention takes 1..{BLOCK_M} query rows a head, got {sq}"
    if d not in HEAD_DIMS:
        return f"head dim must be one of {HEAD_DIMS}, got {d}"
    if k.shape[1] == 0 or h % k.shape[1]:
        return f"query heads ({h}) must be a multiple of KV heads ({k.shape[1]})"
    if 0 in (b, h, k.shape[2]):
        return "empty batch, heads or keys"
    if q.stride(3) != 1 or k.stride(3) != 1 or v.stride(3) != 1:
        return "the head dim of q, k and v must be contiguous"
    if q.device != k.device or q.device != v.device:
        return "q, k and v must be on one device"
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or not bias.is_floating_point() or bias.device != q.device:
            return "bias must be a floating-point tensor on q's device (an additive mask: -inf hides a key)"
        try:
            torch.broadcast_shapes(bias.shape, (b, h, sq, k.shape[2]))
        except RuntimeError:
            return f"bias of shape {tuple(bias.shape)} does not broadcast to {(b, h, sq, k.shape[2])}"
        if bias.dim() > 4:
            return "bias has more than 4 dims"
    return None


def plan_splits(programs: int, keys: int, sm_count: int, cfg: DecodeConfig = DEFAULT) -> tuple[int, int]:
    """(splits, keys a split, a multiple of ``cfg.block_n``) for ``programs`` (batch x head) programs."""
    steps = -(-keys // cfg.block_n)
    splits = max(1, min(MAX_SPLITS, steps, -(-sm_count * cfg.programs_per_sm // programs)))
    per_split = -(-steps // splits) * cfg.block_n
    return -(-keys // per_split), per_split


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None,
                     scale: float | None = None, splits: int | None = None,
                     cfg: DecodeConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """SDPA forward for a few query rows a head (module docstring): (out, lse). ``splits`` and ``cfg``
    force the key split count and the config (tests, the probe); ValueError names what is not supported."""
    reason = unsupported(q, k, v, bias)
    if reason:
        raise ValueError(f"decode_attention: {reason}")
    return run(q, k, v, bias, scale, splits, cfg)


@dataclass(frozen=True)
class Quantized:
    """Where ``run`` puts the output instead of storing it: its MX bytes (kernels_decode's QUANT).
    ``data`` and ``scale_bits`` are flat uint8 tensors of the output's elements / elements a byte and
    elements / 32; ``strides`` place output element (b, h, m, d) at element offset
    b * strides[0] + h * strides[1] + m * strides[2] + d of the quantized rows (``quant_reason``)."""
    data: torch.Tensor
    scale_bits: torch.Tensor
    fp4: bool
    emax: int
    strides: tuple[int, int, int]


def quant_reason(d: int, strides) -> str | None:
    """Why outputs of head dim ``d`` laid out by ``strides`` (b, h, m, d) cannot be quantized in the
    kernel, or None: every row of D elements must be whole 32-element scale blocks."""
    if d % 32:
        return f"head dim {d} is not a multiple of 32 (the MX scale block)"
    if len(strides) != 4 or strides[3] != 1 or any(s % 32 for s in strides[:3]):
        return f"output strides {tuple(strides)} do not keep each head's row in whole 32-element blocks"
    return None


def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None,
        scale: float | None = None, splits: int | None = None,
        cfg: DecodeConfig | None = None, quant: Quantized | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``decode_attention`` for inputs ``unsupported`` already passed (the router's predicate ran it).
    With ``quant`` (``quant_reason`` passed) the output goes to its MX bytes and the returned ``out`` is
    an empty placeholder of q's dtype."""
    b, h, sq, d = q.shape
    sk = k.shape[2]
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    programs = b * h
    sms = _device.sm_count(q) if q.is_cuda else 8
    if cfg is None:
        cfg = decode_tuning.config_for(q.device.index, programs, sk, sq, d) if q.is_cuda else DEFAULT
    if splits is None:
        splits, per_split = plan_splits(programs, sk, sms, cfg)
    else:
        per_split = -(-(-(-sk // splits)) // cfg.block_n) * cfg.block_n
        splits = -(-sk // per_split)
    f32 = dict(dtype=torch.float32, device=q.device)
    out = torch.empty((b, h, sq, d) if quant is None else (0,), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, h, sq), **f32)
    direct = splits == 1
    if direct:                  # the kernel writes out and lse itself: no partials, no tickets
        o_part = m_part = l_part = lse
        tickets = lse.view(torch.int32)
    else:                       # the last split of each (batch, head) combines: gemm's split-K workspace
        n_o, n_ml = programs * splits * BLOCK_M * d, programs * splits * BLOCK_M
        if q.is_cuda:
            partials, tickets = splitk_buffers(q.device, n_o + 2 * n_ml, programs,
                                               torch.cuda.is_current_stream_capturing())
        else:                   # the interpreter: fresh buffers
            partials, tickets = torch.empty(n_o + 2 * n_ml, **f32), torch.zeros(programs, dtype=torch.int32)
        o_part, m_part, l_part = partials[:n_o], partials[n_o:n_o + n_ml], partials[n_o + n_ml:n_o + 2 * n_ml]
    if bias is None:
        bias_arg, bias_strides = q, (0, 0, 0, 0)
    else:
        bias_arg = bias.expand(b, h, sq, sk)
        bias_strides = bias_arg.stride()
    if quant is None:           # data and scale_bits are never touched: lse stands in for them
        data, scale_bits, out_strides = lse, lse, out.stride()[:3]
        mx = dict(QUANT=False, FP4=False, EMAX=0)
    else:                       # no output is stored: q stands in for it (its dtype is the rounding's)
        data, scale_bits, out_strides = quant.data, quant.scale_bits, quant.strides
        mx = dict(QUANT=True, FP4=quant.fp4, EMAX=quant.emax)
    ints = (scale / math.log(2), sq, sk, h, h // k.shape[1], per_split, *q.stride()[:3], *k.stride()[:3],
            *v.stride()[:3], *bias_strides, *out_strides)
    _triton_launch.launch_direct(_launches, _split_kernel, (programs, splits),
                                 (q, k, v, bias_arg, o_part, m_part, l_part, tickets, out if quant is None else q,
                                  lse, data, scale_bits), ints,
                                 dict(D=d, BLOCK_M=BLOCK_M, BLOCK_N=cfg.block_n, SCAN=SCAN, HAS_BIAS=bias is not None,
                                      DIRECT=direct, UPCAST=not q.is_cuda, **mx),
                                 num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out, lse


def _split_kernel():
    from tilefly.ops.attention.kernels_decode import decode_split_kernel

    return decode_split_kernel


# ---- checks: Triton's interpreter on CPU tensors, and sm_90a compiles (configs collects both) ----------

def _reference(q, k, v, bias, scale):
    """Float64 SDPA with PyTorch's semantics (a fully masked row gives 0, log-sum-exp -inf), under
    kernels_decode's rule that a key whose bias is at most MASK_FLOOR is masked whatever its values."""
    group = q.shape[1] // k.shape[1]
    k64 = k.double().repeat_interleave(group, dim=1)
    v64 = v.double().repeat_interleave(group, dim=1)
    logits = q.double() @ k64.transpose(-1, -2) * scale
    if bias is not None:
        bias = bias.double().expand_as(logits)
        logits = torch.where(bias <= MASK_FLOOR, float("-inf"), logits + bias)
    masked = torch.isneginf(logits)
    weights = torch.softmax(logits.masked_fill(masked.all(-1, keepdim=True), 0.0), dim=-1).masked_fill(masked, 0.0)
    return weights @ v64.masked_fill(masked.all(-2).unsqueeze(-1), 0.0), torch.logsumexp(logits, dim=-1)


def _inputs(b, h, hk, sq, sk, d, dtype, mask, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, sq, d, generator=gen).to(dtype)
    k = torch.randn(b, hk, sk, d, generator=gen).to(dtype)
    v = torch.randn(b, hk, sk, d, generator=gen).to(dtype)
    bias = None
    if mask in ("prefix", "prefix-floor", "prefix-short"):   # a static cache: request i sees its first lengths[i] keys
        lengths = torch.randint(1, sk + 1 if mask != "prefix-short" else 40, (b,), generator=gen)
        lengths[0] = sk if mask != "prefix-short" else 1         # short: most splits hold no visible key
        hidden = float("-inf") if mask == "prefix" else MASK_FLOOR    # -65504: PyTorch's cuDNN conversion
        bias = torch.where(torch.arange(sk)[None, :] < lengths[:, None], 0.0, hidden)
        bias = bias.to(dtype)[:, None, None, :]                                       # (B, 1, 1, Sk)
        k[-1, :, lengths[-1]:] = float("nan")       # masked keys never reach the output: not even
        v[-1, :, lengths[-1]:] = float("nan")       # loaded (a zero weight times a NaN value is NaN)
    elif mask == "window":          # leading keys and a gap masked: whole masked blocks inside the live range
        seen = (torch.arange(sk) >= sk // 3) & ((torch.arange(sk) < sk // 2) | (torch.arange(sk) >= sk - 40))
        bias = torch.where(seen, 0.0, float("-inf")).to(dtype)[None, None, None, :]  # (1, 1, 1, Sk)
    elif mask == "additive":        # finite, per head and row, plus one fully masked row
        bias = (torch.randn(b, h, sq, sk, generator=gen) * 2).to(dtype)
        bias[0, 0, 0] = float("-inf")
    return q, k, v, bias


def _check(b, h, hk, sq, sk, d, dtype, mask, splits, seed=0):
    q, k, v, bias = _inputs(b, h, hk, sq, sk, d, dtype, mask, seed)
    out, lse = decode_attention(q, k, v, bias, splits=splits)
    want, want_lse = _reference(q, k, v, bias, 1.0 / math.sqrt(d))
    if mask == "additive":
        assert bool((out[0, 0, 0] == 0).all()) and lse[0, 0, 0] == float("-inf"), "fully masked row"
    tol = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -9
    torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol * 4)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-4, atol=1e-4)


def _check_quantized(b, h, hk, sq, sk, d, dtype, mask, splits, fmt, heads_inner, seed=1):
    """QUANT's bytes equal quantize_rows of the stored output, for rows laid out as (b, h, m, d) or, with
    ``heads_inner``, as (b, m, h, d) (the output transposed, as attention's o_proj input is)."""
    from tilefly.mx import formats
    from tilefly.mx.quant import quantize_rows_ops

    spec = formats.ELEMENTS[fmt]
    q, k, v, bias = _inputs(b, h, hk, sq, sk, d, dtype, mask, seed)
    v[0, 0, :, :32] *= 2.0 ** -20       # blocks of the output far below their neighbours: scales of their own
    out, _ = run(q, k, v, bias, splits=splits)
    rows = out.transpose(1, 2) if heads_inner else out
    strides = (sq * h * d, d, h * d, 1) if heads_inner else (h * sq * d, sq * d, d, 1)
    want_data, want_scales = quantize_rows_ops(rows.reshape(-1, rows.shape[-2] * d), spec)
    data = torch.full((out.numel() // spec.per_byte,), 0x5A, dtype=torch.uint8)   # poison: every byte is written
    scale_bits = torch.full((out.numel() // 32,), 0xA5, dtype=torch.uint8)
    reason = quant_reason(d, strides)
    assert reason is None, reason
    run(q, k, v, bias, splits=splits, quant=Quantized(data, scale_bits, fmt == "mxfp4", spec.emax, strides[:3]))
    assert torch.equal(data, want_data.view(torch.uint8).reshape(-1)), "data bytes"
    assert torch.equal(scale_bits, want_scales.reshape(-1)), "scale bytes"


def interpreter_checks():
    quantized = [
        ("quantized,mxfp4,gqa-rows,bf16", (2, 2, 2, 4, 200, 64, torch.bfloat16, "prefix", 3, "mxfp4", False)),
        ("quantized,mxfp8,heads-inner,fp16", (2, 4, 2, 1, 150, 32, torch.float16, "additive", 2, "mxfp8", True)),
        ("quantized,mxfp4,one-split", (1, 2, 1, 2, 90, 128, torch.bfloat16, None, 1, "mxfp4", True)),
    ]
    cases = [
        ("prefix-mask,gqa,bf16", (2, 4, 2, 4, 200, 64, torch.bfloat16, "prefix", 3)),
        ("no-mask,fp16,one-row", (1, 2, 2, 1, 320, 128, torch.float16, None, 2)),
        ("additive,bf16,rows-16", (2, 2, 1, 16, 130, 32, torch.bfloat16, "additive", None)),
        ("prefix-mask,one-split", (3, 1, 1, 3, 96, 16, torch.float16, "prefix", 1)),
        ("cudnn-floor-mask,bf16", (3, 2, 2, 4, 700, 64, torch.bfloat16, "prefix-floor", 3)),
        ("cudnn-floor-mask,fp16,one-split", (2, 1, 1, 4, 300, 32, torch.float16, "prefix-floor", 1)),
        ("window-mask,gaps", (2, 2, 1, 2, 400, 32, torch.bfloat16, "window", 2)),
        ("prefix-mask,empty-splits", (3, 2, 2, 4, 700, 64, torch.bfloat16, "prefix-short", 8)),
        ("additive,one-split", (1, 2, 2, 5, 300, 64, torch.float16, "additive", 1)),
    ]
    import functools

    return ([(f"decode_attention[{name}]", functools.partial(_check, *args)) for name, args in cases]
            + [(f"decode_attention[{name}]", functools.partial(_check_quantized, *args)) for name, args in quantized])


def compile_specs():
    """The kernel for sm_90a: BF16 and FP16, head dims 64 and 128, with and without a bias, several
    splits (the last one combines) or one (DIRECT); and the QUANT builds of head dim 128 with a bias
    (what a compiled MX model's decode step runs), MXFP4 and MXFP8."""
    from tilefly.compile_check import KernelSpec

    # the pointers and the K/V/query strides and split length are multiples of 16 on a real cache, and
    # Triton specializes on it: only then do the K and V loads become pipelined 16-byte async copies
    aligned = {(i,): [["tt.divisibility", 16]] for i in (*range(12), *range(17, 27))}
    plain = [(d, has_bias, direct, None) for d in (64, 128) for has_bias, direct in ((False, False), (True, False),
                                                                                     (True, True))]
    quantized = [(128, True, direct, fmt) for direct in (False, True) for fmt in ("mxfp4", "mxfp8")]
    specs = []
    for dtype in ("bf16", "fp16"):
        for d, has_bias, direct, fmt in plain + quantized:
            sig = {"q_ptr": f"*{dtype}", "k_ptr": f"*{dtype}", "v_ptr": f"*{dtype}", "bias_ptr": f"*{dtype}",
                   "o_part_ptr": "*fp32", "m_part_ptr": "*fp32", "l_part_ptr": "*fp32", "ticket_ptr": "*i32",
                   "out_ptr": f"*{dtype}", "lse_ptr": "*fp32", "data_ptr": "*u8" if fmt else "*fp32",
                   "scale_ptr": "*u8" if fmt else "*fp32", "scale_log2": "fp32",
                   **{n: "i32" for n in ("Sq", "Sk", "H", "GROUP", "keys_per_split", "sq_b", "sq_h", "sq_m",
                                         "sk_b", "sk_h", "sk_n", "sv_b", "sv_h", "sv_n", "sb_b", "sb_h", "sb_m",
                                         "sb_n", "so_b", "so_h", "so_m")},
                   **{n: "constexpr" for n in ("D", "BLOCK_M", "BLOCK_N", "SCAN", "HAS_BIAS", "DIRECT", "UPCAST",
                                               "QUANT", "FP4", "EMAX")}}
            name = f"attention.decode_split[{dtype},d={d},bias={int(has_bias)},direct={int(direct)}" + (
                f",{fmt}]" if fmt else "]")
            mx = dict(QUANT=fmt is not None, FP4=fmt == "mxfp4", EMAX={"mxfp4": 2, "mxfp8": 8}.get(fmt, 0))
            specs.append(KernelSpec(name, _split_kernel, sig,
                                    dict(D=d, BLOCK_M=BLOCK_M, BLOCK_N=DEFAULT.block_n, SCAN=SCAN,
                                         HAS_BIAS=has_bias, DIRECT=direct, UPCAST=False, **mx),
                                    attrs=aligned, num_warps=DEFAULT.num_warps, num_stages=DEFAULT.num_stages,
                                    sass_must_contain=("HMMA", "LDGSTS") + (() if direct else ("ATOMG.E.ADD",))))
    return specs

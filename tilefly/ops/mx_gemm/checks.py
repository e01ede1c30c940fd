"""CI checks of the requantization path in Triton's interpreter (TRITON_INTERPRET=1, CPU tensors):
the kernel against a torch transcription of its rule, and ``requant.run`` end to end (PyTorch's
row-scaled ``_scaled_mm`` runs on CPU) against the float64 product of the dequantized operands;
the skinny kernel (skinny.run) against the same reference, split and unsplit, both scale layouts,
bias, FP16 and FP32 out, NaN and extreme scales, its dequantizing builds (scales at the guard's
bounds: the BF16 path) and an exact-only build, and the guard itself (``_dequant_steps``'s
verdict) on bytes just inside and outside its range, NaN bytes and masked rows and blocks.

The dequantizing path's BF16 dot runs on FP32 copies of its operands in the interpreter
(kernels_skinny.INTERPRETED: Triton 3.6's interpreter multiplies BF16 bit patterns); the scaled
BF16 values themselves are what it checks."""
from __future__ import annotations

import functools

SUBNORMAL_STEP = 2.0 ** -9   # E4M3's smallest subnormal: the interpreter truncates there, the GPU rounds


def interpreter_checks():
    from tilefly._interpreter import numpy_compat

    numpy_compat()
    cases = [("requant_rows[mxfp8,K=256]", "mxfp8", 5, 256, "spread"),
             ("requant_rows[mxfp4,K=320]", "mxfp4", 3, 320, "spread"),
             ("requant_rows[mxfp8,nan-scale]", "mxfp8", 4, 128, "nan"),
             ("requant_rows[mxfp8,scales-2^+-127]", "mxfp8", 2, 128, "extreme")]
    checks = [(name, functools.partial(_check_rows, *args)) for name, *args in cases]
    checks += [(f"requant_run[{fmt},{'swizzled' if swz else 'plain'}]", functools.partial(_check_run, fmt, swz))
               for fmt, swz in (("mxfp8", False), ("mxfp4", True))]
    return checks + skinny_checks()


def skinny_checks():
    # (fmt, m, n, k, swizzled, bias, out dtype, scales, splits, build): m < n puts the weight in X
    # (swap-AB), m > n keeps A there; k = 480 leaves the last 128-K step partial. build: "pick" (the
    # first dequantizing config; "nan" and "extreme" scales send programs to its exact path, "edge"
    # keeps every scale at the guard's bounds, so the BF16 path) or "exact" (the first exact-only).
    cases = [("mxfp8", 5, 80, 512, False, False, "fp16", "plain", 2, "pick"),
             ("mxfp4", 3, 96, 480, True, True, "bf16", "spread", 3, "pick"),
             ("mxfp8", 70, 17, 256, True, True, "fp32", "plain", 1, "pick"),
             ("mxfp4", 2, 64, 256, False, False, "fp32", "nan", 2, "pick"),
             ("mxfp8", 3, 64, 512, True, False, "fp32", "extreme", 4, "pick"),
             ("mxfp4", 1, 33, 256, False, False, "fp32", "extreme", 1, "pick"),
             ("mxfp8", 4, 70, 512, False, False, "fp32", "edge", 2, "pick"),
             ("mxfp4", 40, 3, 256, True, False, "fp32", "edge", 1, "pick"),
             ("mxfp8", 5, 80, 480, True, True, "bf16", "spread", 2, "exact"),
             ("mxfp4", 2, 64, 256, False, False, "fp32", "nan", 1, "exact")]
    checks = [(f"skinny[{fmt},{m}x{n}x{k},swz={int(swz)},bias={int(bias)},{out},{scales},splits={splits},{build}]",
               functools.partial(_check_skinny, fmt, m, n, k, swz, bias, out, scales, splits, build))
              for fmt, m, n, k, swz, bias, out, scales, splits, build in cases]
    return checks + [("skinny_scale_guard", _check_scale_guard)]


def _check_scale_guard() -> None:
    """The dequantizing loop's guard through a one-program probe of ``_dequant_steps``: safe
    exactly when every live scale byte of either operand lies in 127 +- SAFE_EXP; bytes of rows
    past the row count and of blocks outside [kb_first, kb_end) ignored."""
    global kernels_skinny  # the probe's body resolves it among this module's globals
    import torch
    import triton
    import triton.language as tl

    from tilefly.ops.mx_gemm import kernels_skinny

    @triton.jit
    def probe(q_ptr, sx_ptr, sy_ptr, out_ptr, ROWS, COLS, kb_first, kb_end, k_blocks, BLOCK: tl.constexpr):
        idx = tl.arange(0, BLOCK)
        q_rows = q_ptr + idx.to(tl.int64)[:, None] * (k_blocks * 32)
        _, safe = kernels_skinny._dequant_steps(q_rows, q_rows, sx_ptr, sy_ptr, idx, idx, ROWS, COLS, kb_first,
                                                kb_end, k_blocks, k_blocks, 1, k_blocks, 1, BLOCK, BLOCK, False,
                                                False, False)
        tl.store(out_ptr, safe.to(tl.int32))

    bound = kernels_skinny.SAFE_EXP.value
    rows, k_blocks = 16, 40
    g = torch.Generator().manual_seed(9)
    data = torch.randint(0, 0x7f, (rows, k_blocks * 32), generator=g, dtype=torch.uint8)
    base = torch.randint(127 - bound, 128 + bound, (rows, k_blocks), generator=g, dtype=torch.int32)
    base[0, 0], base[1, 39] = 127 - bound, 127 + bound

    def safe(sx, sy, count=rows, first=0, end=k_blocks):
        out = torch.full((1,), -1, dtype=torch.int32)
        probe[(1,)](data, sx.to(torch.uint8), sy.to(torch.uint8), out, count, count, first, end, k_blocks,
                    BLOCK=rows)
        return bool(out.item())

    cases = [("in range", base, base, {}, True)]
    for byte in (127 - bound - 1, 127 + bound + 1, 255, 0, 254):
        bad = base.clone()
        bad[5, 33] = byte
        for side, sx, sy in (("x", bad, base), ("y", base, bad)):
            cases += [(f"{side} byte {byte}", sx, sy, {}, False),
                      (f"{side} byte {byte}, row masked", sx, sy, dict(count=5), True),
                      (f"{side} byte {byte}, past the split", sx, sy, dict(end=32), True),
                      (f"{side} byte {byte}, before the split", sx, sy, dict(first=36), True)]
    for name, sx, sy, kwargs, want in cases:
        if safe(sx, sy, **kwargs) != want:
            raise AssertionError(f"scale guard on {name}: want {want}")


def _skinny_operands(fmt: str, m: int, n: int, k: int, scales: str):
    """Quantized A [m, k] and B^T [n, k] with their exponent bytes. "extreme": A's blocks at
    2^-127 / 2^127 / ..., B's at about the inverse, so every product is representable; "nan":
    one NaN byte in A (a token row) and one in B (a weight row)."""
    import torch

    qa, sa = _operand(fmt, m, k, "spread" if scales == "spread" else "plain", seed=3 * k + m)
    qb, sb = _operand(fmt, n, k, "spread" if scales == "spread" else "plain", seed=5 * k + n)
    if scales == "extreme":
        base = torch.tensor([0, 254, 127, 1, 253, 0, 254, 100], dtype=torch.int32).repeat(k // 256)
        sa = base.expand(m, -1).contiguous().to(torch.uint8)
        delta = torch.randint(-6, 7, (n, k // 32), generator=torch.Generator().manual_seed(k), dtype=torch.int32)
        sb = (254 - base + delta).clamp(0, 254).to(torch.uint8)
    elif scales == "edge":  # A at 2^+-54 (the guard's bounds) and 2^0, B about the inverse, all inside
        bound = 54
        base = torch.tensor([127 - bound, 127 + bound, 127, 127 + bound], dtype=torch.int32).repeat(k // 128)
        sa = base.expand(m, -1).contiguous().to(torch.uint8)
        delta = torch.randint(-6, 7, (n, k // 32), generator=torch.Generator().manual_seed(k), dtype=torch.int32)
        sb = (254 - base + delta).clamp(127 - bound, 127 + bound).to(torch.uint8)
    elif scales == "nan":
        sa[m - 1, 1] = 255
        sb[n // 2, k // 32 - 1] = 255
    return qa, sa, qb, sb


def _check_skinny(fmt, m, n, k, swizzled, with_bias, out_name, scales, splits, build) -> None:
    import torch

    from tilefly import mx
    from tilefly.ops.mx_gemm import configs, skinny
    from tilefly.ops.mx_gemm.eligibility import MXProblem

    out_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[out_name]
    qa, sa, qb, sb = _skinny_operands(fmt, m, n, k, scales)
    ref = (mx.dequantize(qa, sa.view(torch.float8_e8m0fnu), fmt, swizzle="none", dtype=torch.float64)
           @ mx.dequantize(qb, sb.view(torch.float8_e8m0fnu), fmt, swizzle="none", dtype=torch.float64).T)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(7)).to(out_dtype) if with_bias else None
    if bias is not None:
        ref = ref + bias.double()
    sa, sb = sa.view(torch.float8_e8m0fnu), sb.view(torch.float8_e8m0fnu)
    if swizzled:
        sa, sb = mx.layout.to_blocked(sa), mx.layout.to_blocked(sb)
    out = torch.full((m, n), float("nan"), dtype=out_dtype)
    builds = configs.skinny_configs(max(m, n), min(m, n), k, fmt)
    want = configs.SKINNY_DEQUANT if build == "pick" else configs.SKINNY
    cfg = next(c for c in builds if c.kernel == want)
    skinny.run(MXProblem(fmt, m, n, k, swizzled, swizzled), qa, qb.t(), sa, sb, out, bias, cfg=cfg, splits=splits)
    nan_want = torch.isnan(ref)
    if scales == "nan" and not nan_want.any():
        raise AssertionError("the NaN case has no NaN in its reference")
    if not torch.equal(torch.isnan(out), nan_want):
        raise AssertionError(f"NaN at {torch.isnan(out).nonzero().tolist()[:8]}, want {nan_want.nonzero().tolist()[:8]}")
    if scales in ("extreme", "edge") and not (torch.isfinite(ref).all() and ref.abs().max() > 1e-3):
        raise AssertionError(f"the {scales}-scale case must have a finite, nonzero product")
    eps = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float32: 2.0 ** -13}[out_dtype]
    ok = ~nan_want
    err = (out.double() - ref).abs()[ok]
    bound = 2 * eps * ref.abs()[ok] + 2 * eps * ref.abs()[ok].max()
    if (err > bound).any():
        raise AssertionError(f"skinny product off by {err.max().item():.3e} (max|C| {ref.abs()[ok].max().item():.3e})")


def _operand(fmt: str, rows: int, k: int, scales: str, seed: int):
    import torch

    from tilefly import mx

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g)
    if scales == "spread":  # block magnitudes over 2^-10 .. 2^10: shifts below E4M3's normal range
        x = x * torch.exp2(torch.randint(-10, 11, (rows, k // 32), generator=g).float().repeat_interleave(32, 1))
    data, bits = mx.quantize(x, fmt, swizzle="none")
    bits = bits.view(torch.uint8)
    if scales == "nan":
        bits[1, 2] = 255
    elif scales == "extreme":
        bits[0, 0], bits[0, 1], bits[1, 3] = 254, 0, 0
    return data, bits


def _check_rows(fmt: str, rows: int, k: int, scales: str) -> None:
    import torch

    from tilefly import mx
    from tilefly.ops.mx_gemm import requant

    data, bits = _operand(fmt, rows, k, scales, seed=k + rows)
    got, row_scale = requant.requantize_rows(data, bits, k, fmt == "mxfp4")
    unit = torch.full_like(bits, 127)  # scale 2^0: the element values themselves, no overflow
    values = mx.dequantize(data, unit.view(torch.float8_e8m0fnu), fmt, swizzle="none").double()
    e = bits.to(torch.int32)
    e_max = torch.where(e == 255, 0, e).max(dim=1).values
    nan_rows = (e == 255).any(dim=1)
    want_scale = torch.exp2((e_max - 127).double())
    if not torch.equal(row_scale.double()[~nan_rows], want_scale[~nan_rows]) or not row_scale[nan_rows].isnan().all():
        raise AssertionError(f"row scales: got {row_scale.tolist()}, want {want_scale.tolist()} (NaN rows {nan_rows})")
    ok = ~nan_rows
    block_e = torch.where(e == 255, e_max[:, None], e).repeat_interleave(32, dim=1)
    shifted = values * torch.exp2((block_e - e_max[:, None]).double())
    want = shifted.float().to(torch.float8_e4m3fn).double()
    diff = (got.double() - want).abs()[ok]
    if diff.max() > SUBNORMAL_STEP:
        raise AssertionError(f"requantized values off by {diff.max().item()} (> one E4M3 subnormal step)")
    if ((diff > 0) & (shifted[ok].abs() >= 2.0 ** -6)).any():
        raise AssertionError("a value that stays in E4M3's normal range was not reproduced exactly")


def _check_run(fmt: str, swizzled: bool) -> None:
    import torch

    from tilefly import mx
    from tilefly.ops.mx_gemm import requant
    from tilefly.ops.mx_gemm.eligibility import MXProblem

    m, n, k = 48, 32, 256
    qa, sa = _operand(fmt, m, k, "plain", seed=1)
    qb, sb = _operand(fmt, n, k, "plain", seed=2)
    ref = (mx.dequantize(qa, sa.view(torch.float8_e8m0fnu), fmt, swizzle="none").double()
           @ mx.dequantize(qb, sb.view(torch.float8_e8m0fnu), fmt, swizzle="none").double().T)
    if swizzled:
        sa, sb = mx.layout.to_blocked(sa), mx.layout.to_blocked(sb)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
    requant.run(MXProblem(fmt, m, n, k, swizzled, swizzled), qa, qb.t(), sa, sb, out)
    err = (out.double() - ref).abs().max() / ref.abs().max()
    if not err < 2.0 ** -7:
        raise AssertionError(f"requantized product off by {err.item():.2e} of max|C|")

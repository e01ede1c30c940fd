"""Operands, references and checks the MX GEMM tests share (the eager, eligibility, v2 and v3 tests): quantized
operands in either scale layout, the float64 product of the dequantized operands, one launch of a
given config, a plan's arguments by name, and the setups of the K-tail and extreme/NaN-scale cases."""
import inspect

import torch

from tilefly import mx
from tilefly.ops.mx_gemm import eligibility

SWIZZLE_NAME = {False: "none", True: "32_4_4"}


def named_args(plan):
    """A launch plan's arguments by the kernel's parameter names."""
    from tilefly.ops.mx_gemm import configs

    names = list(inspect.signature(configs.kernel_of(plan.cfg).fn).parameters)[:len(plan.args)]
    return dict(zip(names, plan.args))


def _layout(swizzle):
    """The scale layout's name: ``swizzle`` is one (mx.SWIZZLES) or the kernels' bool flag."""
    return swizzle if isinstance(swizzle, str) else SWIZZLE_NAME[bool(swizzle)]


def operands(fmt, m, n, k, swizzle=False, device="cpu", seed=0):
    """(A [m, k], B [k, n] column-major, scale_a, scale_b) quantized from N(0, 1) values."""
    g = torch.Generator(device=device).manual_seed(seed)
    qa = mx.quantize(torch.randn(m, k, device=device, generator=g), fmt, swizzle=_layout(swizzle))
    qb = mx.quantize(torch.randn(n, k, device=device, generator=g), fmt, swizzle=_layout(swizzle))
    return qa[0], qb[0].t(), qa[1], qb[1]


def reference(a, b, sa, sb, fmt, swizzle, bias=None):
    """The float64 product of the dequantized operands (+ bias)."""
    da = mx.dequantize(a, sa, fmt, swizzle=_layout(swizzle), dtype=torch.float64)
    db = mx.dequantize(b.t(), sb, fmt, swizzle=_layout(swizzle), dtype=torch.float64)
    out = da @ db.t()
    return out if bias is None else out + bias.double()


def run_config(a, b, sa, sb, swizzled, cfg, out, bias=None):
    """One launch of ``cfg`` into ``out`` (synchronized)."""
    from tilefly.ops.mx_gemm import launch

    p = eligibility.parse(a, b, sa, sb, swizzled, swizzled)
    launch.run(p, a, b, sa, sb, out, bias, cfg=cfg)
    torch.cuda.synchronize()
    return out


def close(out, ref, eps):
    torch.testing.assert_close(out.double(), ref, rtol=2 * eps, atol=2 * eps * ref.abs().max().item() + 1e-30)


def poison_swizzle_padding(sa, sb, m, n, k):
    """Set every padding byte of SWIZZLE_32_4_4 scales to NaN (255): a kernel must never read them."""
    k_blocks = k // 32
    for s, rows in ((sa, m), (sb, n)):
        bits = s.view(torch.uint8).view(-1)
        keep = mx.to_blocked(torch.zeros(rows, k_blocks, dtype=torch.uint8, device=s.device).add_(1)
                             .view(torch.float8_e8m0fnu)).view(torch.uint8) == 1
        bits[~keep] = 255


def raw_data(fmt, rows, k, g):
    """MX data bytes without their own scales (the extreme-scale cases set the scales)."""
    values = torch.randn(rows, k, device="cuda", generator=g)
    if fmt == "mxfp8":
        return values.clamp(-448, 448).to(torch.float8_e4m3fn)
    return mx.quantize(values, "mxfp4")[0]


def with_scales(fmt, swizzled, a, b_nk, bits_a, bits_b):
    """Data ``a`` [m, K] and ``b_nk`` [n, K] with the given scale bytes (uint8 or int32 [rows, K/32]) in
    the layout ``swizzled`` names: (b column-major, scale_a, scale_b, float64 reference)."""
    sa = bits_a.to(torch.uint8).view(torch.float8_e8m0fnu)
    sb = bits_b.to(torch.uint8).view(torch.float8_e8m0fnu)
    if swizzled:
        sa, sb = mx.to_blocked(sa), mx.to_blocked(sb)
    b = b_nk.t()
    return b, sa, sb, reference(a, b, sa, sb, fmt, swizzled)


def assert_compiles_without_spills(name):
    """The compile spec ``name`` (configs.compile_specs) builds for sm_90a with its SASS markers, no
    spills and at most 255 registers."""
    from tilefly.compile_check import compile_one
    from tilefly.ops.mx_gemm import configs

    result = compile_one({s.name: s for s in configs.compile_specs()}[name])
    assert result.ok, result.error
    assert result.local == 0 and result.stack == 0 and result.registers <= 255


def extreme_scale_case(fmt, swizzled, a, b_nk, bits_a, bits_b):
    """Given data and scale bytes whose products are all representable, put one NaN scale byte in B
    (column 3) and, when A has more than one row, one in A (row m // 2); returns (b, sa, sb, ref,
    expect_nan) after checking that the float64 reference is NaN exactly there and finite elsewhere."""
    m, n = a.shape[0], b_nk.shape[0]
    bits_b[3, 5] = 255
    nan_row = m // 2 if m > 1 else None
    if nan_row is not None:
        bits_a[nan_row, 9] = 255
    b, sa, sb, ref = with_scales(fmt, swizzled, a, b_nk, bits_a, bits_b)
    expect_nan = torch.zeros(m, n, dtype=torch.bool, device="cuda")
    expect_nan[:, 3] = True
    if nan_row is not None:
        expect_nan[nan_row, :] = True
    assert torch.equal(torch.isnan(ref), expect_nan)
    finite = ref[~expect_nan]
    assert finite.abs().max() > 1e-3 and torch.isfinite(finite).all()
    return b, sa, sb, ref, expect_nan


def check_extreme_scale_run(a, b, sa, sb, swizzled, cfg, ref, expect_nan):
    """FP32 output: NaN exactly where expected, the rest within FP32-output tolerance."""
    out = torch.full(expect_nan.shape, 12345.0, device="cuda", dtype=torch.float32)
    run_config(a, b, sa, sb, swizzled, cfg, out)
    assert torch.equal(torch.isnan(out), expect_nan), cfg.name
    close(torch.where(expect_nan, 0.0, out), torch.where(expect_nan, 0.0, ref), 2.0 ** -13)

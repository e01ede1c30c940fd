"""MX GEMM on CPU: the predicate's reasons and error messages, routing through the real router
with the real predicates on the CPU key (the kernel replaced by a dequantizing stand-in), the
configs, and the kernel's bit formulas transcribed to torch against tilefly.mx."""
import inspect

import pytest
import torch
import torch.nn.functional as F

from tilefly import _device, _dispatch, mx
from tilefly.ops.mx_gemm import configs, eager, eligibility
from tilefly.ops.mx_gemm.eligibility import MXInputError

from mx_cases import named_args, operands, reference

MX = [eligibility.BLOCKWISE_1X32]


@pytest.fixture
def on_hopper(monkeypatch):
    """CPU tensors pass the device check, so the rest of the predicate runs."""
    monkeypatch.setattr(_device, "hopper_reason", lambda t: None)


@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("swizzled", [False, True])
def test_parse_accepts_what_quantize_makes(fmt, swizzled):
    a, b, sa, sb = operands(fmt, 33, 64, 256, "32_4_4" if swizzled else "none")
    p = eligibility.parse(a, b, sa, sb, swizzled, swizzled)
    assert (p.fmt, p.m, p.n, p.k, p.swizzled_a, p.swizzled_b) == (fmt, 33, 64, 256, swizzled, swizzled)


@pytest.mark.parametrize("mutate, message", [
    (lambda a, b, sa, sb: (a, b, sa[:, :-1], sb), r"scale_a must have shape \(16, 8\)"),
    (lambda a, b, sa, sb: (a, b, sa, sb.view(torch.uint8)), "scale_b must be float8_e8m0fnu"),
    (lambda a, b, sa, sb: (a, b.t().contiguous().t().contiguous(), sa, sb), "mat2 must be column-major"),
    (lambda a, b, sa, sb: (a.t().contiguous().t(), b, sa, sb), "self must be row-major"),
    (lambda a, b, sa, sb: (a, b[:128], sa, sb), "cannot be multiplied"),
    (lambda a, b, sa, sb: (a.view(torch.float8_e5m2), b, sa, sb), "float8_e4m3fn .MXFP8. or float4"),
])
def test_parse_errors_name_the_problem(mutate, message):
    a, b, sa, sb = mutate(*operands("mxfp8", 16, 32, 256))
    with pytest.raises(MXInputError, match=message):
        eligibility.parse(a, b, sa, sb, False, False)


def test_parse_rejects_mismatched_formats_and_bad_k():
    a8, _, sa8, _ = operands("mxfp8", 16, 32, 256)
    _, b4, _, sb4 = operands("mxfp4", 16, 32, 512)
    with pytest.raises(MXInputError, match="mismatched MX formats"):
        eligibility.parse(a8, b4, sa8, sb4, False, False)
    a = torch.randn(4, 48).to(torch.float8_e4m3fn)
    b = torch.randn(8, 48).to(torch.float8_e4m3fn).t()
    s = torch.zeros(4, 1, dtype=torch.float8_e8m0fnu)
    with pytest.raises(MXInputError, match="K = 48 must be a multiple of 32"):
        eligibility.parse(a, b, s, s, False, False)


def test_parse_rejects_wrong_swizzled_count():
    a, b, sa, sb = operands("mxfp4", 16, 32, 256, "32_4_4")
    with pytest.raises(MXInputError, match="SWIZZLE_32_4_4 tensor of 1024 elements"):
        eligibility.parse(a, b, sa[:-4], sb, True, True)
    with pytest.raises(MXInputError, match=r"must have shape \(16, 8\)"):   # blocked scales called NO_SWIZZLE
        eligibility.parse(a, b, sa, sb, False, True)


def _v2_args(a, b, sa, sb, swizzle, bias=None, out_dtype=torch.bfloat16):
    swz = [eligibility.SWIZZLE_32_4_4] if swizzle else []
    return (a, b, [sa], MX, swz, [sb], MX, swz, bias, out_dtype)


def test_predicate_declines_non_mx_and_non_hopper():
    a, b, sa, sb = operands("mxfp8", 16, 32, 256)
    one = torch.ones(1)
    assert "not MX" in eligibility.scaled_mm_v2_reason(a, b, [one], [0], [], [one], [0], [], None, torch.bfloat16)
    assert "tensor is on cpu" in eligibility.scaled_mm_v2_reason(*_v2_args(a, b, sa, sb, False))
    assert "not MX" in eligibility.scaled_mm_reason(a, b, one, one, out_dtype=torch.bfloat16)


def test_predicate_serves_and_declines_on_hopper(on_hopper):
    a, b, sa, sb = operands("mxfp4", 33, 64, 256, "32_4_4")
    assert eligibility.scaled_mm_v2_reason(*_v2_args(a, b, sa, sb, True)) is None
    assert eligibility.scaled_mm_reason(a, b, sa, sb, None, None, torch.float16) is None
    assert "out_dtype" in eligibility.scaled_mm_v2_reason(*_v2_args(a, b, sa, sb, True, out_dtype=None))
    bias = torch.randn(63, dtype=torch.bfloat16)
    assert "bias must be a (64,)" in eligibility.scaled_mm_v2_reason(*_v2_args(a, b, sa, sb, True, bias=bias))
    assert "contraction_dim" in eligibility.scaled_mm_v2_reason(*_v2_args(a, b, sa, sb, True), [0, 1])
    assert "scale_result" in eligibility.scaled_mm_reason(a, b, sa, sb, None, torch.ones(1), torch.bfloat16)
    with pytest.raises(MXInputError, match=r"shape \(33, 8\) .* with NO_SWIZZLE"):   # blocked scales, NO_SWIZZLE
        eligibility.scaled_mm_v2_reason(*_v2_args(a, b, sa, sb, True)[:4], [0], [sb], MX, [0], None, torch.bfloat16)
    with pytest.raises(MXInputError, match="one scale tensor per operand"):
        eligibility.scaled_mm_v2_reason(a, b, [sa, sa], MX, [1], [sb], MX, [1], None, torch.bfloat16)


def _misaligned(t):
    """``t``'s values in a buffer one byte off 16-byte alignment (same shape and strides)."""
    raw = torch.empty(t.untyped_storage().nbytes() + 1, dtype=torch.uint8)[1:]
    base = raw.view(t.dtype).as_strided(t.shape, t.stride())
    base.view(torch.uint8).copy_(t.view(torch.uint8))
    return base


def test_verdicts_are_kept_per_call_metadata(on_hopper, monkeypatch):
    """Kept verdicts (CUDA calls; here CPU ones let through) answer a repeat without parsing again,
    and every argument the verdict depends on keys it: strides, alignment, out_dtype, bias,
    contraction_dim, swizzle, the op. A malformed call raises every time."""
    parses = []
    real_parse = eligibility.parse
    monkeypatch.setattr(eligibility, "parse", lambda *args: parses.append(1) or real_parse(*args))
    monkeypatch.setattr(eligibility, "_keeps_plans", lambda t: True)
    monkeypatch.setattr(eligibility, "_plans", {})
    a, b, sa, sb = operands("mxfp8", 32, 64, 256, "32_4_4")
    served = eligibility.scaled_mm_v2_plan(*_v2_args(a, b, sa, sb, True))
    assert isinstance(served, eligibility.MXProblem) and len(parses) == 1
    assert eligibility.scaled_mm_v2_plan(*_v2_args(a, b, sa, sb, True)) is served and len(parses) == 1
    a2, b2 = a.clone(), b.t().clone().t()   # new tensors, same metadata: the same verdict
    assert eligibility.scaled_mm_v2_plan(*_v2_args(a2, b2, sa.clone(), sb.clone(), True)) is served
    assert len(parses) == 1
    assert "16-byte aligned" in eligibility.scaled_mm_v2_plan(*_v2_args(_misaligned(a), b, sa, sb, True))
    assert "out_dtype" in eligibility.scaled_mm_v2_plan(*_v2_args(a, b, sa, sb, True, out_dtype=torch.int32))
    bias = torch.randn(63, dtype=torch.bfloat16)
    assert "bias must be" in eligibility.scaled_mm_v2_plan(*_v2_args(a, b, sa, sb, True, bias=bias))
    assert "contraction_dim" in eligibility.scaled_mm_v2_plan(*_v2_args(a, b, sa, sb, True), [0, 1])
    assert eligibility.scaled_mm_plan(a, b, sa, sb, None, None, torch.bfloat16) == served
    with pytest.raises(MXInputError, match="with NO_SWIZZLE"):
        eligibility.scaled_mm_v2_plan(*_v2_args(a, b, sa, sb, False))
    parsed = len(parses)
    with pytest.raises(MXInputError, match="with NO_SWIZZLE"):
        eligibility.scaled_mm_v2_plan(*_v2_args(a, b, sa, sb, False))
    assert len(parses) == parsed + 1
    sliced = eligibility.scaled_mm_v2_plan(*_v2_args(a[:16], b, sa, sb, True))   # 16 rows, 32 rows' scales
    assert isinstance(sliced, eligibility.MXProblem) and sliced.m == 16


def test_verdicts_of_cpu_calls_are_not_kept(on_hopper, monkeypatch):
    monkeypatch.setattr(eligibility, "_plans", {})
    a, b, sa, sb = operands("mxfp8", 16, 32, 256)
    eligibility.scaled_mm_v2_plan(*_v2_args(a, b, sa, sb, False))
    assert eligibility._plans == {}


def _defaults(fn):
    return {n: p.default for n, p in inspect.signature(fn).parameters.items() if p.default is not p.empty}


@pytest.mark.parametrize("op, fns", [
    ("_scaled_mm_v2", (eligibility.scaled_mm_v2_plan, eligibility.scaled_mm_v2_reason, eager.scaled_mm_v2_served)),
    ("_scaled_mm", (eligibility.scaled_mm_plan, eligibility.scaled_mm_reason, eager.scaled_mm_served))])
def test_signatures_follow_the_schema(op, fns):
    """The router drops trailing defaults, so predicate and op must declare them (same names,
    same positions) as the installed torch's schema does; the op takes the plan first."""
    schema = getattr(torch.ops.aten, op).default._schema
    names = [arg.name for arg in schema.arguments]
    for fn in fns:
        params = list(inspect.signature(fn).parameters)
        if fn.__name__.endswith("_served"):
            assert params[0] == "plan"
            params = params[1:]
        assert params == [n if n != "output_dtype" else "out_dtype" for n in names], (fn, params, names)
        for arg in schema.arguments:
            if arg.has_default_value():
                default = _defaults(fn)[arg.name]
                assert (list(default) if isinstance(default, tuple) else default) == arg.default_value


def test_the_family_registers_both_ops():
    import tilefly.ops.mx_gemm  # noqa: F401

    impls = {i.op: i for i in _dispatch.registered("mx_gemm")}
    assert set(impls) == {"aten::_scaled_mm_v2", "aten::_scaled_mm"}
    assert all(i.dispatch_key == "CUDA" and i.takes_plan for i in impls.values())


STANDIN = "mx_standin"


@pytest.fixture
def standin_route(on_hopper, monkeypatch):
    """The family's predicate and op on the CPU key, registered as the family registers them (the
    op takes the predicate's MXProblem); the launch computes the float64 reference instead and
    records the problem it got and how many times the call was parsed."""
    from tilefly.ops.mx_gemm import launch

    calls = []
    parses = []
    real_parse = eligibility.parse
    monkeypatch.setattr(eligibility, "parse", lambda *args: parses.append(1) or real_parse(*args))

    def run(p, a, b, sa, sb, out, bias=None):
        calls.append((p, len(parses)))
        return out.copy_(reference(a, b, sa, sb, p.fmt, p.swizzled_a, bias))

    monkeypatch.setattr(launch, "run", run)
    _dispatch.register(_dispatch.Impl(STANDIN, "aten::_scaled_mm_v2", "standin_mx", eligibility.scaled_mm_v2_plan,
                                      eager.scaled_mm_v2_served, dispatch_key="CPU", takes_plan=True))
    _dispatch.install([STANDIN])
    yield calls
    _dispatch.uninstall([STANDIN])
    _dispatch._registry.pop(STANDIN, None)


@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("swizzle", ["none", "32_4_4"])
def test_f_scaled_mm_reaches_the_mx_route(standin_route, fmt, swizzle):
    a, b, sa, sb = operands(fmt, 33, 64, 256, swizzle, seed=3)
    layout = F.SwizzleType.SWIZZLE_32_4_4 if swizzle == "32_4_4" else F.SwizzleType.NO_SWIZZLE
    bias = torch.randn(64, dtype=torch.bfloat16)
    with _dispatch.recording() as decisions:
        out = F.scaled_mm(a, b, sa, F.ScalingType.BlockWise1x32, sb, F.ScalingType.BlockWise1x32,
                          swizzle_a=layout, swizzle_b=layout, bias=bias, output_dtype=torch.bfloat16)
    assert len(standin_route) == 1 and decisions[-1].impl == "standin_mx"
    (plan, parses), = standin_route
    assert plan == eligibility.MXProblem(fmt, 33, 64, 256, swizzle == "32_4_4", swizzle == "32_4_4")
    assert parses == 1, "the op takes the predicate's parse instead of parsing again"
    ref = reference(a, b, sa, sb, fmt, swizzle == "32_4_4", bias)
    torch.testing.assert_close(out.double(), ref, rtol=2 ** -7, atol=2 ** -7 * ref.abs().max().item())


def test_non_mx_scaled_mm_stays_aten(standin_route):
    a = torch.randn(16, 64).to(torch.float8_e4m3fn)
    b = torch.randn(32, 64).to(torch.float8_e4m3fn).t()
    one = torch.ones(1)
    with _dispatch.recording() as decisions:
        out = F.scaled_mm(a, b, one, F.ScalingType.TensorWise, one, F.ScalingType.TensorWise,
                          output_dtype=torch.bfloat16)
    assert standin_route == [] and decisions[-1].impl is None and "not MX" in decisions[-1].reason
    torch.testing.assert_close(out.float(), (a.float() @ b.float()), rtol=2 ** -7, atol=1e-2)


def test_malformed_mx_call_raises_the_clear_error(standin_route):
    a, b, sa, sb = operands("mxfp8", 16, 32, 256)
    with pytest.raises(MXInputError, match=r"scale_b must have shape \(32, 8\)"):
        F.scaled_mm(a, b, sa, F.ScalingType.BlockWise1x32, sb[:, :4], F.ScalingType.BlockWise1x32,
                    output_dtype=torch.bfloat16)
    assert standin_route == []


# ---- configs ----------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("rows, cols", [(4096, 1), (4096, 16), (4096, 33), (28672, 32), (4096, 256), (8192, 8192)])
def test_picked_and_offered_configs_are_buildable(fmt, rows, cols):
    picked = configs.pick(rows, cols, 4096, fmt)
    assert configs.static_reason(picked, fmt) is None
    assert picked.block_n >= min(cols, 64)
    offered = configs.offered(rows, cols, 4096, fmt)
    assert offered and picked in offered, "the eager path runs a config the benchmark races"


def test_compile_specs_cover_both_formats_and_layouts():
    names = [s.name for s in configs.compile_specs()]
    assert len(set(names)) == len(names)
    for tag in ("mxfp8", "mxfp4", "swz=11", "swz=10", "bias=1", "bias=2", "fp16"):
        assert any(tag in n for n in names), tag


# ---- the kernel's bit formulas, transcribed to torch -------------------------------------------

def test_swizzled_scale_offsets_match_to_blocked():
    rows, cols = 300, 11
    scales = torch.randint(0, 255, (rows, cols), dtype=torch.uint8)
    blocked = mx.to_blocked(scales)
    r = torch.arange(rows).unsqueeze(1)
    c = torch.arange(cols).unsqueeze(0)
    col_tiles = (cols + 3) // 4                      # scales.scale_bytes, SWIZZLED
    offs = ((r // 128) * col_tiles + c // 4) * 512 + (r % 32) * 16 + ((r // 32) % 4) * 4 + c % 4
    assert torch.equal(blocked[offs], scales)


def test_e2m1_to_e4m3_bits_are_exact():
    code = torch.arange(16, dtype=torch.int32)      # kernels.fp4_to_e4m3_bits
    e, m = (code >> 1) & 3, code & 1
    mag = torch.where(e == 0, m * (6 << 3), ((e + 6) << 3) | (m << 2))
    bits = ((code & 8) << 4) | mag
    got = bits.to(torch.uint8).view(torch.float8_e4m3fn).float()
    want = torch.tensor(mx.FP4_VALUES + tuple(-v for v in mx.FP4_VALUES))
    assert torch.equal(got, want)


def test_crossed_half_scales_are_exact_over_the_e8m0_range():
    """scales.add_scaled: fma(partial * g1, g2, acc) with g1 = 2^(floor(a/2) + ceil(b/2)),
    g2 = 2^(ceil(a/2) + floor(b/2)), a = ex - 127, b = ey - 127, in FP32: one rounding."""
    ex = torch.tensor([0, 0, 1, 100, 127, 127, 200, 254, 254, 0, 254, 3, 250], dtype=torch.int32)
    ey = torch.tensor([0, 254, 254, 30, 127, 10, 100, 0, 254, 127, 1, 252, 4], dtype=torch.int32)
    partial = torch.tensor([3.0, 5.5, -1.25, 7.0, 0.1, 1e6, -2.0, 96.0, 1.0, 1.0, 6e6, -3e-5, 2e6])

    def pow2(h):
        assert bool(((h >= -127) & (h <= 127)).all())
        return torch.where(h == -127, torch.tensor(2.0 ** -127), ((h + 127).clamp(min=1) << 23).view(torch.float32))

    def halves(bits):
        e = bits - 127
        lo = e >> 1
        return lo, e - lo

    x_lo, x_hi = halves(ex)
    y_lo, y_hi = halves(ey)
    g1, g2 = x_lo + y_hi, x_hi + y_lo
    assert bool((g1 <= 127).all() and (g1 >= -127).all() and (g2 <= 127).all() and (g2 >= -127).all())
    got = partial * pow2(g1) * pow2(g2)
    want = (partial.double() * torch.pow(2.0, (ex + ey - 254).double())).float()   # one rounding
    assert torch.equal(got, want)
    assert bool(torch.isinf(want[8]) and want[0] == 0)   # overflow and underflow happen in the result only


# ---- the launcher's decisions (no launch) ------------------------------------------------------



@pytest.mark.parametrize("fmt", mx.FORMATS)
def test_skinny_problems_put_the_weight_rows_in_the_mma_m_slot(launch_cpu, fmt):
    a, b, sa, sb = operands(fmt, 16, 4096, 4096, "none")     # decode: 16 tokens, 4096 x 4096 weight
    sb_swz = mx.to_blocked(sb)
    p = eligibility.parse(a, b, sa, sb_swz, False, True)
    out = torch.empty(16, 4096, dtype=torch.bfloat16)
    bias = torch.randn(4096, dtype=torch.bfloat16)
    plan = launch_cpu._prepare(p, a, b, sa, sb_swz, out, bias, None)
    args = named_args(plan)
    assert (args["M"], args["N"], args["K"]) == (4096, 16, 4096)              # X = B^T, Y = A
    assert args["sx_ptr"].data_ptr() == sb_swz.data_ptr() and args["sy_ptr"].data_ptr() == sa.data_ptr()
    assert (args["stride_syr"], args["stride_syc"]) == sa.stride()
    assert (args["stride_cm"], args["stride_cn"]) == (1, 4096)                # C = out^T
    assert plan.constexprs["X_SWIZZLED"] and not plan.constexprs["Y_SWIZZLED"]
    assert plan.constexprs["BIAS"] == 2 and plan.constexprs["C_ROWS_CONTIGUOUS"]
    assert plan.constexprs["FP4"] == (fmt == "mxfp4") and plan.constexprs["BLOCK_N"] == 16
    tiles, splits, _ = plan.grid
    assert tiles == 4096 // plan.cfg.block_m and splits > 1 and plan.workspace is not None
    per_split = args["iters_per_split" if plan.cfg.kernel == 1 else "slots_per_split"]
    assert splits * per_split >= 4096 // plan.cfg.block_k > (splits - 1) * per_split
    x_desc = args["x_desc"]
    assert x_desc.block_shape == [plan.cfg.block_m, plan.cfg.row_bytes(fmt)]
    assert x_desc.shape == [4096, 4096 if fmt == "mxfp8" else 2048]


def test_tall_problems_are_not_swapped(launch_cpu):
    a, b, sa, sb = operands("mxfp8", 4096, 256, 512, "32_4_4")
    p = eligibility.parse(a, b, sa, sb, True, True)
    out = torch.empty(4096, 256, dtype=torch.float16)
    plan = launch_cpu._prepare(p, a, b, sa, sb, out, torch.randn(256, dtype=torch.float16), None)
    args = named_args(plan)
    assert (args["M"], args["N"], args["stride_cm"], args["stride_cn"]) == (4096, 256, 256, 1)
    assert args["sx_ptr"].data_ptr() == sa.data_ptr()
    assert plan.constexprs["BIAS"] == 1 and not plan.constexprs["C_ROWS_CONTIGUOUS"]
    assert plan.grid[1] == 1 and plan.workspace is None            # enough tiles: no K-split


def test_fast_scaling_is_exact_for_moderate_row_scales():
    """scales.add_scaled_fast: fma(partial * 2^a, 2^b, acc) with |a| <= 100 and any b (byte 0 the
    subnormal 2^-127), over the extreme partials an FP8 K-block can produce."""
    def value(bits):
        pattern = torch.where(bits == 0, 1 << 22, bits << 23)
        return pattern.view(torch.float32)

    ex = torch.tensor([27, 227, 127, 27, 227, 100, 150], dtype=torch.int32)
    ey = torch.tensor([0, 254, 254, 1, 0, 77, 200], dtype=torch.int32)
    smallest, largest = 2.0 ** -18, 32 * 448.0 * 448.0
    for partial in (torch.full((7,), smallest), torch.full((7,), -largest), torch.full((7,), 3.0)):
        got = torch.addcmul(torch.zeros(7), partial * value(ex), value(ey))
        want = (partial.double() * torch.pow(2.0, (ex + ey - 254).double())).float()
        assert torch.equal(got, want)

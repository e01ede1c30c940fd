"""tilefly.mx on the H200: the same bits as on CPU, MXLinear's stock path eager and compiled, and
its scaled_mm path with ATen alone (a clear error) and with tilefly's MX family enabled."""
import re

import pytest
import torch
from torch import nn

import tilefly
from tilefly import mx
from tilefly.ops import FAMILIES

pytestmark = pytest.mark.cuda
MX_FAMILY = "mx_gemm"


def _special_input(dtype):
    torch.manual_seed(0)
    x = torch.randn(130, 256) * torch.logspace(-20, 20, 130).unsqueeze(1)
    x[0, :32] = 0                       # zero block
    x[1, 5] = float("nan")              # NaN block
    x[2, 40] = float("inf")             # Inf block
    x[3, :32] = 2.0 ** -140             # FP32 subnormal block
    x[4, 64] = 500.0                    # saturating element (mxfp8 exponent 0)
    x[5, 96] = 7.5                      # saturating element (mxfp4 exponent 0)
    return x.to(dtype)


def _same_bytes(a, b, rows=slice(None)):
    return torch.equal(a.cpu().view(torch.uint8)[rows], b.view(torch.uint8)[rows])


@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("swizzle", mx.SWIZZLES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_quantize_matches_cpu_bit_for_bit(fmt, swizzle, dtype):
    x = _special_input(dtype)
    data, scales = mx.quantize(x.cuda(), fmt, swizzle=swizzle)
    ref_data, ref_scales = mx.quantize(x, fmt, swizzle=swizzle)
    assert _same_bytes(scales, ref_scales)
    finite_rows = [r for r in range(x.shape[0]) if r not in (1, 2)]  # a NaN block's element bytes are moot
    assert _same_bytes(data, ref_data, finite_rows)
    for out_dtype in (torch.float32, torch.bfloat16, torch.float16):
        got = mx.dequantize(data, scales, fmt, swizzle=swizzle, dtype=out_dtype).cpu()
        ref = mx.dequantize(ref_data, ref_scales, fmt, swizzle=swizzle, dtype=out_dtype)
        torch.testing.assert_close(got, ref, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("rows, k", [(9, 96), (4097, 4128), (3, 14336)])
def test_cuda_quantize_kernel_matches_the_ops_bit_for_bit(monkeypatch, fmt, dtype, rows, k):
    """quant.quantize_rows on CUDA runs kernels_quant (one program per 64 blocks, a tail program
    here) and gives the ops' bytes, NaN blocks included, for every input dtype."""
    from tilefly.mx import formats, quant
    from tilefly.ops.mx_gemm.checks import quantize_input

    dtype_name = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]
    x = quantize_input(dtype_name, rows, k, seed=int(torch.randint(0, 2 ** 31, ()))).cuda()
    spec = formats.ELEMENTS[fmt]
    want_data, want_scales = quant.quantize_rows_ops(x, spec)
    assert quant.kernel_reason(x) is None
    monkeypatch.setattr(quant, "quantize_rows_ops", lambda *a: pytest.fail("the ops served an eager CUDA call"))
    data, scales = quant.quantize_rows(x, spec)
    assert torch.equal(scales, want_scales)
    assert torch.equal(data.view(torch.uint8), want_data.view(torch.uint8))
    poisoned = tuple(torch.full_like(t.view(torch.uint8), 0x5A) for t in (want_data, want_scales))
    data, scales = quant.quantize_rows_kernel(x, spec, out=poisoned)     # every byte written
    assert torch.equal(scales, want_scales)
    assert torch.equal(data.view(torch.uint8), want_data.view(torch.uint8))


def test_cuda_quantize_under_compile_traces_the_ops():
    from tilefly.mx import formats, quant

    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    spec = formats.ELEMENTS["mxfp8"]
    torch._dynamo.reset()
    data, scales = torch.compile(lambda t: quant.quantize_rows(t, spec), fullgraph=True)(x)
    want_data, want_scales = quant.quantize_rows(x, spec)
    assert torch.equal(scales, want_scales) and torch.equal(data.view(torch.uint8), want_data.view(torch.uint8))


def _mx_linear(fmt, backend, dtype=torch.bfloat16, bias=True):
    torch.manual_seed(1)
    lin = nn.Linear(4096, 1024, bias=bias).to("cuda", dtype)
    return mx.MXLinear.from_linear(lin, fmt, backend=backend)


def _reference(m, x):
    a_data, a_scales = mx.quantize(x.reshape(-1, m.in_features), m.fmt)
    a = mx.dequantize(a_data, a_scales, m.fmt, dtype=torch.float64)
    w = mx.dequantize(m.weight_data, m.weight_scales, m.fmt, swizzle=m.swizzle, dtype=torch.float64)
    out = a @ w.t() + (0 if m.bias is None else m.bias.double())
    return out.reshape(*x.shape[:-1], m.out_features)


def _check(out, ref):
    torch.testing.assert_close(out.double(), ref, rtol=2.0 ** -7, atol=2.0 ** -7 * ref.abs().max().item())


@pytest.mark.parametrize("fmt", mx.FORMATS)
def test_cuda_dequant_backend_eager_and_compiled(fmt):
    m = _mx_linear(fmt, "dequant")
    for shape in [(1, 4096), (3, 33, 4096)]:
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        _check(m(x), _reference(m, x))
    torch._dynamo.reset()
    compiled = torch.compile(m, fullgraph=True)
    x = torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16)
    _check(compiled(x), _reference(m, x))


@pytest.mark.parametrize("fmt", mx.FORMATS)
def test_cuda_scaled_mm_without_tilefly_raises_clearly(fmt):
    m = _mx_linear(fmt, "scaled_mm")
    with pytest.raises(mx.MXKernelUnavailable, match="backend='dequant'"):
        m(torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16))


@pytest.mark.skipif(MX_FAMILY not in FAMILIES, reason=f"tilefly has no {MX_FAMILY} family yet")
@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("swizzle", mx.SWIZZLES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_scaled_mm_with_tilefly(fmt, swizzle, dtype):
    torch.manual_seed(2)
    lin = nn.Linear(4096, 1024).to("cuda", dtype)
    m = mx.MXLinear.from_linear(lin, fmt, swizzle=swizzle)
    x = torch.randn(2, 17, 4096, device="cuda", dtype=dtype)
    with tilefly.enabled(MX_FAMILY):
        _check(m(x), _reference(m, x))
        torch._dynamo.reset()
        _check(torch.compile(m)(x), _reference(m, x))


class _Siblings(nn.Module):
    """q / k / v-like: three MX projections of one activation (``x * 2``: exact, so compiled and
    eager quantize the same bits)."""

    def __init__(self, fmt, dtype):
        super().__init__()
        self.projections = nn.ModuleList(
            mx.MXLinear.from_linear(nn.Linear(4096, n, bias=False).to("cuda", dtype), fmt, swizzle="none")
            for n in (1024, 256, 256))

    def forward(self, x):
        h = x * 2
        return [p(h) for p in self.projections]


@pytest.mark.skipif(MX_FAMILY not in FAMILIES, reason=f"tilefly has no {MX_FAMILY} family yet")
@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
@pytest.mark.parametrize("packed", [False, True])
def test_cuda_compiled_siblings_share_one_quantization_and_one_call(monkeypatch, fmt, mode, packed):
    """Compiled on CUDA, MXLinear quantizes through tilefly::mx_quantize_rows (kernels_quant's
    kernel), the SharedQuantization pass keeps one call for the three projections and makes their
    GEMMs one tilefly::mx_linear_mm_packed call. Weights apart, it runs one GEMM each and equals
    eager mode bit for bit, CUDA graphs included; weights packed (tilefly.mx.siblings), one GEMM
    whose columns match each projection's float64 reference."""
    from torch._inductor.utils import run_and_get_code

    from tilefly.mx import linear, siblings

    torch.manual_seed(3)
    m = _Siblings(fmt, torch.bfloat16)
    if packed:
        assert siblings.pack_sibling_weights(m) == 1
    else:   # apart for sure: each scale buffer a view with room behind it, so none can follow another
        for p in m.projections:
            n = p.weight_scale_bits.numel()
            roomy = torch.empty(n + 512, dtype=torch.uint8, device="cuda")
            roomy[:n].copy_(p.weight_scale_bits.reshape(-1))
            p.weight_scale_bits = roomy[:n].view(p.weight_scale_bits.shape)
    gemms = []
    real_scaled_mm = linear._scaled_mm
    monkeypatch.setattr(linear, "_scaled_mm", lambda *a: gemms.append(1) or real_scaled_mm(*a))
    with tilefly.enabled(MX_FAMILY):
        torch._dynamo.reset()
        compiled = torch.compile(m, mode=mode)
        for step in range(3):     # CUDA graph trees: warm-up, record, replay
            x = torch.randn(32, 1, 4096, device="cuda", dtype=torch.bfloat16)     # decode: one token a request
            if step == 0:
                outs, (code,) = run_and_get_code(compiled, x)
                assert code.count("torch.ops.tilefly.mx_quantize_rows.default(") == 1
                assert code.count("torch.ops.tilefly.mx_linear_mm_packed.default(") == 1
                assert code.count("torch.ops.tilefly.mx_linear_mm.default(") == 0
                assert len(gemms) == (1 if packed else 3)      # the last run of the compiled step
            else:
                outs = compiled(x)
            eager = m(x)
            for got, want, p in zip(outs, eager, m.projections):
                if packed:
                    _check(got, _reference(p, x * 2))
                else:
                    torch.testing.assert_close(got, want, rtol=0, atol=0)
        torch._dynamo.reset()


@pytest.mark.skipif(MX_FAMILY not in FAMILIES, reason=f"tilefly has no {MX_FAMILY} family yet")
@pytest.mark.parametrize("fmt", mx.FORMATS)
def test_cuda_pdl_launches_give_the_same_bits(monkeypatch, fmt):
    """config.mx_pdl launches the quantization and the v2 / v4 decode GEMMs with programmatic
    dependent launch; eager and replayed from a CUDA graph, every output equals the launches without."""
    from tilefly import config

    from tilefly.ops.mx_gemm import launch

    torch.manual_seed(4)
    m = _Siblings(fmt, torch.bfloat16)
    xs = [torch.randn(32, 1, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    prepared = []
    prepare = launch._prepare
    monkeypatch.setattr(launch, "_prepare", lambda *args: prepared.append(plan := prepare(*args)) or plan)
    with tilefly.enabled(MX_FAMILY):
        want = [m(x) for x in xs]
        monkeypatch.setattr(config, "mx_pdl", True)
        for x, expected in zip(xs, want):
            for got, ref in zip(m(x), expected):
                torch.testing.assert_close(got, ref, rtol=0, atol=0)
        # MXLinear's weights are X of the swapped decode GEMM: v2 builds stream them in before the wait
        assert any(plan.cfg.pdl and plan.cfg.prefetch_x for plan in prepared if plan.cfg.kernel == 2), \
            [plan.cfg.name for plan in prepared]
        static = xs[0].clone()
        m(static)                                  # compile and warm the PDL builds outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = m(static)
        for x, expected in zip(xs, want):
            static.copy_(x)
            graph.replay()
            for got, ref in zip(captured, expected):
                torch.testing.assert_close(got, ref, rtol=0, atol=0)


@pytest.mark.skipif(MX_FAMILY not in FAMILIES, reason=f"tilefly has no {MX_FAMILY} family yet")
@pytest.mark.parametrize("fmt", mx.FORMATS)
def test_cuda_pdl_decoder_block_compiled_gives_the_same_bits(monkeypatch, compile_fused, fmt):
    """A compiled add + RMSNorm + gate/up + SiLU + down block with the fused quantization: with
    config.mx_pdl the fused kernels let the GEMMs launch at their start and the GEMMs stream their
    weights in before waiting; every output equals the compile without PDL."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from tilefly import config

    torch.manual_seed(5)
    norm = LlamaRMSNorm(4096, eps=1e-5).cuda().bfloat16()
    gate, up, down = (mx.MXLinear.from_linear(nn.Linear(k, n, bias=False).cuda().bfloat16(), fmt, backend="scaled_mm")
                      for k, n in ((4096, 2048), (4096, 2048), (2048, 4096)))

    def block(a, b):
        h = a + b
        x = norm(h)
        return h, down(nn.functional.silu(gate(x)) * up(x))

    a, b = (torch.randn(32, 1, 4096, device="cuda").bfloat16() for _ in range(2))
    outs = {}
    for pdl in (False, True):
        monkeypatch.setattr(config, "mx_pdl", pdl)
        outs[pdl], code = compile_fused(block, a, b)
        assert len(re.findall(r"torch\.ops\.tilefly\.add_rms_norm_mx_quantize(_expanded)?\.default\(", code)) == 1
    for got, want in zip(outs[True], outs[False]):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


# ---- the fused residual add + RMSNorm + quantization (tilefly.mx.norm_quant, config.mx_fused_quant)

@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("k", [4096, 16384])
def test_cuda_fused_norm_quantize_matches_the_ops_bit_for_bit(fmt, k):
    """Inputs whose sums are exact in any order (checks.norm_quantize_input): the kernel and the PyTorch
    ops on the GPU round the same rstd, so every byte agrees (NaN blocks aside). K a power of two: ATen's
    CUDA mean multiplies by 1 / K where the kernel (as Inductor's) divides by K, an ulp apart otherwise."""
    from tilefly.ops.mx_gemm.checks import check_norm_quantize

    check_norm_quantize(fmt, 33, k, device="cuda")


@pytest.mark.parametrize("k, weight", [(4096, "spread"), (4096, "plain"), (16384, "spread")])
def test_cuda_fused_norm_quantize_expanded_matches_the_ops_bit_for_bit(k, weight):
    """The MXFP4 build that also writes the expanded copy (tilefly.mx.expanded), as in Triton's interpreter."""
    from tilefly.ops.mx_gemm.checks import check_norm_quantize_expanded

    check_norm_quantize_expanded(33, k, weight, device="cuda")


@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("k", [4096, 5120])
def test_cuda_fused_norm_quantize_on_model_like_rows(fmt, k):
    """Gaussian rows: h is exact; the mean's summation order (and at K = 5120 its division) may move a
    normalised value across a BF16 rounding boundary, so a few bytes may differ, each by one step."""
    from tilefly.mx import formats, norm_quant
    from tilefly.mx.quant import dequantize_rows

    spec = formats.ELEMENTS[fmt]
    a, b = (torch.randn(32, k, device="cuda") * 4).bfloat16(), torch.randn(32, k, device="cuda").bfloat16()
    w = torch.randn(k, device="cuda").bfloat16()
    poisoned = (torch.full_like(a, 7.0),
                torch.full((32, k // spec.per_byte), 0x5A, dtype=torch.uint8, device="cuda"),
                torch.full((32, k // 32), 0x5A, dtype=torch.uint8, device="cuda"))
    h, data, scales = norm_quant.add_rms_norm_quantize_kernel(a, b, w, 1e-5, spec, out=poisoned)
    want_h, want_data, want_scales = norm_quant.add_rms_norm_quantize_ops(a, b, w, 1e-5, spec)
    assert torch.equal(h, want_h)
    assert (scales != want_scales).float().mean() < 1e-3 and (data != want_data).float().mean() < 1e-3
    got = dequantize_rows(data, scales, spec, torch.float32)
    want = dequantize_rows(want_data, want_scales, spec, torch.float32)
    # one element step at the top of a block: amax / 8 (E4M3: 32 of 256..448), amax / 2 (E2M1: 2 of 4..6),
    # of the larger amax of the two (a value one ulp apart may move its block to the next scale)
    top = torch.maximum(got.abs(), want.abs()).reshape(32, k // 32, 32).amax(-1, keepdim=True)
    step = (top / (2 if fmt == "mxfp4" else 8)).expand(-1, -1, 32).reshape(32, k)
    assert ((got - want).abs() <= step).all()


@pytest.mark.parametrize("n", [4096, 14336])
def test_cuda_fused_silu_quantize_expanded_is_the_expansion_of_its_bytes(n):
    from tilefly.ops.mx_gemm.checks import check_silu_quantize_expanded

    check_silu_quantize_expanded(33, n, device="cuda")


@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("n", [4096, 14336])
def test_cuda_fused_silu_quantize_matches_the_ops(fmt, n):
    """Strided gate/up rows (slices of one packed output): exact where exp and division cannot round
    apart, within one element step elsewhere (checks.check_silu_quantize)."""
    from tilefly.ops.mx_gemm.checks import check_silu_quantize

    check_silu_quantize(fmt, 32, n, device="cuda")


@pytest.mark.skipif(MX_FAMILY not in FAMILIES, reason=f"tilefly has no {MX_FAMILY} family yet")
@pytest.mark.parametrize("fmt", mx.FORMATS)
def test_cuda_compiled_decoder_block_runs_the_fused_kernels(monkeypatch, fmt):
    """An add + RMSNorm feeding an MX gate/up pair and the SiLU product feeding an MX down projection,
    compiled with config.mx_fused_quant on: one call of each fused op, and the same results as the
    unfused compile (h exactly, the projections within the quantization's error)."""
    from torch._inductor.utils import run_and_get_code
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from tilefly import config

    torch.manual_seed(0)
    norm = LlamaRMSNorm(4096, eps=1e-5).cuda().bfloat16()
    with torch.no_grad():
        norm.weight.normal_()
    linears = [nn.Linear(k, n, bias=False).cuda().bfloat16() for k, n in ((4096, 2048), (4096, 2048), (2048, 4096))]
    gate, up, down = (mx.MXLinear.from_linear(linear, fmt, backend="scaled_mm") for linear in linears)

    def block(a, b):
        h = a + b
        x = norm(h)
        return h, down(nn.functional.silu(gate(x)) * up(x))

    a, b = torch.randn(32, 1, 4096, device="cuda").bfloat16(), torch.randn(32, 1, 4096, device="cuda").bfloat16()
    outs = {}
    for fused, expand in ((False, False), (True, False), (True, True)):
        monkeypatch.setattr(config, "mx_fused_quant", fused)
        monkeypatch.setattr(config, "mx_expanded_activation", expand)
        with tilefly.enabled(), torch.no_grad():
            torch._dynamo.reset()
            out, (code,) = run_and_get_code(torch.compile(block), a, b)
        expanded = expand and fmt == "mxfp4"       # the GEMMs read the fused kernels' expanded copies
        suffix = "_expanded" if expanded else ""
        for op in ("add_rms_norm_mx_quantize" + suffix, "silu_mul_mx_quantize" + suffix):
            assert code.count(f"torch.ops.tilefly.{op}.default(") == (1 if fused else 0), (op, fused)
        assert code.count("a_expanded=buf") == 2 * int(expanded)       # gate/up and down
        if not expand:
            outs[fused] = out
        else:      # the expanded reads give the unpacking build's bits
            assert torch.equal(out[0], outs[True][0]) and torch.equal(out[1], outs[True][1])
    assert torch.equal(outs[True][0], outs[False][0])
    # Inductor's RMSNorm and the fused kernel may round an element of x one bf16 ulp apart, which can
    # move it a whole E2M1 step, so single elements of the output are no measure: compare norms.
    # Each compile sits at the quantization's error from an unquantized float64 block (about 0.08 of
    # its norm for MXFP8, 0.32 for MXFP4), and the two compiles are much closer to each other (a CPU
    # model with 5% of x one ulp apart: 0.27 and 0.19 of that error); a wrong kernel lands near 1.
    w_gate, w_up, w_down = (linear.weight.detach().double() for linear in linears)
    with torch.no_grad():
        x = norm(outs[False][0]).double().squeeze(1)
    exact = (nn.functional.silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T

    def error(got, want):
        return ((got.double().squeeze(1) - want).norm() / want.norm()).item()

    fused, unfused = outs[True][1], outs[False][1]
    quantization = error(unfused, exact)
    assert quantization < (0.15 if fmt == "mxfp8" else 0.5), quantization
    assert error(fused, exact) <= 1.1 * quantization, (error(fused, exact), quantization)
    assert error(fused, unfused.double().squeeze(1)) <= 0.5 * quantization


def _decode_attention_inputs(keys, dtype, batch=32, kv_heads=8, rows=4, d=128):
    """A decode step's grouped attention call (a KV group's query heads as rows) over a static cache."""
    q = torch.randn(batch, kv_heads, rows, d, device="cuda").to(dtype)
    k = torch.randn(batch, kv_heads, keys, d, device="cuda").to(dtype)
    v = torch.randn(batch, kv_heads, keys, d, device="cuda").to(dtype)
    v[:, 0, :, :32] *= 2.0 ** -30         # the first block of every output row far below the others
    lengths = torch.randint(1, keys + 1, (batch,), device="cuda")
    lengths[0] = keys
    bias = torch.where(torch.arange(keys, device="cuda")[None, :] < lengths[:, None], 0.0, float("-inf"))
    return q, k, v, bias.to(dtype)[:, None, None, :]


@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("keys", [64, 1000, 4096])     # one split (the kernel writes directly), several
def test_cuda_attention_quantize_in_the_decode_kernel_gives_the_stored_outputs_bytes(monkeypatch, fmt, dtype, keys):
    """tilefly::attention_mx_quantize where the router serves the call with the decode kernel: the kernel
    quantizes (QUANT) and gives exactly quantize_rows of the output the same call stores."""
    from tilefly import config
    from tilefly.mx import attention_quant
    from tilefly.mx.quant import quantize_rows
    from tilefly.ops.attention import decode

    monkeypatch.setattr(config, "attention_decode", "on")
    quantized = []
    run = decode.run
    monkeypatch.setattr(decode, "run", lambda *a, **kw: quantized.append(kw.get("quant")) or run(*a, **kw))
    torch.manual_seed(0)
    q, k, v, bias = _decode_attention_inputs(keys, dtype)
    strides = [4096, 512, 128, 1]
    with tilefly.enabled(["attention"]):
        data, scales = torch.ops.tilefly.attention_mx_quantize(q, k, v, bias, None, False, "cudnn", strides, 4096, fmt)
        out = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, bias, False)[0]
    assert quantized[0] is not None and quantized[1] is None, "the op's call quantized in the kernel, then a plain one"
    want_data, want_scales = quantize_rows(out.reshape(32, 4096), attention_quant.formats.ELEMENTS[fmt])
    assert torch.equal(data, want_data.view(torch.uint8)) and torch.equal(scales, want_scales)
    assert (scales[:, 0] < scales[:, 1]).all()      # the small blocks kept scales of their own


@pytest.mark.parametrize("fmt", mx.FORMATS)
def test_cuda_compiled_attention_quantization_fuses_and_keeps_the_bits(monkeypatch, compile_fused, fmt):
    """A grouped decode attention call feeding an MX quantization, compiled with the decode kernel on:
    one fused op, no quantization op, and the unfused compile's bytes."""
    import torch.nn.functional as F

    from tilefly import config

    monkeypatch.setattr(config, "attention_decode", "on")
    torch.manual_seed(1)
    q, k, v, bias = _decode_attention_inputs(1500, torch.bfloat16)

    def f(q, k, v, bias):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        b, h, s, d = out.shape
        return torch.ops.tilefly.mx_quantize_rows(out.reshape(b, h * s, 1, d).transpose(1, 2).reshape(b, -1), fmt)

    fused, code = compile_fused(f, q, k, v, bias)
    assert code.count("torch.ops.tilefly.attention_mx_quantize.default(") == 1
    assert "torch.ops.tilefly.mx_quantize_rows.default(" not in code
    unfused, _ = compile_fused(f, q, k, v, bias, fused=False)
    assert all(torch.equal(a, b) for a, b in zip(fused, unfused))

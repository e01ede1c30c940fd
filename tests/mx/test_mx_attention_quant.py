"""tilefly::attention_mx_quantize and the attention step of the post-grad pass (tilefly.mx.attention_fusion),
on CPU: the pass fuses an o_proj input as the e2e models trace it (heads transposed, or a KV group's query
heads as rows) and leaves what it cannot prove is the output's memory in order; the op's CPU path is the
graph's own ops. The decode kernel's quantized output is checked in Triton's interpreter
(decode.interpreter_checks, run by tests/ops/attention/test_attention_bwd.py) and on the GPU
(test_mx_cuda.py)."""
import pytest
import torch
import torch.nn.functional as F

import tilefly.mx.attention_quant  # noqa: F401 - registers tilefly::attention_mx_quantize
from tilefly import mx
from tilefly.mx import formats
from tilefly.mx.quant import quantize_rows_ops

FUSED = "torch.ops.tilefly.attention_mx_quantize.default("
QUANT = "torch.ops.tilefly.mx_quantize_rows.default("
B, KEYS = 3, 40


def _inputs(heads=4, kv_heads=4, rows=1, d=64, dtype=torch.bfloat16):
    q = torch.randn(B, heads, rows, d).to(dtype)
    k = torch.randn(B, kv_heads, KEYS, d).to(dtype)
    v = torch.randn(B, kv_heads, KEYS, d).to(dtype)
    lengths = torch.tensor([KEYS, 7, 23])
    mask = torch.where(torch.arange(KEYS)[None, :] < lengths[:, None], 0.0, float("-inf")).to(dtype)
    return q, k, v, mask[:, None, None, :]


def _o_proj_input(fmt="mxfp4", layout="transposed", extra_user=False, mask=True):
    """The attention output reshaped to o_proj's rows and quantized, as MXLinear traces it."""
    def f(q, k, v, bias):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias if mask else None, is_causal=not mask)
        b, h, s, d = out.shape
        if layout == "transposed":          # transformers' SDPA path: (B, S, H, D) rows
            rows = out.transpose(1, 2).reshape(b * s, h * d)
        else:                               # e2e's grouped decode: a KV group's query heads as rows
            rows = out.reshape(b, h * s, 1, d).transpose(1, 2).reshape(b, h * s * d)
        data, scales = torch.ops.tilefly.mx_quantize_rows(rows, fmt)
        return (data, scales, out.float().sum()) if extra_user else (data, scales)
    return f


@pytest.mark.parametrize("fmt", mx.FORMATS)
@pytest.mark.parametrize("layout, rows", [("transposed", 1), ("grouped", 4)])
def test_the_pass_fuses_attention_and_the_quantization_of_its_output(compile_fused, fmt, layout, rows):
    args = _inputs(heads=2 if layout == "grouped" else 4, kv_heads=2 if layout == "grouped" else 4, rows=rows)
    f = _o_proj_input(fmt, layout)
    out, code = compile_fused(f, *args)
    assert code.count(FUSED) == 1 and QUANT not in code
    unfused, code = compile_fused(f, *args, fused=False)
    assert FUSED not in code and code.count(QUANT) == 1
    for got, want in zip(out, unfused):     # the op's CPU path runs the graph's own ops
        assert got.dtype == torch.uint8 and torch.equal(got, want)


@pytest.mark.parametrize("case", ["option off", "output used elsewhere", "no mask", "head dim 16",
                                  "rows not the output's memory"])
def test_the_pass_leaves_what_it_does_not_match(compile_fused, case):
    # several query rows a head: the CPU op's output is (B, H, S, D) in memory, so the transposed rows
    # are a copy in another order
    args = _inputs(d=16 if case == "head dim 16" else 64, rows=3 if case == "rows not the output's memory" else 1)
    f = _o_proj_input(extra_user=case == "output used elsewhere", mask=case != "no mask")
    out, code = compile_fused(f, *args, fused=case != "option off")
    assert FUSED not in code and code.count(QUANT) == 1
    if case == "rows not the output's memory":    # and the results stay the graph's
        want, _ = compile_fused(f, *args, fused=False)
        assert all(torch.equal(a, b) for a, b in zip(out, want))


@pytest.mark.parametrize("fmt", mx.FORMATS)
def test_the_ops_cpu_path_is_attention_then_quantize_rows(fmt):
    q, k, v, bias = _inputs()
    row_len = q.shape[1] * q.shape[-1]
    out = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=bias)[0]
    data, scales = torch.ops.tilefly.attention_mx_quantize(q, k, v, bias, None, False, "cpu", list(out.stride()),
                                                           row_len, fmt)
    want_data, want_scales = quantize_rows_ops(out.transpose(1, 2).reshape(-1, row_len), formats.ELEMENTS[fmt])
    assert torch.equal(data, want_data.view(torch.uint8)) and torch.equal(scales, want_scales)


def test_the_op_regathers_an_output_laid_out_otherwise():
    """An output whose strides are not the graph's (never expected) is copied to them first."""
    from tilefly.mx.attention_quant import _rows_of

    out = torch.arange(24.0).reshape(2, 3, 1, 4)       # contiguous (b, h, m, d)
    heads_inner = [12, 4, 12, 1]                        # the graph's layout: (b, m, h, d) memory
    rows = _rows_of(out, heads_inner, 12)
    assert torch.equal(rows, out.transpose(1, 2).reshape(2, 12))


@pytest.mark.parametrize("fmt", mx.FORMATS)
def test_fake_outputs_match_the_op(fmt):
    from torch._subclasses.fake_tensor import FakeTensorMode

    q, k, v, bias = _inputs()
    args = (None, False, "cpu", [4 * 64, 64, 4 * 64, 1], 4 * 64, fmt)
    real = torch.ops.tilefly.attention_mx_quantize(q, k, v, bias, *args)
    with FakeTensorMode() as mode:
        fake = torch.ops.tilefly.attention_mx_quantize(*(mode.from_tensor(t) for t in (q, k, v, bias)), *args)
    assert [(t.shape, t.dtype) for t in fake] == [(t.shape, t.dtype) for t in real]


def test_decode_refusal_says_why_the_kernel_would_not_serve():
    import tilefly
    from tilefly.mx.attention_quant import _decoded
    from tilefly.ops.attention import eager

    q, k, v, bias = _inputs()
    assert "family is not enabled" in eager.decode_refusal("cudnn", q, k, v, bias, None)
    assert "no attention mask" in eager.decode_refusal("efficient", q, k, v, None, None)
    with tilefly.enabled(["attention"]):
        assert eager.decode_refusal("cudnn", q, k, v, bias, None) is not None     # no GPU here
    assert _decoded(q, k, v, bias, None, "cudnn", [256, 64, 256, 1], formats.ELEMENTS["mxfp4"]) == (
        None, "cpu tensors on the cudnn op")


def test_quant_reason_names_what_the_kernel_cannot_quantize():
    from tilefly.ops.attention import decode

    assert decode.quant_reason(128, (4096, 512, 128, 1)) is None
    assert "head dim 16" in decode.quant_reason(16, (64, 16, 16, 1))
    assert "strides" in decode.quant_reason(64, (640, 80, 80, 1))
    assert "strides" in decode.quant_reason(64, (64, 1, 64, 64))


def test_every_layers_o_proj_input_fuses_in_a_static_cache_decode_step(monkeypatch, compile_fused, reference):
    """The pattern as a transformers Llama decode step over a static cache traces it (e2e's grouped
    attention, MXFP4 layers, the CUDA path's opaque quantization forced on CPU; head dim 32): one fused
    call a layer, and logits as near eager mode's as the unfused compile's. (Not its bits: the pass changes
    Inductor's graph, so its fusions of the rope and the norms round elsewhere, and one BF16 ulp moves an
    E2M1 code.)"""
    from transformers import AutoModelForCausalLM

    from tilefly.bench.e2e import engine, models
    from tilefly.mx import linear

    monkeypatch.setattr(linear, "_quantize_as_op", lambda rows: torch.compiler.is_compiling())
    monkeypatch.setattr(torch._inductor.config, "fx_graph_cache", False)   # the pass must run
    config = models.hf_config("tiny")
    config.head_dim = 32
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval().requires_grad_(False)
    models.apply_precision(model, "mxfp4", backend="scaled_mm", swizzle="none")
    prompt = torch.randint(0, config.vocab_size, (2, 5))

    def decode(fused):
        cache = engine.new_cache(model, 2, 16)
        with torch.no_grad():
            ids, _ = engine.prefill_step(model, cache, prompt)
            if fused is None:
                return engine.decode_step(model, cache, ids)[1], ""
        (_, logits), code = compile_fused(lambda ids: engine.decode_step(model, cache, ids), ids, fused=fused)
        return logits, code

    eager, _ = decode(None)
    logits, code = decode(True)
    assert code.count(FUSED) == config.num_hidden_layers
    unfused, code = decode(False)
    assert FUSED not in code
    for got in (logits, unfused):
        torch.testing.assert_close(got, eager, rtol=0, atol=0.1 * eager.abs().max().item())

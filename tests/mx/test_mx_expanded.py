"""Expanded MXFP4 activations (tilefly.mx.expanded) on CPU: the copy holds the quantized values exactly, which
rows fold, the offer MXLinear makes, the fused norm op's expanded build and when the post-grad pass uses it.
The kernel's bits against these ops: Triton's interpreter (tilefly.ops.mx_gemm.checks, run by
tests/ops/mx_gemm/test_mx_requant.py) and the GPU (test_mx_cuda.py)."""
import pytest
import torch

from tilefly import config
from tilefly.mx import expanded, formats, norm_quant
from tilefly.mx.quant import dequantize_rows, quantize_rows

SPEC = formats.ELEMENTS["mxfp4"]


def _decode(copy, scales):
    """The values an expanded copy stands for, in natural K order (scale 255: NaN)."""
    rows, k = copy.shape
    values = copy.view(torch.float8_e4m3fn).float().view(rows, k // 32, 2, 16).transpose(2, 3).reshape(rows, k)
    factor = torch.exp2(scales.float() - 127).masked_fill(scales == 255, float("nan"))
    return values * factor.repeat_interleave(32, dim=1)


def _quantized(x):
    data, scales = quantize_rows(x, SPEC)
    return data.view(torch.uint8), scales


def _block_scaled(rows, blocks, spans):
    """Gaussian rows whose blocks are scaled by 2^0 .. 2^-span (row i: spans[i])."""
    x = torch.randn(rows, blocks * 32)
    shift = torch.stack([torch.arange(blocks) % (s + 1) for s in spans]).float()
    return x * torch.exp2(-shift).repeat_interleave(32, dim=1)


def test_the_copy_holds_the_quantized_values_exactly():
    x = _block_scaled(6, 12, [0, 3, 6, 8, 12, 20])
    x[0, :32] = 0.0                        # an all-zero block
    x[5, 40] = float("nan")
    data, scales = _quantized(x)
    copy, copy_scales = expanded.expand_rows_ops(data, scales)
    assert copy.shape == (6, 384) and copy_scales.shape == (6, 12) and copy.dtype == copy_scales.dtype == torch.uint8
    want = dequantize_rows(data, scales, SPEC, torch.float32)
    got = _decode(copy, copy_scales)
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())


def test_rows_fold_within_the_span_of_their_nonzero_blocks():
    x = torch.full((4, 384), 1.5) * torch.tensor([1.0, -1.0]).repeat(192)      # every block's scale 2^-2
    x[1, 32:64] *= 2.0 ** -(expanded.EXPAND_SPAN)        # one block exactly EXPAND_SPAN below the rest
    x[2, 32:64] *= 2.0 ** -(expanded.EXPAND_SPAN + 1)    # one step further
    x[3, 32:64] = 0.0                                    # a zero block: its scale (0) does not count
    data, scales = _quantized(x)
    e = scales.int()
    assert (e[1].max() - e[1, 1]).item() == expanded.EXPAND_SPAN and (e[2].max() - e[2, 1]).item() == 9
    codes = torch.stack((data.int() & 15, data.int() >> 4), -1).view(4, -1)
    folded, top = expanded.folded_rows(codes, e)
    assert folded.tolist() == [True, True, False, True] and torch.equal(top, e.amax(1))
    _, copy_scales = expanded.expand_rows_ops(data, scales)
    assert (copy_scales[folded] == top[folded, None].to(torch.uint8)).all()     # the top, every block
    assert torch.equal(copy_scales[2], scales[2])                                 # its own scales


def test_a_nan_row_keeps_its_own_scales():
    x = torch.randn(2, 64)
    x[1, 3] = float("nan")
    data, scales = _quantized(x)
    _, copy_scales = expanded.expand_rows_ops(data, scales)
    assert torch.equal(copy_scales[1], scales[1]) and copy_scales[1, 0] == 255


def test_kernel_order_puts_a_blocks_even_k_first():
    values = torch.arange(64).view(1, 64)
    order = expanded.kernel_order(values)[0].tolist()
    assert order[:16] == list(range(0, 32, 2)) and order[16:32] == list(range(1, 32, 2))
    assert order[32:48] == list(range(32, 64, 2))


def test_an_offer_lasts_for_its_call_and_is_matched_by_address_and_layout():
    data, scales = _quantized(torch.randn(4, 128))
    copy, copy_scales = expanded.expand_rows_ops(data, scales)
    assert expanded.offered() is None and expanded.matching(data) is None
    inside = expanded.offering(lambda: (expanded.offered(), expanded.matching(data)), data, copy, copy_scales)
    assert inside[0][0] is data and inside[1] == (copy, copy_scales)
    assert expanded.offered() is None
    with pytest.raises(RuntimeError):
        expanded.offering(lambda: (_ for _ in ()).throw(RuntimeError("boom")), data, copy, copy_scales)
    assert expanded.offered() is None                                             # restored after a raise too
    for other in (data.clone(), data[:2]):
        assert expanded.offering(expanded.matching, data, copy, copy_scales, other) is None
    assert expanded.offering(expanded.matching, data, copy.float(), copy_scales, data) is None


def test_the_expanded_op_adds_the_copy_to_the_norm_ops_outputs():
    a, b = torch.randn(3, 1, 256).bfloat16(), torch.randn(3, 1, 256).bfloat16()
    w = torch.randn(256).bfloat16()
    plain = torch.ops.tilefly.add_rms_norm_mx_quantize(a, b, w, 1e-5, "mxfp4")
    out = torch.ops.tilefly.add_rms_norm_mx_quantize_expanded(a, b, w, 1e-5)
    assert len(out) == 5 and all(torch.equal(x, y) for x, y in zip(out[:3], plain))
    want = expanded.expand_rows_ops(plain[1], plain[2])
    assert torch.equal(out[3], want[0]) and torch.equal(out[4], want[1])
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = torch.ops.tilefly.add_rms_norm_mx_quantize_expanded(mode.from_tensor(a), mode.from_tensor(b),
                                                                   mode.from_tensor(w), 1e-5)
    assert [(t.shape, t.dtype) for t in fake] == [(t.shape, t.dtype) for t in out]
    assert [tuple(t.shape) for t in norm_quant.fake_outputs(a, SPEC, expand=True)[3:]] == [(3, 256), (3, 8)]


def _gemm_layer(fmt):
    """An add + RMSNorm whose output feeds an MX GEMM, as a compiled MXLinear traces it."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(128).to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.normal_()
    w, w_scales = quantize_rows(torch.randn(64, 128), formats.ELEMENTS[fmt])

    def f(a, b):
        h = a + b
        x = norm(h)
        data, scales = torch.ops.tilefly.mx_quantize_rows(x.reshape(-1, 128), fmt)
        return h, torch.ops.tilefly.mx_linear_mm(data, w.view(torch.uint8), scales, w_scales, fmt, "none", None,
                                                 torch.bfloat16)
    return f


@pytest.mark.parametrize("fmt, option, tokens, expand", [("mxfp4", True, 32, True), ("mxfp4", False, 32, False),
                                                         ("mxfp8", True, 32, False), ("mxfp4", True, 16, False)])
def test_the_pass_hands_gemms_the_copy_of_mxfp4_only_under_the_option_where_read(monkeypatch, compile_fused, reference,
                                                                                  fmt, option, tokens, expand):
    """MXFP4 under ``config.mx_expanded_activation``, and only where the GEMM's build reads it: 17-32 tokens
    (configs.reads_expanded; at 16 tokens the pick unpacks without folding)."""
    from tilefly.ops.mx_gemm import configs

    assert configs.reads_expanded(tokens, 64, 128) == (tokens == 32)
    monkeypatch.setattr(config, "mx_expanded_activation", option)
    monkeypatch.setattr(torch._inductor.config, "fx_graph_cache", False)   # the pass must run
    f = _gemm_layer(fmt)
    a, b = torch.randn(tokens, 1, 128).bfloat16(), torch.randn(tokens, 1, 128).bfloat16()
    out, code = compile_fused(f, a, b)
    assert code.count("torch.ops.tilefly.add_rms_norm_mx_quantize_expanded.default(") == int(expand)
    assert code.count("torch.ops.tilefly.add_rms_norm_mx_quantize.default(") == int(not expand)
    assert code.count("a_expanded=buf") == int(expand)
    want = f(a, b)
    assert torch.equal(out[0], want[0]) and torch.equal(out[1], want[1])


def test_the_option_enters_the_pass_key(monkeypatch):
    from tilefly.mx.shared_quant_pass import SharedQuantization

    monkeypatch.setattr(config, "mx_fused_quant", True)
    keys = set()
    for option in (False, True):
        monkeypatch.setattr(config, "mx_expanded_activation", option)
        keys.add(SharedQuantization().uuid())
    assert len(keys) == 2


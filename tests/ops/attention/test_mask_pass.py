"""The SharedAttentionMask pass on CPU: equal attention masks become one node (in a hand-built graph and
in Inductor's output for two attention calls on one boolean mask), unequal ones stay apart, results
stay ATen's. Its slot and chaining: tests/test_graph_pass.py."""
import re

import pytest
import torch
import torch.nn.functional as F
from torch._inductor import config as inductor_config
from torch._inductor.utils import run_and_get_code
from torch._subclasses.fake_tensor import FakeTensorMode

import tilefly
from tilefly.ops.attention.mask_pass import SharedAttentionMask, share_attention_masks

SDPA_CPU = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
EFFICIENT = torch.ops.aten._scaled_dot_product_efficient_attention.default


def _additive(graph, mask, fill, val):
    """where(mask, 0, fill) as SDPA's decomposition traces it: two scalar constants of its own; ``val``:
    the fake value Inductor's graphs carry in each node's meta."""
    zero = graph.call_function(torch.ops.aten.full.default, ([], 0.0), {"dtype": torch.bfloat16})
    low = graph.call_function(torch.ops.aten.full.default, ([], fill), {"dtype": torch.bfloat16})
    where = graph.call_function(torch.ops.aten.where.self, (mask, zero, low))
    where.meta["val"] = val
    return where


def _mask_value(device="cpu", keys=12):
    with FakeTensorMode():
        return torch.empty(2, 1, 1, keys, dtype=torch.bfloat16, device=device)


def _graph(fills, val=None):
    """One attention call per fill value, each on its own conversion of one boolean mask: kwarg
    ``attn_mask`` (the CPU op) and positional ``attn_bias`` (the efficient op) alternating."""
    val = _mask_value() if val is None else val
    graph = torch.fx.Graph()
    q, k, v, mask = (graph.placeholder(n) for n in ("q", "k", "v", "mask"))
    outs, calls = [], []
    for i, fill in enumerate(fills):
        bias = _additive(graph, mask, fill, val)
        if i % 2 == 0:
            call = graph.call_function(SDPA_CPU, (q, k, v), {"attn_mask": bias})
        else:
            call = graph.call_function(EFFICIENT, (q, k, v, bias, False))
        calls.append(call)
        outs.append(graph.call_function(torch.ops.aten.add.Tensor, (call, 1)))
    graph.output(tuple(outs))
    return graph, calls


def _mask_of(call):
    return call.kwargs["attn_mask"] if "attn_mask" in call.kwargs else call.args[3]


def _count(graph, target):
    return sum(1 for n in graph.nodes if n.op == "call_function" and n.target is target)


def test_equal_masks_become_one_and_the_copies_are_erased():
    graph, calls = _graph([float("-inf")] * 4)
    assert _count(graph, torch.ops.aten.where.self) == 4
    assert share_attention_masks(graph) == 3
    graph.lint()
    masks = {_mask_of(c) for c in calls}
    assert len(masks) == 1
    assert _count(graph, torch.ops.aten.where.self) == 1
    assert _count(graph, torch.ops.aten.full.default) == 2     # the kept conversion's two constants
    assert next(iter(masks)).meta["inductor_realize_to_strides"]


def test_cuda_masks_with_unaligned_rows_stay_apart():
    """Inductor pads such a mask for each CUDA attention op anyway: sharing would only add a kernel."""
    graph, calls = _graph([float("-inf")] * 2, _mask_value("cuda", keys=12))     # 24-byte rows
    assert share_attention_masks(graph) == 0 and len({_mask_of(c) for c in calls}) == 2
    graph, calls = _graph([float("-inf")] * 2, _mask_value("cuda", keys=768))
    assert share_attention_masks(graph) == 1 and len({_mask_of(c) for c in calls}) == 1


def test_unequal_masks_stay_apart():
    graph, calls = _graph([float("-inf"), -1e4, float("-inf"), -1e4])
    assert share_attention_masks(graph) == 2
    graph.lint()
    assert _mask_of(calls[0]) is _mask_of(calls[2]) and _mask_of(calls[1]) is _mask_of(calls[3])
    assert _mask_of(calls[0]) is not _mask_of(calls[1])
    assert _count(graph, torch.ops.aten.where.self) == 2


def test_a_graph_without_attention_is_left_alone():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(torch.ops.aten.add.Tensor, (x, 1)))
    before = len(graph.nodes)
    assert share_attention_masks(graph) == 0 and len(graph.nodes) == before


def _two_layers(q, k1, v1, k2, v2, mask):
    a = F.scaled_dot_product_attention(q, k1, v1, attn_mask=mask)
    return F.scaled_dot_product_attention(a, k2, v2, attn_mask=mask)


def _inputs(device="cpu", b=2, h=4, length=12, d=16):
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    q = torch.randn(b, h, 1, d, generator=gen).to(device, torch.bfloat16)
    kv = [torch.randn(b, h, length, d, generator=gen).to(device, torch.bfloat16) for _ in range(4)]
    position = torch.randint(3, length, (b, 1, 1, 1), generator=gen).to(device)
    mask = torch.arange(length, device=device).view(1, 1, 1, length) <= position   # a decode step's causal mask
    return q, *kv, mask


def test_compiled_attention_converts_the_mask_once_and_matches_eager():
    torch._dynamo.reset()
    args = _inputs()
    expected = _two_layers(*args)
    with tilefly.enabled("attention"):
        assert isinstance(inductor_config.post_grad_custom_post_pass, SharedAttentionMask)
        out, (code, *_) = run_and_get_code(torch.compile(_two_layers), *args)
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)
    calls = [line for line in code.splitlines() if "_scaled_dot_product" in line and "attn_mask=" in line
             and "= torch.ops.aten" in line]
    assert len(calls) == 2
    masks = {line.split("attn_mask=")[1].split(",")[0].split(")")[0] for line in calls}
    assert len(masks) == 1, calls


@pytest.mark.cuda
def test_cuda_compiled_attention_converts_the_mask_once_and_matches_eager():
    """On the GPU the attention ops take the additive mask positionally; the generated code makes one
    mask buffer, not one a call (the e2e model's shape: 768 keys, 128-wide heads)."""
    torch._dynamo.reset()
    args = _inputs("cuda", b=8, h=8, length=768, d=128)
    expected = _two_layers(*args)
    with tilefly.enabled("attention"):
        out, (code, *_) = run_and_get_code(torch.compile(_two_layers), *args)
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)
    # the only BF16 buffers the graph allocates with 768 keys last are masks (without the pass: one a call)
    masks = re.findall(r"(buf\d+) = empty_strided_cuda\(\([^)]*768\), \([^)]*\), torch\.bfloat16\)", code)
    assert len(masks) == 1, masks


def test_the_mx_pass_fused_attention_op_shares_its_mask_too():
    """tilefly.mx's attention + quantization op (the MX pass runs first) takes the mask as attn_bias."""
    import tilefly.mx.attention_quant  # noqa: F401 - registers the op

    fused_op = torch.ops.tilefly.attention_mx_quantize.default
    graph = torch.fx.Graph()
    q, k, v, mask = (graph.placeholder(n) for n in ("q", "k", "v", "mask"))
    calls = [graph.call_function(fused_op, (q, k, v, _additive(graph, mask, float("-inf"), _mask_value()), None,
                                            False, "cudnn", [512, 128, 128, 1], 512, "mxfp4")) for _ in range(3)]
    graph.output(tuple(calls))
    assert share_attention_masks(graph) == 2
    assert len({c.args[3] for c in calls}) == 1 and _count(graph, torch.ops.aten.where.self) == 1

"""The dense GEMM eligibility predicate on meta and fake tensors and on Inductor IR nodes."""
import pytest
import torch

from tilefly.ops.gemm.eligibility import (MatrixFacts, bias_mode, facts_from_node, facts_from_tensor, gemm_reason,
                                          orientation)

BF16, FP16 = torch.bfloat16, torch.float16


def meta(*shape, dtype=BF16, t=False):
    x = torch.empty(*(shape[::-1] if t else shape), dtype=dtype, device="meta")
    return x.t() if t else x


def reason(a, b, **kw):
    kw.setdefault("device_type", "cuda")
    kw.setdefault("capability", (9, 0))
    bias = kw.pop("bias", None)
    return gemm_reason(facts_from_tensor(a), facts_from_tensor(b),
                       bias=None if bias is None else facts_from_tensor(bias), **kw)


@pytest.mark.parametrize("a_t, b_t", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("dtype", [BF16, FP16])
def test_all_four_layouts_are_eligible(a_t, b_t, dtype):
    a, b = meta(64, 128, dtype=dtype, t=a_t), meta(128, 256, dtype=dtype, t=b_t)
    assert reason(a, b) is None
    assert orientation(facts_from_tensor(a)) == ("col" if a_t else "row")
    assert orientation(facts_from_tensor(b)) == ("col" if b_t else "row")


@pytest.mark.parametrize("m, n, k", [(1, 1, 8), (1, 4096, 4096), (4096, 1, 8), (17, 1000, 64), (8, 8, 1)])
def test_single_rows_and_columns_need_no_alignment(m, n, k):
    # a size-1 dimension's stride is never used, and K = 1 is read through the transpose
    a, b = meta(m, k), meta(k, n, t=True)
    assert reason(a, b) is None


@pytest.mark.parametrize("case, words", [
    (lambda: (meta(64, 17), meta(17, 64)), "TMA-readable"),                   # K=17: 34-byte rows
    (lambda: (meta(64, 64), meta(64, 127)), "TMA-readable"),                  # N=127 row-major B
    (lambda: (meta(64, 64, dtype=torch.float32), meta(64, 64, dtype=torch.float32)), "FP16 or BF16"),
    (lambda: (meta(64, 64), meta(64, 64, dtype=FP16)), "FP16 or BF16"),
    (lambda: (meta(64, 32), meta(64, 64)), "inner sizes"),
    (lambda: (meta(2, 64, 64), meta(64, 64)), "2-D"),
    (lambda: (meta(0, 64), meta(64, 64)), "out of range"),
    (lambda: (meta(64, 64), meta(64, 64)[:, :1].expand(64, 64)), "TMA-readable"),   # stride-0 operand
    (lambda: (torch.empty(64 * 64 + 1, dtype=BF16, device="meta")[1:].view(64, 64), meta(64, 64)), "aligned"),
])
def test_ineligible_inputs_get_a_reason(case, words):
    a, b = case()
    r = reason(a, b)
    assert r is not None and words in r, r


def test_device_dtype_and_scalar_conditions():
    a, b = meta(64, 64), meta(64, 64)
    assert "CUDA" in reason(a, b, device_type="cpu")
    assert "sm_90" in reason(a, b, capability=(8, 0))
    assert "sm_90" in reason(a, b, capability=(10, 0))
    assert "output dtype" in reason(a, b, out_dtype=torch.float32)
    assert reason(a, b, out_dtype=BF16) is None
    assert "alpha" in reason(a, b, alpha=2)
    assert "beta" in reason(a, b, beta=0)


@pytest.mark.parametrize("shape, stride, expect", [
    ((256,), (1,), (1, 1)),            # addmm's usual 1-D bias of N
    ((1, 256), (256, 1), (1, 1)),      # a broadcast row
    ((64, 256), (0, 1), (1, 1)),       # Inductor's expanded bias
    ((64, 1), (1, 1), (2, 1)),         # a column vector: bias[m]
    ((64, 256), (1, 0), (2, 1)),
    ((1, 1), (1, 1), (1, 0)),          # a scalar broadcast everywhere
    ((64, 256), (256, 1), None),       # a full 2-D bias stays with ATen
    ((128,), (1,), None),              # does not broadcast to N=256
])
def test_bias_modes(shape, stride, expect):
    assert bias_mode(MatrixFacts(shape, stride, BF16), 64, 256) == expect


def test_bias_conditions_in_the_predicate():
    a, b = meta(64, 128), meta(128, 256)
    assert reason(a, b, bias=meta(256)) is None
    assert reason(a, b, bias=meta(64, 1)) is None
    assert "broadcast vector" in reason(a, b, bias=meta(64, 256))
    assert "bias dtype" in reason(a, b, bias=meta(256, dtype=torch.float32))


def test_fake_tensors_use_storage_offsets_for_alignment():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        base = torch.empty(64 * 64 + 8, dtype=BF16)
        aligned, shifted = base[8:].view(64, 64), base[1:4097].view(64, 64)
        assert facts_from_tensor(aligned).misalign == 0
        assert facts_from_tensor(shifted).misalign == 2


def test_inductor_nodes_give_the_same_facts():
    pytest.importorskip("torch._inductor")
    import sympy
    from torch._inductor import ir

    layout = ir.FixedLayout(torch.device("cuda", 0), BF16, [64, 128], [1, 64])
    node = ir.InputBuffer(name="a", layout=layout)
    facts = facts_from_node(node)
    assert facts.shape == (64, 128) and facts.stride == (1, 64) and facts.misalign == 0
    assert orientation(facts) == "col"
    s0 = sympy.Symbol("s0", integer=True, positive=True)
    dynamic = ir.InputBuffer(name="d", layout=ir.FixedLayout(torch.device("cuda", 0), BF16, [s0, 128], [128, 1]))
    assert facts_from_node(dynamic).shape is None
    assert "dynamic" in gemm_reason(facts_from_node(dynamic), facts, device_type="cuda")
